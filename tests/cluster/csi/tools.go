//go:build tools

// Package csi pins the upstream CSI sidecars hack/build-cluster.sh builds
// (external-provisioner, external-attacher) for the storage tests, which run
// them against the project's test driver (src/bin/csi-hostpath.rs). It is a
// module of its own so that its Kubernetes library versions never move the
// control plane's.
package csi

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
)
