//! The topology manager's configuration: `topologyManagerPolicy`,
//! `topologyManagerScope` and `topologyManagerPolicyOptions`, read and
//! checked as the kubelet's `NewManager`, `NewPolicyOptions` and its
//! configuration validation.

use std::collections::BTreeMap;

/// The kubelet's default `max-allowable-numa-nodes`
/// (`defaultMaxAllowableNUMANodes`).
pub const DEFAULT_MAX_NUMA_NODES: usize = 8;

/// The most NUMA nodes any policy but `none` runs on, whatever
/// `max-allowable-numa-nodes` says: hints weigh every set of nodes (2^n).
pub const MAX_NUMA_NODES: usize = 16;

/// `topologyManagerPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// `none`: no alignment (the default).
    #[default]
    None,
    /// `best-effort`: the best hint, every pod admitted.
    BestEffort,
    /// `restricted`: a pod without a preferred hint is rejected.
    Restricted,
    /// `single-numa-node`: a pod its resources cannot hold on one NUMA
    /// node is rejected.
    SingleNumaNode,
}

impl Policy {
    /// The policies by their configuration names.
    pub const NAMES: [(&'static str, Self); 4] = [
        ("none", Self::None),
        ("best-effort", Self::BestEffort),
        ("restricted", Self::Restricted),
        ("single-numa-node", Self::SingleNumaNode),
    ];

    /// Reads a policy name.
    ///
    /// # Errors
    /// The kubelet's validation message for an unknown name.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                format!(
                    "topologyManagerPolicy (--topology-manager-policy) {name:?} must be one of: [\"none\" \"best-effort\" \"restricted\" \"single-numa-node\"]"
                )
            })
    }

    /// The configuration name.
    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("none", |(n, _)| n)
    }
}

/// `topologyManagerScope`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// `container`: each container aligned on its own (the default).
    #[default]
    Container,
    /// `pod`: the pod's containers aligned together.
    Pod,
}

impl Scope {
    /// Reads a scope name.
    ///
    /// # Errors
    /// The kubelet's validation message for an unknown name.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "container" => Ok(Self::Container),
            "pod" => Ok(Self::Pod),
            _ => Err(format!(
                "topologyManagerScope (--topology-manager-scope) {name:?} must be one of: \"container\", or \"pod\""
            )),
        }
    }

    /// The configuration name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Pod => "pod",
        }
    }
}

/// `topologyManagerPolicyOptions`, both GA in v1.37.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `prefer-closest-numa-nodes`: among hints of as many nodes, the one
    /// whose nodes are closest (by the kernel's distances) wins.
    pub prefer_closest_numa_nodes: bool,
    /// `max-allowable-numa-nodes`: a machine with more NUMA nodes stops the
    /// agent under any policy but `none` (at least 8, the default).
    pub max_allowable_numa_nodes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            prefer_closest_numa_nodes: false,
            max_allowable_numa_nodes: DEFAULT_MAX_NUMA_NODES,
        }
    }
}

impl Options {
    /// Reads the options as `NewPolicyOptions`.
    ///
    /// # Errors
    /// The kubelet's message for an unknown option, a value that is not a
    /// Go boolean or integer, or a node limit below 8.
    pub fn parse(options: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut out = Self::default();
        for (name, value) in options {
            match name.as_str() {
                "prefer-closest-numa-nodes" => {
                    out.prefer_closest_numa_nodes = go_bool(value).ok_or_else(|| {
                        format!(
                            "bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax"
                        )
                    })?;
                }
                "max-allowable-numa-nodes" => {
                    let n: i64 = value.parse().map_err(|_| {
                        format!(
                            "unable to convert policy option to integer {name:?}: strconv.Atoi: parsing {value:?}: invalid syntax"
                        )
                    })?;
                    if n < DEFAULT_MAX_NUMA_NODES as i64 {
                        return Err(format!(
                            "the minimum value of {name:?} should not be less than {DEFAULT_MAX_NUMA_NODES}"
                        ));
                    }
                    out.max_allowable_numa_nodes = usize::try_from(n).unwrap_or(usize::MAX);
                }
                _ => return Err(format!("unknown Topology Manager Policy option: {name:?}")),
            }
        }
        Ok(out)
    }

    /// Checks the machine against the node limit, as `NewManager`.
    ///
    /// # Errors
    /// `unsupported on machines with more than N NUMA Nodes` when the
    /// policy is not `none` and the machine has more nodes than allowed, or
    /// more than [`MAX_NUMA_NODES`].
    pub fn check_machine(&self, policy: Policy, numa_nodes: usize) -> Result<(), String> {
        if policy != Policy::None && numa_nodes > MAX_NUMA_NODES {
            return Err(format!(
                "unsupported on machines with more than {MAX_NUMA_NODES} NUMA Nodes: every set of them is weighed at each admission"
            ));
        }
        if policy != Policy::None && numa_nodes > self.max_allowable_numa_nodes {
            return Err(format!(
                "unsupported on machines with more than {} NUMA Nodes",
                self.max_allowable_numa_nodes
            ));
        }
        Ok(())
    }
}

/// Go's `strconv.ParseBool`.
#[must_use]
pub fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
