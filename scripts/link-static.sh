#!/usr/bin/env bash
# Relinks the two binaries that container runtimes start on every container's start and stop,
# gpushare-cdi-hook and gpushare-runtime, as static-pie executables, in place of the dynamically
# linked ones `cargo build` made.
#
#   scripts/link-static.sh [--profile dev|release] [--target TRIPLE]   (default: release)
#
# Why: a process's start is most of what a hook costs, and resolving a dynamically linked Rust
# binary (ld.so loading libgcc_s and libc, relocating them) costs about as much again as the
# whole of /bin/true; a static-pie one starts as fast as /bin/true (BENCHMARKS.md, section 1).
# Both binaries need nothing glibc only does dynamically (no NSS lookups, no dlopen). The daemon
# and the CLI stay dynamic: they load the driver's NVML with dlopen.
#
# `cargo rustc` passes the flag to the binary's own crate alone, and static linking changes no
# code path. The libraries are built for that one package's features (cargo may rebuild some of
# them, where the workspace build unified more features). Needs glibc's static libraries
# (Debian: libc6-dev; AL2023 and Fedora: glibc-static; a cross build: the target's). A later
# plain `cargo build` of these binaries links them dynamically again.
#
# What that costs: the two binaries carry the build host's glibc, so a glibc update on the node
# reaches them only with a new gpushare build (they use it for little: memory, files, sockets,
# exec).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
target=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --target) target=(--target "$2"); shift 2 ;;
    *) echo "link-static: unknown argument $1" >&2; exit 2 ;;
  esac
done

for pair in gpushare-cdi-hook:gpushare-cdi-hook gpushare-runtime:gpushare-runtime; do
  cargo rustc --locked --profile "$profile" "${target[@]}" -p "${pair%%:*}" --bin "${pair#*:}" \
    -- -C target-feature=+crt-static
done
