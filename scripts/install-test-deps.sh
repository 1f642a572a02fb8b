#!/usr/bin/env bash
# Installs what the test suite runs for real: runc, crun, podman (reads CDI specs with the
# reference library), containerd 1.6 with ctr (runs gpushare-runtime as its runc binary),
# busybox-static (container rootfs), NVIDIA's MPS control program (Debian package
# nvidia-cuda-mps, in the non-free component), the packaging checks' tools (rpm, binutils,
# systemd, python3-prometheus-client, cargo-generate-rpm) and cargo-fuzz (from crates.io).
# Idempotent; installs only what is missing. Needs root and Debian bookworm's package registry.
set -euo pipefail

need=()
command -v runc >/dev/null || need+=(runc)
command -v crun >/dev/null || need+=(crun)
command -v podman >/dev/null || need+=(podman)
command -v containerd >/dev/null || need+=(containerd)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v nvidia-cuda-mps-control >/dev/null || need+=(nvidia-cuda-mps)
command -v python3 >/dev/null || need+=(python3)
# Packaging checks: rpm (rpm -qlp, rpm -i --root), objdump (glibc symbol versions),
# systemd-analyze (unit verification), Prometheus' own parser for /metrics.
command -v rpm >/dev/null || need+=(rpm)
command -v objdump >/dev/null || need+=(binutils)
command -v systemd-analyze >/dev/null || need+=(systemd)
# (Debian's python3, which the tests call as /usr/bin/python3: PATH may name another one.)
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || need+=(python3-prometheus-client)
# cargo-generate-rpm builds the RPM (a pinned version, built once per machine, ~3 min on 2 cores).
if ! command -v cargo-generate-rpm >/dev/null; then
  cargo install --locked --quiet cargo-generate-rpm --version 0.21.1
fi
# cargo-fuzz (a cargo subcommand, built from crates.io) for the fuzz smoke runs of
# scripts/fuzz.sh.
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked --quiet cargo-fuzz --version 0.13.2
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-deps: missing ${need[*]}; run as root to install them" >&2
  exit 1
fi

src=/etc/apt/sources.list.d/gpushare-non-free.sources
if [ ! -f "$src" ]; then
  cat >"$src" <<'SRC'
# Added by gpushare's test setup: NVIDIA's MPS control program (nvidia-cuda-mps) is in non-free.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "install-test-deps: installed ${need[*]}"
