#!/usr/bin/env bash
# Builds the gpushare-dra image FROM scratch with podman: the binary and the libraries it
# links (from `ldd`), so no base image is pulled.
#
#   deployments/build-image.sh [BINARY] [TAG]
#     BINARY  default target/release/gpushare-dra (cargo build --release -p gpushare-dra)
#     TAG     default localhost/gpushare-dra:<version>
#
# packaging/release.sh builds the release's image with it (saved as an OCI archive). For an
# image of your own build: push it (`podman push TAG registry.example/gpushare-dra:TAG`) and
# install the chart with `--set image.repository=registry.example/gpushare-dra`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/gpushare-dra}
tag=${2:-localhost/gpushare-dra:$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}
[ -x "$bin" ] || { echo "build-image: $bin missing (cargo build --release -p gpushare-dra)" >&2; exit 1; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/rootfs/usr/bin"
cp "$bin" "$ctx/rootfs/usr/bin/gpushare-dra"
strip --strip-debug "$ctx/rootfs/usr/bin/gpushare-dra" 2>/dev/null || true
# Every library ldd resolves, and the dynamic loader, at their own paths.
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  mkdir -p "$ctx/rootfs$(dirname "$lib")"
  cp -L "$lib" "$ctx/rootfs$lib"
done
cp deployments/Containerfile "$ctx/Containerfile"
podman build --quiet -f "$ctx/Containerfile" -t "$tag" "$ctx" >&2
echo "$tag"
