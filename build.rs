//! Generates the gRPC code of the APIs in `proto/` (plugin registration, the
//! device plugin API, the CSI Identity, Controller and Node services, the CRI fields newer than the
//! runtime API bindings, the pod resources API, the DRA driver API v1 and v1beta1, the DRA health API), clients and
//! servers, with protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
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
