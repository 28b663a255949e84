#!/usr/bin/env bash
# Builds each Python handler (a folder holding app.py) into
# guests/dist/NAME.wasm with componentize-py, against the repository's WIT,
# with the SDK in guests/python/sdk on the module path. A component newer
# than its sources, the SDK and the WIT is left as it is: a build takes
# about ten seconds and bundles the interpreter (some 18 MB).
set -euo pipefail
cd "$(dirname "$0")"
wit=../../wit
dist=../dist
mkdir -p "$dist"
for app in */app.py; do
  name=$(dirname "$app")
  out="$dist/$name.wasm"
  newer=$(find "$name" sdk "$wit" -newer "$out" -print -quit 2>/dev/null || echo changed)
  if [ -f "$out" ] && [ -z "$newer" ]; then
    continue
  fi
  componentize-py -d "$wit" -w job-http componentize -p "$name" -p sdk app -o "$out.tmp" > /dev/null
  mv -f "$out.tmp" "$out"
done
