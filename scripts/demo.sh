#!/usr/bin/env bash
# Installs what is needed (the wasm32-wasip2 target), builds the example
# handlers and the host, then runs a host on the embedded backend (a SQLite
# file; no server) on sample components and jobs and shows what happened:
# results, a retry, child jobs, a trap, a delayed job, the sandbox refusing a
# nosy guest, concurrency limits blocking jobs and refusing one, a
# rate-limited tenant whose API says "slow down" (its key throttled), a
# duplicate of a unique job answered with the waiting job's id, a batch
# with its callback and progress, a diamond workflow whose first step
# grows it by three steps and whose last step receives the outputs of all
# before it, an approval that waits for its event, a job's progress while it runs, a wait
# for a job's result, a schedule enqueueing a job every second once it
# is dropped in, schedules made at run time for three customers, a
# component deployed through the database, and a handler
# calling a small local HTTP API with a secret it never sees (and a request
# refused, with the command that would allow it); all of it on the web dashboard, whose address it prints
# (run from a terminal, it keeps the dashboard up at the end until Ctrl-C).
# DATABASE_URL=postgres://... runs the same demo on PostgreSQL instead.
set -euo pipefail
cd "$(dirname "$0")/.."

bash guests/build.sh
cargo build --quiet --release --locked
jobhost=$PWD/target/release/jobhost
export JOBHOST_CACHE_DIR="${JOBHOST_CACHE_DIR:-$PWD/target/jobhost-cache}"
components=$(mktemp -d)
# A fresh embedded database file for each run of the demo.
export DATABASE_URL="${DATABASE_URL:-sqlite://$components/jobhost.db}"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

cp guests/dist/{hello,flaky,fanout,trap,sleep,snoop,serial,limited_raise,digest,batcher,fetcher,grower,paced}.wasm "$components"
# The hosts' key for secrets: every host of a fleet holds the same one.
export JOBHOST_SECRET_KEY="${JOBHOST_SECRET_KEY:-$("$jobhost" secret new-key)}"
step "$jobhost" migrate
"$jobhost" run --components "$components,db" --heartbeat 1s --lease 5s > "$components/host.log" 2>&1 &
host=$!
trap 'kill $host 2>/dev/null || true' EXIT
until "$jobhost" stats | grep -q 'hosts alive: 1'; do sleep 0.2; done
# The dashboard, API and metrics over the same database (a free port;
# JOBHOST_DEMO_LISTEN picks one), with a token so its buttons work.
export JOBHOST_TOKEN="${JOBHOST_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
"$jobhost" serve --listen "${JOBHOST_DEMO_LISTEN:-127.0.0.1:0}" > "$components/serve.log" 2>&1 &
serve=$!
trap 'kill $host $serve 2>/dev/null || true' EXIT
until grep -q 'dashboard and API on' "$components/serve.log"; do sleep 0.1; done
dashboard=$(grep -o 'http://[^ ]*' "$components/serve.log")
printf '\n\033[1mdashboard: %s  (sign in with the token %s)\033[0m\n' "$dashboard" "$JOBHOST_TOKEN"

step "$jobhost" enqueue hello --payload '{"name": "Ada"}'
step "$jobhost" enqueue flaky --payload '{"fail_times": 2}'
step "$jobhost" enqueue fanout --payload '{"count": 3}'
step "$jobhost" enqueue trap --payload '{"message": "the disk is lava"}'
step "$jobhost" enqueue sleep --payload '{"ms": 100}' --delay 2s
step "$jobhost" enqueue snoop --payload '{}'
step "$jobhost" enqueue nosuchjob --payload '{}' || true

# One run at a time per key: the first runs, the other two are blocked.
for _ in 1 2 3; do "$jobhost" enqueue serial --payload '{"key": "acct-7", "ms": 500}' > /dev/null; done
step "$jobhost" concurrency
# Two slots per key, and a third enqueue is refused (exit code 3).
for _ in 1 2; do "$jobhost" enqueue limited_raise --payload '{"key": "acct-7", "ms": 500}' > /dev/null; done
step "$jobhost" enqueue limited_raise --payload '{"key": "acct-7", "ms": 500}' || echo "(exit code $?)"

# At most 5 `paced` runs of one tenant start a second (a rate limit): 12
# enqueued at once are planned over three seconds. The first is told
# "slow down" by its API for 3 s: it returns `throttled`, and no run of the
# tenant starts until then, with no attempt spent (docs/rate-limits.md).
busy_until=$(( $(date +%s%3N) + 3000 ))
"$jobhost" enqueue paced --payload "{\"tenant\": \"acme\", \"busy_until_ms\": $busy_until}" > /dev/null
for _ in $(seq 11); do "$jobhost" enqueue paced --payload '{"tenant": "acme", "ms": 50}' > /dev/null; done
until "$jobhost" concurrency | grep -q 'throttled'; do sleep 0.2; done
step "$jobhost" concurrency

# One digest per account at a time: the second enqueue, while the first
# waits, is a duplicate of it (exit code 0, nothing stored).
step "$jobhost" enqueue digest --payload '{"account": "acct-7", "ms": 200}' --delay 1s
step "$jobhost" enqueue digest --payload '{"account": "acct-7", "ms": 200}'

# A batch of four jobs, counted as they end; its callback is enqueued once,
# when the last has ended. One member fails after its last attempt, so the
# batch fails (an on-success callback would not fire).
printf '%s\n' '{"job": "hello", "payload": {"name": "member 1"}}' '{"job": "hello", "payload": {"name": "member 2"}}' \
  '{"job": "sleep", "payload": {"ms": 1500}}' '{"job": "flaky", "payload": {"fail_times": 99}}' > "$components/batch.jsonl"
step "$jobhost" batch create --file "$components/batch.jsonl" --label "demo batch" \
  --on-finish hello --callback-payload '{"name": "the batch callback"}'
step "$jobhost" batch list

# A diamond workflow: "resize" runs first, "thumb" and "caption" after it,
# "page" after both, receiving their outputs under _deps (docs/workflows.md).
# "resize" (the `grower` handler) adds three steps to the workflow as it
# runs, resize/part-0 to part-2: "thumb" and "caption" wait for them too.
cat > "$components/workflow.json" <<'JSON'
{"label": "demo diamond", "steps": [
  {"name": "resize", "job": "grower", "payload": {"grow": {"count": 3}}},
  {"name": "thumb", "job": "hello", "payload": {"name": "thumb"}, "after": ["resize"]},
  {"name": "caption", "job": "hello", "payload": {"name": "caption"}, "after": ["resize"]},
  {"name": "page", "job": "hello", "payload": {"name": "page"}, "after": ["thumb", "caption"]}
]}
JSON
step "$jobhost" workflow create --file "$components/workflow.json"
until "$jobhost" workflow list | grep -q succeeded; do sleep 0.2; done
step "$jobhost" workflow show 1
page_job=$("$jobhost" workflow show 1 --json | python3 -c 'import json,sys; print([s["job_id"] for s in json.load(sys.stdin)["steps"] if s["name"] == "page"][0])' 2>/dev/null || true)
[ -n "$page_job" ] && step "$jobhost" job "$page_job"

# An approval (docs/events.md): "approve" waits up to three days for the
# event order.approved of its order, "ship" for "approve". Nothing runs and
# no host holds anything while it waits; the event (from the command line
# here; from SQL in the application's own transaction, HTTP, a signed
# webhook or the dashboard's Approve button elsewhere) releases it once.
cp docs/examples/approval-workflow.json "$components/approval.json"
approval=$("$jobhost" workflow create --file "$components/approval.json" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["workflow"])')
step "$jobhost" workflow show "$approval"
step "$jobhost" event send order.approved --payload '{"order_id": 42, "by": "the demo"}'
until "$jobhost" workflow show "$approval" --json | grep -q '"state": "succeeded"'; do sleep 0.2; done
step "$jobhost" workflow show "$approval"

# A job's progress shows while it runs (sent with the host's heartbeat).
progressing=$("$jobhost" enqueue batcher --payload '{"steps": 4, "step_ms": 800}')
until "$jobhost" job "$progressing" --json | grep -q '"done"'; do sleep 0.2; done
step "$jobhost" job "$progressing"

# Enqueue and wait for the result: the output, and the exit code says how it ended.
step "$jobhost" enqueue hello --payload '{"name": "Grace"}' --wait --timeout 30s

waiting() { "$jobhost" jobs --state "$1" --limit 1 | grep -c . || true; }
until [ "$(waiting scheduled)$(waiting available)$(waiting running)$(waiting blocked)" = 0000 ]; do sleep 0.2; done

step "$jobhost" jobs
step "$jobhost" job 2
step "$jobhost" stats
step "$jobhost" batch show 1

# A schedule: dropped into the directory, the ticker is enqueued once per
# second (once per tick however many hosts run), its tick in its payload.
cp guests/dist/ticker.wasm "$components"
until [ "$("$jobhost" jobs --job ticker --state completed | grep -c .)" -ge 3 ]; do sleep 0.2; done
step "$jobhost" schedules
step "$jobhost" jobs --job ticker --limit 3
step "$jobhost" job "$("$jobhost" jobs --job ticker --state completed --limit 1 --json | sed -E 's/^\{"id":([0-9]+).*/\1/')"
# Schedules made at run time, one per customer (docs/schedules.md): acme
# every two seconds, skipped while its last job still runs; globex every
# second by Berlin's clock; initech paused with a note. Each job carries
# its tick and its key.
step "$jobhost" schedule add hello acme --cron "*/2 * * * * *" --payload '{"name": "acme"}' --overlap skip
step "$jobhost" schedule add hello globex --cron "* * * * * *" --zone Europe/Berlin --payload '{"name": "globex"}'
step "$jobhost" schedule add hello initech --cron "0 9 * * MON" --paused --note "trial ended"
until "$jobhost" schedule show hello acme --json | grep -q '"last_job": [0-9]'; do sleep 0.2; done
step "$jobhost" schedule list
step "$jobhost" job "$("$jobhost" schedule show hello acme --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_job"])')"
step "$jobhost" schedule remove hello globex
# Deployed through the database instead of copied into the directory: the
# host (serving `--components DIR,db`) loads it within a second or two.
step "$jobhost" deploy guests/dist/limited.wasm
until "$jobhost" components --json | grep -q '"job_type":"limited".*"hosts":{"[0-9a-f]'; do sleep 0.2; done
step "$jobhost" components
step "$jobhost" enqueue limited --payload '{"key": "acct-7", "ms": 100}' --wait --timeout 30s
# The same numbers over HTTP, as JSON and as Prometheus metrics, and an
# enqueue through the API (reads and changes need the token).
if command -v curl >/dev/null; then
  step curl -s "$dashboard/api/stats" -H "Authorization: Bearer $JOBHOST_TOKEN"
  echo; step curl -s -X POST "$dashboard/api/jobs" -H "Authorization: Bearer $JOBHOST_TOKEN" \
    -H 'content-type: application/json' -d '{"job": "hello", "payload": {"name": "HTTP"}}'
  echo; curl -s "$dashboard/metrics" | grep '^jobhost_jobs{' | head -n 5
fi
# Outbound HTTP: a small API on loopback (a private address, so the grant
# names it), a secret the handler sends in a header without ever seeing it
# (its environment holds a placeholder the host swaps on the way out), a
# plain variable, and a request to an origin declared but not granted.
if command -v python3 >/dev/null; then
  cat > "$components/api.py" <<'PY'
import http.server, json
class Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        seen = {"path": self.path, "authorization": self.headers.get("authorization"),
                "x-region": self.headers.get("x-region")}
        print(f"demo API received: {seen}", flush=True)
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Api)
print(server.server_address[1], flush=True)
server.serve_forever()
PY
  python3 "$components/api.py" > "$components/api.log" 2>&1 &
  api=$!
  trap 'kill $host $serve $api 2>/dev/null || true' EXIT
  until [ -s "$components/api.log" ]; do sleep 0.1; done
  api_origin="http://127.0.0.1:$(head -n 1 "$components/api.log")"
  export DEMO_API_KEY="demo-key-$RANDOM$RANDOM"
  step "$jobhost" secret set API_KEY --from-env DEMO_API_KEY
  step "$jobhost" grant fetcher "$api_origin" --methods GET --secret API_KEY
  step "$jobhost" var set fetcher REGION eu-west
  step "$jobhost" enqueue fetcher --wait --timeout 30s --payload \
    "{\"url\": \"$api_origin/orders\", \"headers\": {\"authorization\": \"Bearer \${API_KEY}\", \"x-region\": \"\${REGION}\"}}"
  echo "(the API received the real key; the job's output and log hold [secret API_KEY] and the placeholder:)"
  tail -n 1 "$components/api.log"
  refused=$("$jobhost" enqueue fetcher --payload '{"url": "https://api.example.com/v1/things"}')
  until "$jobhost" job "$refused" --json | grep -q '"state": "completed"'; do sleep 0.2; done
  step "$jobhost" job "$refused"
fi
kill -TERM "$host" && wait "$host"
echo; echo "host log:"; cat "$components/host.log"

step "$jobhost" inspect --pretty guests/dist/limited.wasm
step "$jobhost" exec guests/dist/hog.wasm || true
step "$jobhost" inspect guests/dist/misconfigured.wasm || true

if [ -t 0 ] && [ -t 1 ]; then
  printf '\n\033[1mThe dashboard stays up at %s (token %s): press Ctrl-C to stop.\033[0m\n' "$dashboard" "$JOBHOST_TOKEN"
  wait "$serve" || true
fi
