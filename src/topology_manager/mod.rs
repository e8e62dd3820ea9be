//! The topology manager, as the kubelet's (pkg/kubelet/cm/topologymanager):
//! it asks each hint provider (the device manager, the CPU manager) which
//! NUMA nodes could hold what a container (or a pod) asks for, merges the
//! hints into the best NUMA affinity, and admits or rejects the pod by the
//! policy (`none`, `best-effort`, `restricted`, `single-numa-node`). The
//! providers then allocate along the merged hint.
//!
//! This module is pure: masks, hints, the merge and the policies. The
//! admission that calls the providers is the pod worker's
//! (`pod::admission`).

pub mod policy;

pub use policy::{Options, Policy, Scope};

use std::collections::BTreeMap;
use std::fmt;

/// The kubelet's admission reason for a pod the policy cannot align
/// (`TopologyAffinityError.Type()`).
pub const REJECTION_REASON: &str = "TopologyAffinityError";
/// Its message (`TopologyAffinityError.Error()`).
pub const REJECTION_MESSAGE: &str = "Resources cannot be allocated with Topology locality";
/// The most permutations of hints one merge examines: the product of the
/// number of hints of each resource, which a pod's requests control. A
/// merge beyond it is refused ([`merge`] returns `None`).
pub const MAX_PERMUTATIONS: u64 = 1 << 20;

/// The topology manager's settings and the machine's NUMA nodes: what
/// admission merges hints with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyManager {
    /// `topologyManagerPolicy`.
    pub policy: Policy,
    /// `topologyManagerScope`; ignored under `none`.
    pub scope: Scope,
    /// `topologyManagerPolicyOptions`.
    pub options: Options,
    /// The machine's NUMA nodes.
    pub info: NumaInfo,
}

/// A set of NUMA nodes, bit `i` for node `i` (the kubelet's
/// `bitmask.BitMask`, nodes 0 to 63).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumaMask(pub u64);

impl NumaMask {
    /// The mask of `nodes`; nodes above 63 are left out.
    #[must_use]
    pub fn of(nodes: &[usize]) -> Self {
        Self(
            nodes
                .iter()
                .filter(|&&n| n < 64)
                .fold(0, |m, &n| m | (1 << n)),
        )
    }

    /// The number of nodes.
    #[must_use]
    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// The nodes, lowest first.
    #[must_use]
    pub fn nodes(self) -> Vec<usize> {
        (0..64).filter(|i| self.0 & (1 << i) != 0).collect()
    }

    /// True when `node` is in the mask.
    #[must_use]
    pub fn contains(self, node: usize) -> bool {
        node < 64 && self.0 & (1 << node) != 0
    }

    /// True when every node of `self` is in `other`.
    #[must_use]
    pub fn is_subset_of(self, other: Self) -> bool {
        self.0 & !other.0 == 0
    }

    /// As `IsNarrowerThan`: fewer nodes, or as many with a lower value.
    #[must_use]
    pub fn is_narrower_than(self, other: Self) -> bool {
        if self.count() == other.count() {
            self.0 < other.0
        } else {
            self.count() < other.count()
        }
    }

    /// Every non-empty subset of `nodes`, the smallest first, each size in
    /// the order of the nodes' positions (as `IterateBitMasks`).
    #[must_use]
    pub fn subsets(nodes: &[usize]) -> Vec<Self> {
        let nodes: Vec<usize> = nodes.iter().copied().filter(|&n| n < 64).collect();
        let mut out = Vec::new();
        for size in 1..=nodes.len() {
            combinations(&nodes, size, 0, 0, &mut out);
        }
        out
    }
}

fn combinations(nodes: &[usize], size: usize, start: usize, mask: u64, out: &mut Vec<NumaMask>) {
    if size == 0 {
        out.push(NumaMask(mask));
        return;
    }
    for i in start..nodes.len() {
        if nodes.len() - i < size {
            break;
        }
        combinations(nodes, size - 1, i + 1, mask | (1 << nodes[i]), out);
    }
}

impl fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.nodes())
    }
}

/// A hint: NUMA nodes that can hold a request, and whether they are the
/// provider's preference (the kubelet's `TopologyHint`; no affinity means
/// any node).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hint {
    /// The nodes; `None` for no preference.
    pub affinity: Option<NumaMask>,
    /// True for a preferred hint.
    pub preferred: bool,
}

impl Hint {
    /// A hint with these nodes.
    #[must_use]
    pub fn new(nodes: &[usize], preferred: bool) -> Self {
        Self {
            affinity: Some(NumaMask::of(nodes)),
            preferred,
        }
    }

    /// The hints of `masks` (the sets of nodes that can hold a request),
    /// preferred those of `narrowest` nodes: what each provider's hint
    /// generation ends with (`generateCPUTopologyHints`,
    /// `generateDeviceTopologyHints`).
    #[must_use]
    pub fn preferring(masks: Vec<NumaMask>, narrowest: usize) -> Vec<Self> {
        masks
            .into_iter()
            .map(|m| Self {
                affinity: Some(m),
                preferred: m.count() as usize == narrowest,
            })
            .collect()
    }
}

/// One provider's hints: by resource name, `None` for a resource without
/// preference and an empty list for one no node can hold. A provider without
/// any (`None` or an empty map) has no preference at all.
pub type ProviderHints = Option<BTreeMap<String, Option<Vec<Hint>>>>;

/// The machine's NUMA nodes and their distances (the kubelet's `NUMAInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaInfo {
    /// The nodes, lowest first.
    pub nodes: Vec<usize>,
    /// Each node's distance to every node, by position in `nodes` (from
    /// `/sys/devices/system/node/nodeN/distance`); needed only with
    /// `prefer-closest-numa-nodes`.
    pub distances: BTreeMap<usize, Vec<u64>>,
}

impl NumaInfo {
    /// Every node.
    #[must_use]
    pub fn default_mask(&self) -> NumaMask {
        NumaMask::of(&self.nodes)
    }

    /// The average distance between the nodes of `mask`, every ordered pair
    /// counted, a node with itself too (`CalculateAverageFor`).
    fn average_distance(&self, mask: NumaMask) -> f64 {
        let nodes = mask.nodes();
        if nodes.is_empty() {
            return 0.0;
        }
        let mut sum = 0.0;
        for a in &nodes {
            for b in &nodes {
                let d = self
                    .distances
                    .get(a)
                    .and_then(|row| row.get(*b))
                    .copied()
                    .unwrap_or(0);
                #[allow(clippy::cast_precision_loss, reason = "distances are small")]
                {
                    sum += d as f64;
                }
            }
        }
        #[allow(clippy::cast_precision_loss, reason = "at most 64² pairs")]
        let pairs = (nodes.len() * nodes.len()) as f64;
        sum / pairs
    }

    /// The narrower mask; at equal counts the closer one, then the lower
    /// (`Closest`).
    fn closest(&self, a: NumaMask, b: NumaMask) -> NumaMask {
        if a.count() != b.count() {
            return narrowest(a, b);
        }
        let (da, db) = (self.average_distance(a), self.average_distance(b));
        if (da - db).abs() < f64::EPSILON {
            if a.0 < b.0 { a } else { b }
        } else if da < db {
            a
        } else {
            b
        }
    }
}

/// `Narrowest`: `a` when narrower than `b`, else `b`.
fn narrowest(a: NumaMask, b: NumaMask) -> NumaMask {
    if a.is_narrower_than(b) { a } else { b }
}

/// The providers' hints as lists to permute (`filterProvidersHints`),
/// resources in name order.
fn flatten(providers: &[ProviderHints]) -> Vec<Vec<Hint>> {
    let any = |preferred| Hint {
        affinity: None,
        preferred,
    };
    let mut lists = Vec::new();
    for hints in providers {
        match hints {
            Some(map) if !map.is_empty() => {
                for hints in map.values() {
                    lists.push(match hints {
                        None => vec![any(true)],
                        Some(h) if h.is_empty() => vec![any(false)],
                        Some(h) => h.clone(),
                    });
                }
            }
            _ => lists.push(vec![any(true)]),
        }
    }
    lists
}

/// One permutation merged: every affinity and-ed into the default mask,
/// preferred when every hint is and their affinities are equal
/// (`mergePermutation`).
fn merge_permutation(default: NumaMask, permutation: &[Hint]) -> Hint {
    let mut preferred = true;
    let mut first = None;
    let mut mask = default;
    for hint in permutation {
        if let Some(a) = hint.affinity {
            if *first.get_or_insert(a) != a {
                preferred = false;
            }
            mask = NumaMask(mask.0 & a.0);
        }
        if !hint.preferred {
            preferred = false;
        }
    }
    Hint {
        affinity: Some(mask),
        preferred,
    }
}

/// The best merged hint of every permutation of `lists` (`HintMerger`).
struct Merger<'a> {
    info: &'a NumaInfo,
    closest: bool,
    best_non_preferred_count: u32,
}

impl Merger<'_> {
    fn compare_masks(&self, current: Hint, candidate: Hint) -> Hint {
        let (Some(c), Some(k)) = (current.affinity, candidate.affinity) else {
            return current;
        };
        if c == k {
            return current;
        }
        let best = if self.closest {
            self.info.closest(c, k)
        } else {
            narrowest(c, k)
        };
        if best == c { current } else { candidate }
    }

    /// `HintMerger.compare`.
    fn compare(&self, current: Option<Hint>, candidate: Hint) -> Option<Hint> {
        let k = candidate.affinity.map_or(0, NumaMask::count);
        if k == 0 {
            return current;
        }
        let Some(current) = current else {
            return Some(candidate);
        };
        let best = self.best_non_preferred_count;
        let c = current.affinity.map_or(0, NumaMask::count);
        Some(match (current.preferred, candidate.preferred) {
            (false, true) => candidate,
            (true, false) => current,
            (true, true) => self.compare_masks(current, candidate),
            (false, false) if c > best => self.compare_masks(current, candidate),
            (false, false) if c == best => {
                if k == best {
                    self.compare_masks(current, candidate)
                } else {
                    current
                }
            }
            (false, false) if k > best => current,
            (false, false) if k == best => candidate,
            (false, false) if k > c => candidate,
            (false, false) if k < c => current,
            (false, false) => self.compare_masks(current, candidate),
        })
    }
}

/// The number of permutations of `lists`, saturating.
fn permutations(lists: &[Vec<Hint>]) -> u64 {
    lists
        .iter()
        .fold(1u64, |n, l| n.saturating_mul(l.len() as u64))
}

/// Merges the providers' hints under `policy` (the policies' `Merge`) and
/// says whether the pod may be admitted (`canAdmitPodResult`): the best
/// hint and the verdict. `none` asks nothing and admits; `best-effort`
/// admits always; `restricted` and `single-numa-node` only on a preferred
/// hint, the latter considering single-node hints only (its result spanning
/// every node reads as no affinity).
///
/// `None` when the hints have more than [`MAX_PERMUTATIONS`] permutations.
#[must_use]
pub fn merge(
    policy: Policy,
    options: &Options,
    info: &NumaInfo,
    providers: &[ProviderHints],
) -> Option<(Hint, bool)> {
    if policy == Policy::None {
        return Some((Hint::default(), true));
    }
    let mut lists = flatten(providers);
    if policy == Policy::SingleNumaNode {
        for list in &mut lists {
            list.retain(|h| h.preferred && h.affinity.is_none_or(|a| a.count() == 1));
        }
    }
    if permutations(&lists) > MAX_PERMUTATIONS {
        return None;
    }
    let merger = Merger {
        info,
        closest: options.prefer_closest_numa_nodes && policy != Policy::SingleNumaNode,
        best_non_preferred_count: lists
            .iter()
            .filter_map(|l| {
                l.iter()
                    .filter_map(|h| h.affinity)
                    .reduce(|n, a| if a.is_narrower_than(n) { a } else { n })
            })
            .map(NumaMask::count)
            .max()
            .unwrap_or(0),
    };
    let default = info.default_mask();
    let mut best = None;
    let mut permutation = Vec::with_capacity(lists.len());
    each_permutation(&lists, &mut permutation, &mut |p| {
        best = merger.compare(best, merge_permutation(default, p));
    });
    let mut best = best.unwrap_or(Hint {
        affinity: Some(default),
        preferred: false,
    });
    if policy == Policy::SingleNumaNode && best.affinity == Some(default) {
        best.affinity = None;
    }
    let admit = policy == Policy::BestEffort || best.preferred;
    Some((best, admit))
}

fn each_permutation(lists: &[Vec<Hint>], accum: &mut Vec<Hint>, f: &mut impl FnMut(&[Hint])) {
    let Some((first, rest)) = lists.split_first() else {
        f(accum);
        return;
    };
    for hint in first {
        accum.push(*hint);
        each_permutation(rest, accum, f);
        accum.pop();
    }
}

#[cfg(test)]
mod tests;
