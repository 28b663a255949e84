#!/usr/bin/env bash
# Makes sure a PostgreSQL server accepts connections on 127.0.0.1:5432 as
# user postgres without a password, installing and starting one if needed
# (Debian/Ubuntu, as root). Used by the tests (scripts/test.sh), the
# benchmarks and CI; the demo needs no server.
set -euo pipefail

ready() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
ready && exit 0

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "installing PostgreSQL..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
hba=/etc/postgresql/$version/main/pg_hba.conf
# Local test server: trust loopback connections (the tests create and drop databases).
if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
  sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
fi
pg_ctlcluster --skip-systemctl-redirect "$version" main start || pg_ctlcluster --skip-systemctl-redirect "$version" main reload

for _ in $(seq 1 60); do
  ready && exit 0
  sleep 0.5
done
echo "PostgreSQL did not start" >&2
exit 1
