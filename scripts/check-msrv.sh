#!/usr/bin/env bash
# The workspace's `rust-version` must be the real minimum: the highest `rust-version` that any
# locked dependency built for Linux declares (crates.io's own statement of what each needs).
# Our own code is held to it by clippy's `incompatible_msrv` lint, which refuses std APIs
# stabilised after the workspace's `rust-version` (scripts/test.sh runs clippy with -D warnings).
# No older toolchain can be installed on these machines, so this is how the minimum is found.
# Dependencies only the loom models build (`--cfg gpushare_loom`, scripts/loom.sh) are left
# out: they need a newer Rust, which CONTRIBUTING.md states.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
cargo metadata --format-version 1 --locked --filter-platform "$host" | python3 -c '
import json, re, sys
m = json.load(sys.stdin)
ws = open("Cargo.toml").read()
declared = re.search(r"^rust-version\s*=\s*\"([0-9.]+)\"", ws, re.M).group(1)
def key(v):
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
ids = {n["id"] for n in m["resolve"]["nodes"]}
deps = [(key(p["rust_version"]), p["name"], p["version"])
        for p in m["packages"]
        if p["id"] in ids and p.get("source") and p.get("rust_version")]
need, name, version = max(deps)
need_s = ".".join(str(x) for x in need).removesuffix(".0")
if key(declared) != need:
    print(f"check-msrv: Cargo.toml says rust-version = \"{declared}\", but the locked "
          f"dependencies need {need_s} ({name} {version} is the highest); set it to \"{need_s}\"",
          file=sys.stderr)
    sys.exit(1)
print(f"check-msrv: rust-version {declared} is what the locked dependencies need ({name} {version})")
'
