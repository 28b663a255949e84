/**
 * One run at a time per payload `key`, from JavaScript: sleeps the
 * payload's `ms` and reports when it ran, so tests can check from outside
 * that runs of one key never overlapped.
 */

import { config, limit, output, parsePayload, sleep } from '../sdk/jobhost_guest.js';

export function describe() {
  return config('js_limited', { concurrency: limit(1, { key: '{key}', durationSecs: 10 }) });
}

// Async so that it can wait without spinning: see sleep() in the SDK.
export async function run(ctx, payload) {
  const data = parsePayload(payload);
  const started = Date.now();
  await sleep(Number(data.ms ?? 0));
  const ended = Date.now();
  return output({ started_ms: started, ended_ms: ended });
}
