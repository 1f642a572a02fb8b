#!/usr/bin/env bash
# gpushare's whole test suite: installs what the tests run for real (as root, when missing),
# checks formatting and lints, builds the workspace once, and runs every test, end-to-end ones
# included (they need root: mounts, device nodes, containers).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-test-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo build"
cargo build --workspace --locked
echo "== cargo test"
# The end-to-end tests fail (instead of skipping) when a tool they need is missing.
GPUSHARE_E2E_REQUIRE=1 cargo test --workspace --locked -- --test-threads=2
