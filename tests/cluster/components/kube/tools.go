//go:build tools

// Package kube pins Kubernetes' own commands for gpushare's real-node tests. It is never
// compiled (the build tag): the imports keep `go mod tidy` from dropping what
// scripts/build-cluster.sh builds with `go build`.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
