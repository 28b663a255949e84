#!/usr/bin/env bash
# A serial-shape result write, and its promotion alone, under pgbench:
# steadier than any host run. Two keys of the `serial` type each have a
# running holder and a blocked job; every transaction writes the two
# holders' results (jobhost.finish_runs_unless_locked, as a host sends
# it, archiving both, promoting and leasing the two blocked jobs), or only
# gives their slots back (jobhost.release_slots_leasing), and rolls back,
# so each call does the same work. Prints each one's latency and that of
# an empty transaction (BEGIN; SELECT 1; ROLLBACK): the differences are
# the functions' costs.
#
#   benches/write_pgbench.sh [RELEASE_FUNCTION] [CALLS]
#
# Run benches/serial_functions.sh first: it leaves the database
# jobhost_bench_serial migrated, with `serial` registered and no jobs.
# RELEASE_FUNCTION (default jobhost.release_slots_leasing) may name a
# variant created in that database with the same arguments, for an A/B.
# Each measurement is CALLS transactions (default 1000) after a VACUUM:
# rolled-back rows are dead tuples, and thousands of them slow the next.
set -euo pipefail
release=${1:-jobhost.release_slots_leasing}
calls=${2:-1000}
url=${JOBHOST_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}/jobhost_bench_serial
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)
sql() { psql -qAtX -v ON_ERROR_STOP=1 "$url" -c "$1"; }

if [ "$(sql "SELECT count(*) FROM jobhost.jobs WHERE state = 'running' AND host_id = 'pgbench'")" != 2 ]; then
    [ "$(sql "SELECT count(*) FROM jobhost.jobs")" = 0 ] || { echo "jobhost_bench_serial has jobs; run serial_functions.sh again" >&2; exit 1; }
    sql "SELECT jobhost.enqueue('serial', jsonb_build_object('key', 'k' || (g % 2), 'ms', 5)) FROM generate_series(0, 3) g" >/dev/null
    sql "SELECT count(*) FROM jobhost.fetch('{default}', '{serial}', '{60}', 2, 'pgbench')" >/dev/null
fi
runs=$(sql "SELECT string_agg(id::text, ',' ORDER BY id) || '|' || string_agg(lease_token::text, ',' ORDER BY id)
            FROM jobhost.jobs WHERE state = 'running' AND host_id = 'pgbench'")
ids=${runs%|*}
tokens=${runs#*|}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'BEGIN;\nSELECT 1;\nROLLBACK;\n' >"$work/empty.sql"
cat >"$work/write.sql" <<SQL
BEGIN;
SELECT * FROM jobhost.finish_runs_unless_locked(
    ARRAY[$ids]::bigint[], ARRAY[$tokens]::bigint[],
    ARRAY[$ids]::bigint[], ARRAY[$tokens]::bigint[], '{completed,completed}'::text[],
    ARRAY['{"ended_us": 1}', '{"ended_us": 2}']::jsonb[], ARRAY[NULL, NULL]::jsonb[],
    ARRAY['[]', '[]']::jsonb[], ARRAY[NULL, NULL]::jsonb[],
    '{}'::bigint[], '{}'::bigint[], '{}'::bigint[], '{}'::int[], '{}'::jsonb[], '{}'::jsonb[],
    jobhost.unpaused('{default}'::text[]), '{serial}'::text[], '{60}'::int[], 2, 'h');
ROLLBACK;
SQL
cat >"$work/release.sql" <<SQL
BEGIN;
SELECT * FROM $release(ARRAY['serial', 'serial'], ARRAY['k0', 'k1'],
                       '{default}'::text[], '{serial}'::text[], '{60}'::int[], 2, 'h');
ROLLBACK;
SQL
latency() {
    sql "VACUUM jobhost.jobs, jobhost.blocked_jobs, jobhost.semaphores, jobhost.archive"
    "$pgbench" -n -M prepared -t "$calls" -c 1 -f "$1" "$url" 2>&1 | sed -n 's/^latency average = //p'
}
echo "empty transaction: $(latency "$work/empty.sql")"
echo "result write of two holders (archive, promote, lease): $(latency "$work/write.sql")"
echo "$release, two keys promoted and leased: $(latency "$work/release.sql")"
sql "VACUUM jobhost.jobs, jobhost.blocked_jobs, jobhost.semaphores, jobhost.archive"
