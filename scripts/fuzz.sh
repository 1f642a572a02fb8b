#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for SECONDS each (default 60; release checks run
# longer, see fuzz/README.md), seeded from fuzz/seeds, the repository's sample claims and
# config, and the shared cases (GPUSHARE_CASES_DIR, default ../shared/cases). Inputs in
# fuzz/regressions/<target>/ (crashes found earlier) are run first; any crash fails the run and
# leaves the input under fuzz/artifacts/<target>/.
#
# cargo-fuzz needs nightly compiler flags (-Zsanitizer); on the stable toolchain
# RUSTC_BOOTSTRAP=1 allows them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
root=$PWD
cases=${GPUSHARE_CASES_DIR:-$root/../shared/cases}
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is missing (scripts/install-test-deps.sh installs it)" >&2
  exit 1
fi
targets=(protocol claim daemon_config oci_state cdi_spec mps_control)

corpus=$root/fuzz/corpus
seed() { # seed TARGET FILE...: copies the files that exist into TARGET's corpus
  local target=$1 f
  shift
  mkdir -p "$corpus/$target"
  for f in "$@"; do
    if [ -f "$f" ]; then cp "$f" "$corpus/$target/seed-$(basename "$f")"; fi
  done
}
for t in "${targets[@]}"; do
  mkdir -p "$corpus/$t"
  if [ -d "fuzz/seeds/$t" ]; then seed "$t" fuzz/seeds/"$t"/*; fi
done
seed claim daemon/examples/claims/*
seed daemon_config packaging/config.toml
if [ -d "$cases" ]; then
  seed claim "$cases"/claims/*.json "$cases"/claims/*.yaml "$cases"/claims/invalid/*.json
  seed oci_state "$cases"/oci/*.json
  seed mps_control "$cases"/mps/script.txt
  # Prepare requests carrying the JSON claims, as the DRA driver sends them.
  for f in "$cases"/claims/*.json "$cases"/claims/invalid/*.json; do
    python3 -c 'import json,sys; print(json.dumps({"version":1,"id":1,"method":"prepare","params":{"claim":json.load(open(sys.argv[1]))}}))' "$f" \
      >"$corpus/protocol/seed-prepare-$(basename "$f")"
  done
else
  echo "fuzz: no shared cases at $cases; seeding from the repository only" >&2
fi

cd fuzz
echo "== cargo fuzz build"
cargo fuzz build
failed=()
for t in "${targets[@]}"; do
  mkdir -p "artifacts/$t"
  if [ -d "regressions/$t" ] && ls "regressions/$t"/* >/dev/null 2>&1; then
    echo "== fuzz $t: regressions"
    cargo fuzz run "$t" "regressions/$t"/* -- -runs=1 || failed+=("$t (regression)")
  fi
  echo "== fuzz $t: ${seconds}s"
  if ! cargo fuzz run "$t" "corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=262144 \
      -print_final_stats=1 2>"artifacts/$t/log"; then
    tail -40 "artifacts/$t/log" >&2
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^Done' "artifacts/$t/log" | tr '\n' ' ' || true
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]}; inputs are in fuzz/artifacts/" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without a crash"
