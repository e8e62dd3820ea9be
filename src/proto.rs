//! The gRPC APIs of `proto/` that rustlet serves or consumes, generated at
//! build time (`build.rs`): clients and servers.

/// Plugin registration, as the kubelet's `pluginregistration.Registration`
/// (k8s.io/kubelet/pkg/apis/pluginregistration/v1).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// The device plugin API, as the kubelet's deviceplugin v1beta1
/// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): the agent's
/// `Registration` service and the plugins' `DevicePlugin` service.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// The Container Storage Interface v1: the Identity service's plugin info
/// and the Node service the agent calls, and the Identity and Controller
/// parts the test driver (`src/bin/csi-hostpath.rs`) serves.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

/// The CRI runtime API fields newer than the `k8s-cri` bindings (the image
/// volume's `image_sub_path`), as messages whose encoding is appended to a
/// request encoded with the bindings ([`crate::cri::extension`]).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod cri_extension {
    tonic::include_proto!("rustlet.cri.v1");
}

/// The pod resources API the agent serves (module `pod_resources`), as
/// the kubelet's podresources v1 and v1alpha1
/// (k8s.io/kubelet/pkg/apis/podresources).
pub mod podresources {
    /// podresources v1.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
    /// podresources v1alpha1.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
}

/// The DRA driver API the agent calls (module `dra`), as the kubelet's dra
/// v1 and v1beta1 (k8s.io/kubelet/pkg/apis/dra): the `DRAPlugin` service a
/// driver's kubelet plugin serves, and its `DRAResourceHealth` service
/// (k8s.io/kubelet/pkg/apis/dra-health v1 and v1alpha1).
pub mod dra {
    /// dra v1 (`v1.DRAPlugin`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// dra v1beta1 (`v1beta1.DRAPlugin`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
    /// dra-health v1 (`v1.DRAResourceHealth`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod health_v1 {
        include!(concat!(env!("OUT_DIR"), "/drahealth/v1.rs"));
    }
    /// dra-health v1alpha1 (`v1alpha1.DRAResourceHealth`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod health_v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/drahealth/v1alpha1.rs"));
    }
}
