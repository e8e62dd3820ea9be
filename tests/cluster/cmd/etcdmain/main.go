// Command etcdmain is the etcd server's own command line (etcdmain.Main of
// go.etcd.io/etcd/server/v3, as upstream's etcd binary runs it), for the
// etcd image of kind's node: kubeadm's static pod passes it etcd's own
// flags, which the local cluster's smaller embedded etcd (cmd/etcd) lacks.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
