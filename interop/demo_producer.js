'use strict';
// The demo's Node producer: a Node service adding work for a Python worker.
//   node interop/demo_producer.js '<json args>'      e.g. {"redis": URL, "queue": "demo"}
//                                                    or {"postgres": URL, "schema": S, "queue": "demo"}
//   node interop/demo_producer.js <redisUrl> <queue>  (the older form, Redis)
// (the connection fields are interop/backend.js's). Adds plain jobs, jobs that fail once and are
// retried, jobs that always fail, a delayed job, a job scheduler that adds one every 5 s and, on
// Redis, grouped jobs (through interop/groups.js; groups are Redis-only).
const { open } = require('./backend');

async function main() {
  const [first, second] = process.argv.slice(2);
  const args = first.startsWith('{') ? JSON.parse(first) : { redis: first, queue: second };
  const b = open(args);
  await b.ready();
  const queue = new b.Queue(args.queue, b.options());
  for (let i = 1; i <= 10; i++) {
    await queue.add('resize-image', { image: `photo-${i}.jpg`, ms: 300 });
  }
  for (let i = 1; i <= 3; i++) {
    await queue.add('charge-card', { order: i, failTimes: 1, ms: 200 },
      { attempts: 3, backoff: { type: 'exponential', delay: 1000 } });
  }
  await queue.add('send-sms', { to: '+0000', failTimes: 99 }, { attempts: 2, backoff: 500 });
  await queue.add('weekly-report', { ms: 100 }, { delay: 60 * 60 * 1000 });
  if (b.kind === 'redis') {
    const { GroupProducer } = require('./groups');
    const groups = new GroupProducer(args.queue, { connection: b.connection });
    for (let user = 1; user <= 3; user++) {
      for (let step = 1; step <= 4; step++) {
        await groups.add('sync-account', { user, step, ms: 1500 }, { group: { id: `user:${user}` } });
      }
    }
  }
  await queue.upsertJobScheduler('heartbeat', { every: 5000 }, { name: 'heartbeat', data: { ms: 50 } });
  console.log(JSON.stringify({ added: true }));
  await queue.close();
  await b.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
