//go:build tools

// Package metricsserver pins metrics-server, which hack/build-cluster.sh
// builds for `hack/local-up.sh --metrics-server`, so that `go mod tidy` keeps
// it. It is a module of its own so that its Kubernetes library versions never
// move the control plane's.
package metricsserver

import (
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
