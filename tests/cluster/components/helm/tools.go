//go:build tools

// Package helm pins Helm 4 (its command) for gpushare's chart checks (`helm lint`, `helm
// package`) and the real-node tests' `helm install`; never compiled, see ../kube/tools.go.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
