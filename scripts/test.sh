#!/usr/bin/env bash
# The whole test suite: starts PostgreSQL if none runs (tests create and drop
# their own databases on it) and installs what is missing: chromium and
# chromedriver (the dashboard's browser tests), libfaketime (hosts whose
# clocks are skewed), componentize-py (the Python handlers) and
# componentize-js (the JavaScript ones). Then it runs every
# test. The test harness builds the example guests (and adds the
# wasm32-wasip2 target) itself. Every test binary runs even when an earlier
# one fails, so one run reports every failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/postgres.sh
bash scripts/chromium.sh
bash scripts/faketime.sh
bash guests/python/toolchain.sh
bash guests/js/toolchain.sh
cargo test --locked --no-fail-fast "$@"
