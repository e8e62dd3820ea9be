// Command nnp prints the effective user ID of its process. Installed setuid
// root as /usr/local/bin/nnp, it plays the part of
// registry.k8s.io/e2e-test-images/nonewprivs: with allowPrivilegeEscalation
// (no_new_privs unset) it prints "Effective uid: 0", with no_new_privs set it
// prints the container's own user ID.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
