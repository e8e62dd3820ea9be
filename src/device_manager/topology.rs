//! Where a resource's devices sit, for the topology manager, pure: the hints
//! the device manager gives (the kubelet's `topology_hints.go`:
//! `generateDeviceTopologyHints` and the checks of `GetTopologyHints`) and
//! how it picks devices along the merged hint (`devicesToAllocate` with
//! `filterByAffinity`).

use std::collections::{BTreeMap, BTreeSet};

use crate::topology_manager::{Hint, NumaMask};

/// The devices of one resource, healthy or not, with the NUMA nodes each
/// reports (an empty mask: none). Node IDs below 0 or above 63 are left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceTopology {
    devices: BTreeMap<String, NumaMask>,
}

/// What to give one container of one resource, once the devices it may
/// reuse are taken: the free devices split by the merged hint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Picker {
    /// How many devices the container asks for.
    pub required: usize,
    /// The devices it takes first: those its pod's init containers held and
    /// no other container of the pod holds (`devicesToReuse`).
    pub reused: Vec<String>,
    /// Free devices on a node of the hint.
    pub aligned: Vec<String>,
    /// Free devices on other nodes only.
    pub unaligned: Vec<String>,
    /// Free devices without NUMA nodes (or every free device when the
    /// resource has no topology or there is no hint).
    pub no_affinity: Vec<String>,
}

impl ResourceTopology {
    /// The topology of `devices`: (ID, the NUMA node IDs its plugin reports).
    pub fn new<'a>(devices: impl IntoIterator<Item = (&'a String, &'a [i64])>) -> Self {
        let devices = devices
            .into_iter()
            .map(|(id, nodes)| {
                let nodes: Vec<usize> = nodes
                    .iter()
                    .filter_map(|n| usize::try_from(*n).ok())
                    .collect();
                (id.clone(), NumaMask::of(&nodes))
            })
            .collect();
        Self { devices }
    }

    fn mask(&self, id: &str) -> NumaMask {
        self.devices.get(id).copied().unwrap_or_default()
    }

    /// True when some device reports NUMA nodes
    /// (`deviceHasTopologyAlignment`): without any, the resource has no
    /// preference.
    #[must_use]
    pub fn has_alignment(&self) -> bool {
        self.devices.values().any(|m| m.count() > 0)
    }

    /// The hints for `requested` devices (`GetTopologyHints` for one
    /// resource): `None` without alignment; the hints of the devices
    /// already `allocated` when there are any (none when their number is
    /// not the request's); else those of the `available` and `reusable`
    /// devices, none when they are too few. `machine` holds the machine's
    /// NUMA nodes.
    #[must_use]
    pub fn hints(
        &self,
        requested: usize,
        allocated: &[String],
        available: &[String],
        reusable: &[String],
        machine: &[usize],
    ) -> Option<Vec<Hint>> {
        if !self.has_alignment() {
            return None;
        }
        if !allocated.is_empty() {
            if allocated.len() != requested {
                return Some(Vec::new());
            }
            return Some(self.generate(allocated, &[], requested, machine));
        }
        let listed: BTreeSet<&String> = available.iter().collect();
        let free = listed.len() + reusable.iter().filter(|d| !listed.contains(d)).count();
        if free < requested {
            return Some(Vec::new());
        }
        Some(self.generate(available, reusable, requested, machine))
    }

    /// The machine's nodes that hold devices of the resource, all of them
    /// when none do (`deviceNUMANodes`: nodes the machine does not have are
    /// ignored).
    fn nodes(&self, machine: &[usize]) -> Vec<usize> {
        let held = self
            .devices
            .values()
            .fold(NumaMask::default(), |a, m| NumaMask(a.0 | m.0));
        let nodes: Vec<usize> = machine
            .iter()
            .copied()
            .filter(|n| held.contains(*n))
            .collect();
        if nodes.is_empty() {
            machine.to_vec()
        } else {
            nodes
        }
    }

    /// `generateDeviceTopologyHints`: every set of the resource's nodes
    /// where `request` devices fit (the reusable devices, all of them on
    /// it, plus available ones), preferred when no smaller set holds as
    /// many of the resource's devices.
    fn generate(
        &self,
        available: &[String],
        reusable: &[String],
        request: usize,
        machine: &[usize],
    ) -> Vec<Hint> {
        let nodes = self.nodes(machine);
        // Devices by mask: the sets are weighed per distinct mask, not per
        // device.
        let mut all: BTreeMap<NumaMask, usize> = BTreeMap::new();
        for m in self.devices.values() {
            *all.entry(*m).or_default() += 1;
        }
        let mut free: BTreeMap<NumaMask, usize> = BTreeMap::new();
        for d in available {
            *free.entry(self.mask(d)).or_default() += 1;
        }
        let reused: Vec<NumaMask> = reusable
            .iter()
            .map(|d| self.mask(d))
            .filter(|m| m.count() > 0)
            .collect();
        let touches = |set: NumaMask, m: NumaMask| set.0 & m.0 != 0;
        let mut min_size = nodes.len();
        let mut masks = Vec::new();
        for set in NumaMask::subsets(&nodes) {
            let in_set: usize = all
                .iter()
                .filter(|(m, _)| touches(set, **m))
                .map(|(_, n)| n)
                .sum();
            let size = set.count() as usize;
            if in_set >= request && size < min_size {
                min_size = size;
            }
            if !reused.iter().all(|m| touches(set, *m)) {
                continue;
            }
            let matching = reused.len()
                + free
                    .iter()
                    .filter(|(m, _)| touches(set, **m))
                    .map(|(_, n)| n)
                    .sum::<usize>();
            if matching >= request {
                masks.push(set);
            }
        }
        Hint::preferring(masks, min_size)
    }

    /// The picker for a container that needs `required` devices: `reusable`
    /// first, then `available` (free, healthy) split by `affinity`, the
    /// merged hint's nodes (`filterByAffinity`). Devices keep their sorted
    /// order in each group.
    #[must_use]
    pub fn picker(
        &self,
        required: usize,
        reusable: &[String],
        available: &[String],
        affinity: Option<NumaMask>,
    ) -> Picker {
        let mut p = Picker {
            required,
            reused: reusable.iter().take(required).cloned().collect(),
            ..Picker::default()
        };
        let reused: BTreeSet<&String> = p.reused.iter().collect();
        let available: Vec<String> = available
            .iter()
            .filter(|d| !reused.contains(d))
            .cloned()
            .collect();
        match affinity.filter(|_| self.has_alignment()) {
            None => p.no_affinity = available,
            Some(hint) => {
                for d in available {
                    let m = self.mask(&d);
                    if m.count() == 0 {
                        p.no_affinity.push(d);
                    } else if m.0 & hint.0 != 0 {
                        p.aligned.push(d);
                    } else {
                        p.unaligned.push(d);
                    }
                }
            }
        }
        p
    }
}

/// What to ask a plugin's `GetPreferredAllocation`: the devices to choose
/// from, those it must include, and how many in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreferredRequest {
    /// The devices it may choose from.
    pub available: Vec<String>,
    /// The devices already taken, which it must include.
    pub must_include: Vec<String>,
    /// How many devices the container asks for.
    pub size: usize,
}

impl Picker {
    /// How many free devices there are besides the reused ones.
    #[must_use]
    pub fn free(&self) -> usize {
        self.aligned.len() + self.unaligned.len() + self.no_affinity.len()
    }

    /// How many devices are still needed once the reused ones are taken.
    #[must_use]
    pub fn needed(&self) -> usize {
        self.required.saturating_sub(self.reused.len())
    }

    /// What to ask the plugin's preference for, as `devicesToAllocate` asks
    /// it: among the aligned devices when they are more than needed, else
    /// among every free device once the aligned ones are taken; `None` when
    /// nothing is left to choose.
    #[must_use]
    pub fn preferred_request(&self) -> Option<PreferredRequest> {
        let needed = self.needed();
        if needed == 0 {
            return None;
        }
        if needed < self.aligned.len() {
            return Some(PreferredRequest {
                available: self.reused.iter().chain(&self.aligned).cloned().collect(),
                must_include: self.reused.clone(),
                size: self.required,
            });
        }
        if needed == self.aligned.len() {
            return None;
        }
        let taken: Vec<String> = self.reused.iter().chain(&self.aligned).cloned().collect();
        let available = taken
            .iter()
            .chain(&self.unaligned)
            .chain(&self.no_affinity)
            .cloned()
            .collect();
        Some(PreferredRequest {
            available,
            must_include: taken,
            size: self.required,
        })
    }

    /// The devices given, sorted: the reused ones, then the plugin's
    /// `preferred` among the aligned (when they are more than needed),
    /// else every aligned one, the preferred among the others, the
    /// unaligned, the ones without NUMA nodes.
    #[must_use]
    pub fn pick(&self, preferred: &[String]) -> Vec<String> {
        let aligned: BTreeSet<&String> = self.aligned.iter().collect();
        let others: BTreeSet<&String> = self.unaligned.iter().chain(&self.no_affinity).collect();
        let mut chosen: BTreeSet<String> = self.reused.iter().cloned().collect();
        let required = self.required;
        let mut take = |from: &mut dyn Iterator<Item = &String>| {
            for d in from {
                if chosen.len() >= required {
                    return;
                }
                chosen.insert(d.clone());
            }
        };
        if self.needed() < self.aligned.len() {
            take(&mut preferred.iter().filter(|d| aligned.contains(d)));
            take(&mut self.aligned.iter());
        } else {
            take(&mut self.aligned.iter());
            take(&mut preferred.iter().filter(|d| others.contains(d)));
            take(&mut self.unaligned.iter());
            take(&mut self.no_affinity.iter());
        }
        chosen.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Devices `(id, NUMA nodes)`.
    fn topo(devices: &[(&str, &[i64])]) -> (ResourceTopology, Vec<String>) {
        let owned: Vec<(String, Vec<i64>)> = devices
            .iter()
            .map(|(id, n)| ((*id).to_string(), n.to_vec()))
            .collect();
        let t = ResourceTopology::new(owned.iter().map(|(id, n)| (id, n.as_slice())));
        (t, owned.into_iter().map(|(id, _)| id).collect())
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_string()).collect()
    }

    fn hint(nodes: &[usize], preferred: bool) -> Hint {
        Hint::new(nodes, preferred)
    }

    const TWO: &[usize] = &[0, 1];

    /// The cases of the kubelet's `getCommonTestCases` (a machine of two
    /// NUMA nodes): devices, request, devices the container already has,
    /// devices another container of the pod holds, the hints.
    #[test]
    fn hints_are_the_kubelets() {
        type Case<'a> = (
            &'a str,
            &'a [(&'a str, &'a [i64])],
            usize,
            &'a [&'a str],
            &'a [&'a str],
            Option<Vec<Hint>>,
        );
        let per_socket: &[(&str, &[i64])] = &[
            ("Dev1", &[0]),
            ("Dev2", &[1]),
            ("Dev3", &[0]),
            ("Dev4", &[1]),
        ];
        let cases: Vec<Case> = vec![
            (
                "no alignment",
                &[("Dev1", &[]), ("Dev2", &[])],
                1,
                &[],
                &[],
                None,
            ),
            (
                "only one with alignment",
                &[("Dev1", &[]), ("Dev2", &[1])],
                1,
                &[],
                &[],
                Some(vec![hint(&[1], true)]),
            ),
            (
                "one device per socket",
                &[("Dev1", &[0]), ("Dev2", &[1])],
                1,
                &[],
                &[],
                Some(vec![
                    hint(&[0], true),
                    hint(&[1], true),
                    hint(&[0, 1], false),
                ]),
            ),
            (
                "request for 2, one device per socket",
                &[("Dev1", &[0]), ("Dev2", &[1])],
                2,
                &[],
                &[],
                Some(vec![hint(&[0, 1], true)]),
            ),
            (
                "request for 2, 2 devices per socket",
                per_socket,
                2,
                &[],
                &[],
                Some(vec![
                    hint(&[0], true),
                    hint(&[1], true),
                    hint(&[0, 1], false),
                ]),
            ),
            (
                "optimal on 1 NUMA node, forced cross-NUMA",
                per_socket,
                2,
                &[],
                &["Dev1", "Dev2"],
                Some(vec![hint(&[0, 1], false)]),
            ),
            (
                "more requested than available",
                per_socket,
                6,
                &[],
                &[],
                Some(vec![]),
            ),
            (
                "all already allocated to the container",
                &[("Dev1", &[0]), ("Dev2", &[0])],
                2,
                &["Dev1", "Dev2"],
                &[],
                Some(vec![hint(&[0], true)]),
            ),
            (
                "less already allocated than requested",
                per_socket,
                4,
                &["Dev1", "Dev2"],
                &[],
                Some(vec![]),
            ),
            (
                "more already allocated than requested",
                per_socket,
                2,
                &["Dev1", "Dev2", "Dev3", "Dev4"],
                &[],
                Some(vec![]),
            ),
        ];
        for (name, devices, request, allocated, held, want) in cases {
            let (t, all) = topo(devices);
            let taken: Vec<&str> = allocated.iter().chain(held).copied().collect();
            let available: Vec<String> = all
                .into_iter()
                .filter(|d| !taken.contains(&d.as_str()))
                .collect();
            let got = t.hints(request, &ids(allocated), &available, &[], TWO);
            assert_eq!(got, want, "{name}");
        }
    }

    /// Two resources of one container: each gives its own hints.
    #[test]
    fn each_resource_gives_its_own_hints() {
        let (t1, a1) = topo(&[
            ("Dev1", &[0]),
            ("Dev2", &[1]),
            ("Dev3", &[0]),
            ("Dev4", &[1]),
        ]);
        let (t2, a2) = topo(&[("Dev1", &[0])]);
        assert_eq!(
            t1.hints(2, &[], &a1, &[], TWO),
            Some(vec![
                hint(&[0], true),
                hint(&[1], true),
                hint(&[0, 1], false)
            ])
        );
        assert_eq!(
            t2.hints(1, &[], &a2, &[], TWO),
            Some(vec![hint(&[0], true)])
        );
    }

    /// `TestGenerateDeviceTopologyHintsFiltersNUMANodes`: only the nodes
    /// that hold devices are weighed; a device reused from an init container
    /// must be on every hint.
    #[test]
    fn only_the_nodes_with_devices_are_weighed() {
        let (t, a) = topo(&[("a", &[0])]);
        assert_eq!(t.hints(1, &[], &a, &[], TWO), Some(vec![hint(&[0], true)]));
        let machine: Vec<usize> = (0..34).collect();
        let (t, a) = topo(&[("gpu0", &[0]), ("gpu1", &[1])]);
        assert_eq!(
            t.hints(1, &[], &a, &[], &machine),
            Some(vec![
                hint(&[0], true),
                hint(&[1], true),
                hint(&[0, 1], false)
            ])
        );
        let four = &[0, 1, 2, 3];
        let (t, _) = topo(&[("a", &[0])]);
        assert_eq!(
            t.hints(1, &[], &[], &ids(&["a"]), four),
            Some(vec![hint(&[0], true)])
        );
        let (t, _) = topo(&[("a", &[0]), ("b", &[1])]);
        assert_eq!(
            t.hints(2, &[], &ids(&["b"]), &ids(&["a"]), four),
            Some(vec![hint(&[0, 1], true)])
        );
        // Nodes the machine does not have are ignored.
        let (t, a) = topo(&[("a", &[0]), ("b", &[7]), ("c", &[-1])]);
        assert_eq!(t.hints(1, &[], &a, &[], TWO), Some(vec![hint(&[0], true)]));
    }

    /// The devices picked along a hint, as `TestTopologyAlignedAllocation`:
    /// how many land on each node.
    #[test]
    fn devices_are_picked_along_the_hint() {
        type Case<'a> = (
            &'a str,
            Vec<(String, Vec<i64>)>,
            usize,
            &'a [usize],
            Vec<(i64, usize)>,
        );
        let alternating = |n: usize, nodes: i64| -> Vec<(String, Vec<i64>)> {
            (0..n)
                .map(|i| {
                    (
                        format!("Dev{}", i + 1),
                        vec![i64::try_from(i).unwrap() % nodes],
                    )
                })
                .collect()
        };
        let cases: Vec<Case> = vec![
            (
                "no alignment",
                vec![("Dev1".into(), vec![]), ("Dev2".into(), vec![])],
                1,
                &[0, 1],
                vec![],
            ),
            (
                "request for 1, partial alignment",
                vec![("Dev1".into(), vec![]), ("Dev2".into(), vec![1])],
                1,
                &[1],
                vec![(1, 1)],
            ),
            (
                "single request, socket 0",
                alternating(2, 2),
                1,
                &[0],
                vec![(0, 1)],
            ),
            (
                "single request, socket 1",
                alternating(2, 2),
                1,
                &[1],
                vec![(1, 1)],
            ),
            (
                "request for 2, socket 0",
                alternating(4, 2),
                2,
                &[0],
                vec![(0, 2)],
            ),
            (
                "request for 2, socket 1",
                alternating(4, 2),
                2,
                &[1],
                vec![(1, 2)],
            ),
            (
                "request for 4, unsatisfiable, socket 0",
                alternating(6, 2),
                4,
                &[0],
                vec![(0, 3), (1, 1)],
            ),
            (
                "request for 4, unsatisfiable, socket 1",
                alternating(6, 2),
                4,
                &[1],
                vec![(0, 1), (1, 3)],
            ),
            (
                "request for 4, multisocket",
                alternating(8, 4),
                4,
                &[1, 3],
                vec![(1, 2), (3, 2)],
            ),
        ];
        for (name, devices, request, nodes, want) in cases {
            let t = ResourceTopology::new(devices.iter().map(|(id, n)| (id, n.as_slice())));
            let all: Vec<String> = devices.iter().map(|(id, _)| id.clone()).collect();
            let picker = t.picker(request, &[], &all, Some(NumaMask::of(nodes)));
            let picked = picker.pick(&[]);
            assert_eq!(picked.len(), request, "{name}");
            let mut per_node: BTreeMap<i64, usize> = BTreeMap::new();
            for d in &picked {
                if let Some(node) = devices
                    .iter()
                    .find(|(id, _)| id == d)
                    .and_then(|(_, n)| n.first())
                {
                    *per_node.entry(*node).or_default() += 1;
                }
            }
            assert_eq!(per_node.into_iter().collect::<Vec<_>>(), want, "{name}");
        }
    }

    /// The plugin's preference: asked among the aligned devices when they
    /// are more than needed (and followed there only), else among all the
    /// free ones with the aligned ones included (`TestGetPreferredAllocationParameters`).
    #[test]
    fn the_plugins_preference_is_asked_where_the_kubelet_asks_it() {
        let (t, all) = topo(&[
            ("a", &[0]),
            ("b", &[0]),
            ("c", &[0]),
            ("d", &[1]),
            ("e", &[1]),
        ]);
        let p = t.picker(2, &[], &all, Some(NumaMask::of(&[0])));
        let req = p.preferred_request().unwrap();
        assert_eq!(
            (req.available, req.must_include, req.size),
            (ids(&["a", "b", "c"]), vec![], 2)
        );
        // A preference outside the hint is not followed.
        assert_eq!(p.pick(&ids(&["d", "c"])), ids(&["a", "c"]));
        // Four asked: the three aligned, then the plugin picks among the rest.
        let p = t.picker(4, &[], &all, Some(NumaMask::of(&[0])));
        let req = p.preferred_request().unwrap();
        assert_eq!(req.available, ids(&["a", "b", "c", "d", "e"]));
        assert_eq!(req.must_include, ids(&["a", "b", "c"]));
        assert_eq!(p.pick(&ids(&["e"])), ids(&["a", "b", "c", "e"]));
        // Exactly the aligned ones: nothing to ask.
        let p = t.picker(3, &[], &all, Some(NumaMask::of(&[0])));
        assert_eq!(p.preferred_request(), None);
        // Reused devices come first and must be included.
        let p = t.picker(
            2,
            &ids(&["d"]),
            &ids(&["a", "b", "c", "e"]),
            Some(NumaMask::of(&[0])),
        );
        let req = p.preferred_request().unwrap();
        assert_eq!(
            (req.available, req.must_include),
            (ids(&["d", "a", "b", "c"]), ids(&["d"]))
        );
        assert_eq!(p.pick(&ids(&["b"])), ids(&["b", "d"]));
        // No hint: every free device is equal; the preference decides.
        let p = t.picker(1, &[], &all, None);
        assert_eq!(p.no_affinity.len(), 5);
        assert_eq!(p.pick(&ids(&["e"])), ids(&["e"]));
    }
}
