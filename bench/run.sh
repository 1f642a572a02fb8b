#!/usr/bin/env bash
# Builds gpushare in release mode once, runs every benchmark beside its baseline, and writes
# BENCHMARKS.md at the repository root (see bench/README.md).
#
#   bench/run.sh            full run (about 8 minutes of measurements on 2 cores after the
#                           release build; section 11 brings the tests' cluster up), as root
#   bench/run.sh --smoke    a minute or two on the debug build: checks that every measurement
#                           works (scripts/test.sh runs it), writes target/bench-smoke.md
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
for arg in "$@"; do
    case "$arg" in
        --smoke) smoke=1 ;;
        *) echo "usage: bench/run.sh [--smoke]" >&2; exit 2 ;;
    esac
done
if [[ $EUID -ne 0 ]]; then
    echo "bench/run.sh: run as root (the daemon mounts tmpfs and creates device nodes; runc and podman start containers)" >&2
    exit 1
fi

target=${CARGO_TARGET_DIR:-target}
if ((smoke)); then
    cargo build --workspace --locked
    scripts/link-static.sh --profile dev
    bins=$target/debug
    exec "$bins/gpushare-bench" --smoke --bin-dir "$bins" --out "$target/bench-smoke.md" \
        --command "bench/run.sh --smoke"
fi

start=$(date +%s)
cargo build --workspace --release --locked
scripts/link-static.sh --profile release
# The build's output goes to disk first, so that its writeback does not land in the first
# section's tail (the hook's p99).
sync
bins=$target/release
"$bins/gpushare-bench" --bin-dir "$bins" --out BENCHMARKS.md --notes bench/NOTES.md \
    --command "bench/run.sh"
echo "bench/run.sh: done in $(($(date +%s) - start)) s (build included)"
