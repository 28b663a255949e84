#!/usr/bin/env bash
# Makes sure Debian's libfaketime is installed, for the test that runs hosts
# whose clocks disagree with the database's (tests/all/rate_fleet.rs),
# installing it if needed (Debian/Ubuntu, as root). Used by the tests
# (scripts/test.sh) and CI.
set -euo pipefail

[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] && exit 0
echo "installing faketime..."
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
