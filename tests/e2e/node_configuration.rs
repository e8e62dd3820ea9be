//! The `NodeConfiguration` definition of `crds/` on the real API server: it
//! is accepted (its CEL rules within the API server's cost budget), its
//! printer columns show, and the kubelet's checks it carries refuse what
//! the kubelet's validation would.

use crate::common::*;

/// Applies `yaml` with `kubectl apply` (strict field validation); the exit
/// code and stderr.
fn apply(yaml: &str) -> (i32, String) {
    let (code, _, err) = kubectl(&["apply", "--validate=strict", "-f", "-"], yaml);
    (code, err)
}

fn resource(name: &str, live: &str) -> String {
    format!(
        "apiVersion: rustlet.dev/v1alpha1\nkind: NodeConfiguration\nmetadata:\n  name: {name}\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      pool: e2e-none\n  kubeletConfiguration:\n{live}"
    )
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_definition_is_accepted_and_refuses_what_the_kubelet_refuses() {
    let crd = root().join("crds/nodeconfigurations.rustlet.dev.yaml");
    let (code, _, err) = kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crd.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "the definition: {err}");
    let (code, _, err) = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/nodeconfigurations.rustlet.dev",
        ],
        "",
    );
    assert_eq!(code, 0, "established: {err}");

    let name = "e2e-valid";
    let (code, err) = apply(&resource(
        name,
        "    imageGCHighThresholdPercent: 70\n    imageGCLowThresholdPercent: 60\n\
         \x20   evictionSoft:\n      memory.available: 200Mi\n      nodefs.available: \"10%\"\n\
         \x20   evictionSoftGracePeriod:\n      memory.available: 1m\n      nodefs.available: 1m\n\
         \x20   evictionPressureTransitionPeriod: 30s\n",
    ));
    assert_eq!(code, 0, "a valid resource: {err}");
    let (code, table, err) = kubectl(&["get", "nodeconfig", name], "");
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "SELECTED", "APPLIED", "REFUSED", "AGE"]);

    for (live, says) in [
        (
            "    imageGCHighThresholdPercent: 60\n    imageGCLowThresholdPercent: 60\n",
            "imageGCLowThresholdPercent must be less than imageGCHighThresholdPercent",
        ),
        (
            "    imageGCHighThresholdPercent: 101\n",
            "should be less than or equal to 100",
        ),
        (
            "    evictionMinimumReclaim:\n      memory.free: 1Gi\n",
            "keys must be eviction signals",
        ),
        (
            "    evictionSoft:\n      memory.available: lots\n",
            "keys must be eviction signals",
        ),
        (
            "    imageGCLowThresholdPercent: -1\n",
            "should be greater than or equal to 0",
        ),
        (
            "    evictionPressureTransitionPeriod: soon\n",
            "should match",
        ),
        ("    cgroupDriver: systemd\n", "unknown field"),
    ] {
        let (code, err) = apply(&resource("e2e-invalid", live));
        assert_ne!(code, 0, "accepted: {live}");
        assert!(err.contains(says), "{live}: {err}");
    }
    let (code, _, err) = kubectl(&["delete", "nodeconfig", name], "");
    assert_eq!(code, 0, "{err}");
}
