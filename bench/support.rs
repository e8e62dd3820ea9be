//! What both benchmarks share: percentiles, the node agent's resource use
//! sampled from /proc, and the JSON record `hack/bench.sh` collects.
#![allow(
    dead_code,
    reason = "each benchmark uses a different part of this module"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The value at quantile `p` (0–1) of ascending `sorted`, nearest rank; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Samples needed before a 99th percentile means more than "the largest".
pub const P99_MIN_SAMPLES: usize = 100;

/// The median and, given enough samples, the 99th percentile (seconds) of
/// latencies `v`, plus the raw values sorted.
#[derive(Debug, Serialize)]
pub struct Latency {
    /// Median, seconds.
    pub p50: f64,
    /// 99th percentile, seconds; only with at least [`P99_MIN_SAMPLES`]
    /// samples: with fewer, the nearest-rank 99th percentile is just the
    /// largest sample, which `max` already is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    /// Largest value, seconds.
    pub max: f64,
    /// Every sample, ascending, seconds.
    pub samples: Vec<f64>,
}

impl Latency {
    /// Summarizes `v` (seconds).
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self {
            p50: percentile(&v, 0.5),
            p99: (v.len() >= P99_MIN_SAMPLES).then(|| percentile(&v, 0.99)),
            max: v.last().copied().unwrap_or(0.0),
            samples: v,
        }
    }
}

/// A process's resource use over a window.
#[derive(Debug, Serialize, Default)]
pub struct Usage {
    /// Mean resident set size, MiB.
    pub rss_mib_mean: f64,
    /// Largest resident set size seen, MiB.
    pub rss_mib_max: f64,
    /// Mean anonymous part of the RSS (heap, stacks), MiB.
    pub rss_anon_mib_mean: f64,
    /// Mean file-backed part of the RSS (the binary's and libraries' pages), MiB.
    pub rss_file_mib_mean: f64,
    /// CPU time used divided by wall time, cores.
    pub cpu_cores: f64,
    /// Length of the window, seconds.
    pub seconds: f64,
}

/// One reading of a process: RSS, its anonymous and file-backed parts (KiB),
/// and user+system CPU time (clock ticks).
#[derive(Clone, Copy, Default)]
struct Reading {
    rss: u64,
    anon: u64,
    file: u64,
    ticks: u64,
}

/// Reads process `pid` from /proc/PID/status and /proc/PID/stat; `None` once it is gone.
fn read_proc(pid: u32) -> Option<Reading> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3,
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Reading {
        rss: kib("VmRSS:")?,
        anon: kib("RssAnon:")?,
        file: kib("RssFile:")?,
        ticks: utime + stime,
    })
}

/// Samples a process's RSS every 250 ms until stopped.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Usage>,
}

impl Sampler {
    /// Starts sampling `pid`; `None` samples nothing (bare CRI has no agent).
    pub fn start(pid: Option<u32>) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let Some(pid) = pid else {
                return Usage::default();
            };
            let t0 = Instant::now();
            let Some(first) = read_proc(pid) else {
                return Usage::default();
            };
            let ticks0 = first.ticks;
            let (mut sum, mut n, mut max, mut ticks) = (Reading::default(), 0u64, 0u64, ticks0);
            loop {
                if let Some(r) = read_proc(pid) {
                    sum.rss += r.rss;
                    sum.anon += r.anon;
                    sum.file += r.file;
                    n += 1;
                    max = max.max(r.rss);
                    ticks = r.ticks;
                }
                tokio::select! {
                    _ = stopped.changed() => break,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
            if let Some(r) = read_proc(pid) {
                ticks = r.ticks;
            }
            let seconds = t0.elapsed().as_secs_f64();
            let hz = rustix::param::clock_ticks_per_second() as f64;
            let mean = |kib: u64| kib as f64 / n.max(1) as f64 / 1024.0;
            Usage {
                rss_mib_mean: mean(sum.rss),
                rss_anon_mib_mean: mean(sum.anon),
                rss_file_mib_mean: mean(sum.file),
                rss_mib_max: max as f64 / 1024.0,
                cpu_cores: (ticks - ticks0) as f64 / hz / seconds,
                seconds,
            }
        });
        Self { stop, task }
    }

    /// Stops sampling and returns what was seen.
    pub async fn finish(self) -> anyhow::Result<Usage> {
        let _ = self.stop.send(true);
        Ok(self.task.await?)
    }
}

/// The wall-clock time now, RFC 3339 (the audit log's timestamps are too).
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Writes `value` as pretty JSON to `path`, or prints it when `path` is `None`.
pub fn emit(path: Option<&Path>, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    match path {
        Some(p) => std::fs::write(p, text + "\n")?,
        None => println!("{text}"),
    }
    Ok(())
}

/// The arguments cargo passes through to a benchmark, without `--bench`.
pub fn args() -> Vec<String> {
    std::env::args().filter(|a| a != "--bench").collect()
}
