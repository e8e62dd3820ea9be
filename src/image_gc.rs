//! Image garbage collection, as the kubelet's image GC manager
//! (pkg/kubelet/images/image_gc_manager.go): the agent remembers when it
//! first saw each image and when a container last used it; every 5 min it
//! removes the images unused for longer than `imageMaximumGCAge` (when set),
//! then, when the image filesystem is at least `imageGCHighThresholdPercent`
//! full, the images no container uses (exited ones count as users) and the
//! runtime has not pinned (the sandbox image), least recently used first,
//! those younger than `imageMinimumGCAge` spared, until usage is down to
//! `imageGCLowThresholdPercent`. A pass that cannot free enough reports
//! `FreeDiskSpaceFailed` on the Node; a second failure in a row,
//! `ImageGCFailed`. The eviction manager reclaims disk with
//! [`ImageGc::delete_unused`], which frees every such image.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tracing::{debug, info, warn};

use crate::cri::Runtime;
use crate::events::{EventType, Recorder, publish_node};
use crate::stats::Provider;

/// How often the manager collects (the kubelet's `ImageGCPeriod`).
pub const PERIOD: Duration = Duration::from_secs(300);

/// The image GC policy (KubeletConfiguration).
pub use crate::config::ImageGcPolicy as Policy;

/// What the manager knows of one image (times in Unix seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// When the agent first saw it.
    pub first_detected: i64,
    /// When a container last used it (0: never, since the agent started).
    pub last_used: i64,
    /// Its size, bytes.
    pub size: u64,
    /// The runtime pinned it (never removed).
    pub pinned: bool,
}

/// The records, by image ID.
#[derive(Clone, Debug, Default)]
pub struct Records {
    images: HashMap<String, Record>,
}

impl Records {
    /// Updates the records from the runtime's `images` at `now`: new images
    /// are first detected now, images `in_use` (by ID, tag or digest) are
    /// used now, and records of images gone are dropped (`detectImages`).
    pub fn detect(&mut self, images: &[cri::Image], in_use: &HashSet<String>, now: i64) {
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.images.retain(|id, _| present.contains(id.as_str()));
        for i in images {
            let r = self.images.entry(i.id.clone()).or_insert(Record {
                first_detected: now,
                ..Default::default()
            });
            r.size = i.size;
            r.pinned = i.pinned;
            let used = in_use.contains(&i.id)
                || i.repo_tags
                    .iter()
                    .chain(&i.repo_digests)
                    .any(|n| in_use.contains(n));
            if used {
                r.last_used = now;
            }
        }
    }

    /// How many images are remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// True when none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }
}

/// The images to remove now, in order, and the bytes they free; `needed` is
/// what the pass must free, 0 when usage is below the high threshold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Image IDs to remove, least recently used first.
    pub remove: Vec<String>,
    /// Bytes to free to reach the low threshold.
    pub needed: u64,
    /// Bytes the removals free.
    pub freed: u64,
}

/// The collection due on a filesystem of `capacity` bytes with `available`
/// free, as the kubelet's `GarbageCollect`: nothing below the high threshold
/// (usage percent = 100 − available × 100 / capacity); else
/// `capacity × (100 − low) / 100 − available` bytes, freed from the
/// [`candidates`] in their order.
#[must_use]
pub fn pass(
    records: &Records,
    in_use_now: &HashSet<String>,
    policy: Policy,
    capacity: u64,
    available: u64,
    now: i64,
) -> Pass {
    if capacity == 0 {
        return Pass::default();
    }
    let usage = 100u64.saturating_sub(available.saturating_mul(100) / capacity);
    if usage < u64::from(policy.high_percent) {
        return Pass::default();
    }
    let target = capacity.saturating_mul(100 - u64::from(policy.low_percent.min(100))) / 100;
    free(
        records,
        in_use_now,
        policy.min_age,
        target.saturating_sub(available),
        now,
    )
}

/// Frees `needed` bytes from the [`candidates`], in their order.
fn free(
    records: &Records,
    in_use: &HashSet<String>,
    min_age: Duration,
    needed: u64,
    now: i64,
) -> Pass {
    let mut out = Pass {
        needed,
        ..Default::default()
    };
    for (id, size) in candidates(records, in_use, min_age, now) {
        if out.freed >= needed {
            break;
        }
        out.remove.push(id);
        out.freed = out.freed.saturating_add(size);
    }
    out
}

/// The images a collection may remove at `now`, with their sizes, least
/// recently used first (ties: first detected first), as
/// `imagesInEvictionOrder` and `freeSpace`: not pinned, not `in_use`, not
/// used at `now`, and first seen at least `min_age` ago.
#[must_use]
pub fn candidates(
    records: &Records,
    in_use: &HashSet<String>,
    min_age: Duration,
    now: i64,
) -> Vec<(String, u64)> {
    let min_age = i64::try_from(min_age.as_secs()).unwrap_or(i64::MAX);
    let mut out: Vec<(&String, &Record)> = records
        .images
        .iter()
        .filter(|(id, r)| !r.pinned && !in_use.contains(*id) && r.last_used < now)
        .filter(|(_, r)| now.saturating_sub(r.first_detected) >= min_age)
        .collect();
    out.sort_by_key(|(id, r)| (r.last_used, r.first_detected, (*id).clone()));
    out.into_iter()
        .map(|(id, r)| (id.clone(), r.size))
        .collect()
}

/// The images unused for longer than `max_age` at `now` (an image never
/// used since the agent started counts from time 0), not pinned and not
/// `in_use`, as the first step of the kubelet's `GarbageCollect`; none when
/// `max_age` is zero or the agent has run less than `max_age` (`started`,
/// Unix seconds).
#[must_use]
pub fn expired(
    records: &Records,
    in_use: &HashSet<String>,
    max_age: Duration,
    started: i64,
    now: i64,
) -> Vec<String> {
    let max_age = i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX);
    if max_age == 0 || now.saturating_sub(started) <= max_age {
        return Vec::new();
    }
    let mut out: Vec<String> = records
        .images
        .iter()
        .filter(|(id, r)| !r.pinned && !in_use.contains(*id))
        .filter(|(_, r)| now.saturating_sub(r.last_used) > max_age)
        .map(|(id, _)| id.clone())
        .collect();
    out.sort();
    out
}

/// The images the runtime's containers use, running or exited: their image
/// IDs (`imageRef`) and the names they were created from.
fn in_use(containers: &[cri::Container]) -> HashSet<String> {
    containers
        .iter()
        .flat_map(|c| {
            let name = c.image.as_ref().map(|i| i.image.clone());
            std::iter::once(c.image_ref.clone()).chain(name)
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// `bytes` as the kubelet's `formatSize` writes a size: `100.0 GiB`.
#[must_use]
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The image GC manager: the records behind a lock, shared by its periodic
/// collection and the eviction manager's reclaim.
pub struct ImageGc {
    runtime: Runtime,
    stats: Arc<Provider>,
    policy: std::sync::Mutex<Policy>,
    recorder: Recorder,
    node: String,
    started: i64,
    records: tokio::sync::Mutex<Records>,
}

impl ImageGc {
    /// A manager for `node`, started now.
    #[must_use]
    pub fn new(
        runtime: Runtime,
        stats: Arc<Provider>,
        policy: Policy,
        recorder: Recorder,
        node: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            stats,
            policy: std::sync::Mutex::new(policy),
            recorder,
            node,
            started: now(),
            records: tokio::sync::Mutex::new(Records::default()),
        })
    }

    /// The policy in effect.
    #[must_use]
    pub fn policy(&self) -> Policy {
        *self
            .policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the policy; the next pass uses it (a `NodeConfiguration`
    /// applied while the agent runs).
    pub fn set_policy(&self, policy: Policy) {
        *self
            .policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }

    /// Runs the periodic collection forever, every [`PERIOD`] from now; a
    /// pass does nothing while the high threshold is 100% and no maximum
    /// age is set (the kubelet's collection is off then).
    pub async fn run(self: Arc<Self>) {
        let mut failed_before = false;
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let policy = self.policy();
            if policy.high_percent >= 100 && policy.max_age.is_zero() {
                continue;
            }
            match self.collect().await {
                Ok(()) => failed_before = false,
                Err(e) => {
                    warn!(error = %e, "image GC");
                    // As the kubelet: the first failure is only logged.
                    if failed_before {
                        self.node_event(crate::reasons::event::IMAGE_GC_FAILED, e.clone());
                    }
                    failed_before = true;
                }
            }
        }
    }

    /// Refreshes the records from the runtime; returns the images in use.
    async fn detect(&self, records: &mut Records, now: i64) -> Result<HashSet<String>, String> {
        let images = self
            .runtime
            .list_images()
            .await
            .map_err(|e| e.to_string())?;
        let containers = self
            .runtime
            .list_containers(HashMap::new())
            .await
            .map_err(|e| e.to_string())?;
        let used = in_use(&containers);
        records.detect(&images, &used, now);
        Ok(used)
    }

    /// Removes `ids`; returns the bytes freed.
    async fn remove(&self, records: &mut Records, ids: &[String]) -> u64 {
        let mut freed = 0u64;
        for id in ids {
            match self.runtime.remove_image(id).await {
                Ok(()) => {
                    info!(image = id, "image GC: removed an unused image");
                    let size = records.images.remove(id).map_or(0, |r| r.size);
                    freed = freed.saturating_add(size);
                }
                Err(e) => warn!(image = id, error = %e, "image GC: remove image"),
            }
        }
        freed
    }

    /// One periodic collection, as the kubelet's `GarbageCollect`: images
    /// past the maximum age, then the high-to-low threshold pass.
    ///
    /// # Errors
    /// The runtime or the image filesystem's stats could not be read; the
    /// text is the event's message.
    pub async fn collect(&self) -> Result<(), String> {
        let policy = self.policy();
        let mut records = self.records.lock().await;
        let now = now();
        let used = self.detect(&mut records, now).await?;
        let old = expired(&records, &used, policy.max_age, self.started, now);
        self.remove(&mut records, &old).await;
        if policy.high_percent >= 100 {
            return Ok(());
        }
        let fs = self
            .stats
            .summary(false)
            .await
            .map_err(|e| format!("get image filesystem stats: {e}"))?
            .node
            .runtime
            .and_then(|r| r.image_fs);
        let (capacity, available) = fs
            .and_then(|f| Some((f.capacity_bytes?, f.available_bytes?)))
            .ok_or("the image filesystem has no capacity and availability stats")?;
        if capacity == 0 {
            let text = "invalid capacity 0 on image filesystem".to_string();
            self.node_event(crate::reasons::event::INVALID_DISK_CAPACITY, text.clone());
            return Err(text);
        }
        let p = pass(&records, &used, policy, capacity, available, now);
        let freed = self.remove(&mut records, &p.remove).await;
        if freed < p.needed {
            let usage = 100u64.saturating_sub(available.saturating_mul(100) / capacity);
            self.node_event(
                crate::reasons::event::FREE_DISK_SPACE_FAILED,
                format!(
                    "Insufficient free disk space on the node's image filesystem ({usage}% of {} used). Failed to free sufficient space by deleting unused images (freed {freed} bytes). Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
                    format_size(capacity)
                ),
            );
        }
        Ok(())
    }

    /// Removes every image a collection may ([`candidates`]), whatever the
    /// usage, as the kubelet's `DeleteUnusedImages` for the eviction
    /// manager; returns the bytes freed.
    ///
    /// # Errors
    /// The runtime could not be read.
    pub async fn delete_unused(&self) -> Result<u64, String> {
        let mut records = self.records.lock().await;
        let now = now();
        let used = self.detect(&mut records, now).await?;
        let ids: Vec<String> = candidates(&records, &used, self.policy().min_age, now)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        debug!(images = ids.len(), "image GC: deleting unused images");
        Ok(self.remove(&mut records, &ids).await)
    }

    fn node_event(&self, reason: &str, text: String) {
        publish_node(&self.recorder, &self.node, EventType::Warning, reason, text);
    }
}

/// Now, Unix seconds.
fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64, pinned: bool) -> cri::Image {
        cri::Image {
            id: id.into(),
            size,
            pinned,
            repo_tags: vec![format!("{id}:tag")],
            ..Default::default()
        }
    }

    #[test]
    fn unused_unpinned_images_go_least_recently_used_first_down_to_the_low_threshold() {
        let mut r = Records::default();
        let images = [
            image("old", 100, false),
            image("recent", 100, false),
            image("pause", 100, true),
            image("busy", 100, false),
            image("young", 100, false),
        ];
        // At 0: everything but "young" is seen; "old" and "recent" are used.
        r.detect(
            &images[..4],
            &HashSet::from(["old".to_string(), "recent:tag".to_string()]),
            0,
        );
        r.detect(&images[..4], &HashSet::from(["recent".to_string()]), 100);
        r.detect(&images, &HashSet::from(["busy".to_string()]), 200);
        assert_eq!(r.len(), 5);
        let busy = HashSet::from(["busy".to_string()]);
        let policy = Policy::default();
        // 90% used of 1000 bytes: free down to 80%, 100 bytes.
        let p = pass(&r, &busy, policy, 1000, 100, 200);
        assert_eq!((p.needed, p.freed), (100, 100));
        assert_eq!(p.remove, ["old"]);
        // More to free: "recent" next; "young" (seen 0 s ago) and the pinned
        // and busy images never.
        let p = pass(&r, &busy, policy, 1000, 0, 200);
        assert_eq!(p.remove, ["old", "recent"]);
        assert_eq!((p.needed, p.freed), (200, 200));
        // Below the high threshold: nothing.
        assert_eq!(pass(&r, &busy, policy, 1000, 200, 200), Pass::default());
        // Images gone from the runtime are forgotten.
        r.detect(&images[2..], &HashSet::new(), 300);
        assert_eq!(r.len(), 3);
        assert_eq!(format_size(100 * (1 << 30)), "100.0 GiB");
        assert_eq!(format_size(512), "512 B");
    }

    #[test]
    fn images_unused_past_the_maximum_age_go_once_the_agent_has_run_that_long() {
        let mut r = Records::default();
        let images = [
            image("stale", 10, false),
            image("fresh", 10, false),
            image("never", 10, false),
            image("pause", 10, true),
            image("busy", 10, false),
        ];
        r.detect(&images, &HashSet::from(["stale".to_string()]), 1000);
        r.detect(&images, &HashSet::from(["fresh".to_string()]), 1050);
        let busy = HashSet::from(["busy".to_string()]);
        let hour = Duration::from_secs(60);
        // Up for less than the maximum age: nothing.
        assert!(expired(&r, &busy, hour, 1000, 1059).is_empty());
        // Off at 0.
        assert!(expired(&r, &busy, Duration::ZERO, 0, 5000).is_empty());
        // At 1070: "stale" unused for 70 s, "never" never used; "fresh" for 20 s.
        assert_eq!(expired(&r, &busy, hour, 1000, 1070), ["never", "stale"]);
        // The eviction manager's candidates: every unused image past the
        // minimum age, least recently used first.
        let all = candidates(&r, &busy, Duration::ZERO, 1070);
        let ids: Vec<&str> = all.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["never", "stale", "fresh"]);
        assert!(candidates(&r, &busy, Duration::from_secs(120), 1070).is_empty());
    }
}
