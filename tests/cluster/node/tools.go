//go:build tools

// Package node pins the containerd commands that hack/build-cluster.sh
// builds, so that `go mod tidy` keeps them. It is a module of its own so that
// containerd's dependency versions never move the control plane's.
package node

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
