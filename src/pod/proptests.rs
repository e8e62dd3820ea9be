//! Property test of the pure pod pipeline: generated pod specs with hostile
//! values (int64 ends of grace periods and deadlines, negative and huge probe
//! timings, quantities such as `9e15`, `1Ei`, `-1` or not quantities at all,
//! ports out of range, empty, huge and unicode names, many containers,
//! sidecars, `$(VAR)` nesting, volumes of every kind, `..` sub paths, extreme
//! user and group IDs), with generated runtime states, probe results, pull
//! back-offs and times, go through admission, the plan, the CRI configs, the
//! environment, the volume payloads and the status, as one sync of the pod
//! worker would. Nothing may panic, and the results keep their invariants
//! (see [`check_sync`]).
//!
//! The number of cases is [`DEFAULT_CASES`] (well under a minute in a debug
//! build on two cores), or `PROPTEST_CASES` for a longer run by hand:
//! `PROPTEST_CASES=20000 cargo test --lib pod::proptests`. Under `CI=true`
//! the seed is fixed (every CI run tries the same cases, and a failure there
//! fails again); elsewhere each run takes a new one, and a failure names it
//! (`PROPTEST_RNG_SEED=<seed>` runs those cases again).

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection,
    ConfigMapVolumeSource, Container, ContainerPort, ContainerRestartRule,
    ContainerRestartRuleOnExitCodes, ContainerState as ApiContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, DownwardAPIProjection,
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource, EnvFromSource, EnvVar,
    EnvVarSource, EphemeralContainer, ExecAction, GRPCAction, HTTPGetAction, HostAlias,
    HostPathVolumeSource, KeyToPath, Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod,
    PodCondition, PodDNSConfig, PodDNSConfigOption, PodIP, PodOS, PodReadinessGate,
    PodSecurityContext, PodSpec, PodStatus, Probe, ProjectedVolumeSource, ResourceFieldSelector,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    ServiceAccountTokenProjection, SleepAction, Sysctl, TCPSocketAction, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::lifecycle;
use crate::pod_core::facts::{HostDns, NodeContext, PodFacts};
use crate::pod_core::plan::{self, PullBackoff, Step, Volumes};
use crate::pod_core::runtime::{
    Container as RuntimeContainer, ContainerState, PodRuntime, Sandbox,
};
use crate::pod_core::translate;
use crate::pod_core::{admit, env, hosts, spec, status};
use crate::prober::{ContainerProbes, ProbeKind, ProbeState, Timing};
use crate::reasons::phase;

/// Cases per run without `PROPTEST_CASES`.
const DEFAULT_CASES: u32 = 1000;

/// Container names the runtime states are drawn from, so that records meet
/// the spec's containers.
const NAMES: &[&str] = &["a", "b", "c", "init", "side", "dbg"];

// ---------------------------------------------------------------- numbers

fn hostile_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => prop::sample::select(vec![
            i64::MIN,
            i64::MIN + 1,
            -1,
            0,
            1,
            2,
            30,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            i64::from(u32::MAX),
            253_402_300_799, // the last second of year 9999
            i64::MAX / 1_000_000_000,
            i64::MAX - 1,
            i64::MAX,
        ]),
        1 => any::<i64>(),
        1 => -100i64..100,
    ]
}

fn hostile_i32() -> impl Strategy<Value = i32> {
    prop_oneof![
        4 => prop::sample::select(vec![
            i32::MIN,
            -65_536,
            -1,
            0,
            1,
            80,
            65_535,
            65_536,
            i32::MAX - 1,
            i32::MAX,
        ]),
        1 => any::<i32>(),
        1 => -10i32..10,
    ]
}

fn quantity_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "0", "1", "-1", "100m", "0.5", "9e15", "1Ei", "8Ei", "-8Ei", "99999999999999Pi",
            "1Pi", "64Mi", "1e30", "-1e30", "1e-30", "1e2147483647", "1e-9223372036854775808",
            "9223372036854775807", "9223372036854775808", "-9223372036854775808", "1n", "1.5Gi",
            "", " ", "abc", "1Qi", "1e", "--1", "+1", ".", "1..2", "0x10", "١٢", "NaN", "inf",
            "1E18", "170141183460469231731687303715884105727",
            "1701411834604692317316873037158841057271e9",
        ])
        .prop_map(str::to_string),
        1 => "[-+]?[0-9]{0,25}(\\.[0-9]{0,12})?([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]{1,20})?",
        1 => any::<String>(),
    ]
}

fn quantity() -> impl Strategy<Value = Quantity> {
    quantity_text().prop_map(Quantity)
}

/// Times the API can carry (`metav1.Time`: years 0 to 9999) and beyond, to
/// the ends of what a timestamp holds.
fn api_timestamp() -> impl Strategy<Value = Timestamp> {
    let min = Timestamp::MIN.as_second();
    let max = Timestamp::MAX.as_second();
    prop_oneof![
        2 => prop::sample::select(vec![
            min,
            min + 1,
            -62_135_596_800, // 0001-01-01
            -1,
            0,
            1_700_000_000,
            1_700_000_030,
            253_402_300_799,
            max - 1,
            max,
        ]),
        2 => 1_699_999_000i64..1_700_001_000,
        1 => min..=max,
    ]
    .prop_map(move |s| Timestamp::from_second(s.clamp(min, max)).expect("in range"))
}

/// Times a runtime reports: CRI's nanoseconds of an `i64`.
fn runtime_timestamp() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        2 => prop::sample::select(vec![i64::MIN, -1, 0, 1, i64::MAX]),
        3 => (1_699_999_000i64..1_700_001_000).prop_map(|s| s * 1_000_000_000),
        1 => any::<i64>(),
    ]
    .prop_map(|n| Timestamp::from_nanosecond(i128::from(n)).expect("in range"))
}

// ---------------------------------------------------------------- strings

fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "".to_string(),
            "a".into(),
            "web".into(),
            "x".repeat(300),
            "-".repeat(70),
            "ünïcødé-🙂".into(),
            "a.b.c".into(),
            "..".into(),
            "../../etc".into(),
            "a/../../b".into(),
            "/abs/path".into(),
            "$(A)".into(),
            "$(A$(B))".into(),
            "$$(A)".into(),
            "$(".into(),
            "nul\0byte".into(),
            "new\nline".into(),
            "UPPER_case-1".into(),
        ]),
        1 => any::<String>(),
        1 => "[a-z0-9.-]{0,80}",
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(NAMES.to_vec()).prop_map(str::to_string),
        1 => hostile_string(),
    ]
}

fn opt<S: Strategy>(s: S) -> impl Strategy<Value = Option<S::Value>> {
    prop::option::weighted(0.6, s)
}

/// An environment value: `$(VAR)` nesting, escapes, huge values.
fn env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "$(A)".to_string(),
            "$(B)-$(A)".into(),
            "$(A$(B))".into(),
            "$$(A)".into(),
            "$$$(A)".into(),
            "$(".into(),
            "$()".into(),
            "$(UNDEFINED)".into(),
            "$(A)".repeat(2000),
            "v".repeat(1 << 17),
            "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)".into(),
        ]),
        1 => hostile_string(),
    ]
}

// ---------------------------------------------------------------- spec parts

fn env_var() -> impl Strategy<Value = EnvVar> {
    let value_from = prop_oneof![
        prop::sample::select(vec![
            "metadata.name",
            "metadata.namespace",
            "metadata.uid",
            "metadata.labels['x']",
            "metadata.annotations['y']",
            "metadata.labels",
            "spec.nodeName",
            "status.podIP",
            "status.hostIPs",
            "bogus",
        ])
        .prop_map(|p| EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: p.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        (
            opt(name()),
            prop::sample::select(vec![
                "limits.cpu",
                "requests.cpu",
                "limits.memory",
                "requests.memory",
                "limits.ephemeral-storage",
                "limits.hugepages-2Mi",
                "limits.gpu",
                "cpu",
            ]),
            opt(quantity()),
        )
            .prop_map(|(c, r, d)| EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: c,
                    resource: r.into(),
                    divisor: d,
                }),
                ..Default::default()
            }),
        (hostile_string(), hostile_string(), opt(any::<bool>())).prop_map(|(n, k, o)| {
            EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: n,
                    key: k,
                    optional: o,
                }),
                ..Default::default()
            }
        }),
        (hostile_string(), hostile_string(), opt(any::<bool>())).prop_map(|(n, k, o)| {
            EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: n,
                    key: k,
                    optional: o,
                }),
                ..Default::default()
            }
        }),
    ];
    (
        prop_oneof![
            3 => prop::sample::select(vec!["A", "B", "C", "KUBERNETES_SERVICE_HOST"])
                .prop_map(str::to_string),
            1 => hostile_string(),
        ],
        opt(env_value()),
        prop::option::weighted(0.3, value_from),
    )
        .prop_map(|(name, value, value_from)| EnvVar {
            name,
            value,
            value_from,
        })
}

fn amounts() -> impl Strategy<Value = BTreeMap<String, Quantity>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["cpu", "memory", "ephemeral-storage", "hugepages-2Mi"])
            .prop_map(str::to_string),
        quantity(),
        0..4,
    )
}

fn resources() -> impl Strategy<Value = ResourceRequirements> {
    (opt(amounts()), opt(amounts())).prop_map(|(limits, requests)| ResourceRequirements {
        limits,
        requests,
        ..Default::default()
    })
}

fn port() -> impl Strategy<Value = IntOrString> {
    prop_oneof![
        hostile_i32().prop_map(IntOrString::Int),
        prop::sample::select(vec!["http", "80", "65536", "-1", "", "9999999999"])
            .prop_map(|s| IntOrString::String(s.into())),
    ]
}

fn probe() -> impl Strategy<Value = Probe> {
    let handler = prop_oneof![
        Just((None, None, None, None)),
        Just((
            Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            None,
            None,
            None
        )),
        (port(), opt(hostile_string())).prop_map(|(p, host)| (
            None,
            Some(HTTPGetAction {
                port: p,
                host,
                path: Some("/$(A)".into()),
                ..Default::default()
            }),
            None,
            None
        )),
        port().prop_map(|p| (
            None,
            None,
            Some(TCPSocketAction {
                port: p,
                host: None
            }),
            None
        )),
        (hostile_i32(), opt(hostile_string())).prop_map(|(p, service)| (
            None,
            None,
            None,
            Some(GRPCAction {
                port: p,
                service,
                ..Default::default()
            })
        )),
    ];
    (
        handler,
        (
            opt(hostile_i32()),
            opt(hostile_i32()),
            opt(hostile_i32()),
            opt(hostile_i32()),
            opt(hostile_i32()),
        ),
        opt(hostile_i64()),
    )
        .prop_map(
            |((exec, http_get, tcp_socket, grpc), (delay, period, timeout, ok, fail), grace)| {
                Probe {
                    exec,
                    http_get,
                    tcp_socket,
                    grpc,
                    initial_delay_seconds: delay,
                    period_seconds: period,
                    timeout_seconds: timeout,
                    success_threshold: ok,
                    failure_threshold: fail,
                    termination_grace_period_seconds: grace,
                }
            },
        )
}

fn hook() -> impl Strategy<Value = LifecycleHandler> {
    prop_oneof![
        hostile_i64().prop_map(|seconds| LifecycleHandler {
            sleep: Some(SleepAction { seconds }),
            ..Default::default()
        }),
        Just(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["sleep".into(), "100000".into()]),
            }),
            ..Default::default()
        }),
        port().prop_map(|port| LifecycleHandler {
            http_get: Some(HTTPGetAction {
                port,
                ..Default::default()
            }),
            ..Default::default()
        }),
        Just(LifecycleHandler::default()),
    ]
}

fn security_context() -> impl Strategy<Value = SecurityContext> {
    (
        opt(hostile_i64()),
        opt(hostile_i64()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(prop::sample::select(vec!["Default", "Unmasked", "bogus"])),
        opt(prop::sample::select(vec![
            "RuntimeDefault",
            "Localhost",
            "Unconfined",
            "bogus",
        ])),
        opt(prop::collection::vec(hostile_string(), 0..3)),
        prop_oneof![
            Just("../../../etc/passwd".to_string()),
            Just("/etc/passwd".to_string()),
            Just("profiles/ok.json".to_string()),
            hostile_string(),
        ],
        opt(prop::sample::select(vec![
            "RuntimeDefault",
            "Localhost",
            "Unconfined",
            "bogus",
        ])),
    )
        .prop_map(
            |(
                uid,
                gid,
                non_root,
                privileged,
                escalation,
                proc_mount,
                seccomp,
                caps,
                localhost,
                apparmor,
            )| {
                SecurityContext {
                    run_as_user: uid,
                    run_as_group: gid,
                    run_as_non_root: non_root,
                    privileged,
                    allow_privilege_escalation: escalation,
                    proc_mount: proc_mount.map(Into::into),
                    seccomp_profile: seccomp.map(|t| SeccompProfile {
                        type_: t.into(),
                        localhost_profile: Some(localhost.clone()),
                    }),
                    app_armor_profile: apparmor.map(|t| AppArmorProfile {
                        type_: t.into(),
                        localhost_profile: Some(localhost),
                    }),
                    capabilities: caps.map(|c| Capabilities {
                        add: Some(c.clone()),
                        drop: Some(c),
                    }),
                    ..Default::default()
                }
            },
        )
}

fn volume_mount() -> impl Strategy<Value = VolumeMount> {
    (
        prop::sample::select(vec!["v0", "v1", "v2", "missing"]),
        hostile_string(),
        opt(hostile_string()),
        opt(prop::sample::select(vec![
            "$(A)/x",
            "$(UNDEFINED)",
            "$(A)/../..",
            "../$(B)",
            "$$(A)",
            "",
        ])),
        opt(prop::sample::select(vec![
            "None",
            "HostToContainer",
            "Bidirectional",
            "bogus",
        ])),
    )
        .prop_map(|(n, path, sub_path, expr, prop)| VolumeMount {
            name: n.into(),
            mount_path: path,
            sub_path,
            sub_path_expr: expr.map(Into::into),
            mount_propagation: prop.map(Into::into),
            ..Default::default()
        })
}

fn restart_policy() -> impl Strategy<Value = Option<String>> {
    opt(
        prop::sample::select(vec!["Always", "OnFailure", "Never", "bogus", ""])
            .prop_map(Into::into),
    )
}

fn restart_rules() -> impl Strategy<Value = Option<Vec<ContainerRestartRule>>> {
    opt(prop::collection::vec(
        (
            prop::sample::select(vec!["Restart", "RestartAllContainers", "bogus"]),
            prop::sample::select(vec!["In", "NotIn", "bogus"]),
            prop::collection::vec(hostile_i32(), 0..3),
        )
            .prop_map(|(action, op, codes)| ContainerRestartRule {
                action: action.into(),
                exit_codes: Some(ContainerRestartRuleOnExitCodes {
                    operator: op.into(),
                    values: Some(codes),
                }),
            }),
        0..3,
    ))
}

fn container() -> impl Strategy<Value = Container> {
    (
        (
            name(),
            opt(prop::sample::select(vec![
                "busybox:1.36",
                "",
                "bad image",
                "registry.example/x@sha256:00",
            ])),
            opt(prop::collection::vec(env_value(), 0..3)),
            opt(prop::collection::vec(env_value(), 0..3)),
            opt(prop::collection::vec(env_var(), 0..6)),
            opt(prop::collection::vec(
                (opt(hostile_string()), any::<bool>(), opt(any::<bool>())).prop_map(
                    |(prefix, cm, optional)| EnvFromSource {
                        prefix,
                        config_map_ref: cm.then(|| ConfigMapEnvSource {
                            name: "cm".into(),
                            optional,
                        }),
                        ..Default::default()
                    },
                ),
                0..2,
            )),
        ),
        (
            opt(prop::collection::vec(
                (
                    hostile_i32(),
                    opt(hostile_i32()),
                    opt(prop::sample::select(vec![
                        "http",
                        "",
                        "a-port-name-too-long",
                    ])),
                    opt(prop::sample::select(vec!["TCP", "UDP", "SCTP", "bogus"])),
                )
                    .prop_map(|(container_port, host_port, name, protocol)| {
                        ContainerPort {
                            container_port,
                            host_port,
                            name: name.map(Into::into),
                            protocol: protocol.map(Into::into),
                            ..Default::default()
                        }
                    }),
                0..3,
            )),
            opt(resources()),
            opt(probe()),
            opt(probe()),
            opt(probe()),
            opt((opt(hook()), opt(hook()))),
        ),
        (
            opt(security_context()),
            opt(prop::collection::vec(volume_mount(), 0..3)),
            restart_policy(),
            restart_rules(),
            opt(hostile_string()),
            opt(prop::sample::select(vec![
                "File",
                "FallbackToLogsOnError",
                "bogus",
            ])),
        ),
    )
        .prop_map(
            |(
                (name, image, command, args, env, env_from),
                (ports, resources, liveness, readiness, startup, hooks),
                (sc, mounts, restart_policy, rules, msg_path, msg_policy),
            )| Container {
                name,
                image: image.map(Into::into),
                command,
                args,
                env,
                env_from,
                ports,
                resources,
                liveness_probe: liveness,
                readiness_probe: readiness,
                startup_probe: startup,
                lifecycle: hooks.map(|(post_start, pre_stop)| Lifecycle {
                    post_start,
                    pre_stop,
                    ..Default::default()
                }),
                security_context: sc,
                volume_mounts: mounts,
                restart_policy,
                restart_policy_rules: rules,
                termination_message_path: msg_path,
                termination_message_policy: msg_policy.map(Into::into),
                ..Default::default()
            },
        )
}

fn downward_items() -> impl Strategy<Value = Vec<DownwardAPIVolumeFile>> {
    prop::collection::vec(
        (
            hostile_string(),
            opt(hostile_i32()),
            prop_oneof![
                prop::sample::select(vec!["metadata.labels", "metadata.name", "bogus"]).prop_map(
                    |p| (
                        Some(ObjectFieldSelector {
                            field_path: p.into(),
                            ..Default::default()
                        }),
                        None
                    )
                ),
                (
                    opt(name()),
                    prop::sample::select(vec!["limits.cpu", "requests.memory", "limits.x"]),
                    opt(quantity())
                )
                    .prop_map(|(c, r, d)| (
                        None,
                        Some(ResourceFieldSelector {
                            container_name: c,
                            resource: r.into(),
                            divisor: d,
                        })
                    )),
            ],
        )
            .prop_map(|(path, mode, (field_ref, resource_field_ref))| {
                DownwardAPIVolumeFile {
                    path,
                    mode,
                    field_ref,
                    resource_field_ref,
                    ..Default::default()
                }
            }),
        0..3,
    )
}

fn items() -> impl Strategy<Value = Option<Vec<KeyToPath>>> {
    opt(prop::collection::vec(
        (
            hostile_string(),
            hostile_string(),
            opt(hostile_i32()),
            opt(hostile_i64()),
        )
            .prop_map(|(key, path, mode, user)| KeyToPath {
                key,
                path,
                mode,
                user,
            }),
        0..3,
    ))
}

fn volume(name: &'static str) -> impl Strategy<Value = Volume> {
    prop_oneof![
        (
            opt(prop::sample::select(vec![
                "",
                "Memory",
                "HugePages",
                "bogus"
            ])),
            opt(quantity())
        )
            .prop_map(|(medium, size_limit)| Volume {
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: medium.map(Into::into),
                    size_limit,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        (items(), opt(hostile_i32()), opt(hostile_i64())).prop_map(
            |(items, default_mode, default_user)| Volume {
                config_map: Some(ConfigMapVolumeSource {
                    name: "cm".into(),
                    items,
                    default_mode,
                    default_user,
                    optional: Some(true),
                }),
                ..Default::default()
            }
        ),
        (items(), opt(hostile_i32()), opt(hostile_i64())).prop_map(
            |(items, default_mode, default_user)| Volume {
                secret: Some(SecretVolumeSource {
                    secret_name: Some("s".into()),
                    items,
                    default_mode,
                    default_user,
                    optional: Some(true),
                }),
                ..Default::default()
            }
        ),
        (downward_items(), opt(hostile_i32())).prop_map(|(items, default_mode)| Volume {
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(items),
                default_mode,
                ..Default::default()
            }),
            ..Default::default()
        }),
        (
            downward_items(),
            items(),
            opt(hostile_i64()),
            opt(hostile_i32()),
            opt(hostile_string())
        )
            .prop_map(|(downward, items, expiry, default_mode, audience)| Volume {
                projected: Some(ProjectedVolumeSource {
                    default_mode,
                    sources: Some(vec![
                        VolumeProjection {
                            downward_api: Some(DownwardAPIProjection {
                                items: Some(downward),
                            }),
                            ..Default::default()
                        },
                        VolumeProjection {
                            config_map: Some(ConfigMapProjection {
                                name: "cm".into(),
                                items,
                                optional: Some(true),
                            }),
                            ..Default::default()
                        },
                        VolumeProjection {
                            service_account_token: Some(ServiceAccountTokenProjection {
                                audience,
                                expiration_seconds: expiry,
                                path: "token".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        (
            hostile_string(),
            opt(prop::sample::select(vec!["", "Directory", "File", "bogus"]))
        )
            .prop_map(|(path, type_)| Volume {
                host_path: Some(HostPathVolumeSource {
                    path,
                    type_: type_.map(Into::into),
                }),
                ..Default::default()
            }),
        Just(Volume::default()),
    ]
    .prop_map(move |mut v| {
        v.name = name.into();
        v
    })
}

fn pod_security_context() -> impl Strategy<Value = PodSecurityContext> {
    (
        opt(hostile_i64()),
        opt(hostile_i64()),
        opt(hostile_i64()),
        opt(prop::collection::vec(hostile_i64(), 0..3)),
        opt(prop::collection::vec(
            (
                prop::sample::select(vec![
                    "net.ipv4.tcp_syncookies",
                    "kernel.shm_rmid_forced",
                    "net/ipv4/ip_local_port_range",
                    "kernel.msgmax",
                    "user.max_user_namespaces",
                    "vm.swappiness",
                    "",
                    ".",
                    "/",
                ]),
                hostile_string(),
            )
                .prop_map(|(name, value)| Sysctl {
                    name: name.into(),
                    value,
                }),
            0..3,
        )),
        opt(any::<bool>()),
    )
        .prop_map(
            |(uid, gid, fs_group, groups, sysctls, non_root)| PodSecurityContext {
                run_as_user: uid,
                run_as_group: gid,
                fs_group,
                supplemental_groups: groups,
                sysctls,
                run_as_non_root: non_root,
                ..Default::default()
            },
        )
}

/// The sidecars and regular init containers of a pod.
fn init_container() -> impl Strategy<Value = Container> {
    (container(), any::<bool>()).prop_map(|(mut c, sidecar)| {
        if sidecar {
            c.restart_policy = Some("Always".into());
            c.name = "side".into();
        } else if c.name.len() <= 1 {
            c.name = "init".into();
        }
        c
    })
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (
        (
            prop::collection::vec(container(), 0..5),
            opt(prop::collection::vec(init_container(), 0..3)),
            opt(prop::collection::vec(
                (container(), opt(name())).prop_map(|(c, target)| EphemeralContainer {
                    name: "dbg".into(),
                    image: c.image,
                    env: c.env,
                    target_container_name: target,
                    security_context: c.security_context,
                    ..Default::default()
                }),
                0..2,
            )),
            opt(hostile_i64()),
            opt(hostile_i64()),
            restart_policy(),
        ),
        (
            opt(any::<bool>()),
            opt(any::<bool>()),
            opt(any::<bool>()),
            opt(prop::sample::select(vec![
                "ClusterFirst",
                "ClusterFirstWithHostNet",
                "Default",
                "None",
                "bogus",
            ])),
            opt((
                opt(prop::collection::vec(hostile_string(), 0..3)),
                opt(prop::collection::vec(hostile_string(), 0..3)),
                opt(prop::collection::vec(
                    (opt(hostile_string()), opt(hostile_string()))
                        .prop_map(|(name, value)| PodDNSConfigOption { name, value }),
                    0..3,
                )),
            )),
            (
                opt(hostile_string()),
                opt(hostile_string()),
                opt(hostile_string()),
                opt(any::<bool>()),
            ),
        ),
        (
            opt(pod_security_context()),
            opt(prop::sample::select(vec!["linux", "windows", ""])),
            (volume("v0"), volume("v1"), volume("v2")),
            opt(prop::collection::vec(
                hostile_string().prop_map(|c| PodReadinessGate { condition_type: c }),
                0..2,
            )),
            opt(prop::collection::vec(
                (
                    opt(prop::collection::vec(hostile_string(), 0..3)),
                    hostile_string(),
                )
                    .prop_map(|(hostnames, ip)| HostAlias { hostnames, ip }),
                0..2,
            )),
            opt(any::<bool>()),
            opt(any::<bool>()),
        ),
    )
        .prop_map(
            |(
                (containers, init, ephemeral, grace, deadline, restart_policy),
                (host_network, host_pid, share_pid, dns_policy, dns, names),
                (psc, os, volumes, gates, aliases, links, host_users),
            )| PodSpec {
                containers,
                init_containers: init,
                ephemeral_containers: ephemeral,
                termination_grace_period_seconds: grace,
                active_deadline_seconds: deadline,
                restart_policy,
                host_network,
                host_pid,
                share_process_namespace: share_pid,
                dns_policy: dns_policy.map(Into::into),
                dns_config: dns.map(|(nameservers, searches, options)| PodDNSConfig {
                    nameservers,
                    searches,
                    options,
                }),
                hostname: names.0,
                subdomain: names.1,
                hostname_override: names.2,
                set_hostname_as_fqdn: names.3,
                security_context: psc,
                os: os.map(|name| PodOS { name: name.into() }),
                volumes: Some(vec![volumes.0, volumes.1, volumes.2]),
                readiness_gates: gates,
                host_aliases: aliases,
                enable_service_links: links,
                host_users,
                ..Default::default()
            },
        )
}

/// A container status the API may hold from an earlier sync.
fn old_container_status() -> impl Strategy<Value = ContainerStatus> {
    (name(), 0u8..4, hostile_i32(), opt(api_timestamp())).prop_map(|(name, state, code, at)| {
        let at = at.map(Time);
        let state = match state {
            0 => ApiContainerState {
                running: Some(ContainerStateRunning { started_at: at }),
                ..Default::default()
            },
            1 => ApiContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    finished_at: at,
                    ..Default::default()
                }),
                ..Default::default()
            },
            2 => ApiContainerState {
                waiting: Some(ContainerStateWaiting::default()),
                ..Default::default()
            },
            _ => ApiContainerState::default(),
        };
        ContainerStatus {
            name,
            state: Some(state),
            restart_count: code,
            ..Default::default()
        }
    })
}

fn pod_status() -> impl Strategy<Value = PodStatus> {
    (
        opt(prop::sample::select(vec![
            "Pending",
            "Running",
            "Succeeded",
            "Failed",
            "Unknown",
            "bogus",
        ])),
        opt(api_timestamp()),
        opt(prop::collection::vec(old_container_status(), 0..3)),
        opt(prop::collection::vec(old_container_status(), 0..2)),
        opt(prop::collection::vec(
            (
                prop::sample::select(vec!["Ready", "Initialized", "PodScheduled", "x"]),
                prop::sample::select(vec!["True", "False", "Unknown"]),
                opt(api_timestamp()),
            )
                .prop_map(|(type_, status, at)| PodCondition {
                    type_: type_.into(),
                    status: status.into(),
                    last_transition_time: at.map(Time),
                    ..Default::default()
                }),
            0..3,
        )),
        opt(prop::collection::vec(
            prop::sample::select(vec!["10.88.0.2", "", "not an ip", "fd00::1"])
                .prop_map(|ip| PodIP { ip: ip.into() }),
            0..2,
        )),
    )
        .prop_map(
            |(phase, start, statuses, ephemeral, conditions, ips)| PodStatus {
                phase: phase.map(Into::into),
                start_time: start.map(Time),
                container_statuses: statuses,
                ephemeral_container_statuses: ephemeral,
                conditions,
                pod_ips: ips,
                ..Default::default()
            },
        )
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        pod_spec(),
        (hostile_string(), opt(hostile_string()), hostile_string()),
        opt((api_timestamp(), opt(hostile_i64()))),
        opt(pod_status()),
        opt(hostile_i64()),
        opt(prop::collection::btree_map(
            hostile_string(),
            hostile_string(),
            0..3,
        )),
    )
        .prop_map(
            |(spec, (name, ns, uid), deletion, status, generation, labels)| {
                let mut p = Pod {
                    spec: Some(spec),
                    status,
                    ..Default::default()
                };
                p.metadata.name = Some(name);
                p.metadata.namespace = ns;
                p.metadata.uid = Some(uid);
                p.metadata.generation = generation;
                p.metadata.labels = labels.clone();
                p.metadata.annotations = labels;
                if let Some((at, grace)) = deletion {
                    p.metadata.deletion_timestamp = Some(Time(at));
                    p.metadata.deletion_grace_period_seconds = grace;
                }
                p
            },
        )
}

// ---------------------------------------------------------------- runtime

fn runtime_state() -> impl Strategy<Value = PodRuntime> {
    let attempt = prop_oneof![
        3 => 0u32..4,
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ];
    let sandboxes = prop::collection::vec(
        (
            0usize..3,
            attempt.clone(),
            any::<bool>(),
            runtime_timestamp(),
        ),
        0..3,
    );
    let containers = prop::collection::vec(
        (
            name(),
            attempt,
            0usize..3,
            prop::sample::select(vec![
                ContainerState::Created,
                ContainerState::Running,
                ContainerState::Exited,
                ContainerState::Unknown,
            ]),
            (
                runtime_timestamp(),
                opt(runtime_timestamp()),
                opt(runtime_timestamp()),
            ),
            prop_oneof![Just(0), Just(1), Just(137), Just(-1), any::<i32>()],
            opt(hostile_string()),
        ),
        0..8,
    );
    (sandboxes, containers).prop_map(|(sandboxes, containers)| {
        let mut rt = PodRuntime {
            sandboxes: sandboxes
                .into_iter()
                .map(|(i, attempt, ready, created_at)| Sandbox {
                    id: format!("s{i}"),
                    attempt,
                    ready,
                    created_at,
                    ips: if ready {
                        vec!["10.88.0.2".into()]
                    } else {
                        vec![]
                    },
                })
                .collect(),
            containers: containers
                .into_iter()
                .enumerate()
                .map(
                    |(i, (name, attempt, s, state, (created, started, finished), code, hash))| {
                        RuntimeContainer {
                            id: format!("c{i}"),
                            name,
                            attempt,
                            sandbox_id: format!("s{s}"),
                            state,
                            created_at: created,
                            started_at: started,
                            finished_at: finished,
                            exit_code: code,
                            hash: hash.unwrap_or_default(),
                            ..Default::default()
                        }
                    },
                )
                .collect(),
        };
        rt.sort();
        rt
    })
}

fn probes() -> impl Strategy<Value = BTreeMap<String, ContainerProbes>> {
    prop::collection::btree_map(
        prop::sample::select(NAMES.to_vec()).prop_map(str::to_string),
        (
            any::<bool>(),
            any::<bool>(),
            opt(prop::sample::select(vec![
                ProbeKind::Startup,
                ProbeKind::Liveness,
                ProbeKind::Readiness,
            ])),
        )
            .prop_map(|(ready, started, failed)| ContainerProbes {
                ready,
                started,
                failed,
            }),
        0..4,
    )
}

fn pull_backoffs() -> impl Strategy<Value = BTreeMap<String, PullBackoff>> {
    prop::collection::btree_map(
        prop::sample::select(NAMES.to_vec()).prop_map(str::to_string),
        runtime_timestamp().prop_map(|until| PullBackoff {
            until,
            image: "busybox".into(),
        }),
        0..3,
    )
}

/// One generated sync: the pod and everything the worker feeds the pipeline.
#[derive(Debug, Clone)]
struct Case {
    pod: Pod,
    rt: PodRuntime,
    probes: BTreeMap<String, ContainerProbes>,
    backoffs: BTreeMap<String, PullBackoff>,
    volumes_ready: bool,
    now: Timestamp,
    allocatable: BTreeMap<String, Quantity>,
    memory_capacity: u64,
    /// The node's settings and abilities: seccompDefault, AppArmor enforced,
    /// the UserNamespacesSupport gate, Strict supplemental groups supported.
    node_flags: [bool; 4],
}

fn case() -> impl Strategy<Value = Case> {
    (
        pod(),
        runtime_state(),
        probes(),
        pull_backoffs(),
        any::<bool>(),
        runtime_timestamp(),
        prop::collection::btree_map(
            prop::sample::select(vec!["cpu", "memory", "ephemeral-storage"])
                .prop_map(str::to_string),
            quantity(),
            0..3,
        ),
        prop_oneof![Just(0u64), Just(1 << 30), Just(u64::MAX), any::<u64>()],
        any::<[bool; 4]>(),
    )
        .prop_map(
            |(
                pod,
                rt,
                probes,
                backoffs,
                volumes_ready,
                now,
                allocatable,
                memory_capacity,
                node_flags,
            )| Case {
                pod,
                rt,
                probes,
                backoffs,
                volumes_ready,
                now,
                allocatable,
                memory_capacity,
                node_flags,
            },
        )
}

// ---------------------------------------------------------------- checks

fn node(c: &Case) -> NodeContext {
    NodeContext {
        host_dns: HostDns::parse("nameserver 10.0.0.2\nsearch corp.example\noptions ndots:2\n"),
        cluster_dns: vec!["10.96.0.10".into()],
        allocatable: c.allocatable.clone(),
        memory_capacity_bytes: c.memory_capacity,
        allowed_unsafe_sysctls: vec!["kernel.msg*".into(), "net.core.somaxconn".into()],
        seccomp_default: c.node_flags[0],
        apparmor_enabled: c.node_flags[1],
        user_namespaces_support: c.node_flags[2],
        ..crate::fixtures::node_context()
    }
}

/// Every container of the pod as the runtime manager starts them.
fn all_containers(pod: &Pod) -> Vec<Container> {
    spec::init_containers(pod)
        .iter()
        .chain(spec::main_containers(pod))
        .cloned()
        .chain(spec::ephemeral_containers(pod))
        .collect()
}

/// The plan's invariants for `pod` against `rt`.
fn check_plan(pod: &Pod, rt: &PodRuntime, p: &plan::Plan, volumes: Volumes) {
    let starts = |s: &Step| {
        matches!(
            s,
            Step::CreateSandbox { .. }
                | Step::StartContainer { .. }
                | Step::StartEphemeralContainer { .. }
        )
    };
    if pod.metadata.deletion_timestamp.is_some() || spec::is_terminal(pod) || p.deadline_exceeded {
        assert!(
            !p.steps.iter().any(starts),
            "a terminated or terminating pod starts something: {:?}",
            p.steps
        );
    }
    if volumes == Volumes::NotReady {
        assert!(
            !p.steps
                .iter()
                .any(|s| matches!(s, Step::CreateSandbox { .. } | Step::StartContainer { .. })),
            "something starts before its volumes: {:?}",
            p.steps
        );
        assert!(p.requeue_after.is_some());
    }
    let names: Vec<&str> = spec::init_containers(pod)
        .iter()
        .chain(spec::main_containers(pod))
        .map(|c| c.name.as_str())
        .collect();
    for s in &p.steps {
        match s {
            Step::KillContainer {
                id, grace_seconds, ..
            } => {
                assert!(*grace_seconds >= 0, "negative grace period: {s:?}");
                assert!(
                    rt.containers
                        .iter()
                        .any(|c| &c.id == id && c.state == ContainerState::Running),
                    "kills what does not run: {s:?}"
                );
            }
            Step::StartContainer { name, .. } => {
                assert!(
                    names.contains(&name.as_str()),
                    "starts an unknown container: {s:?}"
                );
            }
            Step::StartEphemeralContainer { name, .. } => {
                assert!(spec::ephemeral_names(pod).any(|n| n == name), "{s:?}");
            }
            _ => {}
        }
    }
    assert_eq!(
        p.leading_kills().len(),
        p.steps
            .iter()
            .take_while(|s| matches!(s, Step::KillContainer { .. }))
            .count()
    );
}

/// The CRI resources' invariants: the kubelet's clamps.
fn check_resources(r: &cri::LinuxContainerResources) {
    assert!(
        (translate::MIN_SHARES..=translate::MAX_SHARES).contains(&r.cpu_shares),
        "cpu shares {}",
        r.cpu_shares
    );
    assert!(
        r.cpu_quota == 0 || r.cpu_quota >= translate::MIN_QUOTA_US,
        "cpu quota {}",
        r.cpu_quota
    );
    assert!(r.cpu_period == 0 || r.cpu_period == translate::CPU_PERIOD_US);
    assert!(
        r.memory_limit_in_bytes >= 0,
        "memory {}",
        r.memory_limit_in_bytes
    );
    assert!(
        (-1000..=1000).contains(&r.oom_score_adj),
        "oom_score_adj {}",
        r.oom_score_adj
    );
}

/// The CRI configs, environment, volume payloads and probe timings of every
/// container of the pod.
fn check_containers(c: &Case, node: &NodeContext) {
    let pod = &c.pod;
    let facts = PodFacts {
        pod_ips: vec!["10.88.0.2".into()],
        host_ips: vec!["10.0.0.1".into()],
    };
    let mut sources = env::EnvSources::default();
    sources.config_maps.insert(
        "cm".into(),
        BTreeMap::from([("A".into(), "$(B)".into()), ("1bad".into(), "x".into())]),
    );
    sources
        .services
        .insert("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into());
    let _ = env::referenced_sources(&spec::main_containers(pod).iter().collect::<Vec<_>>());
    for ctr in all_containers(pod) {
        let environment = env::environment(pod, &ctr, node, &facts, &sources);
        let vars = environment.unwrap_or_default();
        let by_name: BTreeMap<String, String> = vars.iter().cloned().collect();
        for m in ctr.volume_mounts.iter().flatten() {
            if let Ok(Some(sub)) = crate::volume::mounts::sub_path(m, &by_name) {
                assert!(!sub.starts_with('/'), "absolute sub path {sub:?}");
                assert!(
                    !std::path::Path::new(&sub)
                        .components()
                        .any(|x| x == std::path::Component::ParentDir),
                    "sub path leaves its volume: {sub:?}"
                );
            }
            let _ = crate::volume::mounts::propagation(m.mount_propagation.as_deref());
        }
        let config = translate::container_config(pod, &ctr, 3, "sha256:b", &vars, node, vec![]);
        if let Ok(config) = &config {
            let linux = config.linux.as_ref().expect("linux config");
            check_resources(linux.resources.as_ref().expect("resources"));
            let seccomp = linux
                .security_context
                .as_ref()
                .and_then(|s| s.seccomp.as_ref());
            if let Some(p) = seccomp.filter(|p| !p.localhost_ref.is_empty()) {
                let path = std::path::Path::new(&p.localhost_ref);
                assert!(
                    path.starts_with(node.root_dir.join("seccomp"))
                        && !path
                            .components()
                            .any(|x| x == std::path::Component::ParentDir),
                    "seccomp profile outside <root-dir>/seccomp: {path:?}"
                );
            }
        }
        let _ = translate::verify_run_as_non_root(pod, &ctr, Some(0), "");
        let _ = translate::verify_run_as_non_root(pod, &ctr, None, "nobody");
        let _ = hosts::should_mount(pod, &ctr, &facts.pod_ips);
        for probe in [
            &ctr.liveness_probe,
            &ctr.readiness_probe,
            &ctr.startup_probe,
        ]
        .into_iter()
        .flatten()
        {
            let timing = Timing::of(probe);
            assert!(timing.period >= std::time::Duration::from_secs(1));
            assert!(timing.timeout >= std::time::Duration::from_secs(1));
            assert!(timing.success_threshold >= 1 && timing.failure_threshold >= 1);
            for started in c.rt.containers.iter().filter_map(|x| x.started_at) {
                let _ = ProbeState::due(&timing, started, c.now);
            }
            let mut state = ProbeState::new(ProbeKind::Liveness);
            for ok in [false, false, true, false] {
                state.record(ok, &timing);
            }
            if let Some(h) = &probe.http_get {
                let _ = crate::prober::run::HttpTarget::of(h, &ctr, "10.88.0.2".parse().ok())
                    .map(|t| (t.url(), t.authority()));
            }
            if let Some(t) = &probe.tcp_socket {
                let _ = crate::prober::run::resolve_port(&t.port, &ctr);
            }
            if let Some(g) = probe.termination_grace_period_seconds {
                check_kill_budget(g);
            }
        }
        for h in ctr
            .lifecycle
            .iter()
            .flat_map(|l| [&l.post_start, &l.pre_stop])
            .flatten()
        {
            if let Some(http) = &h.http_get {
                let _ = crate::prober::run::HttpTarget::of(http, &ctr, None);
            }
        }
    }
    let handlers = [cri::RuntimeHandler {
        name: String::new(),
        features: Some(cri::RuntimeHandlerFeatures {
            recursive_read_only_mounts: false,
            user_namespaces: c.node_flags[2],
        }),
    }];
    let need = translate::user_namespace_need(pod, "", &handlers, node.user_namespaces_support);
    let isolation = translate::Isolation {
        runtime_handler: String::new(),
        user_namespace: match need {
            Ok(translate::UserNamespaceNeed::Pod) => Some(translate::pod_user_namespace(
                translate::USER_NS_LENGTH.saturating_mul(7),
            )),
            _ => None,
        },
    };
    if let Ok(config) = translate::sandbox_config(pod, u32::MAX, node, &isolation) {
        let host_userns = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .and_then(|n| n.userns_options.as_ref())
            .is_none_or(|u| u.mode != cri::NamespaceMode::Pod as i32);
        assert!(
            !(need == Ok(translate::UserNamespaceNeed::Pod) && host_userns),
            "hostUsers: false ran in the host's user namespace"
        );
    }
    let _ = translate::dns_config(pod, node);
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(d) = &v.downward_api {
            let items = d.items.as_deref().unwrap_or_default();
            let _ = crate::volume::downward_api::payload(
                items,
                pod,
                &node.allocatable,
                d.default_mode,
                None,
            );
        }
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(d) = &source.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                let _ = crate::volume::downward_api::payload(
                    items,
                    pod,
                    &node.allocatable,
                    Some(0o644),
                    None,
                );
            }
        }
    }
    let _ = crate::volume::references(pod);
}

/// A kill's budget for a grace period of `grace` seconds.
fn check_kill_budget(grace: i64) {
    let t0 = tokio::time::Instant::now();
    let budget = lifecycle::KillBudget::new(t0, grace);
    let _ = budget.deadline();
    let later = t0 + std::time::Duration::from_secs(5);
    assert!(budget.stop_grace(later) >= lifecycle::MIN_GRACE_SECONDS);
    let _ = budget.observe(30, later);
    let _ = lifecycle::grace_after_hook(grace, std::time::Duration::MAX);
}

/// The status's invariants.
fn check_status(pod: &Pod, st: &k8s_openapi::api::core::v1::PodStatus) {
    let known = [
        phase::PENDING,
        phase::RUNNING,
        phase::SUCCEEDED,
        phase::FAILED,
    ];
    let old = pod.status.as_ref();
    let kept = old.is_some_and(|o| {
        o.phase.as_deref().is_some_and(phase::is_terminal) && o.container_statuses.is_some()
    });
    if !kept {
        let p = st.phase.as_deref().unwrap_or_default();
        assert!(known.contains(&p), "unknown phase {p:?}");
        assert_eq!(
            st.container_statuses.as_ref().map(Vec::len),
            Some(spec::main_containers(pod).len())
        );
    }
    if old
        .and_then(|o| o.phase.as_deref())
        .is_some_and(phase::is_terminal)
    {
        assert_eq!(
            st.phase,
            old.and_then(|o| o.phase.clone()),
            "a terminal phase left"
        );
    }
    if !kept {
        for s in st
            .container_statuses
            .iter()
            .chain(st.init_container_statuses.iter())
            .flatten()
        {
            assert!(s.restart_count >= 0, "restart count {}", s.restart_count);
        }
        let qos = st.qos_class.as_deref().unwrap_or_default();
        assert!(
            ["Guaranteed", "Burstable", "BestEffort"].contains(&qos),
            "{qos}"
        );
    }
}

/// One sync of the generated case through the whole pure pipeline, then a
/// second plan against the status it reported.
fn check_sync(c: &Case) {
    let node = node(c);
    let pod = &c.pod;
    let _ = admit::admit(
        pod,
        &admit::NodeAbilities {
            allowed_unsafe_sysctls: &node.allowed_unsafe_sysctls,
            apparmor_enabled: node.apparmor_enabled,
            supplemental_groups_policy: c.node_flags[3],
            pod_level_resources_disabled: false,
        },
    );
    let _ = hosts::hostname_and_domain(pod, &node.cluster_domain)
        .map(|(h, d)| hosts::kernel_hostname(pod, &h, &d));
    let _ = hosts::host_alias_entries(
        pod.spec
            .as_ref()
            .and_then(|s| s.host_aliases.as_deref())
            .unwrap_or_default(),
    );
    let _ = spec::grace_period(pod);
    check_kill_budget(spec::grace_period(pod));
    let _ = plan::active_deadline(pod, c.now);
    let _ = plan::volume_need(pod, &c.rt, c.now);
    let volumes = if c.volumes_ready {
        Volumes::Ready
    } else {
        Volumes::NotReady
    };
    let p = plan::plan(pod, &c.rt, &c.backoffs, &c.probes, volumes, c.now);
    check_plan(pod, &c.rt, &p, volumes);
    check_containers(c, &node);
    let ctx = crate::fixtures::status_context();
    let st = status::status(pod, &c.rt, &p.waiting, &c.probes, &ctx, c.now);
    check_status(pod, &st);
    let _ = status::rejected(
        pod,
        &admit::Rejection {
            reason: "SysctlForbidden".into(),
            message: "x".into(),
        },
    );
    // The next sync sees the status just reported.
    let mut next = pod.clone();
    next.status = Some(st);
    let p2 = plan::plan(&next, &c.rt, &c.backoffs, &c.probes, volumes, c.now);
    check_plan(&next, &c.rt, &p2, volumes);
    let st2 = status::status(&next, &c.rt, &p2.waiting, &c.probes, &ctx, c.now);
    check_status(&next, &st2);
}

/// The seed of CI's runs: every CI run tries the same cases, so a failure
/// there fails again, and in a run by hand with `PROPTEST_RNG_SEED`.
const CI_SEED: u64 = 0x7275_7374_6c65_7401;

/// The seed of this run: `PROPTEST_RNG_SEED`, else [`CI_SEED`] under
/// `CI=true`, else a new one (printed with a failure, to run it again).
fn seed() -> u64 {
    if let Some(seed) = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return seed;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        return CI_SEED;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(CI_SEED, |d| {
            d.as_secs() ^ u64::from(d.subsec_nanos()).rotate_left(32)
        })
}

/// Runs `test` over `strategy` with `cases` cases from a fixed seed; a
/// failure's message names the seed that finds it again.
fn run_cases<S: Strategy>(
    strategy: &S,
    cases: u32,
    test: impl Fn(S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) {
    let seed = seed();
    let config = Config {
        cases,
        // Found cases become unit tests of their own, not files; the seed
        // finds them again.
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(strategy, test) {
        panic!(
            "{e}\nseed {seed}: PROPTEST_RNG_SEED={seed} cargo test --lib pod::proptests runs these cases again"
        );
    }
}

/// The number of cases: `PROPTEST_CASES`, else [`DEFAULT_CASES`].
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Runs `f` on a thread with a large stack: the strategies' value trees of a
/// whole pod are deep, beyond a test thread's 2 MiB in a debug build.
fn with_large_stack(f: impl FnOnce() + Send + 'static) {
    let run = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .expect("a test thread");
    if let Err(panic) = run.join() {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn hostile_pods_never_panic_the_pipeline() {
    with_large_stack(hostile_pods);
}

fn hostile_pods() {
    run_cases(&case(), cases(), |c| {
        check_sync(&c);
        Ok(())
    });
}

/// Quantity parsing alone, with many more cases (it is cheap).
#[test]
fn hostile_quantities_never_panic() {
    run_cases(
        &(quantity_text(), any::<i64>()),
        cases().saturating_mul(10),
        |(text, millicores)| {
            if let Ok(q) = crate::resource::Quantity::parse(&text) {
                let _ = (q.value(), q.milli_value());
                let saturated = crate::resource::Quantity::parse_saturating(&text);
                prop_assert_eq!(saturated, Ok(q));
            }
            if let Ok(q) = crate::resource::Quantity::parse_saturating(&text) {
                let _ = (q.value(), q.milli_value(), q.is_zero());
            }
            let shares = translate::cpu_shares(millicores);
            prop_assert!((translate::MIN_SHARES..=translate::MAX_SHARES).contains(&shares));
            let quota = translate::cpu_quota(millicores, translate::CPU_PERIOD_US);
            prop_assert!(quota == 0 || quota >= translate::MIN_QUOTA_US);
            Ok(())
        },
    );
}

/// Expansion's memory and work are bounded by its limit and its input, never
/// by the values it multiplies: references to a doubling chain of variables
/// (`V0` is one byte, each next one twice the last), expanded to at most
/// `max` bytes, give at most `max` bytes, exactly the full expansion when it
/// fits, and at most one lookup per token of the input (a reference or an
/// escaped `$`).
#[test]
fn expansion_is_bounded_by_its_limit_and_its_input() {
    let tokens = prop::collection::vec(prop_oneof![(0usize..16).prop_map(Some), Just(None)], 0..64);
    run_cases(&(tokens, 0usize..(1 << 16)), cases(), |(tokens, max)| {
        let mut vars = BTreeMap::from([("V0".to_string(), "x".to_string())]);
        for i in 1..16 {
            let doubled = vars[&format!("V{}", i - 1)].repeat(2);
            vars.insert(format!("V{i}"), doubled);
        }
        // A reference, or an escaped `$`.
        let input: String = tokens
            .iter()
            .map(|t| t.map_or_else(|| "$$".to_string(), |i| format!("$(V{i})")))
            .collect();
        let lookups = std::cell::Cell::new(0usize);
        let bounded = crate::expansion::expand_at_most(
            &input,
            |k| {
                lookups.set(lookups.get() + 1);
                vars.get(k).cloned()
            },
            max,
        );
        prop_assert!(lookups.get() <= tokens.len(), "{} lookups", lookups.get());
        let full = crate::expansion::expand(&input, |k| vars.get(k).cloned());
        match bounded {
            Some(out) => {
                prop_assert!(out.len() <= max, "{} bytes past {}", out.len(), max);
                prop_assert_eq!(out, full);
            }
            None => prop_assert!(full.len() > max),
        }
        Ok(())
    });
}

/// A wildcard match by dynamic programming: `*` any run, `?` any one
/// character. Quadratic, obviously right, and only for small inputs.
fn reference_glob(pattern: &[u8], text: &[u8]) -> bool {
    let mut row = vec![false; text.len() + 1];
    row[0] = true;
    for &p in pattern {
        let mut next = vec![false; text.len() + 1];
        for j in 0..=text.len() {
            next[j] = match p {
                b'*' => row[j] || (j > 0 && next[j - 1]),
                b'?' => j > 0 && row[j - 1],
                c => j > 0 && row[j - 1] && text[j - 1] == c,
            };
        }
        row = next;
    }
    row[text.len()]
}

/// Pull secrets' registry globs match a host label exactly when the
/// reference matcher does (the glob bomb that a backtracking matcher never
/// finishes is a unit test of `credentials`).
#[test]
fn registry_globs_match_as_the_reference_does() {
    run_cases(
        &("[ab*?]{0,10}", "[ab]{0,14}"),
        cases().saturating_mul(10),
        |(pattern, label)| {
            let expected = reference_glob(pattern.as_bytes(), label.as_bytes());
            let got = crate::registry::registry_matches(
                &format!("{pattern}.example"),
                &format!("{label}.example/img:1"),
            );
            prop_assert_eq!(got, expected, "{:?} against {:?}", pattern, label);
            Ok(())
        },
    );
}
