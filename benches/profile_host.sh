#!/usr/bin/env bash
# Where a host's CPU goes under a benchmark's workload: runs the benchmark,
# attaches `perf record` (software clock, DWARF call stacks) to the HOST-th
# `jobhost run` that benchmark starts (default the first), from a few
# milliseconds after its start to its exit, and writes a flame graph
# (inferno) of it.
#
#   [HOST=N] benches/profile_host.sh BENCH OUT.svg [BENCH ARGS...]
#   e.g. OUTBOUND_RUNS=1 benches/profile_host.sh outbound benches/profiles/io.svg
#        HOST=2 benches/profile_host.sh queue benches/profiles/noop.svg
#        (the queue benchmark's first host only registers the job types;
#        its second is the one host of workload A on PostgreSQL)
#
# Needs perf (Debian's linux-perf) and inferno (`cargo install inferno`).
# The host is the release build the benchmark itself starts (or
# JOBHOST_BENCH_BIN); its symbols suffice for a graph by function. Only
# the benchmark's own descendants are counted, so hosts of other programs
# (a test run beside it) are never picked. The benchmark's figures, printed
# as usual, are slowed by the sampling: read them from a run without it.
# FOLDED=PATH keeps the folded stacks too (one line a stack, with its
# samples), to sum by function: the graph leaves out frames narrower than
# half a pixel.
set -euo pipefail
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bench=$1
out=$(absolute "$2")
folded=${FOLDED:+$(absolute "$FOLDED")}
[ -n "${JOBHOST_BENCH_BIN:-}" ] && export JOBHOST_BENCH_BIN=$(absolute "$JOBHOST_BENCH_BIN")
shift 2
cd "$(dirname "$0")/.."
work=$(mktemp -d)
bench_pid=""
trap '[ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null; rm -rf "$work"' EXIT

# Whether process $1 descends from process $2.
descends() {
    local pid=$1
    while [ "$pid" -gt 1 ]; do
        [ "$pid" = "$2" ] && return 0
        pid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null) || return 1
    done
    return 1
}

cargo bench --bench "$bench" --no-run
cargo bench --bench "$bench" -- "$@" &
bench_pid=$!
binary=$(basename "${JOBHOST_BENCH_BIN:-jobhost}")
seen=()
while [ "${#seen[@]}" -lt "${HOST:-1}" ]; do
    kill -0 "$bench_pid" 2>/dev/null || { echo "the benchmark ended before its host ${HOST:-1} started" >&2; exit 1; }
    for pid in $(pgrep -f "$binary run" || true); do
        if [[ " ${seen[*]} " != *" $pid "* ]] && descends "$pid" "$bench_pid"; then
            seen+=("$pid")
        fi
    done
    sleep 0.01
done
host=${seen[$((${HOST:-1} - 1))]}
# Until that host exits: a benchmark stops each host it starts.
perf record -q -e cpu-clock -F 997 --call-graph dwarf,16384 -p "$host" -o "$work/perf.data"
wait "$bench_pid"
bench_pid=""
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"$work/folded"
inferno-flamegraph --minwidth 0.5 --title "jobhost run: cargo bench --bench $bench ($(date -u +%F))" \
    <"$work/folded" >"$out"
if [ -n "$folded" ]; then cp "$work/folded" "$folded"; fi
echo "flame graph: $out ($(wc -l <"$work/folded") distinct stacks)"
