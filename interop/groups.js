'use strict';
// Add bullmq-compat group jobs (per-group FIFO) from Node.js.
//
//   const { GroupProducer } = require('./groups');
//   const producer = new GroupProducer('emails', { connection: new IORedis(url) });
//   await producer.add('sync', { user: 42 }, { group: { id: 'user:42' }, attempts: 3 });
//
// The job is stored exactly as Queue.add stores it, plus BullMQ Pro's opts.group = {id}; our
// addGroupJob script (built by the Python package: `bullmq-compat lua addGroupJob > file`,
// which `make setup` writes to interop/lua/addGroupJob.lua) decides whether it runs now or
// waits behind its group. opts.deduplication (upstream's five modes: {id, ttl, extend, replace,
// keepLastIfActive, reschedule}) decides as it does for Node's Queue.add (docs/groups.md,
// "Deduplication"); flow parents are refused. With an ordering delay on the queue or the group (set from Python), a job with an
// orderMs runs only once orderMs + the delay has passed.
const fs = require('fs');
const path = require('path');
const { Packr } = require('msgpackr');

const packr = new Packr({ useRecords: false, encodeUndefinedAsNil: true });
const DEFAULT_LUA = path.join(__dirname, 'lua', 'addGroupJob.lua');

class GroupProducer {
  constructor(queueName, { connection, prefix = 'bull', luaPath = DEFAULT_LUA }) {
    this.redis = connection;
    this.base = `${prefix}:${queueName}:`;
    if (!this.redis.bullmqCompatAddGroupJob) {
      this.redis.defineCommand('bullmqCompatAddGroupJob', { numberOfKeys: 12, lua: fs.readFileSync(luaPath, 'utf8') });
    }
  }

  async add(name, data, opts = {}) {
    const { group, orderMs, jobId, keepLogs, parent, deduplication, ...rest } = opts;
    const gid = typeof group === 'string' ? group : group && group.id;
    if (!gid) throw new Error('opts.group (a group id or {id}) is required');
    if (parent) throw new Error('group jobs cannot have a flow parent');
    if (deduplication && (typeof deduplication.id !== 'string' || !deduplication.id)) {
      throw new Error('opts.deduplication needs a non-empty id');
    }
    const timestamp = rest.timestamp || Date.now();
    const stored = { attempts: 0, ...rest, group: { id: gid } };
    if (typeof stored.backoff === 'number') stored.backoff = { type: 'fixed', delay: stored.backoff };
    if (jobId) stored.jobId = jobId;
    if (keepLogs) stored.kl = keepLogs;
    if (deduplication) stored.de = deduplication;
    const keys = ['wait', 'meta', 'active', 'marker', 'prioritized', 'pc', 'delayed', 'events',
      'waiting-children', 'completed', 'failed', 'id'].map((k) => this.base + k);
    const dedupKey = deduplication ? `${this.base}de:${deduplication.id}` : null;
    const args = packr.pack([this.base, jobId || '', name, timestamp, null, null, null, null, dedupKey, null]);
    const id = await this.redis.bullmqCompatAddGroupJob(...keys, args, JSON.stringify(data === undefined ? {} : data),
      packr.pack(stored), gid, orderMs === undefined ? timestamp : orderMs, Date.now(), orderMs === undefined ? 0 : 1);
    if (id === -100) throw new Error('group jobs cannot be flow children');
    if (id === -101) {
      throw new Error(`deduplication keepLastIfActive: the job of id ${deduplication.id} is active and not a group job`);
    }
    return id;
  }
}

module.exports = { GroupProducer };
