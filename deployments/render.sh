#!/usr/bin/env bash
# Renders the plain manifests of deployments/ from the Helm chart (deployments/helm/gpushare-dra,
# the one source of gpushare-dra's Kubernetes objects), for clusters installed with
# `kubectl apply`: the chart's defaults, release gpushare-dra in namespace gpushare, the
# Namespace included with its Pod Security labels.
#
#   deployments/render.sh           rewrite the plain manifests
#   deployments/render.sh --check   lint the chart (`helm lint --strict`) and fail when a plain
#                                   manifest differs from the rendering (scripts/test.sh)
#
# helm: $HELM, else the one scripts/build-cluster.sh builds from its Go module.
set -euo pipefail
cd "$(dirname "$0")"
check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  *) echo "render: unknown argument $1 (--check or nothing)" >&2; exit 2 ;;
esac
helm=${HELM:-$(../scripts/build-cluster.sh | tail -1)/helm}
chart=helm/gpushare-dra

if $check; then
  "$helm" lint --strict "$chart" >/dev/null || { "$helm" lint --strict "$chart" >&2; exit 1; }
fi

# file: the chart's templates it holds, in apply order
files=(
  "rbac.yaml:templates/namespace.yaml templates/rbac.yaml"
  "deviceclasses.yaml:templates/deviceclasses.yaml"
  "validatingadmissionpolicy.yaml:templates/validatingadmissionpolicy.yaml"
  "networkpolicy.yaml:templates/networkpolicy.yaml"
  "daemonset.yaml:templates/daemonset.yaml"
)
stale=()
for entry in "${files[@]}"; do
  file=${entry%%:*}
  show=()
  for t in ${entry#*:}; do show+=(--show-only "$t"); done
  new=$(
    echo "# Rendered from the Helm chart deployments/helm/gpushare-dra by deployments/render.sh"
    echo "# (release gpushare-dra, namespace gpushare, the chart's defaults): edit the chart, not this file."
    "$helm" template gpushare-dra "$chart" --namespace gpushare --set namespace.create=true "${show[@]}"
  )
  if $check; then
    [ "$new" = "$(cat "$file" 2>/dev/null)" ] || stale+=("$file")
  else
    printf '%s\n' "$new" >"$file"
  fi
done
if [ ${#stale[@]} -gt 0 ]; then
  echo "render: ${stale[*]} differ from the chart's rendering: run deployments/render.sh and commit" >&2
  exit 1
fi
