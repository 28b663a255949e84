#!/usr/bin/env bash
# Installs the JavaScript toolchain pinned in package-lock.json (jco and
# componentize-js, from the npm registry) into guests/js/node_modules when
# it is missing or was installed from another lock file: what
# guests/js/build.sh needs. Needs Node 20.19 or later and npm.
set -euo pipefail
cd "$(dirname "$0")"
# A stamp of the lock file npm ci installed from: cheaper and surer than
# asking npm whether the tree matches.
stamp=node_modules/.jobhost-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x node_modules/.bin/componentize-js ]; then
  echo "installing the JavaScript toolchain (jco, componentize-js)..."
  npm ci --no-audit --no-fund --loglevel=error > /dev/null
  echo "$want" > "$stamp"
fi
