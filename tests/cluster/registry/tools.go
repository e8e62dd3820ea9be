//go:build tools

// Package registry pins the OCI distribution registry that the end-to-end
// tests of private image pulls (imagePullSecrets) run on loopback.
package registry

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
