#!/usr/bin/env bash
# Installs what the test suite runs for real: runc, crun, podman (reads CDI specs with the
# reference library), containerd 1.6 with ctr (runs gpushare-runtime as its runc binary), what
# the real Kubernetes node needs from Debian (tini, the CNI plugins, iptables, openssl, curl),
# busybox-static (container rootfs), NVIDIA's MPS control program (Debian package
# nvidia-cuda-mps, in the non-free component), the packaging checks' tools (rpm, binutils,
# systemd, python3-prometheus-client, cargo-generate-rpm) and cargo-fuzz (from crates.io).
# Idempotent; installs only what is missing. Needs root and a configured Debian source (its non-free component is added beside it).
set -euo pipefail

need=()
command -v runc >/dev/null || need+=(runc)
command -v crun >/dev/null || need+=(crun)
command -v podman >/dev/null || need+=(podman)
command -v containerd >/dev/null || need+=(containerd)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v nvidia-cuda-mps-control >/dev/null || need+=(nvidia-cuda-mps)
command -v python3 >/dev/null || need+=(python3)
# The real Kubernetes node of tests/cluster/: tini reaps for its components (PID 1 here reaps
# nothing), the bridge and host-local CNI plugins network its pods, kube-proxy writes iptables
# rules, openssl makes each run's certificates, curl asks etcd whether it is up. Its
# components themselves are built from Go modules by scripts/build-cluster.sh.
command -v tini >/dev/null || need+=(tini)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
command -v ip >/dev/null || need+=(iproute2)
# Packaging checks: rpm (rpm -qlp, rpm -i --root), objdump (glibc symbol versions),
# systemd-analyze (unit verification), Prometheus' own parser for /metrics.
command -v rpm >/dev/null || need+=(rpm)
# The release command (packaging/release.sh): rpmsign (in rpm) signs with a gpg key.
command -v gpg >/dev/null || need+=(gpg)
command -v objdump >/dev/null || need+=(binutils)
command -v valgrind >/dev/null || need+=(valgrind)
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

# NVIDIA's MPS control program is in Debian's non-free component. Its sources entries are derived
# from the machine's own configured Debian sources (the same URIs, suites and keyring with the
# component non-free), so no package registry's address is written by this project.
deb822=/etc/apt/sources.list.d/gpushare-non-free.sources
oneline=/etc/apt/sources.list.d/gpushare-non-free.list
if [[ " ${need[*]} " == *" nvidia-cuda-mps "* ]] && [ ! -f "$deb822" ] && [ ! -f "$oneline" ]; then
  stanzas=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # Every enabled deb822 stanza whose Components include main, with Components: non-free.
    stanzas+=$(awk 'BEGIN { RS = ""; FS = "\n" }
      /(^|\n)Components:([^\n]*[ \t])?main([ \t\n]|$)/ && !/(^|\n)Enabled: *[Nn]o/ {
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^#/) continue
          if ($i ~ /^Components:/) $i = "Components: non-free"
          print $i
        }
        print ""
      }' "$f")$'\n'
  done
  lines=""
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # One-line entries "deb [options] URI suite main ...", rewritten as "... URI suite non-free".
    lines+=$(awk '$1 == "deb" && / main( |$)/ {
        line = $1; i = 2
        if ($2 ~ /^\[/) { while ($i !~ /\]$/) { line = line " " $i; i++ } line = line " " $i; i++ }
        print line " " $i " " $(i + 1) " non-free"
      }' "$f")$'\n'
  done
  if ! grep -q '[^[:space:]]' <<<"$stanzas$lines"; then
    echo "install-test-deps: no Debian source with the 'main' component is configured in /etc/apt; configure one and run again (nvidia-cuda-mps is in its non-free component)" >&2
    exit 1
  fi
  header="# Added by gpushare's test setup: nvidia-cuda-mps is in non-free (derived from this machine's own sources)."
  if grep -q '[^[:space:]]' <<<"$stanzas"; then printf '%s\n%s' "$header" "$stanzas" >"$deb822"; fi
  if grep -q '[^[:space:]]' <<<"$lines"; then printf '%s\n%s' "$header" "$lines" >"$oneline"; fi
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "install-test-deps: installed ${need[*]}"
