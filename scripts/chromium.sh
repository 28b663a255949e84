#!/usr/bin/env bash
# Makes sure Debian's chromium and chromedriver are installed, for the
# dashboard's browser tests (tests/all/dashboard.rs), installing them if needed
# (Debian/Ubuntu, as root). Used by the tests (scripts/test.sh) and CI.
set -euo pipefail

command -v chromedriver >/dev/null 2>&1 && [ -x /usr/bin/chromium ] && exit 0
echo "installing chromium and chromedriver..."
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver fonts-dejavu-core >/dev/null
