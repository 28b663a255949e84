#!/usr/bin/env bash
# Builds the example handlers and the host, then shows what each handler
# declares and what happens when it runs: results, retries, a timeout, a
# memory cap, a trap, and a sandbox that gives a nosy guest nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash guests/build.sh
cargo build --quiet --release --locked
jobhost=target/release/jobhost
export JOBHOST_CACHE_DIR="${JOBHOST_CACHE_DIR:-$PWD/target/jobhost-cache}"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@" || true; }

step "$jobhost" inspect guests/dist/limited.wasm
step "$jobhost" exec guests/dist/hello.wasm --payload '{"name": "Ada"}'
step "$jobhost" exec guests/dist/flaky.wasm --payload '{"fail_times": 1}' --attempt 1
step "$jobhost" exec guests/dist/flaky.wasm --payload '{"fail_times": 1}' --attempt 2
step "$jobhost" exec guests/dist/fanout.wasm --payload '{"count": 2}'
step "$jobhost" exec guests/dist/spin.wasm
step "$jobhost" exec guests/dist/hog.wasm
step "$jobhost" exec guests/dist/trap.wasm --payload '{"message": "the disk is lava"}'
step "$jobhost" exec guests/dist/snoop.wasm
step "$jobhost" inspect guests/dist/misconfigured.wasm
