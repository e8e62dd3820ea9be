//! The definition derived from the types: names, printer columns and the
//! kubelet's checks as schema rules.

use super::*;

#[test]
fn the_definition_has_the_kubelets_names_and_checks() {
    let crd = serde_json::to_value(NodeConfiguration::crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "nodeconfigurations.rustlet.dev");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Selected", "Applied", "Refused", "Age"]);
    let live = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["kubeletConfiguration"];
    let props = &live["properties"];
    for name in [
        "imageGCHighThresholdPercent",
        "imageGCLowThresholdPercent",
        "imageMinimumGCAge",
        "imageMaximumGCAge",
        "evictionHard",
        "evictionSoft",
        "evictionSoftGracePeriod",
        "evictionMinimumReclaim",
        "evictionPressureTransitionPeriod",
        "evictionMaxPodGracePeriod",
        "containerLogMaxSize",
        "containerLogMaxFiles",
        "maxPods",
        "nodeStatusUpdateFrequency",
        "nodeStatusReportFrequency",
    ] {
        assert!(props[name].is_object(), "{name} in {live}");
    }
    assert_eq!(
        props["imageGCHighThresholdPercent"]["maximum"].as_f64(),
        Some(100.0)
    );
    assert_eq!(props["containerLogMaxFiles"]["minimum"].as_f64(), Some(2.0));
    assert_eq!(props["evictionHard"]["maxProperties"], 9);
    let rules = live["x-kubernetes-validations"].to_string();
    assert!(
        rules.contains("self.imageGCLowThresholdPercent < self.imageGCHighThresholdPercent"),
        "{rules}"
    );
    let hard = props["evictionHard"]["x-kubernetes-validations"].to_string();
    assert!(
        hard.contains("'memory.available'") && hard.contains("isQuantity"),
        "{hard}"
    );
}

#[test]
fn a_resource_reads_as_the_kubelets_field_names() {
    let r: NodeConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "rustlet.dev/v1alpha1",
        "kind": "NodeConfiguration",
        "metadata": { "name": "gpu-pool" },
        "spec": {
            "nodeSelector": { "matchLabels": { "pool": "gpu" } },
            "kubeletConfiguration": {
                "imageGCHighThresholdPercent": 70,
                "evictionHard": { "memory.available": "500Mi" }
            }
        }
    }))
    .unwrap();
    let live = &r.spec.kubelet_configuration;
    assert_eq!(live.image_gc_high_threshold_percent, Some(70));
    assert_eq!(
        live.eviction_hard.as_ref().unwrap()["memory.available"],
        "500Mi"
    );
    // Only the fields set go back out, under the kubelet's names.
    assert_eq!(
        serde_json::to_value(live).unwrap(),
        serde_json::json!({
            "imageGCHighThresholdPercent": 70,
            "evictionHard": { "memory.available": "500Mi" }
        })
    );
    // A field outside the live set is refused.
    let e = serde_json::from_value::<LiveKubeletConfiguration>(serde_json::json!({
        "cgroupDriver": "systemd"
    }))
    .unwrap_err();
    assert!(
        e.to_string().contains("unknown field `cgroupDriver`"),
        "{e}"
    );
}
