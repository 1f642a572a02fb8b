#!/usr/bin/env bash
# Runs gpushare-core's loom models (core/tests/loom.rs) in their own target directory, so the
# `--cfg gpushare_loom` build never invalidates the main one. Extra arguments go to the test
# binary (a model name to run one). LOOM_MAX_PREEMPTIONS overrides the models' bound of 3.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg gpushare_loom ${RUSTFLAGS:-}"
# Optimized (the models run many thousands of interleavings), without LTO (faster to build).
export CARGO_PROFILE_RELEASE_LTO=false
# The models and the loom build of the primitives get the same lints as everything else.
cargo clippy -p gpushare-core --release --locked --tests --target-dir target/loom -- -D warnings
time cargo test -p gpushare-core --release --locked --test loom \
    --target-dir target/loom -- --test-threads=1 "$@"
