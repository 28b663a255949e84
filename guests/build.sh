#!/usr/bin/env bash
# Builds every example handler into guests/dist/NAME.wasm (a component):
# the Rust ones, the Python ones (guests/python/) when componentize-py is
# installed, and the JavaScript ones (guests/js/) when its toolchain is
# (scripts/test.sh installs both; CI always has them).
set -euo pipefail
cd "$(dirname "$0")"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi
cargo build --quiet --release --target wasm32-wasip2
mkdir -p dist
for manifest in */Cargo.toml; do
  name=$(dirname "$manifest")
  [ "$name" = sdk ] && continue
  cp -f "target/wasm32-wasip2/release/$name.wasm" "dist/$name.wasm.tmp"
  mv -f "dist/$name.wasm.tmp" "dist/$name.wasm"
done
if command -v componentize-py >/dev/null 2>&1; then
  bash python/build.sh
fi
if [ -x js/node_modules/.bin/componentize-js ]; then
  bash js/build.sh
fi
echo "built: $(ls dist | tr '\n' ' ')"
