#!/usr/bin/env bash
# The serial shape (limit 1 per key, 10 keys, 5 ms jobs, one host at
# concurrency 10) on PostgreSQL, with the server's own time per result write
# by function (track_functions = pl, set for this database only): the figure
# that moves when the write's SQL changes, far steadier than jobs/s on a
# shared machine.
#
#   benches/serial_functions.sh [JOBHOST_BINARY] [JOBS]
#
# Needs guests/dist/hello.wasm (guests/build.sh) and a PostgreSQL at
# JOBHOST_BENCH_DATABASE_URL (postgres://postgres@127.0.0.1:5432). Drops and
# recreates the database jobhost_bench_serial. The binary migrates it, so
# two builds are compared each on its own schema.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/jobhost}")
jobs=${2:-1000}
server=${JOBHOST_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}
db=jobhost_bench_serial
url="$server/$db"
sql() { psql -qAtX -v ON_ERROR_STOP=1 "$url" -c "$1"; }

psql -qAtX "$server/postgres" -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql -qAtX "$server/postgres" -c "ALTER DATABASE $db SET track_functions = 'all'"
DATABASE_URL=$url "$bin" migrate >/dev/null

work=$(mktemp -d)
trap 'kill "$host" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/components"
cp guests/dist/hello.wasm "$work/components/"
DATABASE_URL=$url RUST_LOG=warn "$bin" run --no-migrate --concurrency 10 \
    --components "$work/components" --cache-dir "$work/cache" >/dev/null &
host=$!
until [ "$(sql "SELECT count(*) FROM jobhost.hosts WHERE 'hello' = ANY(job_types)")" = 1 ]; do sleep 0.1; done

for ((i = 0; i < jobs; i++)); do printf '{"name":"n%d"}\n' $i; done >"$work/payloads"
sql "SELECT pg_stat_reset()"
DATABASE_URL=$url "$bin" enqueue hello --file "$work/payloads" >/dev/null
until [ "$(sql "SELECT count(*) FROM jobhost.archive")" = "$jobs" ]; do sleep 0.2; done
sleep 0.6 # the host's session reports its function counts when idle, at most once a second

echo "binary: $bin"
sql "SELECT 'jobs/s: ' || round($jobs / extract(epoch FROM max(finished_at) - min(started_at)))
     FROM jobhost.archive"
sql "SELECT 'hand-off p50 ms: ' || round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 2)
     FROM (SELECT ((output->>'started_us')::bigint
                   - lag((output->>'ended_us')::bigint) OVER (PARTITION BY concurrency_key ORDER BY started_at))
                  / 1000.0 AS ms
           FROM jobhost.archive) h WHERE ms IS NOT NULL"
writes=$(sql "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'finish_runs'")
echo "result writes: $writes ($(awk "BEGIN { printf \"%.2f\", $jobs / $writes }") results each)"
echo "function | calls | total ms per write | own ms per write"
sql "SELECT funcname || ' | ' || calls || ' | ' || round((total_time / $writes)::numeric, 3)
            || ' | ' || round((self_time / $writes)::numeric, 3)
     FROM pg_stat_user_functions
     WHERE calls > 0
     ORDER BY total_time DESC"
