#!/usr/bin/env bash
# Builds the real Kubernetes node's components for gpushare's cluster tests from their own Go
# modules, pinned in tests/cluster/components/ (kube: Kubernetes' commands; etcd; containerd 2;
# helm 4): kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl,
# etcd, containerd, containerd-shim-runc-v2, ctr and helm (the chart's lint and package, the
# real-node tests' `helm install`). runc is Debian's (1.1.5 runs containerd 2.4's
# containers here once oom_score_adj is restricted: see tests/cluster/node.sh).
#
# They go into a per-machine cache outside the repository, keyed by a hash of the pins, this
# script and the Go version, and are built only when that key changes:
#   ${GPUSHARE_CLUSTER_CACHE:-/var/cache/gpushare-test}/components-<key>/bin
# Prints that bin directory as its last line. Other keys' directories are removed once a new
# one is complete (each is about 580 MB). Nothing is downloaded but Go modules, from the
# machine's configured module proxy (about 1.4 GB into the machine's GOMODCACHE). Measured on 2
# cores, modules and build cache cold: 5 min 15 s (Kubernetes' six commands 4 min 5 s, etcd
# 21 s, containerd's three 48 s); cached: well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

src=tests/cluster/components
command -v go >/dev/null || { echo "build-cluster: go missing (Go 1.26 builds the real node's components)" >&2; exit 1; }
cache=${GPUSHARE_CLUSTER_CACHE:-/var/cache/gpushare-test}
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly

# Kubernetes' and containerd's own release builds set these; without them the binaries report
# v0.0.0-master and the node's kubeletVersion looks unsupported to version-skew checks.
pin() { # module go.mod: the version go.mod requires, in a require block or on one line
  awk -v m="$1" '$1 == "require" && $2 == m { print $3; exit } $1 == m { print $2; exit }' "$2"
}
kube_version=$(pin k8s.io/kubernetes "$src/kube/go.mod")
containerd_version=$(pin github.com/containerd/containerd/v2 "$src/containerd/go.mod")
helm_version=$(pin helm.sh/helm/v4 "$src/helm/go.mod")
if [ -z "$kube_version" ] || [ -z "$containerd_version" ] || [ -z "$helm_version" ]; then
  echo "build-cluster: cannot read the Kubernetes, containerd or helm pin from $src" >&2
  exit 1
fi

key=$(
  {
    go version
    cat "$0"
    find "$src" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)
out=$cache/components-$key
if [ -f "$out/complete" ]; then
  echo "build-cluster: components $key cached" >&2
  echo "$out/bin"
  exit 0
fi

mkdir -p "$cache"
# One build at a time per machine (a second waits, then finds the first's result).
exec 9>"$cache/.lock"
flock 9
if [ -f "$out/complete" ]; then
  echo "$out/bin"
  exit 0
fi
work=$(mktemp -d "$cache/.building-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
# A Go build cache of its own beside the builds (3.8 GB; Go trims what goes unused for days):
# a change of one pin or of this script recompiles only what it changes.
export GOCACHE=$cache/go-build

minor=${kube_version#v1.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

start=$(date +%s)
echo "build-cluster: building Kubernetes $kube_version, etcd and containerd $containerd_version into $out (once per pin)" >&2
# One `go build` per module, every command of it at once: the packages they share compile once.
(cd "$src/kube" && go build -trimpath -ldflags "$kube_ldflags" -o "$work/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy \
  k8s.io/kubernetes/cmd/kubectl)
echo "build-cluster: Kubernetes built after $(($(date +%s) - start)) s" >&2
(cd "$src/etcd" && go build -trimpath -ldflags "-s -w" -o "$work/bin/etcd" .)
echo "build-cluster: etcd built after $(($(date +%s) - start)) s" >&2
(cd "$src/containerd" && go build -trimpath \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
  -o "$work/bin/" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr)
echo "build-cluster: containerd built after $(($(date +%s) - start)) s" >&2
# Helm's release builds stamp the full version (the source says only the minor one).
(cd "$src/helm" && go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
  -o "$work/bin/helm" helm.sh/helm/v4/cmd/helm)
echo "build-cluster: helm built after $(($(date +%s) - start)) s" >&2

for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd containerd containerd-shim-runc-v2 ctr helm; do
  if [ ! -x "$work/bin/$b" ]; then
    echo "build-cluster: $b was not built" >&2
    exit 1
  fi
done
touch "$work/complete"
rm -rf "$out"
mv "$work" "$out"
trap - EXIT
# Older pins' builds are of no further use.
for old in "$cache"/components-* "$cache"/.building-*; do
  [ "$old" = "$out" ] || rm -rf "$old"
done
echo "build-cluster: done in $(($(date +%s) - start)) s" >&2
echo "$out/bin"
