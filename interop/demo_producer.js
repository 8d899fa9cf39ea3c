'use strict';
// The demo's Node producer: a Node service adding work for a Python worker.
//   node interop/demo_producer.js <redisUrl> <queue>
// Adds plain jobs, jobs that fail once and are retried, jobs that always fail, a delayed job,
// grouped jobs (through interop/groups.js) and a job scheduler that adds one every 5 s.
const IORedis = require('ioredis');
const { Queue } = require('bullmq');
const { GroupProducer } = require('./groups');

async function main() {
  const [url, name] = process.argv.slice(2);
  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  const queue = new Queue(name, { connection });
  const groups = new GroupProducer(name, { connection });
  for (let i = 1; i <= 10; i++) {
    await queue.add('resize-image', { image: `photo-${i}.jpg`, ms: 300 });
  }
  for (let i = 1; i <= 3; i++) {
    await queue.add('charge-card', { order: i, failTimes: 1, ms: 200 },
      { attempts: 3, backoff: { type: 'exponential', delay: 1000 } });
  }
  await queue.add('send-sms', { to: '+0000', failTimes: 99 }, { attempts: 2, backoff: 500 });
  await queue.add('weekly-report', { ms: 100 }, { delay: 60 * 60 * 1000 });
  for (let user = 1; user <= 3; user++) {
    for (let step = 1; step <= 4; step++) {
      await groups.add('sync-account', { user, step, ms: 1500 }, { group: { id: `user:${user}` } });
    }
  }
  await queue.upsertJobScheduler('heartbeat', { every: 5000 }, { name: 'heartbeat', data: { ms: 50 } });
  console.log(JSON.stringify({ added: true }));
  await queue.close();
  connection.disconnect();
}

main().catch((err) => { console.error(err); process.exit(1); });
