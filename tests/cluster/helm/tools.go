//go:build tools

// Package helm pins the helm CLI (helm.sh/helm/v4), built by
// `hack/build-cluster.sh helm` into _output/bin: the chart in charts/ is
// linted, rendered and installed with the real helm.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
