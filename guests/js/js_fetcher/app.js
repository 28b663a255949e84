/**
 * The fetcher handler in JavaScript (as `guests/fetcher` in Rust): sends the
 * payload's request with `fetch` (`url`, `method`, `headers`, `body`;
 * `${NAME}` in a header value is the environment variable NAME, where a
 * secret's placeholder is) and returns `{status, body}`, or `{error}` when
 * the request is refused or fails. Declares the same origins.
 */

import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { allow, config, log, output, parsePayload } from '../sdk/jobhost_guest.js';

export function describe() {
  return config('js_fetcher', {
    maxAttempts: 1,
    outbound: [
      allow('http://127.0.0.1:*', { methods: ['GET', 'POST'], secrets: ['API_KEY'] }),
      allow('http://localhost:*'),
      allow('https://api.example.com', { methods: ['GET'] }),
    ],
  });
}

export async function run(ctx, payload) {
  const data = parsePayload(payload);
  // Read at each run: the placeholders are new for every run.
  const env = Object.fromEntries(getEnvironment());
  const headers = {};
  for (const [name, value] of Object.entries(data.headers ?? {})) {
    headers[name] = value.replace(/\$\{([A-Z0-9_]+)\}/g, (_, variable) => env[variable] ?? '');
    log.info(`sending ${name}: ${headers[name]}`);
  }
  try {
    const response = await fetch(data.url, { method: data.method ?? 'GET', headers, body: data.body });
    return output({ status: response.status, body: await response.text() });
  } catch (error) {
    return output({ error: String(error) });
  }
}
