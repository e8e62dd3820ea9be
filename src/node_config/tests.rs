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
    // /configz/sources names the resource of each field it set.
    let sources = &d.settings.sources;
    assert_eq!(
        sources["imageGCHighThresholdPercent"],
        "NodeConfiguration gpu"
    );
    assert_eq!(sources["evictionSoftGracePeriod"], "NodeConfiguration soft");
    assert!(!sources.contains_key("maxPods"));
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
    // Their sources: kept, applied, and not applied at all.
    let sources = &d.settings.sources;
    assert_eq!(sources["imageGCHighThresholdPercent"], decide::KEPT_SOURCE);
    assert_eq!(sources["evictionMaxPodGracePeriod"], "NodeConfiguration c");
    assert!(!sources.contains_key("imageMinimumGCAge"));

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

/// A resource named `name` of `generation` selecting `pool=<pool>`.
fn in_pool(name: &str, generation: i64, pool: &str) -> NodeConfiguration {
    let selector = serde_json::json!({ "matchLabels": { "pool": pool } });
    resource(name, generation, selector, serde_json::json!({}))
}

fn node(name: &str, pool: &str, annotations: &[(&str, String)]) -> report::NodeReport {
    let labels = [("pool".to_string(), pool.to_string())].into();
    let annotations = annotations
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect();
    report::NodeReport::read(name, &labels, &annotations)
}

/// What nodes report on their Nodes makes each resource's status: the
/// selected nodes that reported, how many applied and refused the current
/// generation, and why; a report of an older generation counts as
/// selected only; a node not selected, or silent, is not counted.
#[test]
fn a_resources_status_counts_what_the_selected_nodes_reported() {
    use decide::Verdict;
    let verdicts = [
        Verdict {
            name: "gc".into(),
            generation: 3,
            refused: None,
        },
        Verdict {
            name: "evict".into(),
            generation: 2,
            refused: Some(("Conflict", "x".repeat(1000))),
        },
    ];
    let applied = report::applied_annotation(&verdicts);
    assert_eq!(applied, "gc/3");
    let refused = report::refused_annotation(&verdicts).expect("one refused");
    let nodes = [
        node(
            "a",
            "blue",
            &[
                (report::APPLIED_ANNOTATION, applied.clone()),
                (report::REFUSED_ANNOTATION, refused.clone()),
            ],
        ),
        node("b", "blue", &[(report::APPLIED_ANNOTATION, "gc/2".into())]),
        node("c", "blue", &[]),
        node("d", "green", &[(report::APPLIED_ANNOTATION, "gc/3".into())]),
        node(
            "e",
            "blue",
            &[(report::REFUSED_ANNOTATION, "not json".into())],
        ),
    ];
    let gc = report::status(&in_pool("gc", 3, "blue"), &nodes);
    assert_eq!(
        (gc.observed_generation, gc.selected, gc.applied, gc.refused),
        (Some(3), 2, 1, 0)
    );
    assert!(gc.refusals.is_empty());
    let evict = report::status(&in_pool("evict", 2, "blue"), &nodes);
    assert_eq!((evict.selected, evict.applied, evict.refused), (1, 0, 1));
    assert_eq!(evict.refusals[0].node, "a");
    assert_eq!(evict.refusals[0].reason, "Conflict");
    assert!(evict.refusals[0].message.chars().count() <= report::MAX_REFUSAL_MESSAGE + 1);
    // Bounded: a node lists at most MAX_REFUSALS, and a status as many.
    let many: Vec<Verdict> = (0..100)
        .map(|i| Verdict {
            name: format!("r{i}"),
            generation: 1,
            refused: Some(("Invalid", "bad".into())),
        })
        .collect();
    let text = report::refused_annotation(&many).unwrap();
    let listed: Vec<report::Refused> = serde_json::from_str(&text).unwrap();
    assert_eq!(listed.len(), resource::MAX_REFUSALS);
    let crowd: Vec<report::NodeReport> = (0..50)
        .map(|i| {
            node(
                &format!("n{i:02}"),
                "blue",
                &[(report::REFUSED_ANNOTATION, refused.clone())],
            )
        })
        .collect();
    let evict = report::status(&in_pool("evict", 2, "blue"), &crowd);
    assert_eq!((evict.selected, evict.refused), (50, 50));
    assert_eq!(evict.refusals.len(), resource::MAX_REFUSALS);
    assert_eq!(evict.refusals[0].node, "n00");
    assert_eq!(report::refused_annotation(&verdicts[..1]), None);
}
