//! The custom resource definitions checked in under `crds/` (and the copy
//! the Helm chart installs from `charts/rustlet/crds/`) are what the Rust
//! types derive: a changed type without `rustlet crds --out crds` (and the
//! copy) fails here, naming the file.

use std::path::Path;

#[test]
fn the_checked_in_definitions_are_the_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = rustlet::node_config::crds_yaml().expect("serialize the definitions");
    assert!(!generated.is_empty());
    for dir in ["crds", "charts/rustlet/crds"] {
        let mut names: Vec<String> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        names.sort();
        let mut want: Vec<String> = generated.iter().map(|(n, _)| n.clone()).collect();
        want.sort();
        assert_eq!(
            names, want,
            "{dir}: the files are not the definitions; run `cargo run --bin rustlet -- crds --out {dir}`"
        );
        for (name, yaml) in &generated {
            let on_disk = std::fs::read_to_string(root.join(dir).join(name)).unwrap();
            assert!(
                on_disk == *yaml,
                "{dir}/{name} differs from the types; run `cargo run --bin rustlet -- crds --out {dir}`"
            );
        }
    }
}
