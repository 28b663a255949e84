#!/usr/bin/env bash
# Builds every example handler into guests/dist/NAME.wasm (a component).
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
echo "built: $(ls dist | tr '\n' ' ')"
