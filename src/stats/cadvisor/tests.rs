use super::*;

/// The value of the series `name{labels}` (labels written exactly as the
/// encoder writes them) in an exposition.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == series).then(|| v.parse().ok()).flatten()
    })
}

#[test]
fn cpuacct_stat_ticks_are_hundredths_of_a_second() {
    assert_eq!(
        cpuacct_stat("user 250\nsystem 3\n"),
        (2_500_000_000, 30_000_000)
    );
    assert_eq!(cpuacct_stat(""), (0, 0));
    // A hostile-sized count saturates instead of overflowing.
    assert_eq!(cpuacct_stat(&format!("user {}\n", u64::MAX)).0, u64::MAX);
    assert_eq!(
        cpu_stat_v2_user_system("usage_usec 10\nuser_usec 7\nsystem_usec 3\n"),
        (7000, 3000)
    );
}

#[test]
fn memory_v1_uses_hierarchical_totals_and_oom_control() {
    let stat = "cache 1\nrss 2\ntotal_cache 4096\ntotal_rss 8192\ntotal_mapped_file 512\n\
                total_swap 0\ntotal_inactive_file 1000\npgfault 70\npgmajfault 2\n";
    let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
    let m = Memory::parse(20_000, stat, oom, true);
    assert_eq!(
        m,
        Memory {
            usage: 20_000,
            working_set: 19_000,
            cache: 4096,
            rss: 8192,
            mapped_file: 512,
            swap: 0,
            pgfault: 70,
            pgmajfault: 2,
            oom_kills: 1,
            ..Memory::default()
        }
    );
}

#[test]
fn memory_v2_reads_its_keys_and_events() {
    let stat = "anon 300\nfile 400\nfile_mapped 20\ninactive_file 150\npgfault 9\npgmajfault 1\n";
    let events = "low 0\nhigh 4\nmax 2\noom 1\noom_kill 1\n";
    let m = Memory::parse(1000, stat, events, false);
    assert_eq!(
        (m.rss, m.cache, m.mapped_file, m.working_set),
        (300, 400, 20, 850)
    );
    assert_eq!((m.events_high, m.events_max, m.oom_kills), (4, 2, 1));
    // Inactive file above usage: 0, not an underflow.
    assert_eq!(Memory::parse(10, stat, "", false).working_set, 0);
}

#[test]
fn limits_and_cpu_max() {
    for (text, want) in [
        ("max\n", Some(u64::MAX)),
        ("-1\n", Some(u64::MAX)),
        ("79998976\n", Some(79_998_976)),
        ("junk", None),
        ("", None),
    ] {
        assert_eq!(limit_value(text), want, "{text:?}");
    }
    assert_eq!(cpu_max_v2("max 100000\n"), Some((None, 100_000)));
    assert_eq!(cpu_max_v2("50000 100000\n"), Some((Some(50_000), 100_000)));
    assert_eq!(cpu_max_v2("50000"), None);
    // runc's shares→weight conversion, inverted: the ends map to the ends.
    assert_eq!(weight_to_shares(1), 2);
    assert_eq!(weight_to_shares(10_000), 262_144);
    assert_eq!(weight_to_shares(0), 2);
}

#[test]
fn blkio_v1_and_io_stat_v2_by_device() {
    let bytes = "254:0 Read 8192\n254:0 Write 4096\n254:0 Sync 0\n254:0 Total 12288\n\
                 7:1 Read 1\nTotal 12289\n";
    let ops = "254:0 Read 2\n254:0 Write 1\n254:0 Total 3\nbad line\nx:y Read 1\n";
    assert_eq!(
        blkio_v1(bytes, ops),
        vec![
            DeviceIo {
                device: "7:1".into(),
                major: 7,
                minor: 1,
                read_bytes: 1,
                ..DeviceIo::default()
            },
            DeviceIo {
                device: "254:0".into(),
                major: 254,
                minor: 0,
                read_bytes: 8192,
                write_bytes: 4096,
                reads: 2,
                writes: 1,
            },
        ]
    );
    assert!(blkio_v1("", "").is_empty());
    let v2 = "8:0 rbytes=100 wbytes=200 rios=3 wios=4 dbytes=0 dios=0\n8:16 rbytes=x\n";
    let got = io_stat_v2(v2);
    assert_eq!(got.len(), 2);
    assert_eq!(
        (
            got[0].read_bytes,
            got[0].write_bytes,
            got[0].reads,
            got[0].writes
        ),
        (100, 200, 3, 4)
    );
    assert_eq!(got[1].read_bytes, 0);
}

#[test]
fn uevent_and_proc_limits() {
    assert_eq!(
        uevent_device("MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n"),
        Some("/dev/vda".into())
    );
    assert_eq!(uevent_device("MAJOR=0\n"), None);
    let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                  Max cpu time              unlimited            unlimited            seconds   \n\
                  Max open files            1048576              1048576              files     \n";
    assert_eq!(max_open_files_soft(limits), Some(1_048_576));
    assert_eq!(
        max_open_files_soft(
            "Max open files            unlimited            unlimited            files\n"
        ),
        Some(-1)
    );
    assert_eq!(max_open_files_soft(""), None);
}

fn busybox() -> Sample {
    Sample {
        identity: Identity {
            container: "busybox-container".into(),
            id: "/kubepods/burstable/podu1/c1".into(),
            image: "busybox:1.37".into(),
            name: "c1".into(),
            namespace: "ns".into(),
            pod: "p0".into(),
        },
        start_time: 1_700_000_000,
        cpu: Some(Cpu {
            usage: 1_500_000_000,
            user: 1_000_000_000,
            system: 500_000_000,
        }),
        memory: Some(Memory {
            usage: 200_000,
            working_set: 150_000,
            rss: 100_000,
            ..Memory::default()
        }),
        spec: Spec {
            cpu_period: Some(100_000),
            cpu_quota: None,
            cpu_shares: Some(2),
            memory_limit: Some(79_998_976),
            memory_swap_limit: Some(79_998_976),
            memory_reservation: Some(9_223_372_036_854_771_712),
        },
        io: vec![DeviceIo {
            device: "/dev/vda".into(),
            major: 254,
            minor: 0,
            read_bytes: 8192,
            write_bytes: 8192,
            reads: 2,
            writes: 2,
        }],
        fs_usage: Some(("/dev/vda".into(), 12_288)),
        processes: Some(Processes {
            processes: 1,
            threads: 1,
            threads_max: 0,
            file_descriptors: 3,
            sockets: 0,
            max_open_files: Some(1_048_576),
        }),
        network: Vec::new(),
        filesystems: Vec::new(),
    }
}

const BASE: &str = r#"container="busybox-container",id="/kubepods/burstable/podu1/c1",image="busybox:1.37",name="c1",namespace="ns",pod="p0""#;

#[test]
fn render_writes_cadvisors_names_labels_and_units() {
    let text = render(&[busybox()], 1_700_000_100, false).unwrap();
    let at = |name: &str, extra: &str| {
        let series = if extra.is_empty() {
            format!("{name}{{{BASE}}}")
        } else {
            format!("{name}{{{BASE},{extra}}}")
        };
        value(&text, &series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    for (name, extra, want) in [
        ("container_last_seen", "", 1_700_000_100.0),
        ("container_start_time_seconds", "", 1_700_000_000.0),
        ("container_spec_cpu_period", "", 100_000.0),
        ("container_spec_cpu_shares", "", 2.0),
        ("container_spec_memory_limit_bytes", "", 79_998_976.0),
        ("container_spec_memory_swap_limit_bytes", "", 79_998_976.0),
        // Unlimited is 0, as cAdvisor's specMemoryValue.
        ("container_spec_memory_reservation_limit_bytes", "", 0.0),
        ("container_cpu_usage_seconds_total", r#"cpu="total""#, 1.5),
        ("container_cpu_user_seconds_total", "", 1.0),
        ("container_cpu_system_seconds_total", "", 0.5),
        ("container_memory_usage_bytes", "", 200_000.0),
        ("container_memory_working_set_bytes", "", 150_000.0),
        ("container_memory_rss", "", 100_000.0),
        ("container_memory_failcnt", "", 0.0),
        ("container_memory_swap", "", 0.0),
        ("container_memory_events_high_total", "", 0.0),
        ("container_memory_events_max_total", "", 0.0),
        ("container_oom_events_total", "", 0.0),
        (
            "container_memory_failures_total",
            r#"failure_type="pgfault",scope="container""#,
            0.0,
        ),
        (
            "container_fs_reads_bytes_total",
            r#"device="/dev/vda""#,
            8192.0,
        ),
        ("container_fs_writes_total", r#"device="/dev/vda""#, 2.0),
        ("container_fs_usage_bytes", r#"device="/dev/vda""#, 12_288.0),
        (
            "container_blkio_device_usage_total",
            r#"device="/dev/vda",major="254",minor="0",operation="Write""#,
            8192.0,
        ),
        ("container_processes", "", 1.0),
        ("container_threads", "", 1.0),
        ("container_threads_max", "", 0.0),
        ("container_file_descriptors", "", 3.0),
        ("container_sockets", "", 0.0),
        (
            "container_ulimits_soft",
            r#"ulimit="max_open_files""#,
            1_048_576.0,
        ),
    ] {
        assert!(
            (at(name, extra) - want).abs() < 1e-9,
            "{name} {extra}: {} != {want}",
            at(name, extra)
        );
    }
    // No quota: no quota series. No timestamps on samples.
    assert!(!text.contains("container_spec_cpu_quota{"), "{text}");
    assert_eq!(value(&text, "container_scrape_error"), Some(0.0));
    // Every sample line is `series value`: the parser upstream reads.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        assert_eq!(
            l.rsplit_once(' ').map(|(_, v)| v.parse::<f64>().is_ok()),
            Some(true),
            "{l}"
        );
    }
}

#[test]
fn render_reports_a_sandbox_network_and_scrape_errors() {
    let pod = Sample {
        identity: Identity {
            container: POD_INFRA_CONTAINER.into(),
            name: "s1".into(),
            namespace: "ns".into(),
            pod: "p0".into(),
            ..Identity::default()
        },
        network: vec![Interface {
            name: "eth0".into(),
            rx_bytes: 1500,
            tx_packets: 9,
            ..Interface::default()
        }],
        ..Sample::default()
    };
    let text = render(&[pod], 5, false).unwrap();
    let l = r#"container="POD",id="",image="",name="s1",namespace="ns",pod="p0",interface="eth0""#;
    assert_eq!(
        value(
            &text,
            &format!("container_network_receive_bytes_total{{{l}}}")
        ),
        Some(1500.0)
    );
    assert_eq!(
        value(
            &text,
            &format!("container_network_transmit_packets_total{{{l}}}")
        ),
        Some(9.0)
    );
    // Unknown start time, cpu and memory: left out, not zero.
    assert!(!text.contains("container_start_time_seconds{"), "{text}");
    assert!(
        !text.contains("container_cpu_usage_seconds_total{"),
        "{text}"
    );

    let failed = render(&[], 5, true).unwrap();
    assert_eq!(value(&failed, "container_scrape_error"), Some(1.0));
    assert!(!failed.contains("container_last_seen{"), "{failed}");
}

#[test]
fn diskstats_and_mounted_block_devices() {
    let text = " 254       0 vda 4914413 187748 342382946 18709218 3061679 1343903 1085644856 6554247 0 995780 25458249 781178 50 942628696 152112\n\
                  7       0 loop0 1 2 3\n";
    assert_eq!(
        diskstats(text),
        vec![DiskStats {
            major: 254,
            minor: 0,
            reads: 4_914_413,
            reads_merged: 187_748,
            sectors_read: 342_382_946,
            read_ms: 18_709_218,
            writes: 3_061_679,
            writes_merged: 1_343_903,
            sectors_written: 1_085_644_856,
            write_ms: 6_554_247,
            in_progress: 0,
            io_ms: 995_780,
            weighted_io_ms: 25_458_249,
        }]
    );
    let mountinfo = "22 27 0:21 / /proc rw,relatime shared:3 - proc proc rw\n\
                     27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard\n\
                     40 27 254:0 /var/lib/x /data rw - ext4 /dev/vda rw\n\
                     41 27 8:1 / /mnt rw - xfs /dev/sdb1 rw\n\
                     42 27 0:50 / /run/x rw - tmpfs tmpfs rw\n\
                     bad line\n";
    assert_eq!(
        mounted_devices(mountinfo),
        vec![(254, 0, "/".to_string()), (8, 1, "/mnt".to_string())]
    );
}

#[test]
fn the_root_container_reports_its_filesystems_and_their_counters() {
    let root = Sample {
        identity: Identity {
            id: "/".into(),
            ..Identity::default()
        },
        io: vec![DeviceIo {
            device: "/dev/vda".into(),
            major: 254,
            minor: 0,
            read_bytes: 4096,
            reads: 999,
            ..DeviceIo::default()
        }],
        filesystems: vec![Filesystem {
            device: "/dev/vda".into(),
            limit: 1000,
            usage: 400,
            inodes: 50,
            inodes_free: 20,
            stats: Some(DiskStats {
                reads: 7,
                read_ms: 1500,
                in_progress: 2,
                weighted_io_ms: 250,
                ..DiskStats::default()
            }),
        }],
        ..Sample::default()
    };
    let text = render(&[root], 5, false).unwrap();
    let l = r#"container="",id="/",image="",name="",namespace="",pod="",device="/dev/vda""#;
    let at = |name: &str| value(&text, &format!("{name}{{{l}}}"));
    assert_eq!(at("container_fs_limit_bytes"), Some(1000.0));
    assert_eq!(at("container_fs_usage_bytes"), Some(400.0));
    assert_eq!(at("container_fs_inodes_total"), Some(50.0));
    assert_eq!(at("container_fs_inodes_free"), Some(20.0));
    // Operation counts from /proc/diskstats, not added to the cgroup's.
    assert_eq!(at("container_fs_reads_total"), Some(7.0));
    assert_eq!(at("container_fs_read_seconds_total"), Some(1.5));
    assert_eq!(at("container_fs_io_current"), Some(2.0));
    assert_eq!(
        at("container_fs_io_time_weighted_seconds_total"),
        Some(0.25)
    );
    // Bytes still from the cgroup's block I/O.
    assert_eq!(at("container_fs_reads_bytes_total"), Some(4096.0));
}
