#!/usr/bin/env bash
# Where a chained workflow step's database time goes, beside a plain job's:
# 2,000 plain `hello` jobs, then 200 chains of 10 `hello` steps, each run by
# one host at concurrency 10 on PostgreSQL, with the server's own time by
# function (track_functions = all, for this database only) divided by the
# jobs each shape ran. The figure to read before changing the step's path
# (issue 69): it is the server's time, steady on a shared machine, where
# jobs/s is not.
#
#   benches/workflow_functions.sh [JOBHOST_BINARY] [CHAINS] [LENGTH]
#
# Needs guests/dist/hello.wasm (guests/build.sh) and a PostgreSQL at
# JOBHOST_BENCH_DATABASE_URL (postgres://postgres@127.0.0.1:5432). Drops and
# recreates the database jobhost_bench_steps. A debug build serves as well
# as a release one for the server's figures. With EXPLAIN_MS=N, every
# statement (nested ones too) slower than N ms is logged with its plan and
# timings (auto_explain) in the server's log.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/jobhost}")
chains=${2:-200}
length=${3:-10}
jobs=$((chains * length))
server=${JOBHOST_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}
db=jobhost_bench_steps
url="$server/$db"
sql() { psql -qAtX -v ON_ERROR_STOP=1 "$url" -c "$1"; }

psql -qAtX "$server/postgres" -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql -qAtX "$server/postgres" -c "ALTER DATABASE $db SET track_functions = 'all'"
if [ -n "${EXPLAIN_MS:-}" ]; then
    for setting in "session_preload_libraries = 'auto_explain'" "auto_explain.log_min_duration = '${EXPLAIN_MS}ms'" \
        "auto_explain.log_nested_statements = on" "auto_explain.log_analyze = on"; do
        psql -qAtX "$server/postgres" -c "ALTER DATABASE $db SET $setting"
    done
fi
DATABASE_URL=$url "$bin" migrate >/dev/null

work=$(mktemp -d)
trap 'kill "$host" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/components"
cp guests/dist/hello.wasm "$work/components/"
DATABASE_URL=$url RUST_LOG=warn "$bin" run --no-migrate --concurrency 10 \
    --components "$work/components" --cache-dir "$work/cache" >/dev/null &
host=$!
until [ "$(sql "SELECT count(*) FROM jobhost.hosts WHERE 'hello' = ANY(job_types)")" = 1 ]; do sleep 0.1; done

# The server's time by function, per job of the shape just run.
report() {
    sleep 11 # an idle session reports its function counts within 10 s (PostgreSQL 15)
    echo "$1: $(sql "SELECT round($jobs / extract(epoch FROM max(finished_at) - min(started_at)))
                     FROM jobhost.archive") jobs/s"
    echo "  function | calls per job | total µs per job | own µs per job"
    sql "SELECT '  ' || funcname || ' | ' || round(calls::numeric / $jobs, 2)
                || ' | ' || round((total_time * 1000 / $jobs)::numeric, 1)
                || ' | ' || round((self_time * 1000 / $jobs)::numeric, 1)
         FROM pg_stat_user_functions WHERE schemaname = 'jobhost' AND self_time * 1000 / $jobs >= 0.5
         ORDER BY self_time DESC"
    echo "  own µs per job, all functions: $(sql "SELECT round((sum(self_time) * 1000 / $jobs)::numeric, 1)
                                               FROM pg_stat_user_functions WHERE schemaname = 'jobhost'")"
}

for ((i = 0; i < jobs; i++)); do printf '{"name":"s%d"}\n' "$i"; done >"$work/payloads"
sql "SELECT pg_stat_reset()"
DATABASE_URL=$url "$bin" enqueue hello --file "$work/payloads" >/dev/null
until [ "$(sql "SELECT count(*) FROM jobhost.archive")" = "$jobs" ]; do sleep 0.2; done
report "plain"

sql "DELETE FROM jobhost.archive"
python3 - "$chains" "$length" >"$work/workflow.json" <<'PY'
import json, sys
chains, length = int(sys.argv[1]), int(sys.argv[2])
steps = []
for c in range(chains):
    for s in range(length):
        step = {"name": f"c{c}-{s}", "job": "hello", "payload": {"name": f"c{c}-{s}"}}
        if s:
            step["after"] = [f"c{c}-{s - 1}"]
        steps.append(step)
print(json.dumps({"label": "chains", "steps": steps}))
PY
sql "SELECT pg_stat_reset()"
DATABASE_URL=$url "$bin" workflow create --file "$work/workflow.json" >/dev/null
until [ "$(sql "SELECT count(*) FROM jobhost.archive")" = "$jobs" ]; do sleep 0.2; done
report "chained steps"
