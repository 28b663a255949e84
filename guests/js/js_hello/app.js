/**
 * Greets the payload's `name` from JavaScript: logs, reports progress,
 * enqueues the Rust `hello` for each of `children` names, adds a Rust
 * `hello` step for each of `grow` names to the workflow it is a step of,
 * makes the Rust `hello`'s schedule for `schedule` (`{key, cron, zone,
 * overlap, jitter_ms}`) and reports the error a `bad_cron` schedule gets,
 * and fails its first `fail_times` attempts with a retryable error.
 */

import {
  addStep, config, currentStep, enqueue, log, output, parsePayload, progress, retry, setSchedule,
} from '../sdk/jobhost_guest.js';

export function describe() {
  return config('js_hello', { maxAttempts: 5, backoffMs: [10, 100] });
}

export function run(ctx, payload) {
  const data = parsePayload(payload);
  if (ctx.attempt <= Number(data.fail_times ?? 0)) {
    throw retry(`attempt ${ctx.attempt} failed on purpose`);
  }
  const name = String(data.name ?? 'world');
  log.info('greeting ' + name);
  const children = data.children ?? [];
  children.forEach((child, done) => {
    enqueue('hello', { name: child });
    progress(done + 1, children.length);
  });
  for (const grown of data.grow ?? []) {
    addStep(grown, 'hello', { name: grown });
  }
  const result = { greeting: 'hello from JavaScript, ' + name, attempt: ctx.attempt };
  if (data.schedule) {
    const { key, cron, zone, overlap, jitter_ms: jitterMs } = data.schedule;
    setSchedule('hello', key, cron, { timeZone: zone, payload: { name: key }, overlap, jitterMs });
  }
  if (data.bad_cron !== undefined) {
    try {
      setSchedule('hello', 'bad', data.bad_cron);
    } catch (error) {
      result.refused = error.reason;
    }
  }
  const step = currentStep();
  if (step !== undefined) {
    result.step = step.name;
  }
  return output(result);
}
