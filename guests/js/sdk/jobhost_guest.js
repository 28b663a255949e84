/**
 * Helpers for writing a jobhost job handler in JavaScript.
 *
 * A handler is one ES module exporting `describe()` and `run(ctx, payload)`,
 * built into a component with componentize-js against the repository's
 * `wit/` (see guests/js/build.sh). These helpers spare it the bindings'
 * conventions: WIT names in camelCase, `undefined` for a missing option,
 * BigInt for u64, `{tag, val}` for variants and a thrown value for `err`.
 *
 *     import { config, limit, parsePayload, output, retry, log } from '../sdk/jobhost_guest.js';
 *
 *     export function describe() {
 *       return config('resize', { maxAttempts: 5, concurrency: limit(2, { key: '{account}' }) });
 *     }
 *
 *     export function run(ctx, payload) {      // may be async: see sleep()
 *       const data = parsePayload(payload);
 *       if (!data.image) throw retry('no image yet');
 *       log.info('resizing ' + data.image);
 *       return output({ done: true });          // any JSON value, or nothing
 *     }
 *
 * `ctx` is `{jobId, attempt, queue, enqueuedAtMs, batchId, concurrencyKey}`;
 * `jobId`, `enqueuedAtMs` and `batchId` are BigInt (u64), `attempt` a number.
 * `throw retry(...)`, `fail(...)`, `snooze(...)` or `throttled(...)` ends a run otherwise.
 * Any other exception `run` does not catch traps the run, and the attempt is
 * retried like any crash: the bindings try to lower it as a job-error and
 * fail, so stderr says "invalid variant tag value `undefined` (received
 * `TypeError: ...`)" with the original error's text.
 */

import { enqueue as hostEnqueue, log as hostLog, progress as hostProgress } from 'jobhost:job/host@0.8.0';
import { addStep as hostAddStep, currentStep as hostCurrentStep, open as hostOpen } from 'jobhost:job/workflows@0.8.0';
import { send as hostSend } from 'jobhost:job/events@0.8.0';
import {
  pause as schedulePause,
  remove as scheduleRemove,
  resume as scheduleResume,
  set as scheduleSet,
} from 'jobhost:job/schedules@0.8.0';

/**
 * A job type's configuration; every option left out takes the host's default.
 * `backoffMs` is a `[base, cap]` pair in milliseconds.
 */
export function config(
  name,
  {
    queue,
    priority,
    maxAttempts,
    backoffMs,
    timeoutMs,
    memoryLimitBytes,
    concurrency,
    unique,
    outbound,
    rateLimit,
    onEvents,
  } = {},
) {
  return {
    name,
    queue,
    priority,
    maxAttempts,
    backoff: backoffMs ? { baseMs: backoffMs[0], capMs: backoffMs[1] } : undefined,
    timeoutMs,
    memoryLimitBytes: u64(memoryLimitBytes),
    concurrency,
    unique,
    schedule: undefined,
    outbound,
    rateLimit,
    onEvents,
  };
}

/**
 * At most `starts` runs per rendered `key` start in any window of
 * `periodMs`, fleet-wide; without a key, of the job type as a whole
 * (docs/rate-limits.md).
 */
export function rate(starts, periodMs, { key } = {}) {
  return { limit: starts, periodMs: BigInt(periodMs), key };
}

/**
 * An outbound rule for `config`'s `outbound` list: requests to `origin`
 * (`https://api.example.com`, `https://*.example.com`, `http://127.0.0.1:*`)
 * with `methods` (every method when empty), which may carry the named
 * `secrets`. An operator grants it too before a request goes out; the
 * handler sends it with the standard `fetch` (docs/outbound.md).
 */
export function allow(origin, { methods = [], secrets = [] } = {}) {
  return { origin, methods, secrets };
}

/**
 * At most `atOnce` runs per rendered `key` fleet-wide; `onConflict` is
 * `'block'`, `'discard'` or `'raise'`.
 */
export function limit(atOnce, { key, durationSecs = 30, onConflict = 'block' } = {}) {
  return { limit: atOnce, key, durationSecs, onConflict };
}

/**
 * At most one job per rendered `key` at a time; `strategy` is
 * `'until-executed'` or `'while-executing'`, `onDuplicate` `'skip'`,
 * `'replace'` or `'raise'`.
 */
export function unique(key, { strategy = 'until-executed', onDuplicate } = {}) {
  return { key, strategy, onDuplicate };
}

/**
 * How `run` ends other than in success. Throw it (or return it): the
 * bindings lower a thrown value's own `payload` as the `job-error`, and
 * take a returned object whose `tag` is `'err'` as the whole result, so
 * this carries both. It is an Error so that it has a stack when logged.
 */
export class JobError extends Error {
  constructor(error, message) {
    super(message);
    this.name = 'JobError';
    this.payload = error;
    this.tag = 'err';
    this.val = error;
  }
}

/** Ends the attempt as failed; the host retries with backoff while attempts remain. */
export function retry(reason) {
  return new JobError({ tag: 'retry', val: String(reason) }, `retry: ${reason}`);
}

/** Ends the job as failed at once, without retry. */
export function fail(reason) {
  return new JobError({ tag: 'fail', val: String(reason) }, `fail: ${reason}`);
}

/** Runs the job again after `seconds` without spending an attempt. */
export function snooze(seconds) {
  return new JobError({ tag: 'snooze', val: seconds }, `snooze: ${seconds} s`);
}

/**
 * The service said "slow down": the job runs again after `retryAfterMs`
 * without spending an attempt, and no other run of its key starts until
 * then, fleet-wide.
 */
export function throttled(retryAfterMs) {
  return new JobError({ tag: 'throttled', val: BigInt(retryAfterMs) }, `throttled: ${retryAfterMs} ms`);
}

/** The payload as an object; a payload that is not a JSON object fails the job without retry. */
export function parsePayload(payload) {
  let data;
  try {
    data = JSON.parse(payload);
  } catch (error) {
    throw fail(`payload is not JSON: ${error.message}`);
  }
  if (data === null || typeof data !== 'object' || Array.isArray(data)) {
    throw fail('payload must be a JSON object');
  }
  return data;
}

/** What `run` returns for `value`: its JSON text, or nothing for null or undefined. */
export function output(value) {
  return value == null ? undefined : json(value);
}

/** Lines of the job's log, by level. */
export const log = {
  trace: (message) => hostLog('trace', String(message)),
  debug: (message) => hostLog('debug', String(message)),
  info: (message) => hostLog('info', String(message)),
  warn: (message) => hostLog('warn', String(message)),
  error: (message) => hostLog('error', String(message)),
};

/** Reports progress; it shows while the job runs. */
export function progress(done, total) {
  hostProgress(u64(done), u64(total));
}

/** Why the host refused an enqueue. Not a job error: uncaught, it traps the run. */
export class EnqueueError extends Error {
  constructor(job, reason, what = `enqueue of ${job}`) {
    super(`${what} refused: ${reason}`);
    this.name = 'EnqueueError';
    this.reason = reason;
  }
}

/**
 * Enqueues a job of type `job` with `payload` (any JSON value, usually an
 * object), written with this job's completion. Throws EnqueueError when the
 * host refuses it (unknown type, bad payload or options, a full `raise` limit).
 */
export function enqueue(job, payload, { queue, priority, delayMs } = {}) {
  try {
    hostEnqueue(job, json(payload ?? {}), { queue, priority, delayMs: u64(delayMs) });
  } catch (error) {
    // The bindings throw their ComponentError, carrying the host's text as
    // `payload`; thrown on as it is, `run` would lower it as a job-error.
    if (error && Object.prototype.hasOwnProperty.call(error, 'payload')) {
      throw new EnqueueError(job, error.payload);
    }
    throw error;
  }
}

/** The workflow step this job is, as `{workflowId, name}` (workflowId a BigInt), or undefined. */
export function currentStep() {
  return hostCurrentStep() ?? undefined;
}

/**
 * Opens a workflow, created with this job's completion with the steps added
 * to it; returns its number for `addStep(..., { workflow })`.
 */
export function openWorkflow(label) {
  return hostOpen(label);
}

/**
 * Adds a step running `job` with `payload` once the steps named in `after`
 * (added before it; an entry may be `{step, ifFailed}`) have ended, written
 * with this job's completion. `workflow` is a number `openWorkflow`
 * returned, or left out for the workflow this job is a step of: the step is
 * then stored as `THIS-STEP/NAME`, waits for this step too, and every step
 * waiting for this one waits for it. `ifFailed` is 'cancel', 'run' or
 * 'fail'. Throws EnqueueError when the host refuses it.
 */
export function addStep(name, job, payload, { after = [], workflow, queue, priority, delayMs, ifFailed } = {}) {
  const deps = after.map((dep) => (typeof dep === 'string' ? { step: dep } : dep));
  const target = workflow == null ? { tag: 'current' } : { tag: 'opened', val: workflow };
  const options = { queue, priority, delayMs: u64(delayMs) };
  try {
    hostAddStep(target, { name, job, payload: json(payload ?? {}), options, after: deps, ifFailed });
  } catch (error) {
    if (error && Object.prototype.hasOwnProperty.call(error, 'payload')) {
      throw new EnqueueError(job, error.payload);
    }
    throw error;
  }
}

/**
 * Sends an event with `key` and `payload` when this job completes
 * (docs/events.md): it ends the workflow waits for it and enqueues the types
 * subscribed to it (`onEvents`). Throws EnqueueError when the host refuses it.
 */
export function sendEvent(key, payload) {
  refusable(key, () => hostSend(key, json(payload ?? {})), `event ${key}`);
}

/** Calls a host import, turning its refusal into an EnqueueError about `job` (`what` it was). */
function refusable(job, call, what) {
  try {
    call();
  } catch (error) {
    if (error && Object.prototype.hasOwnProperty.call(error, 'payload')) {
      throw new EnqueueError(job, error.payload, what);
    }
    throw error;
  }
}

/**
 * Creates or replaces the schedule of `job` for `key` (a customer, an
 * account) when this job completes (docs/schedules.md, "Schedules made at
 * run time"): `cron` read in `timeZone` (default UTC), each tick enqueuing a
 * job with `payload` plus `_tick` and `_schedule`; `overlap` is `'allow'`,
 * `'skip'` or `'buffer-one'`. Throws EnqueueError naming a refused field.
 */
export function setSchedule(job, key, cron, { timeZone, payload, overlap, jitterMs, backfill, startsAtMs, endsAtMs } = {}) {
  const spec = {
    cron,
    timeZone,
    payload: payload == null ? undefined : json(payload),
    overlap,
    jitterMs: u64(jitterMs),
    backfill,
    startsAtMs: u64(startsAtMs),
    endsAtMs: u64(endsAtMs),
  };
  refusable(job, () => scheduleSet(job, key, spec), `schedule ${job} ${JSON.stringify(key)}`);
}

/** Pauses the schedule of `job` for `key` when this job completes, with a `note` for the next operator. */
export function pauseSchedule(job, key, note) {
  refusable(job, () => schedulePause(job, key, note), `schedule ${job} ${JSON.stringify(key)}`);
}

/** Resumes the schedule of `job` for `key` when this job completes. */
export function resumeSchedule(job, key) {
  refusable(job, () => scheduleResume(job, key), `schedule ${job} ${JSON.stringify(key)}`);
}

/** Removes the schedule of `job` for `key` when this job completes. */
export function removeSchedule(job, key) {
  refusable(job, () => scheduleRemove(job, key), `schedule ${job} ${JSON.stringify(key)}`);
}

/**
 * Resolves after `ms` milliseconds. JavaScript cannot block, so `run` awaits
 * it (`export async function run`): the engine's event loop then waits on a
 * WASI monotonic-clock pollable, idle, instead of spinning.
 */
export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * JSON text of `value`. JSON.stringify throws on a BigInt (such as
 * `ctx.jobId`), so each is a number, or its digits as a string past 2^53
 * where a number would round.
 */
function json(value) {
  return JSON.stringify(value, (_key, v) => (typeof v !== 'bigint' ? v : Number.isSafeInteger(Number(v)) ? Number(v) : String(v)));
}

/** A u64 for the bindings from a number (or BigInt); undefined stays none. */
function u64(value) {
  return value == null ? undefined : BigInt(typeof value === 'bigint' ? value : Math.trunc(value));
}
