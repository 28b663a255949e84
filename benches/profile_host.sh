#!/usr/bin/env bash
# Where a host's CPU goes under a benchmark's workload: runs the benchmark,
# attaches `perf record` (software clock, DWARF call stacks) to the HOST-th
# `jobhost run` it starts (default the first), for that host's whole life,
# and writes a flame graph (inferno) of it.
#
#   [HOST=N] benches/profile_host.sh BENCH OUT.svg [BENCH ARGS...]
#   e.g. OUTBOUND_RUNS=1 benches/profile_host.sh outbound benches/profiles/io.svg
#        HOST=2 benches/profile_host.sh queue benches/profiles/noop.svg
#        (the queue benchmark's first host only registers the job types;
#        its second is the one host of workload A on PostgreSQL)
#
# Needs perf (Debian's linux-perf) and inferno (`cargo install inferno`).
# The host is the release build the benchmark itself starts (or
# JOBHOST_BENCH_BIN); its symbols suffice for a graph by function. The
# benchmark's own figures, printed as usual, are slowed by the sampling:
# read them from a run without it. FOLDED=PATH keeps the folded stacks too
# (one line a stack, with its samples), to sum by function.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=$1
out=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo bench --bench "$bench" --no-run 2>/dev/null
cargo bench --bench "$bench" -- "$@" &
bench_pid=$!
binary=$(basename "${JOBHOST_BENCH_BIN:-jobhost}")
seen=()
while [ "${#seen[@]}" -lt "${HOST:-1}" ]; do
    kill -0 "$bench_pid" 2>/dev/null || { echo "the benchmark ended before its host ${HOST:-1} started" >&2; exit 1; }
    newest=$(pgrep -n -f "$binary run" || true)
    if [ -n "$newest" ] && [[ " ${seen[*]} " != *" $newest "* ]]; then
        seen+=("$newest")
    fi
    sleep 0.02
done
host=${seen[-1]}
# Until that host exits: a benchmark stops each host it starts.
perf record -q -e cpu-clock -F 997 --call-graph dwarf,16384 -p "$host" -o "$work/perf.data" 2>/dev/null
wait "$bench_pid"
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"$work/folded"
inferno-flamegraph --minwidth 0.5 --title "jobhost run: cargo bench --bench $bench ($(date -u +%F))" <"$work/folded" >"$out"
[ -n "${FOLDED:-}" ] && cp "$work/folded" "$FOLDED"
echo "flame graph: $out ($(wc -l <"$work/folded") distinct stacks)"
