//! Which free CPUs an exclusive allocation takes, as the kubelet's
//! `cpu_assignment.go`: `takeByTopologyNUMAPacked` (whole NUMA nodes and
//! sockets first, then whole uncore caches when asked, then whole cores,
//! then single CPUs, the fullest places first so that free ones stay whole)
//! and `takeByTopologyNUMADistributed` (`distribute-cpus-across-numa`: the
//! CPUs spread evenly over the fewest NUMA nodes that hold them).

use std::collections::{BTreeMap, BTreeSet};

use super::topology::{CpuInfo, CpuTopology};
use crate::cpuset::CpuSet;

/// Errors of an allocation, with the kubelet's messages.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// Fewer CPUs are free than asked for.
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnough {
        /// CPUs asked for.
        requested: usize,
        /// CPUs free.
        available: usize,
    },
    /// The steps ended short (an irregular topology).
    #[error("failed to allocate cpus")]
    Failed,
}

/// The free CPUs of an allocation under way and what it took (the
/// kubelet's `cpuAccumulator`).
struct Accumulator<'a> {
    topo: &'a CpuTopology,
    free: BTreeMap<usize, CpuInfo>,
    needed: usize,
    result: CpuSet,
    /// NUMA nodes are the first level when sockets are at least as many.
    numa_first: bool,
}

type Key = fn(&CpuInfo) -> usize;
const NUMA: Key = |c| c.numa;
const SOCKET: Key = |c| c.socket;
const CORE: Key = |c| c.core;
const UNCORE: Key = |c| c.uncore;

impl<'a> Accumulator<'a> {
    fn new(topo: &'a CpuTopology, available: &CpuSet, needed: usize) -> Self {
        Self {
            topo,
            free: topo
                .cpus
                .iter()
                .filter(|(c, _)| available.contains(**c))
                .map(|(c, i)| (*c, *i))
                .collect(),
            needed,
            result: CpuSet::new(),
            numa_first: topo.num_sockets() >= topo.numa_nodes().len(),
        }
    }

    fn free_in(&self, key: Key, id: usize) -> usize {
        self.free.values().filter(|c| key(c) == id).count()
    }

    fn all_in(&self, key: Key, id: usize) -> CpuSet {
        self.topo
            .cpus
            .iter()
            .filter(|(_, c)| key(c) == id)
            .map(|(cpu, _)| *cpu)
            .collect()
    }

    /// The distinct `key`s of the free CPUs that pass `within`, sorted by
    /// their free CPUs, fewest first, then by ID (`cpuAccumulator.sort`).
    fn sorted(&self, key: Key, within: impl Fn(&CpuInfo) -> bool) -> Vec<usize> {
        let ids: BTreeSet<usize> = self.free.values().filter(|c| within(c)).map(key).collect();
        let mut ids: Vec<(usize, usize)> = ids
            .into_iter()
            .map(|id| (self.free_in(key, id), id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    fn numa_order(&self) -> Vec<usize> {
        if self.numa_first {
            self.sorted(NUMA, |_| true)
        } else {
            self.socket_order()
                .into_iter()
                .flat_map(|s| self.sorted(NUMA, move |c| c.socket == s))
                .collect()
        }
    }

    fn socket_order(&self) -> Vec<usize> {
        if self.numa_first {
            self.numa_order()
                .into_iter()
                .flat_map(|n| self.sorted(SOCKET, move |c| c.numa == n))
                .collect()
        } else {
            self.sorted(SOCKET, |_| true)
        }
    }

    fn core_order(&self) -> Vec<usize> {
        if self.numa_first {
            self.socket_order()
                .into_iter()
                .flat_map(|s| self.sorted(CORE, move |c| c.socket == s))
                .collect()
        } else {
            self.numa_order()
                .into_iter()
                .flat_map(|n| self.sorted(CORE, move |c| c.numa == n))
                .collect()
        }
    }

    fn uncore_order(&self) -> Vec<usize> {
        self.numa_order()
            .into_iter()
            .flat_map(|n| self.sorted(UNCORE, move |c| c.numa == n))
            .collect()
    }

    /// Free CPUs, core by core in core order, each core's lowest first.
    fn cpus_packed(&self) -> Vec<usize> {
        self.core_order()
            .into_iter()
            .flat_map(|core| {
                self.free
                    .iter()
                    .filter(move |(_, c)| c.core == core)
                    .map(|(cpu, _)| *cpu)
            })
            .collect()
    }

    fn take(&mut self, cpus: &CpuSet) {
        for cpu in cpus.iter() {
            if self.free.remove(&cpu).is_some() {
                self.result.insert(cpu);
                self.needed = self.needed.saturating_sub(1);
            }
        }
    }

    fn satisfied(&self) -> bool {
        self.needed == 0
    }

    /// Takes each whole free element of `order` (by `key`) that the request
    /// still needs all of, where `is_free` says it is whole.
    fn take_whole(&mut self, key: Key, order: &[usize], is_free: impl Fn(&Self, usize) -> bool) {
        let free: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&id| is_free(self, id))
            .collect();
        for id in free {
            let cpus = self.all_in(key, id);
            if self.needed >= cpus.len() {
                self.take(&cpus);
            }
        }
    }

    fn take_full_numa_nodes(&mut self) {
        let order = self.numa_order();
        self.take_whole(NUMA, &order, |a, id| {
            a.free_in(NUMA, id) == a.all_in(NUMA, id).len()
        });
    }

    fn take_full_sockets(&mut self) {
        let order = self.socket_order();
        let per_socket = self.topo.cpus_per_socket();
        self.take_whole(SOCKET, &order, |a, id| a.free_in(SOCKET, id) == per_socket);
    }

    fn take_full_uncores(&mut self) {
        let order = self.uncore_order();
        self.take_whole(UNCORE, &order, |a, id| {
            a.free_in(UNCORE, id) == a.all_in(UNCORE, id).len()
        });
    }

    fn take_full_cores(&mut self) {
        let order = self.core_order();
        let per_core = self.topo.cpus_per_core();
        self.take_whole(CORE, &order, |a, id| a.free_in(CORE, id) == per_core);
    }

    /// The lowest cores of `uncore` with free CPUs, as many as the request
    /// needs whole cores, taken when they hold exactly what it needs (one
    /// sibling left out for an odd request) (`takePartialUncore`).
    fn take_partial_uncore(&mut self, uncore: usize) {
        let per_core = self.topo.cpus_per_core();
        let cores_needed = self.needed.div_ceil(per_core);
        let cores: BTreeSet<usize> = self
            .free
            .values()
            .filter(|c| c.uncore == uncore)
            .map(|c| c.core)
            .collect();
        let cores: BTreeSet<usize> = cores.into_iter().take(cores_needed).collect();
        let mut cpus: Vec<usize> = self
            .free
            .iter()
            .filter(|(_, c)| cores.contains(&c.core))
            .map(|(cpu, _)| *cpu)
            .collect();
        if !self.needed.is_multiple_of(2) && per_core > 1 && cpus.len() > self.needed {
            cpus.pop();
        }
        if cpus.len() == self.needed {
            self.take(&cpus.into_iter().collect());
        }
    }

    /// `takeUncoreCache`.
    fn take_uncore_caches(&mut self) {
        let per_uncore = self.topo.cpus_per_uncore();
        for uncore in self.uncore_order() {
            if self.needed >= per_uncore {
                self.take_full_uncores();
            }
            if self.satisfied() {
                return;
            }
            self.take_partial_uncore(uncore);
            if self.satisfied() {
                return;
            }
        }
    }

    fn take_remaining(&mut self) {
        for cpu in self.cpus_packed() {
            self.take(&CpuSet::from_iter([cpu]));
            if self.satisfied() {
                return;
            }
        }
    }

    fn free_in_numa(&self, numa: usize) -> CpuSet {
        self.free
            .iter()
            .filter(|(_, c)| c.numa == numa)
            .map(|(cpu, _)| *cpu)
            .collect()
    }
}

/// The steps of a packed allocation, each taking whole places of a level.
#[derive(Clone, Copy)]
enum Level {
    Numa,
    Socket,
    Uncore,
    Core,
    Cpu,
}

/// `n` CPUs of `available`, packed (`takeByTopologyNUMAPacked`); with
/// `uncore` (`prefer-align-cpus-by-uncorecache`) whole uncore caches are
/// taken after whole sockets and NUMA nodes.
///
/// # Errors
/// [`Error::NotEnough`] when fewer than `n` are available.
pub fn take_packed(
    topo: &CpuTopology,
    available: &CpuSet,
    n: usize,
    uncore: bool,
) -> Result<CpuSet, Error> {
    let mut acc = Accumulator::new(topo, available, n);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.needed > acc.free.len() {
        return Err(Error::NotEnough {
            requested: n,
            available: available.len(),
        });
    }
    let first_levels = if acc.numa_first {
        [Level::Numa, Level::Socket]
    } else {
        [Level::Socket, Level::Numa]
    };
    let mut steps = first_levels.to_vec();
    if uncore {
        steps.push(Level::Uncore);
    }
    steps.extend([Level::Core, Level::Cpu]);
    for step in steps {
        match step {
            Level::Numa => acc.take_full_numa_nodes(),
            Level::Socket => acc.take_full_sockets(),
            Level::Uncore => acc.take_uncore_caches(),
            Level::Core => acc.take_full_cores(),
            Level::Cpu => acc.take_remaining(),
        }
        if acc.satisfied() {
            return Ok(acc.result);
        }
    }
    Err(Error::Failed)
}

/// The population standard deviation, the mean and the result each
/// rounded to three decimals (`standardDeviation`).
fn standard_deviation(xs: &[usize]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss, reason = "CPU counts are small")]
    let (values, len): (Vec<f64>, f64) = (xs.iter().map(|&x| x as f64).collect(), xs.len() as f64);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let mean = round(values.iter().sum::<f64>() / len);
    let var = values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / len;
    round(var.sqrt())
}

/// Every `k`-combination of `items`, in lexicographic order of positions.
fn combinations(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    fn go(
        items: &[usize],
        k: usize,
        start: usize,
        acc: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        if k == 0 {
            out.push(acc.clone());
            return;
        }
        for i in start..=items.len().saturating_sub(k) {
            if i >= items.len() {
                break;
            }
            acc.push(items[i]);
            go(items, k - 1, i + 1, acc, out);
            acc.pop();
        }
    }
    let mut out = Vec::new();
    if k >= 1 && k <= items.len() {
        go(items, k, 0, &mut Vec::new(), &mut out);
    }
    out
}

/// Hands out `group` CPUs at a time, round robin over `subset`, from
/// `after` (free CPUs per node) until `remainder` is used; false when it
/// cannot be (a node short of a whole group everywhere).
fn hand_out(
    after: &mut BTreeMap<usize, usize>,
    subset: &[usize],
    mut remainder: usize,
    group: usize,
) -> bool {
    while remainder > 0 {
        let mut progressed = false;
        for numa in subset {
            if remainder == 0 {
                break;
            }
            let Some(free) = after.get_mut(numa) else {
                continue;
            };
            if *free < group {
                continue;
            }
            *free -= group;
            remainder = remainder.saturating_sub(group);
            progressed = true;
        }
        if !progressed {
            return false;
        }
    }
    true
}

/// The best combination of `k` NUMA nodes to spread `n` CPUs over in
/// groups of `group`: the nodes and the subset that takes the remainder,
/// with the most even free CPUs left (the inner loop of
/// `takeByTopologyNUMADistributed`).
fn best_combination(
    acc: &Accumulator<'_>,
    numas: &[usize],
    k: usize,
    n: usize,
    group: usize,
) -> Option<(Vec<usize>, Vec<usize>)> {
    let mut best: Option<(f64, Vec<usize>, Vec<usize>)> = None;
    for combo in combinations(numas, k) {
        if best.as_ref().is_some_and(|(b, _, _)| *b == 0.0) {
            break;
        }
        let free: Vec<usize> = combo.iter().map(|&numa| acc.free_in(NUMA, numa)).collect();
        if free.iter().sum::<usize>() < n
            || free.iter().map(|f| f / group * group).sum::<usize>() < n
        {
            continue;
        }
        let distribution = n / combo.len() / group * group;
        if free.iter().any(|&f| f < distribution) {
            continue;
        }
        let mut after: BTreeMap<usize, usize> = numas
            .iter()
            .map(|&numa| (numa, acc.free_in(NUMA, numa)))
            .collect();
        for numa in &combo {
            if let Some(f) = after.get_mut(numa) {
                *f -= distribution;
            }
        }
        let remainder = n - distribution * combo.len();
        let mut local: Option<(f64, Vec<usize>)> = None;
        if remainder == 0 {
            local = Some((
                standard_deviation(&after.values().copied().collect::<Vec<_>>()),
                Vec::new(),
            ));
        }
        let candidates: Vec<usize> = combo
            .iter()
            .copied()
            .filter(|numa| after[numa] >= group)
            .collect();
        for size in (1..=candidates.len()).rev() {
            if remainder == 0 {
                break;
            }
            for subset in combinations(&candidates, size) {
                if subset.iter().map(|numa| after[numa]).sum::<usize>() < remainder {
                    continue;
                }
                let mut trial = after.clone();
                if !hand_out(&mut trial, &subset, remainder, group) {
                    continue;
                }
                let balance = standard_deviation(&trial.values().copied().collect::<Vec<_>>());
                if local.as_ref().is_none_or(|(b, _)| balance < *b) {
                    local = Some((balance, subset));
                }
            }
        }
        if let Some((balance, subset)) = local
            && best.as_ref().is_none_or(|(b, _, _)| balance < *b)
        {
            best = Some((balance, combo, subset));
        }
    }
    best.map(|(_, combo, subset)| (combo, subset))
}

/// `n` CPUs of `available` spread evenly over NUMA nodes in groups of
/// `group` CPUs (1, or the CPUs per core with `full-pcpus-only`), as
/// `takeByTopologyNUMADistributed`: the fewest nodes that hold them, the
/// combination leaving the free CPUs most even; packed when `n` is not a
/// multiple of `group` or no combination fits.
///
/// # Errors
/// [`Error::NotEnough`] when fewer than `n` are available.
pub fn take_distributed(
    topo: &CpuTopology,
    available: &CpuSet,
    n: usize,
    group: usize,
) -> Result<CpuSet, Error> {
    let group = group.max(1);
    if !n.is_multiple_of(group) {
        return take_packed(topo, available, n, false);
    }
    let mut acc = Accumulator::new(topo, available, n);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.needed > acc.free.len() {
        return Err(Error::NotEnough {
            requested: n,
            available: available.len(),
        });
    }
    let numas = acc.numa_order();
    let groups = topo.num_cpus().div_ceil(group);
    let per_node = groups.div_ceil(topo.numa_nodes().len().max(1));
    let groups_needed = n.div_ceil(group);
    let min_nodes = groups_needed.div_ceil(per_node.max(1));
    let max_nodes = groups_needed.min(numas.len());
    for k in min_nodes..=max_nodes {
        let Some((combo, remainder_nodes)) = best_combination(&acc, &numas, k, n, group) else {
            continue;
        };
        let mut distribution = n / combo.len() / group * group;
        for numa in &combo {
            distribution = distribution.min(acc.free_in(NUMA, *numa) / group * group);
        }
        for numa in &combo {
            let cpus = take_packed(topo, &acc.free_in_numa(*numa), distribution, false)?;
            acc.take(&cpus);
        }
        let mut remainder = n - distribution * combo.len();
        while remainder > 0 {
            let mut progressed = false;
            for numa in &remainder_nodes {
                if remainder == 0 {
                    break;
                }
                let free = acc.free_in_numa(*numa);
                if free.len() < group {
                    continue;
                }
                let cpus = take_packed(topo, &free, group, false)?;
                acc.take(&cpus);
                remainder = remainder.saturating_sub(group);
                progressed = true;
            }
            if !progressed {
                return Err(Error::Failed);
            }
        }
        return if acc.satisfied() {
            Ok(acc.result)
        } else {
            Err(Error::Failed)
        };
    }
    take_packed(topo, available, n, false)
}

#[cfg(test)]
mod tests;
