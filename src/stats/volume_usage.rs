//! Volume disk usage measured in the background and cached, as the kubelet's
//! volume stat calculators (pkg/kubelet/server/stats/volume_stat_calculator.go):
//! a reader (the summary API, the eviction manager) gets the last
//! measurement at once, never waiting on a walk of a tree a container
//! controls; a measurement older than `volumeStatsAggPeriod` starts a new
//! one. Walks run one at a time on a blocking thread
//! ([`crate::volume::tree::usage`]: by descriptors, any depth, no link
//! followed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::debug;

use crate::volume::tree::Usage;

/// What is known of one path.
#[derive(Debug)]
struct Slot {
    /// The last measurement.
    last: Option<Usage>,
    /// When the last attempt ended, measured or not.
    tried: Option<Instant>,
    /// A measurement is under way.
    running: bool,
    /// When a reader last asked.
    asked: Instant,
}

/// The cache: path → last usage.
#[derive(Debug)]
pub struct UsageCache {
    period: Duration,
    slots: Mutex<HashMap<PathBuf, Slot>>,
    walks: tokio::sync::Semaphore,
}

impl UsageCache {
    /// A cache that measures each path at most once per `period`.
    #[must_use]
    pub fn new(period: Duration) -> Arc<Self> {
        Arc::new(Self {
            period,
            slots: Mutex::new(HashMap::new()),
            walks: tokio::sync::Semaphore::new(1),
        })
    }

    /// The last measured usage of `path` (`None` before its first
    /// measurement ends, or if every one failed). Starts a measurement when
    /// none is under way and the last attempt ended a period ago or more (or
    /// there was none); a failed one keeps the usage measured before it; forgets the paths nobody asked for in two periods (pods gone).
    /// Needs a Tokio runtime.
    pub fn get(self: &Arc<Self>, path: &Path) -> Option<Usage> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let forget = self.period.saturating_mul(2);
        slots.retain(|_, s| s.running || now.duration_since(s.asked) < forget);
        let slot = slots.entry(path.to_path_buf()).or_insert(Slot {
            last: None,
            tried: None,
            running: false,
            asked: now,
        });
        slot.asked = now;
        let stale = slot
            .tried
            .is_none_or(|at| now.duration_since(at) >= self.period);
        if stale && !slot.running {
            slot.running = true;
            let (cache, path) = (Arc::clone(self), path.to_path_buf());
            tokio::spawn(async move { cache.measure(path).await });
        }
        slot.last
    }

    async fn measure(self: Arc<Self>, path: PathBuf) {
        let permit = self.walks.acquire().await;
        let walked = path.clone();
        let got = tokio::task::spawn_blocking(move || crate::volume::tree::usage(&walked)).await;
        drop(permit);
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = slots.get_mut(&path) else {
            return;
        };
        slot.running = false;
        slot.tried = Some(Instant::now());
        match got {
            Ok(Ok(usage)) => slot.last = Some(usage),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => slot.last = None,
            Ok(Err(e)) => debug!(path = %path.display(), error = %e, "volume usage not measured"),
            Err(e) => debug!(path = %path.display(), error = %e, "volume usage walk ended"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits for `path`'s measurement to end, up to 5 s.
    async fn measured(cache: &Arc<UsageCache>, path: &Path) -> Option<Usage> {
        for _ in 0..100 {
            let running = cache
                .slots
                .lock()
                .unwrap()
                .get(path)
                .is_some_and(|s| s.running);
            if !running {
                return cache.slots.lock().unwrap().get(path).and_then(|s| s.last);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no measurement of {} ended", path.display());
    }

    #[tokio::test]
    async fn readers_get_the_last_measurement_and_a_stale_one_is_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("v");
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("a"), vec![1u8; 64 << 10]).unwrap();
        let cache = UsageCache::new(Duration::from_millis(400));
        assert_eq!(cache.get(&v), None, "nothing before the first walk ends");
        let first = measured(&cache, &v).await.expect("measured");
        assert_eq!(first.inodes, 2);
        assert_eq!(cache.get(&v), Some(first));
        // Within the period a change is not seen: no walk per reader.
        std::fs::write(v.join("b"), vec![1u8; 64 << 10]).unwrap();
        assert_eq!(cache.get(&v), Some(first));
        assert!(!cache.slots.lock().unwrap()[&v].running);
        tokio::time::sleep(Duration::from_millis(450)).await;
        // Stale: the reader still gets the last at once, and a walk starts.
        assert_eq!(cache.get(&v), Some(first));
        let second = measured(&cache, &v).await.expect("measured");
        assert_eq!(second.inodes, 3);
        assert!(second.bytes > first.bytes);
        // A path nobody asks for goes after two periods.
        tokio::time::sleep(Duration::from_millis(850)).await;
        let other = dir.path().join("w");
        assert_eq!(cache.get(&other), None);
        assert!(!cache.slots.lock().unwrap().contains_key(&v));
        // A path that is not there: measured as nothing.
        assert_eq!(measured(&cache, &other).await, None);
    }
}
