//! Image garbage collection, as the kubelet's image GC manager
//! (pkg/kubelet/images/image_gc_manager.go): the agent remembers when it
//! first saw each image and when a container last used it; every 5 min, when
//! the image filesystem is at least `imageGCHighThresholdPercent` full, the
//! images no container uses (exited ones count as users) and the runtime has
//! not pinned (the sandbox image) are removed least recently used first,
//! those younger than `imageMinimumGCAge` spared, until usage is down to
//! `imageGCLowThresholdPercent`. A pass that cannot free enough reports
//! `FreeDiskSpaceFailed` on the Node.

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `imageGCHighThresholdPercent` (85): usage that starts a collection.
    pub high_percent: u8,
    /// `imageGCLowThresholdPercent` (80): usage a collection brings it to.
    pub low_percent: u8,
    /// `imageMinimumGCAge` (2 min): images first seen more recently stay.
    pub min_age: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
        }
    }
}

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
/// `capacity × (100 − low) / 100 − available` bytes, freed from the images
/// not in use now and not pinned, least recently used first (ties: first
/// detected first), skipping those first seen less than `min_age` ago.
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
    let needed = target.saturating_sub(available);
    let min_age = i64::try_from(policy.min_age.as_secs()).unwrap_or(i64::MAX);
    let mut candidates: Vec<(&String, &Record)> = records
        .images
        .iter()
        .filter(|(id, r)| !r.pinned && !in_use_now.contains(*id) && r.last_used < now)
        .filter(|(_, r)| now.saturating_sub(r.first_detected) >= min_age)
        .collect();
    candidates.sort_by_key(|(id, r)| (r.last_used, r.first_detected, (*id).clone()));
    let mut out = Pass {
        needed,
        ..Default::default()
    };
    for (id, r) in candidates {
        if out.freed >= needed {
            break;
        }
        out.remove.push(id.clone());
        out.freed = out.freed.saturating_add(r.size);
    }
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

/// Runs the manager forever: detects images and collects every [`PERIOD`].
pub async fn run(
    runtime: Runtime,
    stats: Arc<Provider>,
    policy: Policy,
    recorder: Recorder,
    node: String,
) {
    // As the kubelet: a high threshold of 100% turns periodic collection off.
    if policy.high_percent >= 100 {
        return;
    }
    let mut records = Records::default();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let (images, containers) = match (
            runtime.list_images().await,
            runtime.list_containers(HashMap::new()).await,
        ) {
            (Ok(i), Ok(c)) => (i, c),
            (Err(e), _) | (_, Err(e)) => {
                warn!(error = %e, "image GC: list images and containers");
                continue;
            }
        };
        let used = in_use(&containers);
        records.detect(&images, &used, now);
        let fs = match stats.summary(false).await {
            Ok(s) => s.node.runtime.and_then(|r| r.image_fs),
            Err(e) => {
                debug!(error = %e, "image GC: no image filesystem stats");
                continue;
            }
        };
        let Some((capacity, available)) =
            fs.and_then(|f| Some((f.capacity_bytes?, f.available_bytes?)))
        else {
            continue;
        };
        let p = pass(&records, &used, policy, capacity, available, now);
        let mut freed = 0u64;
        for id in &p.remove {
            match runtime.remove_image(id).await {
                Ok(()) => {
                    info!(image = id, "image GC: removed an unused image");
                    freed = freed.saturating_add(records.images.get(id).map_or(0, |r| r.size));
                    records.images.remove(id);
                }
                Err(e) => warn!(image = id, error = %e, "image GC: remove image"),
            }
        }
        if freed < p.needed {
            let usage = 100u64.saturating_sub(available.saturating_mul(100) / capacity.max(1));
            publish_node(
                &recorder,
                &node,
                EventType::Warning,
                "FreeDiskSpaceFailed",
                format!(
                    "Insufficient free disk space on the node's image filesystem ({usage}% of {} used). Failed to free sufficient space by deleting unused images (freed {freed} bytes). Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
                    format_size(capacity)
                ),
            );
        }
    }
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
}
