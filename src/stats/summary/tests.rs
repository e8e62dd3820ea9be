use super::*;
use serde_json::json;

const SEC: i64 = 1_000_000_000;

#[test]
fn working_set_is_usage_minus_inactive_file() {
    for (usage, inactive, want) in [
        (100, 30, 70),
        (100, 0, 100),
        (100, 100, 0),
        // cAdvisor: inactive file above usage gives 0, not an underflow.
        (10, 30, 0),
        (0, 0, 0),
    ] {
        assert_eq!(working_set(usage, inactive), want, "{usage} - {inactive}");
    }
}

#[test]
fn memory_stat_v1_and_v2() {
    let v1 = "cache 10\nrss 5\ntotal_cache 400\ntotal_rss 300\ntotal_inactive_file 150\n\
              inactive_file 1\ntotal_pgfault 77\ntotal_pgmajfault 3\npgfault 9\npgmajfault 1\n";
    let v2 = "anon 300\nfile 400\ninactive_file 150\npgfault 77\npgmajfault 3\n";
    for (usage, text, is_v1, limit, want) in [
        (
            1000,
            v1,
            true,
            Some(4000),
            MemoryStats {
                time: Time(5),
                available_bytes: Some(3150),
                usage_bytes: Some(1000),
                working_set_bytes: Some(850),
                rss_bytes: Some(300),
                page_faults: Some(9),
                major_page_faults: Some(1),
                psi: None,
            },
        ),
        (
            1000,
            v2,
            false,
            None,
            MemoryStats {
                time: Time(5),
                available_bytes: None,
                usage_bytes: Some(1000),
                working_set_bytes: Some(850),
                rss_bytes: Some(300),
                page_faults: Some(77),
                major_page_faults: Some(3),
                psi: None,
            },
        ),
        // A limit below the working set leaves nothing available.
        (
            100,
            "",
            true,
            Some(50),
            MemoryStats {
                time: Time(5),
                available_bytes: Some(0),
                usage_bytes: Some(100),
                working_set_bytes: Some(100),
                rss_bytes: Some(0),
                page_faults: Some(0),
                major_page_faults: Some(0),
                psi: None,
            },
        ),
    ] {
        let got = CgroupMemory::parse(usage, text, is_v1).stats(Time(5), limit);
        assert_eq!(got, want, "v1={is_v1}");
    }
}

#[test]
fn small_file_parsers() {
    assert_eq!(
        boot_time("cpu 1 2 3\nbtime 1714557600\nprocesses 9\n"),
        Some(1_714_557_600)
    );
    assert_eq!(boot_time("cpu 1 2 3\n"), None);
    assert_eq!(loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"), Some(3518));
    let meminfo = "MemTotal:       16384 kB\nMemFree:  1024 kB\nInactive(file):   2048 kB\nHugePages_Total:       3\n";
    for (key, want) in [
        ("MemTotal", Some(16384 * 1024)),
        ("Inactive(file)", Some(2048 * 1024)),
        ("HugePages_Total", Some(3)),
        ("Mem", None),
        ("Active(file)", None),
    ] {
        assert_eq!(meminfo_bytes(meminfo, key), want, "{key}");
    }
    assert_eq!(loadavg_tasks("1.36 3.49"), None);
    assert_eq!(memory_limit("9223372036854771712\n"), None);
    assert_eq!(memory_limit("max\n"), None);
    assert_eq!(memory_limit("104857600\n"), Some(104_857_600));
    assert_eq!(
        cpu_stat_v2_nanos("usage_usec 1500\nuser_usec 1000\n"),
        Some(1_500_000)
    );
    assert_eq!(cpu_stat_v2_nanos("user_usec 1000\n"), None);
    let v1 = "12:memory:/k8s.io/abc\n11:cpu,cpuacct:/k8s.io/abc\n1:name=systemd:/x\n0::/\n";
    for (text, ctrl, want) in [
        (v1, "memory", Some("/k8s.io/abc")),
        (v1, "cpuacct", Some("/k8s.io/abc")),
        (v1, "cpu", Some("/k8s.io/abc")),
        (v1, "", Some("/")),
        (v1, "pids", None),
        ("0::/k8s.io/def\n", "", Some("/k8s.io/def")),
        ("0::/k8s.io/def\n", "memory", None),
    ] {
        assert_eq!(proc_cgroup_path(text, ctrl), want, "{ctrl:?} in {text:?}");
    }
}

#[test]
fn cpu_rate_from_two_samples() {
    // (time s, usage core-ns, expected nano-cores)
    let steps: [(i64, u64, Option<u64>); 7] = [
        // First sample: no rate yet.
        (10, 1_000_000_000, None),
        // 0.5 core over 2 s.
        (12, 2_000_000_000, Some(500_000_000)),
        // Too close to the previous sample: the previous rate, sample kept.
        (12, 2_500_000_000, Some(500_000_000)),
        // 2 cores over 1 s, from the sample at 12 s.
        (13, 4_000_000_000, Some(2_000_000_000)),
        // Idle.
        (15, 4_000_000_000, Some(0)),
        // Usage went down (a restarted container): start again.
        (16, 100, None),
        (18, 2_000_000_100, Some(1_000_000_000)),
    ];
    let mut rates = CpuRates::default();
    for (i, (t, usage, want)) in steps.into_iter().enumerate() {
        assert_eq!(rates.update("c1", t * SEC, usage), want, "step {i}");
    }
    // Another ID has its own sample.
    assert_eq!(rates.update("c2", 18 * SEC, 5), None);
    assert_eq!(rates.len(), 2);
    // Ten minutes after c1's last sample both are kept; a second later, gone.
    rates.prune(18 * SEC + 600 * SEC);
    assert_eq!(rates.len(), 2);
    rates.prune(18 * SEC + 601 * SEC);
    assert!(rates.is_empty());
}

#[test]
fn cri_values_are_taken_as_given() {
    let cpu = cri::CpuUsage {
        timestamp: 7 * SEC,
        usage_core_nano_seconds: Some(cri::UInt64Value { value: 42 }),
        usage_nano_cores: None,
    };
    // No rate from the runtime: ours.
    assert_eq!(
        cpu_from_cri(&cpu, Some(9)),
        CpuStats {
            time: Time(7 * SEC),
            usage_nano_cores: Some(9),
            usage_core_nano_seconds: Some(42),
            psi: None,
        }
    );
    // Ours, over a window of a second or more, wins over the runtime's
    // (since its previous stats call); the runtime's stands in until we
    // have one.
    let with_rate = cri::CpuUsage {
        usage_nano_cores: Some(cri::UInt64Value { value: 5 }),
        ..cpu
    };
    assert_eq!(cpu_from_cri(&with_rate, Some(9)).usage_nano_cores, Some(9));
    assert_eq!(cpu_from_cri(&with_rate, None).usage_nano_cores, Some(5));
    assert!(cri_cpu_usable(Some(&with_rate)));
    assert!(!cri_cpu_usable(Some(&cri::CpuUsage::default())));
    assert!(!cri_cpu_usable(None));
    let mem = cri::MemoryUsage {
        timestamp: 7 * SEC,
        working_set_bytes: Some(cri::UInt64Value { value: 100 }),
        usage_bytes: Some(cri::UInt64Value { value: 150 }),
        ..Default::default()
    };
    assert!(cri_memory_usable(Some(&mem)));
    assert!(!cri_memory_usable(Some(&cri::MemoryUsage::default())));
    let m = memory_from_cri(&mem);
    assert_eq!(
        (m.working_set_bytes, m.usage_bytes, m.rss_bytes),
        (Some(100), Some(150), None)
    );
}

fn container(name: &str, cpu: Option<(i64, u64, u64)>, ws: Option<u64>) -> ContainerStats {
    ContainerStats {
        name: name.into(),
        start_time: Time(SEC),
        cpu: cpu.map(|(t, rate, total)| CpuStats {
            time: Time(t),
            usage_nano_cores: Some(rate),
            usage_core_nano_seconds: Some(total),
            psi: None,
        }),
        memory: ws.map(|w| MemoryStats {
            time: Time(3),
            working_set_bytes: Some(w),
            usage_bytes: Some(w + 1),
            ..MemoryStats::default()
        }),
        ..ContainerStats::default()
    }
}

#[test]
fn pod_cpu_and_memory_sum_the_containers() {
    let (cpu, mem) = pod_cpu_memory(&[
        container("a", Some((5, 10, 100)), Some(1000)),
        container("b", Some((9, 20, 200)), None),
        container("c", None, Some(24)),
    ]);
    assert_eq!(
        cpu,
        Some(CpuStats {
            time: Time(9),
            usage_nano_cores: Some(30),
            usage_core_nano_seconds: Some(300),
            psi: None,
        })
    );
    let mem = mem.expect("memory");
    assert_eq!(
        (
            mem.working_set_bytes,
            mem.usage_bytes,
            mem.rss_bytes,
            mem.time
        ),
        (Some(1024), Some(1026), None, Time(3))
    );
    assert_eq!(pod_cpu_memory(&[]), (None, None));
    assert_eq!(pod_cpu_memory(&[container("x", None, None)]), (None, None));
}

#[test]
fn ephemeral_storage_adds_layers_logs_volumes() {
    let fs = |used: u64, inodes: u64| FsStats {
        time: Time(2),
        used_bytes: Some(used),
        inodes_used: Some(inodes),
        ..FsStats::default()
    };
    let root = FsStats {
        time: Time(1),
        available_bytes: Some(500),
        capacity_bytes: Some(1000),
        inodes_free: Some(50),
        inodes: Some(100),
        ..FsStats::default()
    };
    let mut a = container("a", None, None);
    a.rootfs = Some(fs(10, 1));
    a.logs = Some(fs(5, 2));
    // Logs count only with a writable layer (addContainerUsage).
    let mut b = container("b", None, None);
    b.logs = Some(fs(1000, 1000));
    let vols = [VolumeStats {
        fs: fs(100, 10),
        name: "scratch".into(),
        pvc_ref: None,
    }];
    let got = ephemeral_storage(&root, &[a, b], &vols, Some(&fs(1, 1)));
    assert_eq!(
        got,
        FsStats {
            time: Time(2),
            available_bytes: Some(500),
            capacity_bytes: Some(1000),
            used_bytes: Some(116),
            inodes_free: Some(50),
            inodes: Some(100),
            inodes_used: Some(14),
        }
    );
    let empty = ephemeral_storage(&root, &[], &[], None);
    assert_eq!((empty.used_bytes, empty.capacity_bytes), (None, Some(1000)));
}

#[test]
fn live_sandboxes_drop_older_instances() {
    let sb = |id: &str, name: &str, created: i64, ready: bool| cri::PodSandbox {
        id: id.into(),
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            namespace: "ns".into(),
            uid: id.into(),
            attempt: 0,
        }),
        state: if ready {
            cri::PodSandboxState::SandboxReady as i32
        } else {
            cri::PodSandboxState::SandboxNotready as i32
        },
        created_at: created,
        ..Default::default()
    };
    for (input, want) in [
        (vec![sb("a", "p", 1, false)], vec!["a"]),
        // The ready one of two.
        (
            vec![sb("new", "p", 2, false), sb("old", "p", 1, true)],
            vec!["old"],
        ),
        // None ready: the newest.
        (
            vec![sb("old", "p", 1, false), sb("new", "p", 2, false)],
            vec!["new"],
        ),
        // Other pods are independent.
        (
            vec![
                sb("q1", "q", 3, false),
                sb("p1", "p", 1, true),
                sb("p2", "p", 2, true),
            ],
            vec!["p1", "p2", "q1"],
        ),
    ] {
        let got: Vec<String> = live_sandboxes(input).into_iter().map(|s| s.id).collect();
        assert_eq!(got, want);
    }
}

#[test]
fn summary_json_has_the_kubelets_shape() {
    let mut c = container("web", Some((2 * SEC, 5, 6)), Some(7));
    c.rootfs = Some(FsStats {
        time: Time(2 * SEC),
        used_bytes: Some(8),
        ..FsStats::default()
    });
    let s = Summary {
        node: NodeStats {
            node_name: "n1".into(),
            start_time: Time(1_714_557_600 * SEC + 999),
            cpu: Some(CpuStats {
                time: Time(2 * SEC),
                usage_nano_cores: None,
                usage_core_nano_seconds: Some(11),
                psi: None,
            }),
            memory: Some(MemoryStats {
                psi: psi("some avg10=1.50 avg60=0.00 avg300=0.00 total=7\n"),
                ..MemoryStats::default()
            }),
            io: Some(IoStats {
                time: Time(0),
                psi: Some(PsiStats::default()),
            }),
            network: Some(NetworkStats::default()),
            system_containers: vec![container("pods", None, Some(3))],
            runtime: Some(RuntimeStats {
                image_fs: Some(FsStats::default()),
                container_fs: Some(FsStats::default()),
            }),
            rlimit: Some(RlimitStats {
                time: Time(0),
                maxpid: Some(4_194_304),
                curproc: Some(300),
            }),
            ..NodeStats::default()
        },
        pods: vec![PodStats {
            pod_ref: PodReference {
                name: "p".into(),
                namespace: "ns".into(),
                uid: "u".into(),
            },
            start_time: Time(SEC),
            containers: vec![c],
            network: Some(NetworkStats {
                time: Time(0),
                default: InterfaceStats {
                    name: "eth0".into(),
                    rx_bytes: Some(1),
                    ..InterfaceStats::default()
                },
                interfaces: vec![],
            }),
            volume: vec![VolumeStats {
                fs: FsStats {
                    used_bytes: Some(4),
                    ..FsStats::default()
                },
                name: "v".into(),
                pvc_ref: Some(PvcReference {
                    name: "data-0".into(),
                    namespace: "ns".into(),
                }),
            }],
            ephemeral_storage: Some(FsStats::default()),
            process_stats: Some(ProcessStats {
                process_count: Some(2),
            }),
            ..PodStats::default()
        }],
    };
    let got = serde_json::to_value(&s).expect("serialize");
    let epoch = "1970-01-01T00:00:00Z";
    assert_eq!(
        got,
        json!({
            "node": {
                "nodeName": "n1",
                "startTime": "2024-05-01T10:00:00Z",
                "cpu": {"time": "1970-01-01T00:00:02Z", "usageCoreNanoSeconds": 11},
                "memory": {"time": epoch, "psi": {
                    "some": {"total": 7, "avg10": 1.5, "avg60": 0.0, "avg300": 0.0},
                    "full": {"total": 0, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
                }},
                "io": {"time": epoch, "psi": {
                    "some": {"total": 0, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
                    "full": {"total": 0, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
                }},
                "network": {"time": epoch, "name": ""},
                "systemContainers": [{
                    "name": "pods",
                    "startTime": "1970-01-01T00:00:01Z",
                    "memory": {"time": epoch, "usageBytes": 4, "workingSetBytes": 3},
                }],
                "runtime": {"imageFs": {"time": epoch}, "containerFs": {"time": epoch}},
                "rlimit": {"time": epoch, "maxpid": 4_194_304, "curproc": 300},
            },
            "pods": [{
                "podRef": {"name": "p", "namespace": "ns", "uid": "u"},
                "startTime": "1970-01-01T00:00:01Z",
                "containers": [{
                    "name": "web",
                    "startTime": "1970-01-01T00:00:01Z",
                    "cpu": {"time": "1970-01-01T00:00:02Z", "usageNanoCores": 5, "usageCoreNanoSeconds": 6},
                    "memory": {"time": epoch, "usageBytes": 8, "workingSetBytes": 7},
                    "rootfs": {"time": "1970-01-01T00:00:02Z", "usedBytes": 8},
                }],
                "network": {"time": epoch, "name": "eth0", "rxBytes": 1},
                "volume": [{"time": epoch, "usedBytes": 4, "name": "v",
                    "pvcRef": {"name": "data-0", "namespace": "ns"}}],
                "ephemeral-storage": {"time": epoch},
                "process_stats": {"process_count": 2},
            }],
        })
    );
}

#[test]
fn resource_metrics_under_the_kubelets_names() {
    let s = Summary {
        node: NodeStats {
            node_name: "n1".into(),
            cpu: Some(CpuStats {
                time: Time(SEC),
                usage_nano_cores: None,
                usage_core_nano_seconds: Some(2_500_000_000),
                psi: None,
            }),
            memory: Some(MemoryStats {
                time: Time(SEC),
                working_set_bytes: Some(1024),
                ..MemoryStats::default()
            }),
            ..NodeStats::default()
        },
        pods: vec![PodStats {
            pod_ref: PodReference {
                name: "p".into(),
                namespace: "ns".into(),
                uid: "u".into(),
            },
            containers: vec![
                container("web", Some((SEC, 1, 500_000_000)), Some(2048)),
                // Nothing known: only its start time.
                container("idle", None, None),
            ],
            cpu: Some(CpuStats {
                time: Time(SEC),
                usage_nano_cores: None,
                usage_core_nano_seconds: Some(500_000_000),
                psi: None,
            }),
            memory: Some(MemoryStats {
                time: Time(SEC),
                working_set_bytes: Some(2048),
                ..MemoryStats::default()
            }),
            ..PodStats::default()
        }],
    };
    let text = resource_metrics(Some(&s)).expect("encode");
    for want in [
        "# TYPE node_cpu_usage_seconds counter",
        "node_cpu_usage_seconds_total 2.5",
        "node_memory_working_set_bytes 1024.0",
        "container_cpu_usage_seconds_total{container=\"web\",pod=\"p\",namespace=\"ns\"} 0.5",
        "container_memory_working_set_bytes{container=\"web\",pod=\"p\",namespace=\"ns\"} 2048.0",
        "container_start_time_seconds{container=\"web\",pod=\"p\",namespace=\"ns\"} 1.0",
        "container_start_time_seconds{container=\"idle\",pod=\"p\",namespace=\"ns\"} 1.0",
        "pod_cpu_usage_seconds_total{pod=\"p\",namespace=\"ns\"} 0.5",
        "pod_memory_working_set_bytes{pod=\"p\",namespace=\"ns\"} 2048.0",
        "resource_scrape_error 0",
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "missing {want:?} in\n{text}"
        );
    }
    assert!(
        !text.contains("container=\"idle\",pod=\"p\",namespace=\"ns\"} 0"),
        "{text}"
    );
    assert!(
        !text.contains("container_cpu_usage_seconds_total{container=\"idle\""),
        "{text}"
    );

    let failed = resource_metrics(None).expect("encode");
    assert!(
        failed.lines().any(|l| l == "resource_scrape_error 1"),
        "{failed}"
    );
    assert!(!failed.contains("node_cpu_usage_seconds_total"), "{failed}");
}

/// The two header lines of `/proc/net/dev` and its loopback line.
const NET_DEV_HEAD: &str = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n";

#[test]
fn network_from_proc_net_dev() {
    let text = &format!(
        "{NET_DEV_HEAD}  \
eth0:    1296      16    2    0    0     0          0         0      936      12    3    0    0     0       0          0\n  \
net1:       5       1    0    0    0     0          0         0        6       1    0    0    0     0       0          0\n"
    );
    let got = network_from_net_dev(text, Time(4)).expect("eth0");
    let eth0 = InterfaceStats {
        name: "eth0".into(),
        rx_bytes: Some(1296),
        rx_errors: Some(2),
        tx_bytes: Some(936),
        tx_errors: Some(3),
    };
    assert_eq!(got.default, eth0);
    assert_eq!(got.time, Time(4));
    let names: Vec<&str> = got.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["eth0", "net1"]);
    // A host-network sandbox's namespace without eth0, or garbage: nothing.
    assert_eq!(
        network_from_net_dev("  lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", Time(0)),
        None
    );
    assert_eq!(network_from_net_dev("eth0: x y\n", Time(0)), None);
    assert_eq!(network_from_net_dev("", Time(0)), None);
}

#[test]
fn node_network_keeps_the_hosts_interfaces_but_cadvisors_ignored_ones() {
    let text = &format!(
        "{NET_DEV_HEAD}  \
ens4:    1296      16    2    0    0     0          0         0      936      12    3    0    0     0       0          0\n  \
vethab12cd34:       5       1    0    0    0     0          0         0        6       1    0    0    0     0       0          0\n  \
docker0:       5       1    0    0    0     0          0         0        6       1    0    0    0     0       0          0\n  \
cni0:       5       1    0    0    0     0          0         0        6       1    0    0    0     0       0          0\n"
    );
    let got = node_network_from_net_dev(text, Time(9));
    let names: Vec<&str> = got.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["ens4", "cni0"]);
    // No eth0: the default interface has no name and no counters, as the
    // kubelet's node network on such a host.
    assert_eq!(got.default, InterfaceStats::default());
    assert_eq!(got.time, Time(9));
    let with_eth0 =
        node_network_from_net_dev("eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", Time(0));
    assert_eq!(with_eth0.default.name, "eth0");
    assert_eq!(with_eth0.default.tx_bytes, Some(9));
    // Pods' networks leave the ignored interfaces out too.
    assert_eq!(
        network_from_net_dev("veth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", Time(0)),
        None
    );
}

#[test]
fn pressure_files_parse_as_the_kubelets_psi() {
    let memory = "some avg10=0.09 avg60=0.02 avg300=0.00 total=8990221\n\
                  full avg10=0.00 avg60=0.01 avg300=0.00 total=5593413\n";
    let got = psi(memory).expect("psi");
    assert_eq!(got.some.total, 8_990_221);
    assert!((got.some.avg10 - 0.09).abs() < 1e-9);
    assert!((got.some.avg60 - 0.02).abs() < 1e-9);
    assert_eq!(got.full.total, 5_593_413);
    assert!((got.full.avg60 - 0.01).abs() < 1e-9);
    // cpu before Linux 5.13 has no full line: zero, as cAdvisor reads it.
    let cpu = psi("some avg10=13.86 avg60=7.56 avg300=8.02 total=2704629086\n").expect("cpu");
    assert_eq!(cpu.full, PsiData::default());
    assert_eq!(cpu.some.total, 2_704_629_086);
    // Garbage, an empty file, a bad number: nothing, never a panic.
    for bad in [
        "",
        "full avg10=0 total=1\n",
        "some avg10=x total=1\n",
        "some total\n",
        "somewhat avg10=1\n",
    ] {
        assert_eq!(psi(bad), None, "{bad:?}");
    }
}
