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
        "evictionSoft",
        "evictionSoftGracePeriod",
        "evictionMinimumReclaim",
        "evictionPressureTransitionPeriod",
        "evictionMaxPodGracePeriod",
    ] {
        assert!(props[name].is_object(), "{name} in {live}");
    }
    assert_eq!(
        props["imageGCHighThresholdPercent"]["maximum"].as_f64(),
        Some(100.0)
    );
    assert_eq!(props["evictionSoft"]["maxProperties"], 9);
    let rules = live["x-kubernetes-validations"].to_string();
    assert!(
        rules.contains("self.imageGCLowThresholdPercent < self.imageGCHighThresholdPercent"),
        "{rules}"
    );
    let hard = props["evictionSoft"]["x-kubernetes-validations"].to_string();
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
                "evictionSoft": { "memory.available": "500Mi" }
            }
        }
    }))
    .unwrap();
    let live = &r.spec.kubelet_configuration;
    assert_eq!(live.image_gc_high_threshold_percent, Some(70));
    assert_eq!(
        live.eviction_soft.as_ref().unwrap()["memory.available"],
        "500Mi"
    );
    // Only the fields set go back out, under the kubelet's names.
    assert_eq!(
        serde_json::to_value(live).unwrap(),
        serde_json::json!({
            "imageGCHighThresholdPercent": 70,
            "evictionSoft": { "memory.available": "500Mi" }
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

fn resource(
    name: &str,
    generation: i64,
    selector: serde_json::Value,
    live: serde_json::Value,
) -> NodeConfiguration {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rustlet.dev/v1alpha1",
        "kind": "NodeConfiguration",
        "metadata": { "name": name, "generation": generation },
        "spec": { "nodeSelector": selector, "kubeletConfiguration": live }
    }))
    .unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[test]
fn selected_resources_are_laid_over_the_file() {
    let base = crate::config::Settings::default();
    let gpu = resource(
        "gpu",
        3,
        serde_json::json!({ "matchLabels": { "pool": "gpu" } }),
        serde_json::json!({ "imageGCHighThresholdPercent": 70, "imageGCLowThresholdPercent": 60 }),
    );
    let soft = resource(
        "soft",
        1,
        serde_json::json!({ "matchExpressions": [{ "key": "pool", "operator": "Exists" }] }),
        serde_json::json!({
            "evictionSoft": { "memory.available": "1Gi" },
            "evictionSoftGracePeriod": { "memory.available": "30s" }
        }),
    );
    let other = resource(
        "cpu",
        1,
        serde_json::json!({ "matchLabels": { "pool": "cpu" } }),
        serde_json::json!({ "imageGCHighThresholdPercent": 99 }),
    );
    let all = [other, soft, gpu];
    let d = decide::decide(
        &base,
        &all,
        &labels(&[("pool", "gpu")]),
        &Default::default(),
    );
    let names: Vec<(&str, i64, bool)> = d
        .verdicts
        .iter()
        .map(|v| (v.name.as_str(), v.generation, v.refused.is_none()))
        .collect();
    assert_eq!(names, [("gpu", 3, true), ("soft", 1, true)]);
    assert_eq!(d.settings.image_gc.high_percent, 70);
    assert_eq!(d.settings.image_gc.low_percent, 60);
    assert_eq!(d.settings.eviction.soft["memory.available"], "1Gi");
    assert_eq!(d.live.image_gc_high_threshold_percent, Some(70));
    // The file's other values stay.
    assert_eq!(d.settings.max_pods, base.max_pods);
    // No label matches: the file alone.
    let d = decide::decide(&base, &all, &labels(&[]), &Default::default());
    assert!(d.verdicts.is_empty());
    assert_eq!(d.settings, base);
}

#[test]
fn conflicts_and_invalid_values_are_refused_and_the_last_values_kept() {
    let base = crate::config::Settings::default();
    let every = serde_json::json!({});
    let a = resource(
        "a",
        1,
        every.clone(),
        serde_json::json!({ "imageGCHighThresholdPercent": 70 }),
    );
    let b = resource(
        "b",
        2,
        every.clone(),
        serde_json::json!({ "imageGCHighThresholdPercent": 75, "imageMinimumGCAge": "5m" }),
    );
    let c = resource(
        "c",
        1,
        every.clone(),
        serde_json::json!({ "evictionMaxPodGracePeriod": 30 }),
    );
    let previous = LiveKubeletConfiguration {
        image_gc_high_threshold_percent: Some(90),
        ..Default::default()
    };
    let d = decide::decide(&base, &[a, b, c], &labels(&[]), &previous);
    let refused: Vec<(&str, Option<&str>)> = d
        .verdicts
        .iter()
        .map(|v| (v.name.as_str(), v.refused.as_ref().map(|r| r.0)))
        .collect();
    assert_eq!(
        refused,
        [
            ("a", Some(decide::CONFLICT)),
            ("b", Some(decide::CONFLICT)),
            ("c", None)
        ]
    );
    let message = &d.verdicts[0].refused.as_ref().unwrap().1;
    assert_eq!(message, "imageGCHighThresholdPercent is also set by b");
    // The contested field keeps the value applied last; b's other field is
    // not applied; c applies.
    assert_eq!(d.settings.image_gc.high_percent, 90);
    assert_eq!(d.settings.image_gc.min_age, base.image_gc.min_age);
    assert_eq!(d.settings.eviction.max_pod_grace_period, 30);

    // A value the kubelet refuses over the file (low above the file's high).
    let low = resource(
        "low",
        1,
        every.clone(),
        serde_json::json!({ "imageGCLowThresholdPercent": 95 }),
    );
    let d = decide::decide(&base, &[low], &labels(&[]), &Default::default());
    let (reason, message) = d.verdicts[0].refused.clone().unwrap();
    assert_eq!(reason, decide::INVALID);
    assert!(message.contains("imageGCLowThresholdPercent"), "{message}");
    assert_eq!(d.settings, base);
    // An eviction signal the kubelet does not know.
    let bad = resource(
        "bad",
        1,
        every.clone(),
        serde_json::json!({ "evictionSoft": { "memory.free": "1Gi" } }),
    );
    let d = decide::decide(&base, &[bad], &labels(&[]), &Default::default());
    assert_eq!(d.verdicts[0].refused.as_ref().unwrap().0, decide::INVALID);
    // A selector that does not parse.
    let sel = resource(
        "sel",
        1,
        serde_json::json!({ "matchExpressions": [{ "key": "k", "operator": "Near" }] }),
        serde_json::json!({}),
    );
    let d = decide::decide(&base, &[sel], &labels(&[]), &Default::default());
    assert!(
        d.verdicts[0]
            .refused
            .as_ref()
            .unwrap()
            .1
            .starts_with("nodeSelector:")
    );

    // Two fields valid alone, not together: none applies.
    let hi = resource(
        "hi",
        1,
        every.clone(),
        serde_json::json!({ "imageGCHighThresholdPercent": 82 }),
    );
    let lo = resource(
        "lo",
        1,
        every,
        serde_json::json!({ "imageGCLowThresholdPercent": 83 }),
    );
    let d = decide::decide(&base, &[hi, lo], &labels(&[]), &Default::default());
    assert!(d.verdicts.iter().all(|v| {
        v.refused
            .as_ref()
            .is_some_and(|r| r.1.starts_with("together"))
    }));
    assert_eq!(d.settings, base);
}
