//! Generates the gRPC code of the APIs in `proto/` (plugin registration, the
//! device plugin API, the CSI Identity, Controller and Node services, the CRI fields newer than the
//! runtime API bindings, the pod resources API, the DRA driver API v1 and v1beta1, the DRA health API), clients and
//! servers, with protoc. Also records the compiler's version as
//! `RUSTLET_RUSTC_VERSION` (`/statusz` shows it where the kubelet shows its Go
//! version).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rustc-env=RUSTLET_RUSTC_VERSION={}", rustc_version());
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/pluginregistration/v1/registration.proto",
            "proto/deviceplugin/v1beta1/api.proto",
            "proto/csi/v1/csi.proto",
            "proto/cri/v1/extension.proto",
            "proto/podresources/v1/api.proto",
            "proto/podresources/v1alpha1/api.proto",
            "proto/dra/v1/api.proto",
            "proto/dra/v1beta1/api.proto",
        ],
        &["proto"],
    )?;
    // The DRA health API's packages are `v1` and `v1alpha1`, as the pod
    // resources API's: generated apart, so that they are not merged.
    let health = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("drahealth");
    std::fs::create_dir_all(&health)?;
    tonic_prost_build::configure()
        .out_dir(&health)
        .compile_protos(
            &[
                "proto/drahealth/v1/api.proto",
                "proto/drahealth/v1alpha1/api.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}

/// `rustc --version` of the compiler Cargo builds with (`$RUSTC`), or
/// `unknown` when it cannot be asked.
fn rustc_version() -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}
