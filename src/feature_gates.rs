//! The kubelet's feature gates at the version this agent follows: each
//! gate's default, whether it is locked to it, and its stage, from
//! `src/feature_gates.tsv`. That table is generated from the
//! `k8s.io/kubernetes` module the local cluster is built from
//! (`hack/feature-gates.sh`, which lists what the kubelet binary registers)
//! and checked against it in CI, so a new Kubernetes version brings its
//! gates with it.
//!
//! [`crate::config`] reads `featureGates` with it as the kubelet's
//! `SetFromMap` does: an unknown gate, or a locked one set away from its
//! default, is refused with the kubelet's message.

/// A gate's maturity, as the kubelet's `prerelease`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `ALPHA`: off by default.
    Alpha,
    /// `BETA`.
    Beta,
    /// General availability (the kubelet's empty stage).
    Ga,
    /// `DEPRECATED`.
    Deprecated,
}

/// One feature gate of the kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// Its name (`SidecarContainers`).
    pub name: &'static str,
    /// Whether it is on when not set.
    pub default: bool,
    /// Whether it may only be set to its default (`LockToDefault`).
    pub locked: bool,
    /// Its stage.
    pub stage: Stage,
    /// The gates it depends on, comma separated (empty: none): each must be
    /// on while it is, as the kubelet's `validateDependencies`.
    pub depends_on: &'static str,
}

impl Gate {
    /// The gates it depends on.
    pub fn dependencies(&self) -> impl Iterator<Item = &'static str> {
        self.depends_on.split(',').filter(|d| !d.is_empty())
    }
}

/// The generated table: a `#` comment line, then `name default locked stage
/// depends-on` per line, tab separated (`-`: no dependency).
const TABLE: &str = include_str!("feature_gates.tsv");

/// Every gate of the table, sorted by name; lines that do not parse are
/// skipped (the table's unit test and CI's drift check keep it whole).
pub fn all() -> impl Iterator<Item = Gate> {
    TABLE.lines().filter_map(parse)
}

/// The gate called `name`, if the kubelet has it (case matters, as the
/// kubelet's).
#[must_use]
pub fn lookup(name: &str) -> Option<Gate> {
    all().find(|g| g.name == name)
}

fn parse(line: &'static str) -> Option<Gate> {
    if line.starts_with('#') {
        return None;
    }
    let mut fields = line.split('\t');
    let name = fields.next()?;
    let flag = |f: Option<&str>| match f? {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    };
    let default = flag(fields.next())?;
    let locked = flag(fields.next())?;
    let stage = match fields.next()? {
        "ALPHA" => Stage::Alpha,
        "BETA" => Stage::Beta,
        "GA" => Stage::Ga,
        "DEPRECATED" => Stage::Deprecated,
        _ => return None,
    };
    let depends_on = match fields.next()? {
        "-" => "",
        list => list,
    };
    (fields.next().is_none() && !name.is_empty()).then_some(Gate {
        name,
        default,
        locked,
        stage,
        depends_on,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_the_table_is_a_gate_sorted_by_name() {
        let lines: Vec<&str> = TABLE.lines().filter(|l| !l.starts_with('#')).collect();
        let gates: Vec<Gate> = all().collect();
        assert_eq!(gates.len(), lines.len(), "a line that is no gate");
        assert!(gates.len() > 100, "{} gates", gates.len());
        assert!(gates.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[test]
    fn gates_are_found_by_exact_name_with_their_specs() {
        let all_alpha = lookup("AllAlpha").expect("AllAlpha");
        assert!(!all_alpha.default && !all_alpha.locked);
        assert!(lookup("allalpha").is_none());
        assert!(lookup("NoSuchGate").is_none());
        // GA and locked on in the kubelet of this version.
        let gc = lookup("ImageMaximumGCAge").expect("ImageMaximumGCAge");
        assert!(gc.default, "{gc:?}");
        assert!(
            all().any(|g| g.stage == Stage::Ga && g.locked && g.default),
            "no GA gate locked on"
        );
        assert!(all().any(|g| g.stage == Stage::Alpha && !g.default));
        // Dependencies, as the kubelet registers them.
        let fix = lookup("PodLevelResourcesFixDefaulting").expect("PodLevelResourcesFixDefaulting");
        assert_eq!(
            fix.dependencies().collect::<Vec<_>>(),
            ["PodLevelResources"]
        );
        assert!(all().all(|g| g.dependencies().all(|d| lookup(d).is_some())));
    }

    #[test]
    fn lines_that_are_not_gates_are_skipped() {
        for bad in [
            "",
            "X\ttrue\tfalse",
            "X\tyes\tfalse\tGA",
            "X\ttrue\tfalse\tRC",
            "X\ttrue\tfalse\tGA",
            "X\ttrue\tfalse\tGA\t-\textra",
            "\ttrue\tfalse\tGA",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse("X\ttrue\ttrue\tGA\t-"),
            Some(Gate {
                name: "X",
                default: true,
                locked: true,
                stage: Stage::Ga,
                depends_on: "",
            })
        );
        let y = parse("Y\ttrue\tfalse\tBETA\tA,B").unwrap();
        assert_eq!(y.dependencies().collect::<Vec<_>>(), ["A", "B"]);
    }
}
