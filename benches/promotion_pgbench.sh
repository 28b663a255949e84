#!/usr/bin/env bash
# The promotion alone, steadier than any host run: pgbench calls
# jobhost.release_slots_leasing for two keys of the `serial` type, each
# with a holder and a blocked job, in a transaction it rolls back, so every
# call promotes and leases the same two jobs. Prints the latency of that
# transaction and of an empty one (BEGIN; SELECT 1; ROLLBACK), whose
# difference is the function's cost.
#
#   benches/promotion_pgbench.sh [FUNCTION] [SECONDS]
#
# Run benches/serial_functions.sh first: it leaves the database
# jobhost_bench_serial migrated, with `serial` registered and no jobs.
# FUNCTION (default jobhost.release_slots_leasing) may name a variant
# created in that database with the same arguments, for an A/B.
set -euo pipefail
function=${1:-jobhost.release_slots_leasing}
seconds=${2:-5}
url=${JOBHOST_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}/jobhost_bench_serial
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)
sql() { psql -qAtX -v ON_ERROR_STOP=1 "$url" -c "$1"; }

if [ "$(sql "SELECT count(*) FROM jobhost.blocked_jobs WHERE concurrency_key IN ('k0', 'k1')")" != 2 ]; then
    [ "$(sql "SELECT count(*) FROM jobhost.jobs")" = 0 ] || { echo "jobhost_bench_serial has jobs; run serial_functions.sh again" >&2; exit 1; }
    sql "SELECT jobhost.enqueue('serial', jsonb_build_object('key', 'k' || (g % 2), 'ms', 5)) FROM generate_series(0, 3) g" >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'BEGIN;\nSELECT 1;\nROLLBACK;\n' >"$work/empty.sql"
printf "BEGIN;\nSELECT * FROM %s(ARRAY['serial', 'serial'], ARRAY['k0', 'k1'], '{default}'::text[], '{serial}'::text[], '{60}'::int[], 2, 'h');\nROLLBACK;\n" \
    "$function" >"$work/promote.sql"
latency() { "$pgbench" -n -M prepared -T "$seconds" -c 1 -f "$1" "$url" 2>&1 | sed -n 's/^latency average = //p'; }
echo "empty transaction: $(latency "$work/empty.sql")"
echo "$function, two keys promoted and leased: $(latency "$work/promote.sql")"
# Rolled-back rows are dead tuples: cleared for the next run.
sql "VACUUM jobhost.jobs, jobhost.blocked_jobs, jobhost.semaphores"
