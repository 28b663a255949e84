#!/usr/bin/env bash
# Installs the pinned componentize-py from the Python package registry
# when it is missing or another version: what guests/python/build.sh needs.
# Used by scripts/test.sh and CI.
set -euo pipefail
version=0.25.1
if [ "$(componentize-py --version 2>/dev/null)" != "componentize-py $version" ]; then
  echo "installing componentize-py $version..."
  python3 -m pip install --quiet --disable-pip-version-check "componentize-py==$version"
fi
