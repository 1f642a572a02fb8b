#!/usr/bin/env bash
# gpushare's whole test suite: installs what the tests run for real (as root, when missing),
# checks formatting and lints, builds the workspace once, and runs every test, end-to-end ones
# included (they need root: mounts, device nodes, containers, a real one-node Kubernetes
# cluster built from its Go modules: scripts/build-cluster.sh), the stress test
# (tests/tests/stress.rs) and the loom models of gpushare-core (scripts/loom.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-test-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== layout (no research/ citations, no daemon file over 500 production lines)"
./scripts/check-layout.sh
echo "== cargo clippy (service/ and strategy/: no function over 60 lines)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== rustdoc (every library's docs build: no broken or private intra-doc link)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib --locked
echo "== minimum Rust version (Cargo.toml's rust-version is what the locked dependencies need)"
./scripts/check-msrv.sh
echo "== cargo build"
cargo build --workspace --locked
echo "== the real Kubernetes node's components (built from their Go modules once per pin; tests/tests/cluster.rs runs them)"
components=$(./scripts/build-cluster.sh | tail -1)
echo "== Helm chart (helm lint --strict; the plain manifests of deployments/ are its rendering)"
HELM="$components/helm" ./deployments/render.sh --check
# tests/tests/packaging.rs checks it; tests/tests/release.rs and the real node's tests sign it
# with packaging/release.sh and install from that release.
echo "== RPM (packages the debug build just made)"
./packaging/build-rpm.sh --profile dev
echo "== loom models (gpushare-core)"
# Their own target directory (`--cfg gpushare_loom` would rebuild everything else).
./scripts/loom.sh
echo "== cargo test"
# The end-to-end tests fail (instead of skipping) when a tool they need is missing.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
GPUSHARE_E2E_REQUIRE=1 cargo test --workspace --locked -- --test-threads=2 2>&1 | tee "$log"
echo "== fuzz"
# Every fuzz target for GPUSHARE_FUZZ_SECONDS (default 60) each, under AddressSanitizer.
./scripts/fuzz.sh "${GPUSHARE_FUZZ_SECONDS:-60}" 2>&1 | tee -a "$log"
# One closing line for the whole run (the last runner line is the doc tests' alone).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$log"
./bench/run.sh --smoke  # the benchmarks on the debug build, cut down: checks that they work, not their speed
