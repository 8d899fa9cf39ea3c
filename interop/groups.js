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
// waits behind its group. Flow parents and deduplication are refused for group jobs.
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
    if (parent || deduplication) throw new Error('group jobs cannot have a flow parent or deduplication');
    const timestamp = rest.timestamp || Date.now();
    const stored = { attempts: 0, ...rest, group: { id: gid } };
    if (typeof stored.backoff === 'number') stored.backoff = { type: 'fixed', delay: stored.backoff };
    if (jobId) stored.jobId = jobId;
    if (keepLogs) stored.kl = keepLogs;
    const keys = ['wait', 'meta', 'active', 'marker', 'prioritized', 'pc', 'delayed', 'events',
      'waiting-children', 'completed', 'failed', 'id'].map((k) => this.base + k);
    const args = packr.pack([this.base, jobId || '', name, timestamp, null, null, null, null, null, null]);
    const id = await this.redis.bullmqCompatAddGroupJob(...keys, args, JSON.stringify(data === undefined ? {} : data),
      packr.pack(stored), gid, orderMs === undefined ? timestamp : orderMs, Date.now());
    if (id === -100) throw new Error('group jobs cannot be flow children');
    return id;
  }
}

module.exports = { GroupProducer };
