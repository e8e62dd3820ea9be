//! Node configuration as a custom resource: the `NodeConfiguration` type
//! ([`resource`]), which of them a node applies and the settings they make
//! ([`decide`], pure), what the nodes report and each resource's status
//! made from it ([`report`], pure), and the project's custom resource
//! definitions as YAML ([`crds_yaml`], checked in under `crds/`).

pub mod decide;
pub mod report;
pub mod resource;

use kube::CustomResourceExt;

pub use resource::{LiveKubeletConfiguration, NodeConfiguration, NodeConfigurationSpec};

/// The project's custom resource definitions: `(file name, YAML)`, as
/// `crds/` holds them and `rustlet crds` prints them.
///
/// # Errors
/// A definition that does not serialize (not expected: the types are
/// plain data).
pub fn crds_yaml() -> Result<Vec<(String, String)>, serde_saphyr::SerializeError> {
    let crd = NodeConfiguration::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    let yaml = serde_saphyr::to_string(&crd)?;
    Ok(vec![(
        format!("{name}.yaml"),
        format!(
            "# Generated from src/node_config/resource.rs by `rustlet crds`; do not edit.\n{yaml}"
        ),
    )])
}

#[cfg(test)]
mod tests;
