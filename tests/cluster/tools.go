//go:build tools

// Package cluster pins the upstream commands that hack/build-cluster.sh builds
// from the k8s.io/kubernetes module, and the ginkgo CLI at the version that
// module pins, so that `go mod tidy` keeps them.
package cluster

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
