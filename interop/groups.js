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
// "Deduplication"). With an ordering delay on the queue or the group (set from Python), a job with an
// orderMs runs only once orderMs + the delay has passed. opts.parent ({id, queue}, as Queue.add
// takes it) makes the job a child of an existing parent, held or not behind its group.
// opts.group.priority (0..2097151, Pro's) orders the group's held jobs: 0 first, then 1, 2, ...;
// FIFO among equals (docs/groups.md, "Priority within a group").
//
// Flows with group children (docs/groups.md, "Groups in flows"): GroupFlowProducer is Node's
// FlowProducer whose nodes with opts.group go through our addGroupJob script, in the same MULTI as
// the rest of the tree (every other node is added by upstream's scripts, unchanged):
//
//   const { GroupFlowProducer } = require('./groups');
//   const flows = new GroupFlowProducer({ connection: new IORedis(url) });
//   await flows.add({ name: 'report', queueName: 'reports', children: [
//     { name: 'sync', queueName: 'sync', data: {}, opts: { group: { id: 'user:42' } } }] });
//
// A node with children cannot be a group job (the gate and upstream's children counting share
// waiting-children): add() and addBulk() refuse such a tree before anything is sent.
const fs = require('fs');
const path = require('path');
const { Packr } = require('msgpackr');
const { FlowProducer } = require('bullmq');

const packr = new Packr({ useRecords: false, encodeUndefinedAsNil: true });
const DEFAULT_LUA = path.join(__dirname, 'lua', 'addGroupJob.lua');
const GATE_KEYS = ['wait', 'meta', 'active', 'marker', 'prioritized', 'pc', 'delayed', 'events',
  'waiting-children', 'completed', 'failed', 'id'];
// Node's short names of stored options (its optsEncodeMap)
const SHORT = { deduplication: 'de', failParentOnFailure: 'fpof', continueParentOnFailure: 'cpof',
  ignoreDependencyOnFailure: 'idof', keepLogs: 'kl', removeDependencyOnFailure: 'rdof' };

function defineAddGroupJob(redis, luaPath) {
  if (!redis.bullmqCompatAddGroupJob) {
    redis.defineCommand('bullmqCompatAddGroupJob', { numberOfKeys: 12, lua: fs.readFileSync(luaPath, 'utf8') });
  }
}

function groupIdOf(group) {
  const gid = typeof group === 'string' ? group : group && group.id;
  if (typeof gid !== 'string' || !gid) throw new Error(`opts.group=${JSON.stringify(group)}: a group id or {id} is required`);
  return gid;
}

function refusalOf(id, gid, maxSize, deduplication) {
  if (id === -102) {
    const err = new Error(`group ${gid} already holds maxSize=${maxSize} jobs not started yet: the job was not added`);
    err.name = 'GroupMaxSizeExceededError';
    return err;
  }
  if (id === -101) {
    return new Error(`deduplication keepLastIfActive: the job of id ${deduplication.id} is active and not a group job`);
  }
  if (id === -5) return new Error('Missing key for parent job: the flow parent does not exist');
  return null;
}

class GroupProducer {
  constructor(queueName, { connection, prefix = 'bull', luaPath = DEFAULT_LUA }) {
    this.redis = connection;
    this.base = `${prefix}:${queueName}:`;
    defineAddGroupJob(this.redis, luaPath);
  }

  async add(name, data, opts = {}) {
    const { group, orderMs, jobId, keepLogs, parent, deduplication, ...rest } = opts;
    const gid = groupIdOf(group);
    if (parent && deduplication) throw new Error('options deduplication and parent cannot be used together');
    if (deduplication && (typeof deduplication.id !== 'string' || !deduplication.id)) {
      throw new Error('opts.deduplication needs a non-empty id');
    }
    const timestamp = rest.timestamp || Date.now();
    const maxSize = group && typeof group === 'object' ? group.maxSize : undefined;
    if (maxSize !== undefined && !(Number.isSafeInteger(maxSize) && maxSize >= 1)) {
      throw new Error(`opts.group.maxSize=${maxSize} must be an integer >= 1`);
    }
    const priority = group && typeof group === 'object' ? group.priority : undefined;
    if (priority !== undefined && !(Number.isInteger(priority) && priority >= 0 && priority <= 2097151)) {
      throw new Error(`opts.group.priority=${priority} must be an integer from 0 to 2097151`);
    }
    if (priority > 0 && orderMs !== undefined) {
      throw new Error('opts.group.priority >= 1 cannot be used with orderMs (orderMs orders unprioritised jobs)');
    }
    const storedGroup = { id: gid };
    if (maxSize !== undefined) storedGroup.maxSize = maxSize;
    if (priority !== undefined) storedGroup.priority = priority;
    const stored = { attempts: 0, ...rest, group: storedGroup };
    if (typeof stored.backoff === 'number') stored.backoff = { type: 'fixed', delay: stored.backoff };
    if (jobId) stored.jobId = jobId;
    if (keepLogs) stored.kl = keepLogs;
    if (deduplication) stored.de = deduplication;
    const keys = ['wait', 'meta', 'active', 'marker', 'prioritized', 'pc', 'delayed', 'events',
      'waiting-children', 'completed', 'failed', 'id'].map((k) => this.base + k);
    const dedupKey = deduplication ? `${this.base}de:${deduplication.id}` : null;
    let parentKey = null;
    let link = null;
    if (parent) { // as Node's Queue.add links a child: parent.queue is the parent's "<prefix>:<queue>"
      parentKey = `${parent.queue}:${parent.id}`;
      link = { id: parent.id, queueKey: parent.queue };
      for (const [flag, short] of Object.entries(SHORT)) {
        if (short !== 'de' && short !== 'kl' && rest[flag]) link[short] = true;
      }
    }
    for (const [flag, short] of Object.entries(SHORT)) {
      if (flag in stored && short !== 'de' && short !== 'kl') {
        stored[short] = stored[flag];
        delete stored[flag];
      }
    }
    const args = packr.pack([this.base, jobId || '', name, timestamp, parentKey,
      parentKey && `${parentKey}:dependencies`, link, null, dedupKey, null]);
    const id = await this.redis.bullmqCompatAddGroupJob(...keys, args, JSON.stringify(data === undefined ? {} : data),
      packr.pack(stored), gid, orderMs === undefined ? timestamp : orderMs, Date.now(), orderMs === undefined ? 0 : 1);
    if (id === -110 || id === -111) throw new Error(`opts.group.priority=${priority} refused by the group gate`);
    const refused = refusalOf(id, gid, maxSize, deduplication);
    if (refused) throw refused;
    return id;
  }
}

// Refuse a tree with a group job that has children, before anything is sent.
function checkFlow(node, where) {
  const opts = node.opts || {};
  if ((opts.group !== undefined || opts.orderMs !== undefined) && node.children && node.children.length) {
    throw new Error(`${where}: option group=${JSON.stringify(opts.group)} on a node with children: a group job `
      + 'cannot be a flow parent (the group gate holds jobs in waiting-children, where upstream keeps a parent '
      + 'until its children finish); group its children instead');
  }
  if (opts.group !== undefined) groupIdOf(opts.group);
  (node.children || []).forEach((child, i) => checkFlow(child, `${where}.children[${i}]`));
}

class GroupFlowProducer extends FlowProducer {
  constructor(opts = {}, Connection) {
    super(opts, Connection);
    const luaPath = opts.luaPath || DEFAULT_LUA;
    const backend = this.getBackend();
    const addFlow = backend.addFlow.bind(backend);
    const addJobToTransaction = backend.addJobToTransaction.bind(backend);
    backend.addFlow = async (entries) => {
      defineAddGroupJob(await backend.queue.client, luaPath); // before the MULTI is made: it copies commands
      return addFlow(entries);
    };
    backend.addJobToTransaction = (client, job, jobId, parentKeyOpts = {}, keys = backend.queue.keys) => {
      const opts = job.opts || {};
      if (opts.group === undefined) return addJobToTransaction(client, job, jobId, parentKeyOpts, keys);
      if (parentKeyOpts.addToWaitingChildren) throw new Error('a group job cannot be a flow parent');
      const gid = groupIdOf(opts.group);
      const { orderMs, group, ...rest } = opts;
      const stored = { ...rest, group: typeof group === 'object' && group.maxSize !== undefined
        ? { id: gid, maxSize: group.maxSize } : { id: gid } };
      const encoded = {};
      for (const [key, value] of Object.entries(stored)) {
        if (value === undefined) continue;
        if (key === 'telemetry') {
          if (value.metadata !== undefined) encoded.tm = value.metadata;
          if (value.omitContext !== undefined) encoded.omc = value.omitContext;
        } else {
          encoded[SHORT[key] || key] = value;
        }
      }
      const args = packr.pack([keys[''], jobId === undefined ? '' : jobId, job.name, job.timestamp,
        job.parentKey || null, parentKeyOpts.parentDependenciesKey || null, job.parent, job.repeatJobKey,
        job.deduplicationId ? `${keys.de}:${job.deduplicationId}` : null, parentKeyOpts.deferParentRelease ? 1 : null]);
      const now = Date.now();
      return client.bullmqCompatAddGroupJob(...GATE_KEYS.map((k) => keys[k]), args, job.data, packr.pack(encoded),
        gid, orderMs === undefined ? job.timestamp : orderMs, now, orderMs === undefined ? 0 : 1);
    };
  }

  async add(flow, opts) {
    checkFlow(flow, 'flow');
    return super.add(flow, opts);
  }

  async addBulk(flows) {
    flows.forEach((flow, i) => checkFlow(flow, `flows[${i}]`));
    return super.addBulk(flows);
  }
}

module.exports = { GroupProducer, GroupFlowProducer };
