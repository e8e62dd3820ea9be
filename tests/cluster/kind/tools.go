//go:build tools

// Package tools pins sigs.k8s.io/kind, whose CLI hack/kind-e2e.sh builds.
package tools

import _ "sigs.k8s.io/kind"
