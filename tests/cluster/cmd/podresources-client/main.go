// Command podresources-client calls a node's pod resources API with the
// kubelet's own client (k8s.io/kubernetes/pkg/kubelet/apis/podresources, the
// one the node conformance suite uses) and prints the answers as JSON:
//
//	podresources-client <socket>
//
// It prints {"list": ..., "allocatable": ...} and exits 0, or prints the
// first error and exits 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: podresources-client <socket>")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, conn, err := podresources.GetV1Client(ctx, "unix://"+os.Args[1], 10*time.Second, 1<<24)
	if err != nil {
		fail("client", err)
	}
	defer conn.Close()
	list, err := cli.List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		fail("List", err)
	}
	alloc, err := cli.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
	if err != nil {
		fail("GetAllocatableResources", err)
	}
	out, err := json.Marshal(map[string]any{"list": list, "allocatable": alloc})
	if err != nil {
		fail("json", err)
	}
	fmt.Println(string(out))
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}
