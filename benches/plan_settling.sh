#!/usr/bin/env bash
# Whether a host that started on an empty database keeps pace when a backlog
# arrives: PostgreSQL keeps a statement's generic plan, once settled (after
# five runs), until its tables are next analyzed, so plans settled on
# near-empty tables could outlast them. Two cases, each on a new database,
# one host at concurrency 10 serving `serial` (limit 1 over 10 keys, 5 ms
# jobs):
#   trickle  the host starts on the empty database, 50 jobs go in five at a
#            time and run, then 20,000 are enqueued in bulk;
#   backlog  the 20,000 are enqueued first (a host registers the type and
#            stops), then the measured host starts.
# Prints the jobs archived per 5 s window until the 20,000 are done.
#
#   benches/plan_settling.sh trickle|backlog [JOBHOST_BINARY]
#
# Needs guests/dist/serial.wasm (guests/build.sh) and a PostgreSQL at
# JOBHOST_BENCH_DATABASE_URL (postgres://postgres@127.0.0.1:5432). Drops and
# recreates the database jobhost_bench_settling.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?trickle or backlog}
bin=$(realpath "${2:-target/release/jobhost}")
server=${JOBHOST_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}
db=jobhost_bench_settling
export DATABASE_URL=$server/$db
sql() { psql -Atq "$DATABASE_URL" -c "$1"; }
psql -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" 2>/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cp guests/dist/serial.wasm "$work/"
"$bin" migrate >/dev/null 2>&1
python3 -c "
import json
for i in range(20000): print(json.dumps({'key': 'k%d' % (i % 10), 'ms': 5, 'i': i}))" >"$work/backlog.jsonl"
host() { "$bin" run --no-migrate --concurrency 10 --components "$work" --cache-dir "$work/cache" >/dev/null 2>&1 & }
serving() { until [ "$(sql "SELECT count(*) FROM jobhost.hosts")" = 1 ]; do sleep 0.05; done; }
archived() { sql "SELECT count(*) FROM jobhost.archive"; }

if [ "$mode" = backlog ]; then
  host; serving; kill $!; wait $! 2>/dev/null || true
  sql "DELETE FROM jobhost.hosts" >/dev/null
  "$bin" enqueue serial --file "$work/backlog.jsonl" >/dev/null
  host; serving
  base=0
else
  host; serving
  for batch in $(seq 0 9); do
    python3 -c "
import json
for i in range(5): print(json.dumps({'key': 'k%d' % i, 'ms': 5, 'i': 100000 + $batch * 5 + i}))" |
      "$bin" enqueue serial --file - >/dev/null
    sleep 0.3
  done
  until [ "$(archived)" = 50 ]; do sleep 0.1; done
  base=50
  "$bin" enqueue serial --file "$work/backlog.jsonl" >/dev/null
fi
start=$(date +%s.%N)
previous=$base; since=$start
while :; do
  sleep 5
  n=$(archived); now=$(date +%s.%N)
  echo "$mode: $(echo "($n - $previous) / ($now - $since)" | bc) jobs/s in this window (archived $((n - base)))"
  previous=$n; since=$now
  [ $((n - base)) -ge 20000 ] && break
done
