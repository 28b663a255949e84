#!/usr/bin/env bash
# Builds each JavaScript handler (a folder holding app.js) into
# guests/dist/NAME.wasm with componentize-js, against the repository's WIT,
# world `job-http` (so `fetch` sends through the host's allow-list, and
# `wasi:cli/environment` reads the run's variables), with AOT off. Run
# toolchain.sh first. A component newer than its sources, the SDK and the
# WIT is left as it is: a build takes about ten seconds and bundles the
# SpiderMonkey engine (some 12 MB).
#
# componentize-js resolves an app's imports while it pre-initializes the
# engine, reading files under the directory it is run from, so this runs
# from guests/js and `import ... from '../sdk/jobhost_guest.js'` is
# bundled in without a bundler. Nothing is downloaded: AOT, which would
# fetch weval, stays off.
set -euo pipefail
cd "$(dirname "$0")"
wit=../../wit
dist=../dist
mkdir -p "$dist"
for app in */app.js; do
  name=$(dirname "$app")
  [ "$name" = node_modules ] && continue
  out="$dist/$name.wasm"
  newer=$(find "$name" sdk "$wit" -newer "$out" -print -quit 2>/dev/null || echo changed)
  if [ -f "$out" ] && [ -z "$newer" ]; then
    continue
  fi
  node_modules/.bin/componentize-js "$app" --wit "$wit" --world-name job-http \
    --disable fetch-event -o "$out.tmp" > /dev/null
  mv -f "$out.tmp" "$out"
done
