// Command kubelet-gates prints the feature gates the kubelet of this
// module's k8s.io/kubernetes knows, at its own version, as rustlet's table
// (src/feature_gates.tsv): one gate per line, tab separated, sorted by
// name: the gate, its default (true or false), whether it is locked to that
// default (true or false), its stage (ALPHA, BETA, GA or DEPRECATED) and the
// gates it depends on (comma separated, "-" for none), which must be on
// while it is.
//
// It imports the kubelet's command package, so that every gate the kubelet
// binary registers (Kubernetes', client-go's, logging's) is listed.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	all := utilfeature.DefaultMutableFeatureGate.GetAll()
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, string(name))
	}
	sort.Strings(names)
	deps := utilfeature.DefaultMutableFeatureGate.Dependencies()
	fmt.Println("# gate\tdefault\tlocked\tstage\tdepends on")
	for _, name := range names {
		spec := all[featuregate.Feature(name)]
		stage := string(spec.PreRelease)
		if spec.PreRelease == featuregate.GA {
			stage = "GA"
		}
		on := make([]string, 0, len(deps[featuregate.Feature(name)]))
		for _, d := range deps[featuregate.Feature(name)] {
			on = append(on, string(d))
		}
		sort.Strings(on)
		dependsOn := "-"
		if len(on) > 0 {
			dependsOn = strings.Join(on, ",")
		}
		fmt.Printf("%s\t%t\t%t\t%s\t%s\n", name, spec.Default, spec.LockToDefault, stage, dependsOn)
	}
	if len(names) == 0 {
		fmt.Fprintln(os.Stderr, "kubelet-gates: no feature gates registered")
		os.Exit(1)
	}
}
