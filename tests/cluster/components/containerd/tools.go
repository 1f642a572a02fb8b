//go:build tools

// Package containerd pins containerd 2 (the daemon, its runc shim and ctr) for gpushare's
// real-node tests; never compiled, see ../kube/tools.go.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
