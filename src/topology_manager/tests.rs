//! The merge, table-tested with the cases of the kubelet's
//! `commonPolicyMergeTestCases` and the policies' own tables
//! (pkg/kubelet/cm/topologymanager/policy_*_test.go).

use super::*;

fn four_nodes() -> NumaInfo {
    NumaInfo {
        nodes: vec![0, 1, 2, 3],
        distances: BTreeMap::from([
            (0, vec![10, 11, 12, 12]),
            (1, vec![11, 10, 12, 12]),
            (2, vec![12, 12, 10, 11]),
            (3, vec![12, 12, 11, 10]),
        ]),
    }
}

fn eight_nodes() -> NumaInfo {
    NumaInfo {
        nodes: (0..8).collect(),
        distances: BTreeMap::from([
            (0, vec![10, 11, 12, 12, 30, 30, 30, 30]),
            (1, vec![11, 10, 12, 12, 30, 30, 30, 30]),
            (2, vec![12, 12, 10, 11, 30, 30, 30, 30]),
            (3, vec![12, 12, 11, 10, 30, 30, 30, 30]),
            (4, vec![30, 30, 30, 30, 10, 11, 12, 12]),
            (5, vec![30, 30, 30, 30, 11, 10, 12, 12]),
            (6, vec![30, 30, 30, 30, 12, 12, 10, 11]),
            (7, vec![30, 30, 30, 30, 12, 12, 13, 10]),
        ]),
    }
}

/// A hint: `h(&[0, 1], true)`.
fn h(nodes: &[usize], preferred: bool) -> Hint {
    Hint::new(nodes, preferred)
}

/// One provider with one resource's hints.
fn p(resource: &str, hints: Option<Vec<Hint>>) -> ProviderHints {
    Some(BTreeMap::from([(resource.to_string(), hints)]))
}

fn run(
    policy: Policy,
    closest: bool,
    info: &NumaInfo,
    providers: &[ProviderHints],
) -> (Hint, bool) {
    let options = Options {
        prefer_closest_numa_nodes: closest,
        ..Options::default()
    };
    merge(policy, &options, info, providers).unwrap()
}

#[test]
fn masks_order_and_subsets_as_the_kubelets_bitmask() {
    let m = NumaMask::of(&[0, 2]);
    assert_eq!(m.count(), 2);
    assert_eq!(m.nodes(), [0, 2]);
    assert!(NumaMask::of(&[3]).is_narrower_than(m));
    assert!(
        NumaMask::of(&[0, 1]).is_narrower_than(m),
        "same count, lower value"
    );
    assert!(!m.is_narrower_than(m));
    let subsets: Vec<Vec<usize>> = NumaMask::subsets(&[0, 1, 2])
        .into_iter()
        .map(NumaMask::nodes)
        .collect();
    assert_eq!(
        subsets,
        [
            vec![0],
            vec![1],
            vec![2],
            vec![0, 1],
            vec![0, 2],
            vec![1, 2],
            vec![0, 1, 2]
        ]
    );
    assert_eq!(NumaMask::subsets(&[0, 1, 2, 3, 4, 5, 6, 7]).len(), 255);
}

/// Each case merged under the three policies: `best` under best-effort
/// (always admitted) and restricted (admitted when preferred), `single`
/// under single-numa-node when given.
fn check_cases(info: &NumaInfo, cases: Vec<(&str, Vec<ProviderHints>, Hint, Option<Hint>)>) {
    for (case, providers, best, single) in cases {
        assert_eq!(
            run(Policy::BestEffort, false, info, &providers),
            (best, true),
            "best-effort: {case}"
        );
        assert_eq!(
            run(Policy::Restricted, false, info, &providers),
            (best, best.preferred),
            "restricted: {case}"
        );
        if let Some(single) = single {
            assert_eq!(
                run(Policy::SingleNumaNode, false, info, &providers),
                (single, single.preferred),
                "single-numa-node: {case}"
            );
        }
    }
}

#[test]
fn the_common_merge_cases_under_best_effort_restricted_and_single_numa_node() {
    let info = four_nodes();
    let all = h(&[0, 1, 2, 3], true);
    let all_f = h(&[0, 1, 2, 3], false);
    let none_t = Hint {
        affinity: None,
        preferred: true,
    };
    let none_f = Hint {
        affinity: None,
        preferred: false,
    };
    // (case, providers, best-effort/restricted result, single-numa-node result)
    let cases: Vec<(&str, Vec<ProviderHints>, Hint, Option<Hint>)> = vec![
        (
            "two providers, node 0 each",
            vec![
                p("r1", Some(vec![h(&[0], true)])),
                p("r2", Some(vec![h(&[0], true)])),
            ],
            h(&[0], true),
            Some(h(&[0], true)),
        ),
        ("no providers", vec![], all, Some(none_t)),
        ("a provider with no hints", vec![None], all, Some(none_t)),
        (
            "a resource without preference",
            vec![p("r", None)],
            all,
            Some(none_t),
        ),
        (
            "a resource no node can hold",
            vec![p("r", Some(vec![]))],
            all_f,
            Some(none_f),
        ),
        (
            "an any-node non-preferred hint",
            vec![p("r", Some(vec![none_f]))],
            all_f,
            Some(none_f),
        ),
        (
            "no node in common",
            vec![
                p("r1", Some(vec![h(&[0], true)])),
                p("r2", Some(vec![h(&[1], true)])),
            ],
            all_f,
            Some(none_f),
        ),
        (
            "one non-preferred",
            vec![
                p("r1", Some(vec![h(&[0], true)])),
                p("r2", Some(vec![h(&[0], false)])),
            ],
            h(&[0], false),
            Some(none_f),
        ),
        (
            "preferred masks that differ merge non-preferred",
            vec![
                p("r1", Some(vec![h(&[0], true)])),
                p("r2", Some(vec![h(&[0, 1], true)])),
            ],
            h(&[0], false),
            Some(none_f),
        ),
        (
            "two preferred singles against a wide non-preferred",
            vec![
                p("r1", Some(vec![h(&[0], true), h(&[1], true)])),
                p("r2", Some(vec![h(&[0, 1], false)])),
            ],
            h(&[0], false),
            Some(none_f),
        ),
        (
            "the one node both prefer",
            vec![
                p("r1", Some(vec![h(&[1], true), h(&[0, 1], false)])),
                p(
                    "r2",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
            ],
            h(&[1], true),
            Some(h(&[1], true)),
        ),
        (
            "two preferred pairs: the lower",
            vec![
                p("r1", Some(vec![h(&[0, 1], true), h(&[0, 2], true)])),
                p("r2", Some(vec![h(&[0, 1], true), h(&[0, 2], true)])),
            ],
            h(&[0, 1], true),
            None,
        ),
        (
            "non-preferred: the pair both can hold",
            vec![
                p("r1", Some(vec![all_f, h(&[0, 1], false)])),
                p("r2", Some(vec![h(&[1, 2], false), h(&[2, 3], false)])),
            ],
            h(&[1, 2], false),
            None,
        ),
        (
            "non-preferred: the narrowest at the best count",
            vec![
                p("r1", Some(vec![all_f, h(&[0, 1], false)])),
                p(
                    "r2",
                    Some(vec![
                        h(&[1, 2, 3], false),
                        h(&[1, 2], false),
                        h(&[1, 3], false),
                        h(&[2, 3], false),
                    ]),
                ),
            ],
            h(&[1, 2], false),
            None,
        ),
        (
            "another provider without preference",
            vec![
                p(
                    "r1",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
                None,
            ],
            h(&[0], true),
            Some(h(&[0], true)),
        ),
    ];
    check_cases(&info, cases);
}

/// The merge cases of pairs and of one provider with two resources.
#[test]
fn non_preferred_pairs_and_two_resources_of_one_provider() {
    let info = four_nodes();
    let all_f = h(&[0, 1, 2, 3], false);
    let none_f = Hint {
        affinity: None,
        preferred: false,
    };
    // Each non-preferred pair r2 offers is taken against r1's {0,1}/all.
    for pair in [[0, 1], [0, 3], [1, 2], [2, 3]] {
        let providers = [
            p("r1", Some(vec![all_f, h(&[0, 1], false)])),
            p("r2", Some(vec![h(&pair, false)])),
        ];
        assert_eq!(
            run(Policy::BestEffort, false, &info, &providers).0,
            h(&pair, false)
        );
    }
    // One provider, two resources: single-numa-node finds no single node
    // both prefer.
    let one = Some(BTreeMap::from([
        ("r1".to_string(), Some(vec![h(&[0, 1], true)])),
        (
            "r2".to_string(),
            Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
        ),
    ]));
    assert_eq!(
        run(Policy::SingleNumaNode, false, &info, &[one]),
        (none_f, false)
    );
}

#[test]
fn prefer_closest_numa_nodes_breaks_ties_by_distance() {
    let info = eight_nodes();
    let f = |nodes: &[usize]| h(nodes, false);
    let cases: Vec<(Vec<ProviderHints>, Hint, Hint)> = vec![
        (
            vec![
                p("r1", Some(vec![f(&[0, 1, 2, 3]), f(&[0, 1])])),
                p("r2", Some(vec![f(&[1, 2]), f(&[2, 3])])),
            ],
            f(&[2, 3]),
            f(&[1, 2]),
        ),
        (
            vec![
                p("r1", Some(vec![h(&[0, 4], true), h(&[0, 2], true)])),
                p("r2", Some(vec![h(&[0, 4], true), h(&[0, 2], true)])),
            ],
            h(&[0, 2], true),
            h(&[0, 2], true),
        ),
        (
            vec![
                p("r1", Some(vec![h(&[4], true), h(&[0, 2], true)])),
                p("r2", Some(vec![h(&[4], true), h(&[0, 2], true)])),
            ],
            h(&[4], true),
            h(&[4], true),
        ),
    ];
    for (providers, closest, narrowest) in cases {
        assert_eq!(run(Policy::BestEffort, true, &info, &providers).0, closest);
        assert_eq!(run(Policy::Restricted, true, &info, &providers).0, closest);
        assert_eq!(
            run(Policy::BestEffort, false, &info, &providers).0,
            narrowest
        );
    }
}

#[test]
fn policy_none_admits_without_merging_and_huge_products_are_refused() {
    let info = four_nodes();
    let none = run(Policy::None, false, &info, &[p("r", Some(vec![]))]);
    assert_eq!(none, (Hint::default(), true));
    // 255 hints for each of three resources is past the bound.
    let masks: Vec<Hint> = NumaMask::subsets(&[0, 1, 2, 3, 4, 5, 6, 7])
        .into_iter()
        .map(|m| Hint {
            affinity: Some(m),
            preferred: false,
        })
        .collect();
    let providers: Vec<ProviderHints> = (0..3)
        .map(|i| p(&format!("r{i}"), Some(masks.clone())))
        .collect();
    assert!(
        merge(
            Policy::BestEffort,
            &Options::default(),
            &eight_nodes(),
            &providers
        )
        .is_none()
    );
}

#[test]
fn options_and_names_are_read_with_the_kubelets_messages() {
    let opts = |pairs: &[(&str, &str)]| {
        Options::parse(
            &pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        )
    };
    assert_eq!(opts(&[]).unwrap(), Options::default());
    let o = opts(&[
        ("prefer-closest-numa-nodes", "true"),
        ("max-allowable-numa-nodes", "16"),
    ])
    .unwrap();
    assert!(o.prefer_closest_numa_nodes);
    assert_eq!(o.max_allowable_numa_nodes, 16);
    assert_eq!(
        opts(&[("max-allowable-numa-nodes", "4")]).unwrap_err(),
        "the minimum value of \"max-allowable-numa-nodes\" should not be less than 8"
    );
    assert_eq!(
        opts(&[("prefer-closest-numa-nodes", "yes")]).unwrap_err(),
        "bad value for option \"prefer-closest-numa-nodes\": strconv.ParseBool: parsing \"yes\": invalid syntax"
    );
    assert_eq!(
        opts(&[("align", "true")]).unwrap_err(),
        "unknown Topology Manager Policy option: \"align\""
    );
    assert_eq!(
        Options::default()
            .check_machine(Policy::BestEffort, 9)
            .unwrap_err(),
        "unsupported on machines with more than 8 NUMA Nodes"
    );
    assert!(Options::default().check_machine(Policy::None, 9).is_ok());
    let wide = Options {
        max_allowable_numa_nodes: 64,
        ..Options::default()
    };
    assert!(wide.check_machine(Policy::Restricted, 16).is_ok());
    assert!(
        wide.check_machine(Policy::Restricted, 17)
            .unwrap_err()
            .contains("more than 16")
    );
    assert_eq!(
        Policy::parse("single-numa-node"),
        Ok(Policy::SingleNumaNode)
    );
    assert_eq!(
        Policy::parse("x").unwrap_err(),
        "topologyManagerPolicy (--topology-manager-policy) \"x\" must be one of: [\"none\" \"best-effort\" \"restricted\" \"single-numa-node\"]"
    );
    assert_eq!(Scope::parse("pod"), Ok(Scope::Pod));
    assert_eq!(
        Scope::parse("node").unwrap_err(),
        "topologyManagerScope (--topology-manager-scope) \"node\" must be one of: \"container\", or \"pod\""
    );
}
