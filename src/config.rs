//! The agent's configuration: command-line flags over a KubeletConfiguration
//! file (`kubelet.config.k8s.io/v1beta1`) over the kubelet's defaults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize as _;
use serde::de::{DeserializeOwned, Deserializer, Error as _, IgnoredAny};
use serde_json::Value;

/// Errors reading the configuration file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML or JSON of the right shape.
    #[error("parse config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The file asks for a security setting this agent cannot honour; run
    /// without it, the node would be less protected than configured, so the
    /// agent does not start.
    #[error("config file {path}: {field}: {message}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The field, dotted (`authorization.mode`).
        field: String,
        /// What is asked and what this agent supports.
        message: String,
    },
}

/// `address`'s default: every address.
const DEFAULT_ADDRESS: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
/// `healthzBindAddress`'s default: loopback.
const DEFAULT_HEALTHZ_BIND_ADDRESS: std::net::IpAddr =
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// The configuration in effect, as the node API serves it: `/configz`'s
/// KubeletConfiguration ([`Settings::kubelet_configuration`]) and
/// `/configz/sources` ([`Settings::configuration_sources`]); both JSON
/// objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effective {
    /// The effective KubeletConfiguration.
    pub configuration: Value,
    /// Where each of its fields came from.
    pub sources: Value,
}

/// The settings rustlet runs with, after flags, file and defaults are merged.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// CRI endpoint (`unix:///run/containerd/containerd.sock`).
    pub container_runtime_endpoint: String,
    /// Root directory of the agent's state (`/var/lib/rustlet`).
    pub root_dir: PathBuf,
    /// Directory of pod logs (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// Deadline of each CRI call (`runtimeRequestTimeout`, 2 min).
    pub runtime_request_timeout: Duration,
    /// Pods this node accepts (`maxPods`, 110).
    pub max_pods: u32,
    /// How often node status is computed (`nodeStatusUpdateFrequency`, 10 s).
    pub node_status_update_frequency: Duration,
    /// How often an unchanged node status is still reported (`nodeStatusReportFrequency`, 5 min).
    pub node_status_report_frequency: Duration,
    /// `syncFrequency`: the longest a pod with nothing pending waits for its
    /// next sync (1 min), jittered up to half again as the kubelet's pod
    /// workers requeue (`workerResyncIntervalJitterFactor`).
    pub sync_frequency: Duration,
    /// Node lease duration in seconds (`nodeLeaseDurationSeconds`, 40).
    pub node_lease_duration_seconds: i32,
    /// Cluster DNS server IPs (`clusterDNS`; empty: pods use the host's resolver).
    pub cluster_dns: Vec<String>,
    /// Requests per second of the agent's API client (`kubeAPIQPS`, 50;
    /// 0 takes client-go's 5); the Lease and node status are not counted.
    pub kube_api_qps: u32,
    /// The burst of the agent's API client (`kubeAPIBurst`, 100; 0 takes
    /// client-go's 10).
    pub kube_api_burst: u32,
    /// Events written per second (`eventRecordQPS`, 50; 0 takes client-go's 5).
    pub event_record_qps: u32,
    /// The burst of event writes (`eventBurst`, 100; 0 takes client-go's 10).
    pub event_burst: u32,
    /// Cluster domain (`clusterDomain`, `cluster.local`).
    pub cluster_domain: String,
    /// The host resolver file (`resolvConf`, `/etc/resolv.conf`).
    pub resolv_conf: PathBuf,
    /// Port of the node API (`port`, 10250), reported in daemonEndpoints.
    pub port: i32,
    /// `readOnlyPort` (0: off, the kubelet's default): a plain, unauthenticated
    /// read-only API (pods, stats, metrics) on the node API's address.
    pub read_only_port: u16,
    /// `address`: where the node API (and the read-only API) listen
    /// (0.0.0.0, every address; empty takes the default, as the kubelet's).
    pub address: std::net::IpAddr,
    /// `healthzPort`: the port of the plain health endpoint (10248; 0: none).
    /// `--healthz-port` given on the command line wins.
    pub healthz_port: u16,
    /// `healthzBindAddress`: where the health endpoint listens (127.0.0.1;
    /// empty takes the default).
    pub healthz_bind_address: std::net::IpAddr,
    /// `staticPodPath`: a manifest, or a directory of them, whose pods run
    /// as static pods (none when unset).
    pub static_pod_path: Option<PathBuf>,
    /// `fileCheckFrequency`: how often `staticPodPath` is read again besides
    /// its change notifications (20 s).
    pub file_check_frequency: Duration,
    /// `staticPodURL`: a URL whose body (a Pod or a PodList) defines static
    /// pods (none when unset).
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`: the headers of each `staticPodURL` request,
    /// each name with its values in order.
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// `httpCheckFrequency`: how often `staticPodURL` is read (20 s).
    pub http_check_frequency: Duration,
    /// `authentication.x509.clientCAFile`: the CA bundle node API client
    /// certificates are verified against (`--client-ca-file` wins).
    pub client_ca_file: Option<PathBuf>,
    /// `tlsCertFile` and `tlsPrivateKeyFile`: the node API's serving
    /// certificate and key (`--tls-cert-file` and `--tls-private-key-file` win).
    pub tls_cert_file: Option<PathBuf>,
    /// See [`Settings::tls_cert_file`].
    pub tls_private_key_file: Option<PathBuf>,
    /// `registerWithTaints`: the taints the Node is created with.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `cgroupDriver` (`cgroupfs` or `systemd`): how pod and QoS cgroups
    /// are made (directories, or systemd slices over D-Bus), as the
    /// runtime's own driver must be (containerd's `SystemdCgroup`).
    pub cgroup_driver: String,
    /// `allowedUnsafeSysctls`: sysctls (or prefixes ending in `*`) allowed beyond the safe set.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Container log rotation (`containerLogMaxSize`, `containerLogMaxFiles`,
    /// `containerLogMonitorInterval`).
    pub container_logs: ContainerLogPolicy,
    /// `serverTLSBootstrap`: the node API's certificate comes from the
    /// certificates API (signer `kubernetes.io/kubelet-serving`).
    pub server_tls_bootstrap: bool,
    /// `cgroupsPerQOS` (true): pods run in cgroups of their own below the
    /// QoS hierarchy (`kubepods`, the `cgroups` module).
    pub cgroups_per_qos: bool,
    /// `cgroupRoot` (`/`): where the QoS hierarchy is made.
    pub cgroup_root: String,
    /// `podPidsLimit` (-1): the most processes (tasks) each pod's cgroup
    /// holds, `pids.max`; 0 or below sets none, as the kubelet's pod
    /// container manager.
    pub pod_pids_limit: i64,
    /// `cpuCFSQuotaPeriod` (100 ms): the CFS period of every CPU quota the
    /// agent sets, a container's (CRI `cpu_period`, the quota its cpu limit
    /// in millicores × period / 1000) and a pod cgroup's, as the kubelet's
    /// `milliCPUToQuota` under the `CustomCPUCFSQuotaPeriod` gate; only
    /// 100 ms with the gate off.
    pub cpu_cfs_quota_period: Duration,
    /// The `CustomCPUCFSQuotaPeriod` feature gate (off): another
    /// `cpuCFSQuotaPeriod` than 100 ms may be set.
    pub custom_cpu_cfs_quota_period: bool,
    /// `shutdownGracePeriod` (0: no graceful node shutdown): how long a node
    /// shutdown is held back while pods stop.
    pub shutdown_grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods` (0): the part of
    /// `shutdownGracePeriod` kept for critical pods, stopped last.
    pub shutdown_grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority` (empty): grace periods by pod
    /// priority, instead of the two above.
    pub shutdown_grace_period_by_pod_priority: Vec<PriorityPeriod>,
    /// `enforceNodeAllocatable` (`[pods]`): with `pods`, the `kubepods`
    /// cgroup is limited to the node's capacity less what is reserved; with
    /// `system-reserved` and `kube-reserved`, [`Settings::system_reserved_cgroup`]
    /// and [`Settings::kube_reserved_cgroup`] to what is reserved for them.
    pub enforce_node_allocatable: Vec<String>,
    /// `systemReservedCgroup` (empty): the existing cgroup, a cgroupfs path
    /// (`/system.slice`), that `systemReserved` limits under `system-reserved`.
    pub system_reserved_cgroup: String,
    /// `kubeReservedCgroup` (empty): the same for `kubeReserved` and
    /// `kube-reserved`.
    pub kube_reserved_cgroup: String,
    /// `rotateCertificates`: the client certificate the agent reaches the API
    /// server with is renewed from the certificates API before it expires
    /// (signer `kubernetes.io/kube-apiserver-client-kubelet`).
    pub rotate_certificates: bool,
    /// `serializeImagePulls` (true): one image pull at a time.
    pub serialize_image_pulls: bool,
    /// `maxParallelImagePulls`: the most pulls at once when
    /// `serializeImagePulls` is false (none: no limit).
    pub max_parallel_image_pulls: Option<u32>,
    /// `crashLoopBackOff.maxContainerRestartPeriod` (300 s, from 1 s to
    /// 300 s): the longest CrashLoopBackOff wait, under the
    /// `KubeletCrashLoopBackOffMax` gate (on by default).
    pub crash_loop_max_restart_period: Duration,
    /// `logging`: the log's format and verbosity.
    pub logging: Logging,
    /// `tracing`: where OpenTelemetry spans go, and how many are sampled
    /// (none when unset, as the kubelet).
    pub tracing: Option<Tracing>,
    /// `oomScoreAdj` (-999, from -1000 to 1000): the agent's own
    /// `oom_score_adj`, so that the kernel's OOM killer takes it last.
    pub oom_score_adj: i32,
    /// `memorySwap.swapBehavior` is `LimitedSwap` (else `NoSwap`, the
    /// default): Burstable containers may swap a share of the node's swap
    /// on cgroup v2.
    pub limited_swap: bool,
    /// `registryPullQPS` (5): image pulls started per second; 0: no limit.
    /// A pull past the bucket fails at once with "pull QPS exceeded", as
    /// the kubelet's `throttleImagePulling`.
    pub registry_pull_qps: u32,
    /// `registryBurst` (10): the pulls the bucket holds (with a limit, 0
    /// lets no pull through, as in the kubelet).
    pub registry_burst: u32,
    /// `authentication.webhook.cacheTTL` (2 min): how long a token review's
    /// result is cached.
    pub authentication_cache_ttl: Duration,
    /// `authorization.webhook.cacheAuthorizedTTL` (5 min).
    pub authorization_cache_authorized_ttl: Duration,
    /// `authorization.webhook.cacheUnauthorizedTTL` (30 s).
    pub authorization_cache_unauthorized_ttl: Duration,
    /// `seccompDefault` (false): containers without a seccomp profile run
    /// under the runtime's default profile instead of none.
    pub seccomp_default: bool,
    /// `featureGates.UserNamespacesSupport` (true: GA and locked on in the
    /// kubelet of this version, so a file may only set it to true): pods may
    /// ask for their own user namespace (`hostUsers: false`).
    pub user_namespaces_support: bool,
    /// `featureGates.ReloadKubeletClientCAFile` (true, as the kubelet since
    /// 1.36): the client CA bundle is reloaded when its file changes.
    pub reload_client_ca_file: bool,
    /// `featureGates.PodLevelResources` (true): off, a pod that sets
    /// pod-level resources is rejected at admission, as the kubelet's pod
    /// features admit handler.
    pub pod_level_resources: bool,
    /// `featureGates.InPlacePodLevelResourcesVerticalScaling` (true): off, a
    /// resize of pod-level resources is `Infeasible` and the Node does not
    /// declare the feature.
    pub pod_level_resize: bool,
    /// `featureGates.ReloadKubeletServerCertificateFile` (true, as the
    /// kubelet): the serving certificate and key files are reloaded when
    /// they change.
    pub reload_server_certificate_file: bool,
    /// `featureGates.RotateKubeletServerCertificate` (true, as the kubelet):
    /// `serverTLSBootstrap` takes effect only with it.
    pub rotate_server_certificate: bool,
    /// Gates the file turns on, at the kubelet's default, whose features
    /// this agent does not have (not in [`HONOURED_GATES`]): the agent says
    /// so once at start.
    pub gates_without_effect: Vec<String>,
    /// The gates the file sets away from their defaults (gate → on), shown
    /// again by `/configz` so that a document written back keeps them.
    pub feature_gates: BTreeMap<String, bool>,
    /// Where each top-level KubeletConfiguration field that is not at its
    /// default came from (field → `file <path>`, `flag --<name>` or
    /// `NodeConfiguration <name>`), as `/configz/sources` shows it
    /// ([`Settings::configuration_sources`]).
    pub sources: BTreeMap<String, String>,
    /// `failSwapOn` as set in the file: true makes the agent refuse to start
    /// on a node with swap enabled (unset: not checked).
    pub fail_swap_on: Option<bool>,
    /// `kubeReserved`, `systemReserved` and `evictionHard`: what node
    /// allocatable holds back from capacity.
    pub reservations: Reservations,
    /// The eviction manager's other settings.
    pub eviction: EvictionSettings,
    /// `nodeStatusMaxImages` (50; -1: all): how many images the Node lists.
    pub node_status_max_images: i32,
    /// The image GC policy.
    pub image_gc: ImageGcPolicy,
    /// `volumeStatsAggPeriod` (1 m): how often each volume's disk usage is
    /// measured in the background for the stats and the eviction manager,
    /// as the kubelet's volume stat calculators.
    pub volume_stats_agg_period: Duration,
    /// `imagePullCredentialsVerificationPolicy` (`NeverVerifyPreloadedImages`)
    /// and `preloadedImagesVerificationAllowlist` (empty): which images
    /// present on the node need a pod's credentials checked
    /// ([`crate::image_policy`]).
    pub image_pull_verification: crate::image_policy::VerificationPolicy,
    /// The CPU, memory and topology managers' settings.
    pub resource_managers: ResourceManagers,
}

/// The settings of the CPU manager, the memory manager and the topology
/// manager (`cpuManager*`, `reservedSystemCPUs`, `memoryManagerPolicy`,
/// `reservedMemory`, `topologyManager*`), as read; each manager checks its
/// own against the machine when it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceManagers {
    /// `cpuManagerPolicy` (`none`): `static` gives Guaranteed containers
    /// with whole CPUs exclusive ones.
    pub cpu_policy: CpuManagerPolicy,
    /// `cpuManagerPolicyOptions` (empty): option name to value.
    pub cpu_policy_options: BTreeMap<String, String>,
    /// `cpuManagerReconcilePeriod` (10 s): how often every container's
    /// cpuset is brought in line with the CPU manager's state.
    pub cpu_reconcile_period: Duration,
    /// `reservedSystemCPUs` (none): CPUs kept for the system, never given
    /// to containers; instead of the CPUs of `kubeReserved` and
    /// `systemReserved`.
    pub reserved_system_cpus: Option<crate::cpuset::CpuSet>,
    /// `memoryManagerPolicy` (`None`).
    pub memory_policy: String,
    /// `reservedMemory` (empty): memory reserved per NUMA node.
    pub reserved_memory: Vec<ReservedMemory>,
    /// `topologyManagerPolicy` (`none`).
    pub topology_policy: crate::topology_manager::Policy,
    /// `topologyManagerScope` (`container`).
    pub topology_scope: crate::topology_manager::Scope,
    /// `topologyManagerPolicyOptions`, read.
    pub topology_options: crate::topology_manager::Options,
    /// `topologyManagerPolicyOptions` as written, for `/configz`.
    pub topology_options_text: BTreeMap<String, String>,
    /// `featureGates.CPUManagerPolicyBetaOptions` (true): off, the beta
    /// options of `cpuManagerPolicyOptions` are refused.
    pub cpu_beta_options: bool,
    /// `featureGates.CPUManagerPolicyAlphaOptions` (false): with it on, the
    /// CPU manager's alpha options are refused as unsupported by this agent
    /// rather than as not enabled.
    pub cpu_alpha_options: bool,
}

impl Default for ResourceManagers {
    fn default() -> Self {
        Self {
            cpu_policy: CpuManagerPolicy::None,
            cpu_policy_options: BTreeMap::new(),
            cpu_reconcile_period: Duration::from_secs(10),
            reserved_system_cpus: None,
            memory_policy: "None".into(),
            reserved_memory: Vec::new(),
            topology_policy: crate::topology_manager::Policy::None,
            topology_scope: crate::topology_manager::Scope::Container,
            topology_options: crate::topology_manager::Options::default(),
            topology_options_text: BTreeMap::new(),
            cpu_beta_options: true,
            cpu_alpha_options: false,
        }
    }
}

/// `cpuManagerPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuManagerPolicy {
    /// `none`: every container runs on every CPU (the default).
    #[default]
    None,
    /// `static`: Guaranteed containers asking for whole CPUs get them alone.
    Static,
}

impl CpuManagerPolicy {
    /// Reads a policy name.
    ///
    /// # Errors
    /// The kubelet's `unknown policy: "<name>"`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "none" | "" => Ok(Self::None),
            "static" => Ok(Self::Static),
            _ => Err(format!("none or static (unknown policy: {name:?})")),
        }
    }

    /// The name, as the checkpoint and the configuration write it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Static => "static",
        }
    }
}

/// One entry of `reservedMemory`: what is reserved on a NUMA node
/// (`limits`: `memory`, `hugepages-<size>` to quantities).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReservedMemory {
    /// The NUMA node.
    pub numa_node: i32,
    /// Resource name to quantity.
    pub limits: BTreeMap<String, String>,
}

/// The image GC policy of the KubeletConfiguration, as the kubelet's
/// `ImageGCPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent` (85): image filesystem usage, percent,
    /// that starts a collection; 100 turns the periodic collection off
    /// (unless `max_age` is set).
    pub high_percent: u8,
    /// `imageGCLowThresholdPercent` (80): usage, percent, a collection
    /// brings the filesystem down to.
    pub low_percent: u8,
    /// `imageMinimumGCAge` (2 min): an image first seen more recently stays.
    pub min_age: Duration,
    /// `imageMaximumGCAge` (0: off): an image unused for longer goes,
    /// whatever the usage, once the agent has run that long.
    pub max_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

/// The eviction manager's settings besides `evictionHard`
/// ([`Reservations::eviction_hard`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionSettings {
    /// `evictionSoft`: signal → threshold.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal → how long a soft threshold must
    /// be met before a pod is evicted.
    pub soft_grace: BTreeMap<String, Duration>,
    /// `evictionMinimumReclaim`: signal → how much beyond the threshold must
    /// be free before it stops being met.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (5 min): how long a pressure
    /// condition stays after its threshold was last met.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (0), seconds: the longest grace period a
    /// pod evicted for a soft threshold gets (its own is used when shorter).
    pub max_pod_grace_period: i64,
}

impl Default for EvictionSettings {
    fn default() -> Self {
        Self {
            soft: BTreeMap::new(),
            soft_grace: BTreeMap::new(),
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
        }
    }
}

/// The kubelet's default `evictionHard` on Linux (eviction/defaults_linux.go),
/// used when the file sets none.
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// What node allocatable holds back from capacity, as the kubelet's
/// `GetNodeAllocatableReservation`: `systemReserved` plus `kubeReserved`
/// (resource name to quantity: `cpu: 500m`, `memory: 1Gi`) plus the hard
/// eviction thresholds of `memory.available` and `nodefs.available`
/// (signal to quantity or percentage of capacity: `100Mi`, `10%`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservations {
    /// `kubeReserved`.
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved`.
    pub system_reserved: BTreeMap<String, String>,
    /// `evictionHard`; a file that sets it replaces the defaults
    /// ([`DEFAULT_EVICTION_HARD`]) whole, as the kubelet's.
    pub eviction_hard: BTreeMap<String, String>,
}

impl Default for Reservations {
    fn default() -> Self {
        Self {
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            eviction_hard: DEFAULT_EVICTION_HARD
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        }
    }
}

/// A threshold of `evictionHard`: an amount, or a share of capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    /// A quantity (`100Mi`).
    Quantity(crate::resource::Quantity),
    /// A percentage of capacity (`10%` is 10.0).
    Percent(f64),
}

impl Threshold {
    /// `capacity` × the percentage `percent`, truncated, as the kubelet's
    /// `GetThresholdQuantity`, which keeps the share as a float32 fraction
    /// (10% of 1Gi is 107374184).
    #[must_use]
    pub fn share_of(capacity: i128, percent: f64) -> i128 {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            reason = "as the kubelet: a float32 fraction, the product truncated"
        )]
        let fraction = f64::from(percent as f32 / 100.0);
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            reason = "as the kubelet: a float32 fraction, the product truncated"
        )]
        let out = (capacity as f64 * fraction) as i128;
        out
    }

    /// True for `0%` and `100%`, which turn a signal off (the kubelet's
    /// `parseThresholdStatement` drops them).
    #[must_use]
    pub fn is_off(&self) -> bool {
        match self {
            Self::Percent(p) => *p == 0.0 || *p == 100.0,
            Self::Quantity(q) => q.is_zero(),
        }
    }

    /// Parses `100Mi` or `10%` (0 to 100).
    ///
    /// # Errors
    /// The text is neither a non-negative quantity nor a percentage.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(p) = text.strip_suffix('%') {
            return p
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .map(Self::Percent)
                .ok_or_else(|| format!("invalid percentage {text:?}"));
        }
        crate::resource::Quantity::parse(text)
            .ok()
            .filter(|q| *q >= crate::resource::Quantity::default())
            .map(Self::Quantity)
            .ok_or_else(|| format!("invalid threshold {text:?}"))
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            root_dir: "/var/lib/rustlet".into(),
            pod_logs_dir: "/var/log/pods".into(),
            runtime_request_timeout: Duration::from_secs(120),
            max_pods: 110,
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            sync_frequency: Duration::from_secs(60),
            node_lease_duration_seconds: 40,
            cluster_dns: Vec::new(),
            kube_api_qps: 50,
            kube_api_burst: 100,
            event_record_qps: 50,
            event_burst: 100,
            cluster_domain: "cluster.local".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            port: 10250,
            read_only_port: 0,
            address: DEFAULT_ADDRESS,
            healthz_port: 10248,
            healthz_bind_address: DEFAULT_HEALTHZ_BIND_ADDRESS,
            static_pod_path: None,
            file_check_frequency: Duration::from_secs(20),
            client_ca_file: None,
            tls_cert_file: None,
            tls_private_key_file: None,
            register_with_taints: Vec::new(),
            cgroup_driver: "cgroupfs".into(),
            static_pod_url: None,
            static_pod_url_header: BTreeMap::new(),
            http_check_frequency: Duration::from_secs(20),
            allowed_unsafe_sysctls: Vec::new(),
            container_logs: ContainerLogPolicy::default(),
            server_tls_bootstrap: false,
            rotate_certificates: false,
            cgroups_per_qos: true,
            cgroup_root: "/".into(),
            pod_pids_limit: -1,
            cpu_cfs_quota_period: Duration::from_millis(100),
            custom_cpu_cfs_quota_period: false,
            shutdown_grace_period: Duration::ZERO,
            shutdown_grace_period_critical_pods: Duration::ZERO,
            shutdown_grace_period_by_pod_priority: Vec::new(),
            enforce_node_allocatable: vec!["pods".into()],
            system_reserved_cgroup: String::new(),
            kube_reserved_cgroup: String::new(),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            crash_loop_max_restart_period: Duration::from_secs(300),
            limited_swap: false,
            logging: Logging::default(),
            tracing: None,
            oom_score_adj: -999,
            registry_pull_qps: 5,
            registry_burst: 10,
            authentication_cache_ttl: Duration::from_secs(120),
            authorization_cache_authorized_ttl: Duration::from_secs(300),
            authorization_cache_unauthorized_ttl: Duration::from_secs(30),
            seccomp_default: false,
            user_namespaces_support: true,
            pod_level_resources: true,
            pod_level_resize: true,
            reload_client_ca_file: true,
            reload_server_certificate_file: true,
            rotate_server_certificate: true,
            gates_without_effect: Vec::new(),
            sources: BTreeMap::new(),
            feature_gates: BTreeMap::new(),
            fail_swap_on: None,
            reservations: Reservations::default(),
            eviction: EvictionSettings::default(),
            node_status_max_images: 50,
            image_gc: ImageGcPolicy::default(),
            volume_stats_agg_period: Duration::from_secs(60),
            image_pull_verification: crate::image_policy::VerificationPolicy::default(),
            resource_managers: ResourceManagers::default(),
        }
    }
}

/// `d` as Go's `time.Duration.String` writes it, the form KubeletConfiguration
/// durations take: `0s`, `1.5s`, `2m0s`, `1h0m0s`, `100ms`, `1.5µs`, `10ns`.
#[must_use]
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    // `whole` units of size `unit` nanoseconds, with the fraction trimmed.
    let fixed = |n: u128, unit: u128, suffix: &str| {
        let whole = n / unit;
        let frac = n % unit;
        if frac == 0 {
            format!("{whole}{suffix}")
        } else {
            let width = unit.ilog10() as usize;
            let digits = format!("{frac:0width$}");
            format!("{whole}.{}{suffix}", digits.trim_end_matches('0'))
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return fixed(nanos, 1_000, "µs");
    }
    if nanos < 1_000_000_000 {
        return fixed(nanos, 1_000_000, "ms");
    }
    let secs_nanos = nanos % 60_000_000_000;
    let mins = nanos / 60_000_000_000;
    let seconds = fixed(secs_nanos, 1_000_000_000, "s");
    match (mins / 60, mins % 60) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

impl Settings {
    /// `cpuCFSQuotaPeriod` in microseconds (validated: 1000 to 1000000; the
    /// default 100000 for a period past `i64`, which validation refuses).
    #[must_use]
    pub fn cpu_period_us(&self) -> i64 {
        i64::try_from(self.cpu_cfs_quota_period.as_micros()).unwrap_or(100_000)
    }

    /// The settings as KubeletConfiguration (`kubelet.config.k8s.io/v1beta1`)
    /// fields, for `/configz`: durations in Go's form, paths as strings.
    #[must_use]
    pub fn kubelet_configuration(&self) -> Value {
        let mut doc = self.configuration_core();
        let static_pods = serde_json::json!({
            "staticPodPath": self.static_pod_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "fileCheckFrequency": go_duration(self.file_check_frequency),
            "staticPodURL": self.static_pod_url.clone().unwrap_or_default(),
            "staticPodURLHeader": self.static_pod_url_header,
            "httpCheckFrequency": go_duration(self.http_check_frequency),
            "rotateCertificates": self.rotate_certificates,
            "cgroupsPerQOS": self.cgroups_per_qos,
            "cgroupRoot": self.cgroup_root,
            "podPidsLimit": self.pod_pids_limit,
            "shutdownGracePeriod": go_duration(self.shutdown_grace_period),
            "shutdownGracePeriodCriticalPods": go_duration(self.shutdown_grace_period_critical_pods),
            "enforceNodeAllocatable": self.enforce_node_allocatable,
            "systemReservedCgroup": self.system_reserved_cgroup,
            "kubeReservedCgroup": self.kube_reserved_cgroup,
            "tlsCertFile": self.tls_cert_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "tlsPrivateKeyFile": self.tls_private_key_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "address": self.address.to_string(),
            "healthzPort": self.healthz_port,
            "healthzBindAddress": self.healthz_bind_address.to_string(),
            "registerNode": true,
            // The fields honoured at one value, at that value: a
            // configuration written back from this document (the node
            // suite does) must be one this agent accepts.
            "runOnce": false,
            "podsPerCore": 0,
            "cpuCFSQuota": true,
            "localStorageCapacityIsolation": true,
            "enableControllerAttachDetach": true,
            "protectKernelDefaults": false,
            "tlsMinVersion": "VersionTLS12",
            "userNamespaces": {"idsPerPod": 65536},
            "registerWithTaints": self.register_with_taints,
            "cgroupDriver": self.cgroup_driver,
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true, "cacheTTL": go_duration(self.authentication_cache_ttl)},
                "x509": {"clientCAFile": self.client_ca_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default()},
            },
            "authorization": {
                "mode": "Webhook",
                "webhook": {
                    "cacheAuthorizedTTL": go_duration(self.authorization_cache_authorized_ttl),
                    "cacheUnauthorizedTTL": go_duration(self.authorization_cache_unauthorized_ttl),
                },
            },
        });
        // In a document of its own: one json! of every field passes the
        // macro's recursion limit.
        let limits = serde_json::json!({
            "kubeAPIQPS": self.kube_api_qps,
            "kubeAPIBurst": self.kube_api_burst,
            "eventRecordQPS": self.event_record_qps,
            "eventBurst": self.event_burst,
            "registryPullQPS": self.registry_pull_qps,
            "registryBurst": self.registry_burst,
            "imagePullCredentialsVerificationPolicy": self.image_pull_verification.name(),
            "preloadedImagesVerificationAllowlist": self.image_pull_verification.allowlist(),
            "crashLoopBackOff": {
                "maxContainerRestartPeriod": go_duration(self.crash_loop_max_restart_period),
            },
            "oomScoreAdj": self.oom_score_adj,
            "logging": {
                "format": if self.logging.json { "json" } else { "text" },
                "verbosity": self.logging.verbosity,
            },
            "tracing": self.tracing.as_ref().map(|t| serde_json::json!({
                "endpoint": t.endpoint,
                "samplingRatePerMillion": t.sampling_rate_per_million,
            })),
            "memorySwap": {
                "swapBehavior": if self.limited_swap { "LimitedSwap" } else { "NoSwap" },
            },
        });
        let r = &self.resource_managers;
        let managers = serde_json::json!({
            "cpuManagerPolicy": r.cpu_policy.name(),
            "cpuManagerPolicyOptions": r.cpu_policy_options,
            "cpuManagerReconcilePeriod": go_duration(r.cpu_reconcile_period),
            "cpuCFSQuotaPeriod": go_duration(self.cpu_cfs_quota_period),
            "reservedSystemCPUs": r.reserved_system_cpus.as_ref().map(ToString::to_string).unwrap_or_default(),
            "memoryManagerPolicy": r.memory_policy,
            "reservedMemory": r.reserved_memory,
            "topologyManagerPolicy": r.topology_policy.name(),
            "topologyManagerScope": r.topology_scope.name(),
            "topologyManagerPolicyOptions": r.topology_options_text,
        });
        if let Some(doc) = doc.as_object_mut() {
            for more in [static_pods, limits, managers] {
                if let Value::Object(more) = more {
                    doc.extend(more);
                }
            }
            // Shown when empty too (the kubelet omits it): written back,
            // it reads as unset.
            doc.insert(
                "shutdownGracePeriodByPodPriority".into(),
                serde_json::json!(self.shutdown_grace_period_by_pod_priority),
            );
            // Every gate the file set, so that a document written back
            // keeps those whose dependencies it turned off.
            if let Some(Value::Object(gates)) = doc.get_mut("featureGates") {
                for (gate, on) in &self.feature_gates {
                    gates.insert(gate.clone(), Value::Bool(*on));
                }
            }
        }
        doc
    }

    /// The configuration in effect as the node API shows it.
    #[must_use]
    pub fn effective(&self) -> Effective {
        let configuration = self.kubelet_configuration();
        let sources = self.sources_of(&configuration);
        Effective {
            configuration,
            sources,
        }
    }

    /// Where each top-level field of [`Settings::kubelet_configuration`]
    /// came from, as `/configz/sources` shows it: `{"kubeletconfig":
    /// {field: source}}`, the source one of [`Settings::sources`] or
    /// `default`.
    #[must_use]
    pub fn configuration_sources(&self) -> Value {
        self.sources_of(&self.kubelet_configuration())
    }

    /// [`Settings::configuration_sources`] of the fields of `configuration`
    /// (this settings' [`Settings::kubelet_configuration`]).
    fn sources_of(&self, configuration: &Value) -> Value {
        let sources: serde_json::Map<String, Value> = configuration
            .as_object()
            .into_iter()
            .flat_map(serde_json::Map::keys)
            .filter(|f| !matches!(f.as_str(), "apiVersion" | "kind"))
            .map(|f| {
                let source = self.sources.get(f).map_or("default", String::as_str);
                (f.clone(), Value::String(source.to_string()))
            })
            .collect();
        serde_json::json!({ "kubeletconfig": sources })
    }

    /// [`Settings::kubelet_configuration`] but the static pod sources,
    /// certificate rotation and cgroups (one `json!` holds only so many
    /// fields).
    fn configuration_core(&self) -> Value {
        serde_json::json!({
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "enableServer": true,
            // Shown so that a configuration written back from this document
            // (the node suite does) keeps the value this agent honours.
            "enableDebuggingHandlers": true,
            "containerRuntimeEndpoint": self.container_runtime_endpoint,
            "podLogsDir": self.pod_logs_dir.display().to_string(),
            "runtimeRequestTimeout": go_duration(self.runtime_request_timeout),
            "maxPods": self.max_pods,
            "nodeStatusUpdateFrequency": go_duration(self.node_status_update_frequency),
            "nodeStatusReportFrequency": go_duration(self.node_status_report_frequency),
            "syncFrequency": go_duration(self.sync_frequency),
            "nodeLeaseDurationSeconds": self.node_lease_duration_seconds,
            "volumeStatsAggPeriod": go_duration(self.volume_stats_agg_period),
            "clusterDNS": self.cluster_dns,
            "clusterDomain": self.cluster_domain,
            "resolvConf": self.resolv_conf.display().to_string(),
            "port": self.port,
            "readOnlyPort": self.read_only_port,
            "allowedUnsafeSysctls": self.allowed_unsafe_sysctls,
            "containerLogMaxSize": binary_quantity(self.container_logs.max_bytes),
            "containerLogMaxFiles": self.container_logs.max_files,
            "containerLogMonitorInterval": go_duration(self.container_logs.interval),
            "serverTLSBootstrap": self.server_tls_bootstrap,
            "serializeImagePulls": self.serialize_image_pulls,
            "maxParallelImagePulls": self.max_parallel_image_pulls,
            "seccompDefault": self.seccomp_default,
            "featureGates": {
                "UserNamespacesSupport": self.user_namespaces_support,
                "ReloadKubeletClientCAFile": self.reload_client_ca_file,
                "ReloadKubeletServerCertificateFile": self.reload_server_certificate_file,
                "RotateKubeletServerCertificate": self.rotate_server_certificate,
                "CPUManagerPolicyBetaOptions": self.resource_managers.cpu_beta_options,
                "PodLevelResources": self.pod_level_resources,
                "InPlacePodLevelResourcesVerticalScaling": self.pod_level_resize,
            },
            "failSwapOn": self.fail_swap_on,
            "kubeReserved": self.reservations.kube_reserved,
            "systemReserved": self.reservations.system_reserved,
            "evictionHard": self.reservations.eviction_hard,
            "evictionSoft": self.eviction.soft,
            "evictionSoftGracePeriod": self
                .eviction
                .soft_grace
                .iter()
                .map(|(k, d)| (k.clone(), go_duration(*d)))
                .collect::<BTreeMap<_, _>>(),
            "evictionMinimumReclaim": self.eviction.minimum_reclaim,
            "evictionPressureTransitionPeriod": go_duration(self.eviction.pressure_transition_period),
            "evictionMaxPodGracePeriod": self.eviction.max_pod_grace_period,
            "nodeStatusMaxImages": self.node_status_max_images,
            "imageGCHighThresholdPercent": self.image_gc.high_percent,
            "imageGCLowThresholdPercent": self.image_gc.low_percent,
            "imageMinimumGCAge": go_duration(self.image_gc.min_age),
            "imageMaximumGCAge": go_duration(self.image_gc.max_age),
        })
    }
}

/// One entry of `shutdownGracePeriodByPodPriority`: pods of at least
/// `priority` (up to the next entry's) get `seconds` to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityPeriod {
    /// The lowest priority of the group.
    pub priority: i32,
    /// The group's grace period, seconds.
    #[serde(rename = "shutdownGracePeriodSeconds")]
    pub seconds: i64,
}

/// `bytes` as a quantity in the largest binary unit that divides it: `10Mi`,
/// `2Mi` for a 2048 KiB huge page; plain bytes otherwise.
#[must_use]
pub fn binary_quantity(bytes: u64) -> String {
    for (unit, suffix) in [(1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Feature gates on by default in the kubelet whose features this agent
/// has: set to true (their default) they are accepted without a warning.
/// The [`SETTABLE_GATES`] aside, every other gate set to true is named in
/// [`Settings::gates_without_effect`].
pub const HONOURED_GATES: &[&str] = &[
    "ContainerRestartRules",
    "EnvFiles",
    "ExecProbeTimeout",
    "ExtendWebSocketsToKubelet",
    "GracefulNodeShutdown",
    "GracefulNodeShutdownBasedOnPodPriority",
    "HostnameOverride",
    "ImageMaximumGCAge",
    "ImageVolume",
    "InPlacePodVerticalScaling",
    "InPlacePodVerticalScalingInitContainers",
    "KubeletCgroupDriverFromCRI",
    "KubeletCrashLoopBackOffMax",
    "KubeletPSI",
    "KubeletPodResourcesGet",
    "KubeletSeparateDiskGC",
    "KubeletServiceAccountTokenForCredentialProviders",
    "NodeDeclaredFeatures",
    "PodObservedGenerationTracking",
    "PodReadyToStartContainersCondition",
    "PortForwardWebsockets",
    "ProcMountType",
    "RecursiveReadOnlyMounts",
    "ResourceHealthStatus",
    "ResourceHealthStatusMessage",
    "RestartAllContainersOnContainerExits",
    "SupplementalGroupsPolicy",
    "UserNamespacesSupport",
];

/// Feature gates of the kubelet this agent can turn on and off.
pub const SETTABLE_GATES: &[&str] = &[
    "CPUManagerPolicyAlphaOptions",
    "CPUManagerPolicyBetaOptions",
    "CustomCPUCFSQuotaPeriod",
    "InPlacePodLevelResourcesVerticalScaling",
    "PodLevelResources",
    "PodLevelResourcesFixDefaulting",
    "PodLevelResourcesFixKubeletQOSClass",
    "ReloadKubeletClientCAFile",
    "ReloadKubeletServerCertificateFile",
    "RotateKubeletServerCertificate",
    "TopologyManagerPolicyAlphaOptions",
    "TopologyManagerPolicyBetaOptions",
];

/// KubeletConfiguration fields this agent reads; every other field is reported as ignored.
pub const SUPPORTED_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "containerRuntimeEndpoint",
    "podLogsDir",
    "runtimeRequestTimeout",
    "maxPods",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "syncFrequency",
    "nodeLeaseDurationSeconds",
    "clusterDNS",
    "clusterDomain",
    "resolvConf",
    "port",
    "readOnlyPort",
    "address",
    "healthzPort",
    "healthzBindAddress",
    "staticPodPath",
    "fileCheckFrequency",
    "staticPodURL",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "cgroupDriver",
    "podPidsLimit",
    "cpuCFSQuotaPeriod",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "eventRecordQPS",
    "eventBurst",
    "registryPullQPS",
    "registryBurst",
    "crashLoopBackOff",
    "memorySwap",
    "logging",
    "tracing",
    "oomScoreAdj",
    "registerWithTaints",
    "staticPodURLHeader",
    "httpCheckFrequency",
    "allowedUnsafeSysctls",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMonitorInterval",
    "serverTLSBootstrap",
    "rotateCertificates",
    "cgroupsPerQOS",
    "cgroupRoot",
    "enforceNodeAllocatable",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "authentication",
    "authorization",
    "seccompDefault",
    "featureGates",
    "failSwapOn",
    "kubeReserved",
    "systemReserved",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "nodeStatusMaxImages",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "volumeStatsAggPeriod",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "reservedSystemCPUs",
    "memoryManagerPolicy",
    "reservedMemory",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
];

/// KubeletConfiguration fields that guard the node's security, with the
/// values this agent honours (it does the same whether or not they are set):
/// any other value, or any other shape, stops the agent at start
/// ([`Error::Unsupported`]) rather than running less protected than
/// configured. Each is the dotted path of the field, the values accepted
/// (`[]`: an empty list) and what the agent does instead, for the error.
pub const SECURITY_FIELDS: &[(&str, &[&str], &str)] = &[
    (
        "authentication.anonymous.enabled",
        &["false"],
        "the node API refuses anonymous requests",
    ),
    (
        "authentication.webhook.enabled",
        &["true"],
        "the node API authenticates bearer tokens with TokenReviews",
    ),
    (
        "authorization.mode",
        &["Webhook"],
        "the node API authorizes every request with a SubjectAccessReview",
    ),
    (
        "protectKernelDefaults",
        &["false"],
        "kernel tunables are not checked",
    ),
    (
        "enableDebuggingHandlers",
        &["true"],
        "exec, attach, port-forward and logs are always served",
    ),
    (
        "tlsMinVersion",
        &["VersionTLS12", ""],
        "the node API speaks TLS 1.2 and 1.3",
    ),
    (
        "tlsCipherSuites",
        &["[]"],
        "the node API uses rustls' cipher suites",
    ),
    (
        "userNamespaces.idsPerPod",
        &["65536"],
        "user namespaces get the kubelet's default 65536 IDs per pod",
    ),
    ("enableServer", &["true"], "the node API is always served"),
    (
        "runOnce",
        &["false"],
        "the agent runs as a node agent, not once over a set of pods",
    ),
    ("podsPerCore", &["0"], "maxPods alone caps the pods"),
    (
        "cpuCFSQuota",
        &["true"],
        "CPU limits are enforced with CFS quota",
    ),
    (
        "localStorageCapacityIsolation",
        &["true"],
        "ephemeral storage limits are enforced",
    ),
    (
        "enableControllerAttachDetach",
        &["true"],
        "the Node says volumes are attached by the controller",
    ),
    (
        "registerNode",
        &["true"],
        "the agent always registers its Node",
    ),
    (
        "defaultPodSysctls",
        &["[]"],
        "pods get only the sysctls they ask for",
    ),
];

/// Checks the security fields of a KubeletConfiguration document
/// ([`SECURITY_FIELDS`]; unknown feature gates are checked apart).
///
/// # Errors
/// [`Error::Unsupported`] for the first field set to a value this agent does not honour.
fn check_security_fields(path: &Path, map: &serde_json::Map<String, Value>) -> Result<(), Error> {
    let unsupported = |field: &str, message: String| Error::Unsupported {
        path: path.to_path_buf(),
        field: field.to_string(),
        message,
    };
    for (field, accepted, instead) in SECURITY_FIELDS {
        let mut parts = field.split('.');
        let first = parts.next().unwrap_or_default();
        let mut v = map.get(first);
        for part in parts {
            v = match v {
                Some(Value::Object(m)) => m.get(part),
                Some(Value::Null) | None => None,
                Some(_) => {
                    return Err(unsupported(field, "expected a mapping above it".into()));
                }
            };
        }
        let Some(v) = v.filter(|v| !v.is_null()) else {
            continue;
        };
        if !accepted.contains(&security_text(v).as_str()) {
            return Err(unsupported(
                field,
                format!(
                    "{v} is not supported by this agent (supported: {}): {instead}",
                    accepted.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// A security field's value as [`SECURITY_FIELDS`] lists it: a string as
/// itself, a boolean or number as JSON, an empty list as `[]`, anything else
/// as nothing any entry accepts.
fn security_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(_) | Value::Number(_) => v.to_string(),
        Value::Array(a) if a.is_empty() => "[]".into(),
        _ => "\u{0}".into(),
    }
}

/// True for a top-level field [`check_security_fields`] checks.
fn is_checked_field(key: &str) -> bool {
    SECURITY_FIELDS
        .iter()
        .any(|(f, _, _)| f.split('.').next() == Some(key))
}

/// Sets `target` to `d` unless `d` is absent or zero: as the kubelet's
/// defaulting of `kubelet.config.k8s.io/v1beta1`, a zero duration (kubeadm
/// writes `0s`) means the default.
fn nonzero(target: &mut Duration, d: Option<Duration>) {
    if let Some(d) = d.filter(|d| !d.is_zero()) {
        *target = d;
    }
}

/// Sets `target` to `value` when the file has the field.
fn set<T>(target: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *target = v;
    }
}

/// The error for a field whose value this agent refuses: `{field}: expected {want}`.
fn bad(path: &Path, field: &str, want: &str) -> Error {
    Error::Parse {
        path: path.to_path_buf(),
        message: format!("{field}: expected {want}"),
    }
}

/// A KubeletConfiguration document (`kubelet.config.k8s.io/v1beta1`) as this
/// agent reads it: the fields of the kubelet's `KubeletConfiguration` type it
/// honours ([`SUPPORTED_FIELDS`]), under the kubelet's names, each checked as
/// it is read. A field the file does not set, or sets to null (which Go's
/// decoding leaves at its default), is `None` and leaves [`Settings`] as it
/// is. Every other field lands in `rest` and is named as ignored, but for the
/// fields [`check_security_fields`] checks. [`Settings`] documents each
/// field's meaning and default.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct KubeletConfiguration {
    /// `apiVersion`, any value.
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    /// `kind`, any value.
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    /// `containerRuntimeEndpoint`; empty (kubeadm writes it) is the default.
    #[serde(deserialize_with = "text")]
    container_runtime_endpoint: Option<String>,
    /// `podLogsDir`.
    #[serde(deserialize_with = "text")]
    pod_logs_dir: Option<String>,
    /// `runtimeRequestTimeout`.
    #[serde(deserialize_with = "duration")]
    runtime_request_timeout: Option<Duration>,
    /// `maxPods`.
    #[serde(deserialize_with = "count")]
    max_pods: Option<u32>,
    /// `nodeStatusUpdateFrequency`.
    #[serde(deserialize_with = "duration")]
    node_status_update_frequency: Option<Duration>,
    /// `nodeStatusReportFrequency`.
    #[serde(deserialize_with = "duration")]
    node_status_report_frequency: Option<Duration>,
    /// `syncFrequency`.
    #[serde(deserialize_with = "duration")]
    sync_frequency: Option<Duration>,
    /// `nodeLeaseDurationSeconds`, seconds.
    #[serde(deserialize_with = "lease_seconds")]
    node_lease_duration_seconds: Option<i32>,
    /// `clusterDNS`.
    #[serde(rename = "clusterDNS", deserialize_with = "ips")]
    cluster_dns: Option<Vec<String>>,
    /// `clusterDomain`.
    #[serde(deserialize_with = "text")]
    cluster_domain: Option<String>,
    /// `resolvConf`.
    #[serde(deserialize_with = "text")]
    resolv_conf: Option<String>,
    /// `port`.
    #[serde(deserialize_with = "port")]
    port: Option<i32>,
    /// `readOnlyPort` (0: off).
    #[serde(deserialize_with = "read_only_port")]
    read_only_port: Option<u16>,
    /// `address`; empty is the default.
    #[serde(deserialize_with = "ip_or_empty")]
    address: Option<Option<std::net::IpAddr>>,
    /// `healthzPort` (0: off).
    #[serde(deserialize_with = "healthz_port")]
    healthz_port: Option<u16>,
    /// `healthzBindAddress`; empty is the default.
    #[serde(deserialize_with = "ip_or_empty")]
    healthz_bind_address: Option<Option<std::net::IpAddr>>,
    /// `staticPodPath`; empty is none.
    #[serde(deserialize_with = "text")]
    static_pod_path: Option<String>,
    /// `fileCheckFrequency`.
    #[serde(deserialize_with = "duration")]
    file_check_frequency: Option<Duration>,
    /// `staticPodURL`; empty is none.
    #[serde(rename = "staticPodURL", deserialize_with = "url")]
    static_pod_url: Option<String>,
    /// `staticPodURLHeader`.
    #[serde(rename = "staticPodURLHeader", deserialize_with = "url_headers")]
    static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    /// `httpCheckFrequency`.
    #[serde(deserialize_with = "duration")]
    http_check_frequency: Option<Duration>,
    /// `tlsCertFile`; empty is none.
    #[serde(deserialize_with = "text")]
    tls_cert_file: Option<String>,
    /// `tlsPrivateKeyFile`; empty is none.
    #[serde(deserialize_with = "text")]
    tls_private_key_file: Option<String>,
    /// `cgroupDriver`.
    #[serde(deserialize_with = "cgroup_driver")]
    cgroup_driver: Option<String>,
    /// `registerWithTaints`.
    #[serde(deserialize_with = "taints")]
    register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    /// `allowedUnsafeSysctls`.
    #[serde(deserialize_with = "sysctls")]
    allowed_unsafe_sysctls: Option<Vec<String>>,
    /// `containerLogMaxSize`, in bytes once read.
    #[serde(deserialize_with = "log_size")]
    container_log_max_size: Option<u64>,
    /// `containerLogMaxFiles`.
    #[serde(deserialize_with = "log_files")]
    container_log_max_files: Option<usize>,
    /// `containerLogMonitorInterval`.
    #[serde(deserialize_with = "duration")]
    container_log_monitor_interval: Option<Duration>,
    /// `serverTLSBootstrap`.
    #[serde(rename = "serverTLSBootstrap", deserialize_with = "flag")]
    server_tls_bootstrap: Option<bool>,
    /// `rotateCertificates`.
    #[serde(deserialize_with = "flag")]
    rotate_certificates: Option<bool>,
    /// `cgroupsPerQOS`.
    #[serde(rename = "cgroupsPerQOS", deserialize_with = "flag")]
    cgroups_per_qos: Option<bool>,
    /// `cgroupRoot`.
    #[serde(deserialize_with = "cgroup_root")]
    cgroup_root: Option<String>,
    /// `podPidsLimit`.
    #[serde(deserialize_with = "pids_limit")]
    pod_pids_limit: Option<i64>,
    /// `shutdownGracePeriod`.
    #[serde(deserialize_with = "duration")]
    shutdown_grace_period: Option<Duration>,
    /// `shutdownGracePeriodCriticalPods`.
    #[serde(deserialize_with = "duration")]
    shutdown_grace_period_critical_pods: Option<Duration>,
    /// `shutdownGracePeriodByPodPriority`.
    shutdown_grace_period_by_pod_priority: Option<Vec<PriorityPeriod>>,
    /// `kubeAPIQPS`.
    #[serde(rename = "kubeAPIQPS", deserialize_with = "rate")]
    kube_api_qps: Option<u32>,
    /// `kubeAPIBurst`.
    #[serde(rename = "kubeAPIBurst", deserialize_with = "rate")]
    kube_api_burst: Option<u32>,
    /// `eventRecordQPS`.
    #[serde(rename = "eventRecordQPS", deserialize_with = "rate")]
    event_record_qps: Option<u32>,
    /// `eventBurst`.
    #[serde(deserialize_with = "rate")]
    event_burst: Option<u32>,
    /// `enforceNodeAllocatable`.
    #[serde(deserialize_with = "allocatable")]
    enforce_node_allocatable: Option<Vec<String>>,
    /// `systemReservedCgroup`.
    #[serde(deserialize_with = "reserved_cgroup")]
    system_reserved_cgroup: Option<String>,
    /// `kubeReservedCgroup`.
    #[serde(deserialize_with = "reserved_cgroup")]
    kube_reserved_cgroup: Option<String>,
    /// `serializeImagePulls`.
    #[serde(deserialize_with = "flag")]
    serialize_image_pulls: Option<bool>,
    /// `maxParallelImagePulls`.
    #[serde(deserialize_with = "parallel_pulls")]
    max_parallel_image_pulls: Option<u32>,
    /// `crashLoopBackOff`.
    #[serde(rename = "crashLoopBackOff")]
    crash_loop_back_off: Option<CrashLoopBackOff>,
    /// `memorySwap`.
    #[serde(rename = "memorySwap")]
    memory_swap: Option<MemorySwap>,
    /// `logging`.
    logging: Option<LoggingFile>,
    /// `tracing`.
    #[serde(deserialize_with = "tracing_block")]
    tracing: Option<TracingFile>,
    /// `oomScoreAdj`.
    #[serde(rename = "oomScoreAdj", deserialize_with = "oom_score")]
    oom_score_adj: Option<i32>,
    /// `registryPullQPS`.
    #[serde(rename = "registryPullQPS", deserialize_with = "pull_rate")]
    registry_pull_qps: Option<u32>,
    /// `registryBurst`.
    #[serde(deserialize_with = "pull_rate")]
    registry_burst: Option<u32>,
    /// `imagePullCredentialsVerificationPolicy`.
    image_pull_credentials_verification_policy: Option<String>,
    /// `preloadedImagesVerificationAllowlist`.
    preloaded_images_verification_allowlist: Option<Vec<String>>,
    /// `authentication`.
    authentication: Option<Authentication>,
    /// `authorization`.
    authorization: Option<Authorization>,
    /// `seccompDefault`.
    #[serde(deserialize_with = "flag")]
    seccomp_default: Option<bool>,
    /// `featureGates`: each gate's value is checked as it is applied, so that
    /// the error names the gate.
    #[serde(deserialize_with = "gates")]
    feature_gates: Option<BTreeMap<String, Value>>,
    /// `failSwapOn`.
    #[serde(deserialize_with = "flag")]
    fail_swap_on: Option<bool>,
    /// `kubeReserved`.
    #[serde(deserialize_with = "quantities")]
    kube_reserved: Option<BTreeMap<String, String>>,
    /// `systemReserved`.
    #[serde(deserialize_with = "quantities")]
    system_reserved: Option<BTreeMap<String, String>>,
    /// `evictionHard`.
    #[serde(deserialize_with = "thresholds")]
    eviction_hard: Option<BTreeMap<String, String>>,
    /// `evictionSoft`.
    #[serde(deserialize_with = "thresholds")]
    eviction_soft: Option<BTreeMap<String, String>>,
    /// `evictionSoftGracePeriod`.
    #[serde(deserialize_with = "grace_periods")]
    eviction_soft_grace_period: Option<BTreeMap<String, Duration>>,
    /// `evictionMinimumReclaim`.
    #[serde(deserialize_with = "thresholds")]
    eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    /// `evictionPressureTransitionPeriod`.
    #[serde(deserialize_with = "duration")]
    eviction_pressure_transition_period: Option<Duration>,
    /// `evictionMaxPodGracePeriod`, seconds.
    #[serde(deserialize_with = "grace_seconds")]
    eviction_max_pod_grace_period: Option<i32>,
    /// `nodeStatusMaxImages` (-1: all).
    #[serde(deserialize_with = "max_images")]
    node_status_max_images: Option<i32>,
    /// `imageGCHighThresholdPercent`.
    #[serde(rename = "imageGCHighThresholdPercent", deserialize_with = "percent")]
    image_gc_high_threshold_percent: Option<u8>,
    /// `imageGCLowThresholdPercent`.
    #[serde(rename = "imageGCLowThresholdPercent", deserialize_with = "percent")]
    image_gc_low_threshold_percent: Option<u8>,
    /// `imageMinimumGCAge`.
    #[serde(rename = "imageMinimumGCAge", deserialize_with = "duration")]
    image_minimum_gc_age: Option<Duration>,
    /// `imageMaximumGCAge` (0: off).
    #[serde(rename = "imageMaximumGCAge", deserialize_with = "duration")]
    image_maximum_gc_age: Option<Duration>,
    /// `volumeStatsAggPeriod` (0: the default).
    #[serde(deserialize_with = "duration")]
    volume_stats_agg_period: Option<Duration>,
    /// `cpuManagerPolicy`.
    #[serde(deserialize_with = "text")]
    cpu_manager_policy: Option<String>,
    /// `cpuManagerPolicyOptions`.
    #[serde(deserialize_with = "options")]
    cpu_manager_policy_options: Option<BTreeMap<String, String>>,
    /// `cpuManagerReconcilePeriod` (0: the default).
    #[serde(deserialize_with = "duration")]
    cpu_manager_reconcile_period: Option<Duration>,
    /// `reservedSystemCPUs`; empty is none.
    #[serde(rename = "reservedSystemCPUs", deserialize_with = "text")]
    reserved_system_cpus: Option<String>,
    /// `memoryManagerPolicy`.
    #[serde(deserialize_with = "text")]
    memory_manager_policy: Option<String>,
    /// `reservedMemory`.
    reserved_memory: Option<Vec<ReservedMemory>>,
    /// `topologyManagerPolicy`.
    #[serde(deserialize_with = "text")]
    topology_manager_policy: Option<String>,
    /// `topologyManagerScope`.
    #[serde(deserialize_with = "text")]
    topology_manager_scope: Option<String>,
    /// `topologyManagerPolicyOptions`.
    #[serde(deserialize_with = "options")]
    topology_manager_policy_options: Option<BTreeMap<String, String>>,
    /// `cpuCFSQuotaPeriod`: a Go duration.
    #[serde(rename = "cpuCFSQuotaPeriod")]
    cpu_cfs_quota_period: Option<Value>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `crashLoopBackOff`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct CrashLoopBackOff {
    /// `maxContainerRestartPeriod`.
    #[serde(
        rename = "maxContainerRestartPeriod",
        deserialize_with = "restart_period"
    )]
    max_container_restart_period: Option<Duration>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// The kubelet's `tracing` (component-base's `TracingConfiguration`): spans
/// exported over OTLP gRPC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracing {
    /// `endpoint`: the collector, `host:port` or a URL (`localhost:4317`
    /// when unset, OTLP gRPC's default); plain text, as the kubelet's.
    pub endpoint: String,
    /// `samplingRatePerMillion` (0 to 1,000,000; 0 by default): how many of
    /// a million root spans are sampled; a span with a sampled parent always
    /// is.
    pub sampling_rate_per_million: u32,
}

impl Tracing {
    /// The endpoint as a URL tonic takes: `http://` before a bare
    /// `host:port`.
    #[must_use]
    pub fn endpoint_url(&self) -> String {
        if self.endpoint.contains("://") {
            self.endpoint.clone()
        } else {
            format!("http://{}", self.endpoint)
        }
    }
}

/// `tracing`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct TracingFile {
    /// `endpoint`.
    #[serde(deserialize_with = "tracing_endpoint")]
    endpoint: Option<String>,
    /// `samplingRatePerMillion`.
    #[serde(rename = "samplingRatePerMillion", deserialize_with = "sampling_rate")]
    sampling_rate_per_million: Option<u32>,
}

/// `tracing`: a mapping (serde would take a list for the struct's fields
/// in order).
fn tracing_block<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TracingFile>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(v @ Value::Object(_)) => TracingFile::deserialize(v)
            .map(Some)
            .map_err(D::Error::custom),
        Some(_) => Err(D::Error::custom("expected a mapping")),
    }
}

/// `tracing.endpoint`: a `host:port` or URL without spaces.
fn tracing_endpoint<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    read(d, "a host:port or URL", |e: String| {
        (!e.is_empty() && !e.contains(char::is_whitespace)).then_some(e)
    })
}

/// `tracing.samplingRatePerMillion`: 0 to 1,000,000, as component-base's
/// validation.
fn sampling_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    read(
        d,
        "a number from 0 to 1000000 (sampling rate per million)",
        |r: i64| u32::try_from(r).ok().filter(|r| *r <= 1_000_000),
    )
}

/// The agent's log as `logging` sets it (the kubelet's
/// `LoggingConfiguration`; `--log-format` and `RUST_LOG` go over it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Logging {
    /// `format: json` (else `text`).
    pub json: bool,
    /// `verbosity`, klog's `-v` (0).
    pub verbosity: u32,
}

/// `logging`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct LoggingFile {
    /// `format`: `json` is true, `text` false.
    #[serde(deserialize_with = "log_format")]
    format: Option<bool>,
    /// `verbosity`.
    #[serde(deserialize_with = "verbosity")]
    verbosity: Option<u32>,
    /// `flushFrequency` and `options` (their buffers): the agent's log is
    /// written as each line is made, so they have nothing to set.
    #[serde(rename = "flushFrequency")]
    _flush_frequency: Option<IgnoredAny>,
    /// `options`.
    #[serde(rename = "options")]
    _options: Option<IgnoredAny>,
    /// Every other field (`vmodule`), by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `memorySwap`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct MemorySwap {
    /// `swapBehavior`: `LimitedSwap` is true; `NoSwap` or empty false.
    #[serde(rename = "swapBehavior", deserialize_with = "swap_behavior")]
    swap_behavior: Option<bool>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `authentication`: the webhook's cache TTL and the client CA bundle;
/// `anonymous` and `webhook.enabled` are checked with the security fields.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct Authentication {
    /// `anonymous` ([`SECURITY_FIELDS`]).
    #[serde(rename = "anonymous")]
    _anonymous: Option<IgnoredAny>,
    /// `webhook`.
    webhook: Option<AuthenticationWebhook>,
    /// `x509`.
    x509: Option<X509>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `authentication.webhook`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct AuthenticationWebhook {
    /// `enabled` ([`SECURITY_FIELDS`]).
    #[serde(rename = "enabled")]
    _enabled: Option<IgnoredAny>,
    /// `cacheTTL`.
    #[serde(rename = "cacheTTL", deserialize_with = "duration")]
    cache_ttl: Option<Duration>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `authentication.x509`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct X509 {
    /// `clientCAFile`; empty is none.
    #[serde(rename = "clientCAFile", deserialize_with = "text")]
    client_ca_file: Option<String>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `authorization`: the webhook's cache TTLs; `mode` is checked with the
/// security fields.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct Authorization {
    /// `mode` ([`SECURITY_FIELDS`]).
    #[serde(rename = "mode")]
    _mode: Option<IgnoredAny>,
    /// `webhook`.
    webhook: Option<AuthorizationWebhook>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// `authorization.webhook`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, expecting = "a mapping")]
struct AuthorizationWebhook {
    /// `cacheAuthorizedTTL`.
    #[serde(rename = "cacheAuthorizedTTL", deserialize_with = "duration")]
    cache_authorized_ttl: Option<Duration>,
    /// `cacheUnauthorizedTTL`.
    #[serde(rename = "cacheUnauthorizedTTL", deserialize_with = "duration")]
    cache_unauthorized_ttl: Option<Duration>,
    /// Every other field, by name.
    #[serde(flatten)]
    rest: BTreeMap<String, IgnoredAny>,
}

/// The names in `rest`, each after `prefix` (`authentication.`).
fn prefixed<'a>(
    prefix: &'a str,
    rest: &'a BTreeMap<String, IgnoredAny>,
) -> impl Iterator<Item = String> + 'a {
    rest.keys().map(move |k| format!("{prefix}{k}"))
}

impl Authentication {
    /// The fields of the block this agent does not read, dotted.
    fn ignored(&self) -> impl Iterator<Item = String> + '_ {
        let webhook = self
            .webhook
            .iter()
            .flat_map(|w| prefixed("authentication.webhook.", &w.rest));
        let x509 = self
            .x509
            .iter()
            .flat_map(|x| prefixed("authentication.x509.", &x.rest));
        prefixed("authentication.", &self.rest)
            .chain(webhook)
            .chain(x509)
    }
}

impl Authorization {
    /// The fields of the block this agent does not read, dotted.
    fn ignored(&self) -> impl Iterator<Item = String> + '_ {
        let webhook = self
            .webhook
            .iter()
            .flat_map(|w| prefixed("authorization.webhook.", &w.rest));
        prefixed("authorization.", &self.rest).chain(webhook)
    }
}

impl KubeletConfiguration {
    /// Applies the fields the document sets onto `s`, then checks the
    /// settings together as the kubelet's validation does.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a feature gate this agent does not have,
    /// [`Error::Parse`] for a gate that is not true or false, or settings that
    /// do not go together.
    fn apply(&self, path: &Path, s: &mut Settings) -> Result<(), Error> {
        self.apply_runtime(s);
        self.apply_node(s);
        self.apply_server(s);
        self.apply_static_pods(s);
        self.apply_images(s);
        self.apply_container_logs(s);
        self.apply_eviction(s);
        self.apply_feature_gates(path, s)?;
        self.apply_image_pull_verification(path, s)?;
        self.apply_resource_managers(path, s)?;
        validate(path, s)
    }

    /// The CPU, memory and topology managers, each name and option checked
    /// as the kubelet checks them; what the machine must also satisfy is
    /// checked when each manager starts.
    ///
    /// # Errors
    /// [`Error::Parse`] with the kubelet's message for an unknown policy,
    /// scope or option, or a CPU list that is not one;
    /// [`Error::Unsupported`] for the memory manager's `Static` policy.
    fn apply_resource_managers(&self, path: &Path, s: &mut Settings) -> Result<(), Error> {
        if let Some(v) = &self.cpu_cfs_quota_period {
            s.cpu_cfs_quota_period =
                parse_duration(v).map_err(|e| bad(path, "cpuCFSQuotaPeriod", &e))?;
        }
        let r = &mut s.resource_managers;
        if let Some(name) = &self.cpu_manager_policy {
            r.cpu_policy =
                CpuManagerPolicy::parse(name).map_err(|e| bad(path, "cpuManagerPolicy", &e))?;
        }
        set(
            &mut r.cpu_policy_options,
            self.cpu_manager_policy_options.clone(),
        );
        nonzero(
            &mut r.cpu_reconcile_period,
            self.cpu_manager_reconcile_period,
        );
        if let Some(list) = &self.reserved_system_cpus {
            let set = crate::cpuset::CpuSet::parse(list)
                .map_err(|e| bad(path, "reservedSystemCPUs", &format!("a CPU list ({e})")))?;
            r.reserved_system_cpus = (!set.is_empty()).then_some(set);
        }
        // As the kubelet's `--reserved-cpus`: the CPUs named replace the cpu
        // of kubeReserved and systemReserved in node allocatable.
        if let Some(set) = &s.resource_managers.reserved_system_cpus {
            if !s.system_reserved_cgroup.is_empty() || !s.kube_reserved_cgroup.is_empty() {
                return Err(bad(
                    path,
                    "reservedSystemCPUs",
                    "no systemReservedCgroup or kubeReservedCgroup beside it (invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup))",
                ));
            }
            s.reservations.kube_reserved.remove("cpu");
            s.reservations
                .system_reserved
                .insert("cpu".into(), set.len().to_string());
        }
        let r = &mut s.resource_managers;
        if let Some(policy) = &self.memory_manager_policy {
            r.memory_policy = match policy.as_str() {
                "None" | "" => "None".into(),
                "Static" => "Static".into(),
                other => {
                    return Err(bad(
                        path,
                        "memoryManagerPolicy",
                        &format!("None or Static (unknown policy: {other:?})"),
                    ));
                }
            };
        }
        if let Some(reserved) = &self.reserved_memory {
            validate_reserved_memory(reserved).map_err(|e| {
                bad(
                    path,
                    "reservedMemory",
                    &format!("memory and huge pages per NUMA node (invalid configuration: {e})"),
                )
            })?;
        }
        set(&mut r.reserved_memory, self.reserved_memory.clone());
        if let Some(name) = &self.topology_manager_policy {
            r.topology_policy = crate::topology_manager::Policy::parse(name).map_err(|e| {
                bad(
                    path,
                    "topologyManagerPolicy",
                    &format!("a policy (invalid configuration: {e})"),
                )
            })?;
        }
        if let Some(name) = &self.topology_manager_scope {
            r.topology_scope = crate::topology_manager::Scope::parse(name).map_err(|e| {
                bad(
                    path,
                    "topologyManagerScope",
                    &format!("a scope (invalid configuration: {e})"),
                )
            })?;
        }
        if let Some(options) = &self.topology_manager_policy_options {
            r.topology_options = crate::topology_manager::Options::parse(options).map_err(|e| {
                bad(
                    path,
                    "topologyManagerPolicyOptions",
                    &format!("the kubelet's options ({e})"),
                )
            })?;
            r.topology_options_text.clone_from(options);
        }
        Ok(())
    }

    /// The runtime, its cgroups and what pods may ask of the host.
    fn apply_runtime(&self, s: &mut Settings) {
        if let Some(endpoint) = self
            .container_runtime_endpoint
            .as_ref()
            .filter(|e| !e.is_empty())
        {
            s.container_runtime_endpoint.clone_from(endpoint);
        }
        set(
            &mut s.pod_logs_dir,
            self.pod_logs_dir.as_ref().map(PathBuf::from),
        );
        nonzero(&mut s.runtime_request_timeout, self.runtime_request_timeout);
        set(&mut s.cgroup_driver, self.cgroup_driver.clone());
        set(&mut s.cgroups_per_qos, self.cgroups_per_qos);
        set(&mut s.cgroup_root, self.cgroup_root.clone());
        set(&mut s.pod_pids_limit, self.pod_pids_limit);
        set(&mut s.shutdown_grace_period, self.shutdown_grace_period);
        set(
            &mut s.shutdown_grace_period_critical_pods,
            self.shutdown_grace_period_critical_pods,
        );
        set(
            &mut s.shutdown_grace_period_by_pod_priority,
            self.shutdown_grace_period_by_pod_priority.clone(),
        );
        set(
            &mut s.enforce_node_allocatable,
            self.enforce_node_allocatable.clone(),
        );
        set(
            &mut s.system_reserved_cgroup,
            self.system_reserved_cgroup.clone(),
        );
        set(
            &mut s.kube_reserved_cgroup,
            self.kube_reserved_cgroup.clone(),
        );
        set(
            &mut s.allowed_unsafe_sysctls,
            self.allowed_unsafe_sysctls.clone(),
        );
        set(&mut s.seccomp_default, self.seccomp_default);
        set(&mut s.fail_swap_on, self.fail_swap_on.map(Some));
    }

    /// The Node, its status and lease, and the pods' DNS.
    fn apply_node(&self, s: &mut Settings) {
        set(&mut s.max_pods, self.max_pods);
        set(&mut s.kube_api_qps, self.kube_api_qps);
        set(&mut s.kube_api_burst, self.kube_api_burst);
        set(&mut s.event_record_qps, self.event_record_qps);
        set(&mut s.event_burst, self.event_burst);
        nonzero(
            &mut s.node_status_update_frequency,
            self.node_status_update_frequency,
        );
        // Unset, it follows an explicit nodeStatusUpdateFrequency, as the
        // kubelet's defaulting keeps older configurations writing as often.
        let explicit_update = self.node_status_update_frequency.filter(|d| !d.is_zero());
        nonzero(
            &mut s.node_status_report_frequency,
            self.node_status_report_frequency
                .filter(|d| !d.is_zero())
                .or(explicit_update),
        );
        nonzero(&mut s.sync_frequency, self.sync_frequency);
        set(
            &mut s.node_lease_duration_seconds,
            self.node_lease_duration_seconds,
        );
        set(&mut s.node_status_max_images, self.node_status_max_images);
        set(
            &mut s.register_with_taints,
            self.register_with_taints.clone(),
        );
        set(&mut s.cluster_dns, self.cluster_dns.clone());
        set(&mut s.cluster_domain, self.cluster_domain.clone());
        set(
            &mut s.resolv_conf,
            self.resolv_conf.as_ref().map(PathBuf::from),
        );
    }

    /// The node API: ports, serving certificate, and its authentication and
    /// authorization caches.
    fn apply_server(&self, s: &mut Settings) {
        let file = |f: &String| (!f.is_empty()).then(|| PathBuf::from(f));
        set(&mut s.port, self.port);
        set(&mut s.read_only_port, self.read_only_port);
        set(
            &mut s.address,
            self.address.map(|a| a.unwrap_or(DEFAULT_ADDRESS)),
        );
        set(&mut s.healthz_port, self.healthz_port);
        set(
            &mut s.healthz_bind_address,
            self.healthz_bind_address
                .map(|a| a.unwrap_or(DEFAULT_HEALTHZ_BIND_ADDRESS)),
        );
        set(&mut s.tls_cert_file, self.tls_cert_file.as_ref().map(file));
        set(
            &mut s.tls_private_key_file,
            self.tls_private_key_file.as_ref().map(file),
        );
        set(&mut s.server_tls_bootstrap, self.server_tls_bootstrap);
        set(&mut s.rotate_certificates, self.rotate_certificates);
        if let Some(authn) = &self.authentication {
            let webhook = authn.webhook.as_ref();
            nonzero(
                &mut s.authentication_cache_ttl,
                webhook.and_then(|w| w.cache_ttl),
            );
            if let Some(x509) = &authn.x509 {
                s.client_ca_file = x509.client_ca_file.as_ref().and_then(file);
            }
        }
        if let Some(webhook) = self.authorization.as_ref().and_then(|a| a.webhook.as_ref()) {
            nonzero(
                &mut s.authorization_cache_authorized_ttl,
                webhook.cache_authorized_ttl,
            );
            nonzero(
                &mut s.authorization_cache_unauthorized_ttl,
                webhook.cache_unauthorized_ttl,
            );
        }
    }

    /// The static pod sources.
    fn apply_static_pods(&self, s: &mut Settings) {
        if let Some(path) = &self.static_pod_path {
            // As the kubelet: an empty path is no static pods; a trailing
            // slash is dropped.
            let trimmed = path.trim_end_matches('/');
            s.static_pod_path = match (path.is_empty(), trimmed.is_empty()) {
                (true, _) => None,
                (false, true) => Some("/".into()),
                (false, false) => Some(trimmed.into()),
            };
        }
        nonzero(&mut s.file_check_frequency, self.file_check_frequency);
        if let Some(url) = &self.static_pod_url {
            s.static_pod_url = (!url.is_empty()).then(|| url.clone());
        }
        set(
            &mut s.static_pod_url_header,
            self.static_pod_url_header.clone(),
        );
        nonzero(&mut s.http_check_frequency, self.http_check_frequency);
    }

    /// Image pulls and the image GC policy.
    fn apply_images(&self, s: &mut Settings) {
        set(&mut s.serialize_image_pulls, self.serialize_image_pulls);
        set(
            &mut s.max_parallel_image_pulls,
            self.max_parallel_image_pulls.map(Some),
        );
        set(
            &mut s.crash_loop_max_restart_period,
            self.crash_loop_back_off
                .as_ref()
                .and_then(|c| c.max_container_restart_period),
        );
        set(
            &mut s.limited_swap,
            self.memory_swap.as_ref().and_then(|m| m.swap_behavior),
        );
        set(&mut s.oom_score_adj, self.oom_score_adj);
        if let Some(l) = &self.logging {
            set(&mut s.logging.json, l.format);
            set(&mut s.logging.verbosity, l.verbosity);
        }
        if let Some(t) = &self.tracing {
            s.tracing = Some(Tracing {
                endpoint: t
                    .endpoint
                    .clone()
                    .unwrap_or_else(|| "localhost:4317".to_string()),
                sampling_rate_per_million: t.sampling_rate_per_million.unwrap_or(0),
            });
        }
        set(&mut s.registry_pull_qps, self.registry_pull_qps);
        set(&mut s.registry_burst, self.registry_burst);
        let gc = &mut s.image_gc;
        set(&mut gc.high_percent, self.image_gc_high_threshold_percent);
        set(&mut gc.low_percent, self.image_gc_low_threshold_percent);
        nonzero(&mut gc.min_age, self.image_minimum_gc_age);
        // Zero is a value here: no maximum age.
        set(&mut gc.max_age, self.image_maximum_gc_age);
        nonzero(&mut s.volume_stats_agg_period, self.volume_stats_agg_period);
    }

    /// The image pull credentials verification policy and its allowlist,
    /// checked together as the kubelet's validation does.
    fn apply_image_pull_verification(&self, path: &Path, s: &mut Settings) -> Result<(), Error> {
        if self.image_pull_credentials_verification_policy.is_none()
            && self.preloaded_images_verification_allowlist.is_none()
        {
            return Ok(());
        }
        let policy = self
            .image_pull_credentials_verification_policy
            .as_deref()
            .unwrap_or("");
        let allowlist = self
            .preloaded_images_verification_allowlist
            .as_deref()
            .unwrap_or(&[]);
        s.image_pull_verification = crate::image_policy::VerificationPolicy::parse(
            policy, allowlist,
        )
        .map_err(|message| Error::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        Ok(())
    }

    /// Container log rotation; the interval is at least 3 s.
    fn apply_container_logs(&self, s: &mut Settings) {
        let logs = &mut s.container_logs;
        set(&mut logs.max_bytes, self.container_log_max_size);
        set(&mut logs.max_files, self.container_log_max_files);
        let interval = self.container_log_monitor_interval;
        nonzero(
            &mut logs.interval,
            interval.map(|d| d.max(Duration::from_secs(3))),
        );
    }

    /// What node allocatable holds back, and the eviction manager's
    /// thresholds; a map set in the file replaces the defaults whole.
    fn apply_eviction(&self, s: &mut Settings) {
        let r = &mut s.reservations;
        set(&mut r.kube_reserved, self.kube_reserved.clone());
        set(&mut r.system_reserved, self.system_reserved.clone());
        set(&mut r.eviction_hard, self.eviction_hard.clone());
        let e = &mut s.eviction;
        set(&mut e.soft, self.eviction_soft.clone());
        set(&mut e.soft_grace, self.eviction_soft_grace_period.clone());
        set(
            &mut e.minimum_reclaim,
            self.eviction_minimum_reclaim.clone(),
        );
        nonzero(
            &mut e.pressure_transition_period,
            self.eviction_pressure_transition_period,
        );
        set(
            &mut e.max_pod_grace_period,
            self.eviction_max_pod_grace_period.map(i64::from),
        );
    }

    /// The feature gates, as the kubelet's `SetFromMap` with the table of
    /// its gates ([`crate::feature_gates`]): [`SETTABLE_GATES`] as set;
    /// any other gate at its default (a default-on gate of a feature this
    /// agent lacks, [`HONOURED_GATES`] aside, is named in
    /// [`Settings::gates_without_effect`] for a warning).
    ///
    /// # Errors
    /// [`Error::Parse`] for a gate that is not true or false;
    /// [`Error::Unsupported`] for a gate the kubelet does not know or has
    /// locked to the other value (the kubelet's messages), or any other gate
    /// away from its default (a feature this agent lacks).
    fn apply_feature_gates(&self, path: &Path, s: &mut Settings) -> Result<(), Error> {
        let refuse = |field: String, message: String| Error::Unsupported {
            path: path.to_path_buf(),
            field,
            message,
        };
        for (gate, on) in self.feature_gates.iter().flatten() {
            let field = format!("featureGates.{gate}");
            let on = on
                .as_bool()
                .ok_or_else(|| bad(path, &field, "true or false"))?;
            let Some(spec) = crate::feature_gates::lookup(gate) else {
                return Err(refuse(field, format!("unrecognized feature gate: {gate}")));
            };
            if spec.locked && on != spec.default {
                return Err(refuse(
                    field,
                    format!(
                        "cannot set feature gate {gate} to {on}, feature is locked to {}",
                        spec.default
                    ),
                ));
            }
            if on != spec.default {
                s.feature_gates.insert(gate.clone(), on);
            }
            match gate.as_str() {
                "ReloadKubeletClientCAFile" => s.reload_client_ca_file = on,
                "ReloadKubeletServerCertificateFile" => s.reload_server_certificate_file = on,
                "RotateKubeletServerCertificate" => s.rotate_server_certificate = on,
                "CPUManagerPolicyBetaOptions" => s.resource_managers.cpu_beta_options = on,
                "CPUManagerPolicyAlphaOptions" => s.resource_managers.cpu_alpha_options = on,
                // The v1.37 topology manager has no alpha or beta options,
                // and no code of the v1.37 kubelet reads the two fixes of
                // pod-level resources (the API server's defaulting does):
                // these gates change nothing in the kubelet either.
                "TopologyManagerPolicyAlphaOptions"
                | "TopologyManagerPolicyBetaOptions"
                | "PodLevelResourcesFixDefaulting"
                | "PodLevelResourcesFixKubeletQOSClass" => {}
                "PodLevelResources" => s.pod_level_resources = on,
                "InPlacePodLevelResourcesVerticalScaling" => s.pod_level_resize = on,
                "CustomCPUCFSQuotaPeriod" => s.custom_cpu_cfs_quota_period = on,
                _ if on != spec.default => {
                    return Err(refuse(
                        field,
                        format!(
                            "{gate}={on} is not supported by this agent: it has the kubelet's default, {}, for every gate but {}",
                            spec.default,
                            SETTABLE_GATES.join(", ")
                        ),
                    ));
                }
                g if on && !HONOURED_GATES.contains(&g) => {
                    s.gates_without_effect.push(gate.clone());
                }
                _ => {}
            }
        }
        self.check_gate_dependencies(path)
    }

    /// Whether gate `name` is on: as set in the file, else its default.
    fn gate_on(&self, gate: &crate::feature_gates::Gate) -> bool {
        self.feature_gates
            .as_ref()
            .and_then(|g| g.get(gate.name))
            .and_then(Value::as_bool)
            .unwrap_or(gate.default)
    }

    /// Every gate that is on has its dependencies on, as the kubelet's
    /// `validateDependencies` checks after `SetFromMap`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on `featureGates` with the kubelet's message
    /// for the first gate (by name) that depends on one that is off.
    fn check_gate_dependencies(&self, path: &Path) -> Result<(), Error> {
        for gate in crate::feature_gates::all() {
            if gate.depends_on.is_empty() || !self.gate_on(&gate) {
                continue;
            }
            let off: Vec<&str> = gate
                .dependencies()
                .filter(|d| crate::feature_gates::lookup(d).is_some_and(|g| !self.gate_on(&g)))
                .collect();
            if !off.is_empty() {
                return Err(Error::Unsupported {
                    path: path.to_path_buf(),
                    field: "featureGates".into(),
                    message: format!(
                        "{} is enabled, but depends on features that are disabled: [{}]",
                        gate.name,
                        off.join(" ")
                    ),
                });
            }
        }
        Ok(())
    }

    /// The fields this agent does not read, dotted and sorted; the fields
    /// checked with the security fields are read (at their one value).
    fn ignored(&self) -> Vec<String> {
        let top = self.rest.keys().filter(|k| !is_checked_field(k)).cloned();
        let authn = self.authentication.iter().flat_map(Authentication::ignored);
        let authz = self.authorization.iter().flat_map(Authorization::ignored);
        let crash = self
            .crash_loop_back_off
            .iter()
            .flat_map(|c| prefixed("crashLoopBackOff.", &c.rest));
        let swap = self
            .memory_swap
            .iter()
            .flat_map(|m| prefixed("memorySwap.", &m.rest));
        let logging = self
            .logging
            .iter()
            .flat_map(|l| prefixed("logging.", &l.rest));
        let mut ignored: Vec<String> = top
            .chain(authn)
            .chain(authz)
            .chain(crash)
            .chain(swap)
            .chain(logging)
            .collect();
        ignored.sort();
        ignored
    }
}

/// Checks settings that must go together, as the kubelet's validation of
/// its KubeletConfiguration does.
///
/// # Errors
/// [`Error::Parse`] naming the field at fault.
fn validate(path: &Path, s: &Settings) -> Result<(), Error> {
    let gc = s.image_gc;
    if gc.low_percent >= gc.high_percent {
        return Err(bad(
            path,
            "imageGCLowThresholdPercent",
            "less than imageGCHighThresholdPercent",
        ));
    }
    if !gc.max_age.is_zero() && gc.max_age <= gc.min_age {
        return Err(bad(
            path,
            "imageMaximumGCAge",
            "more than imageMinimumGCAge, or 0",
        ));
    }
    // Graceful node shutdown, as the kubelet's validation (the gates
    // GracefulNodeShutdown and GracefulNodeShutdownBasedOnPodPriority are
    // on, and stay so here).
    let (grace, critical) = (
        s.shutdown_grace_period,
        s.shutdown_grace_period_critical_pods,
    );
    if critical > grace {
        return Err(bad(
            path,
            "shutdownGracePeriodCriticalPods",
            &format!(
                "at most shutdownGracePeriod (invalid configuration: shutdownGracePeriodCriticalPods {} must be <= shutdownGracePeriod {})",
                go_duration(critical),
                go_duration(grace)
            ),
        ));
    }
    for (field, d) in [
        ("shutdownGracePeriod", grace),
        ("shutdownGracePeriodCriticalPods", critical),
    ] {
        if !d.is_zero() && d < Duration::from_secs(1) {
            return Err(bad(path, field, "either zero or otherwise >= 1 sec"));
        }
    }
    let two_periods = !grace.is_zero() || !critical.is_zero();
    if !s.shutdown_grace_period_by_pod_priority.is_empty() && two_periods {
        return Err(bad(
            path,
            "shutdownGracePeriodByPodPriority",
            "empty when shutdownGracePeriod is set (invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time)",
        ));
    }
    validate_enforcement(path, s)?;
    validate_cfs_quota_period(path, s)?;
    // A limit above 1 needs parallel pulls.
    if s.serialize_image_pulls && s.max_parallel_image_pulls.is_some_and(|n| n > 1) {
        return Err(bad(
            path,
            "maxParallelImagePulls",
            "1 or nothing when serializeImagePulls is true",
        ));
    }
    Ok(())
}

/// `cpuCFSQuotaPeriod` as the kubelet's validation: 100 ms unless
/// `CustomCPUCFSQuotaPeriod` is on, and then from 1 ms to 1 s.
///
/// # Errors
/// [`Error::Unsupported`] for another period with the gate off,
/// [`Error::Parse`] for one out of range; each with the kubelet's message.
fn validate_cfs_quota_period(path: &Path, s: &Settings) -> Result<(), Error> {
    let (field, period) = ("cpuCFSQuotaPeriod", s.cpu_cfs_quota_period);
    if !s.custom_cpu_cfs_quota_period && period != Duration::from_millis(100) {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            field: field.into(),
            message: format!(
                "invalid configuration: cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {} requires feature gate CustomCPUCFSQuotaPeriod",
                go_duration(period)
            ),
        });
    }
    if !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&period) {
        return Err(bad(
            path,
            field,
            &format!(
                "from 1ms to 1s (invalid configuration: cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {} must be between 1ms and 1sec, inclusive)",
                go_duration(period)
            ),
        ));
    }
    Ok(())
}

/// `enforceNodeAllocatable` with its cgroups, as the kubelet's validation:
/// `none` alone, and a cgroup named for each reservation enforced.
///
/// # Errors
/// [`Error::Parse`] with the kubelet's message.
fn validate_enforcement(path: &Path, s: &Settings) -> Result<(), Error> {
    let has = |k: &str| s.enforce_node_allocatable.iter().any(|e| e == k);
    if has("none") && s.enforce_node_allocatable.len() > 1 {
        return Err(bad(
            path,
            "enforceNodeAllocatable",
            "nothing else beside none (invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified)",
        ));
    }
    for (key, field, flag, cgroup) in [
        (
            "system-reserved",
            "systemReservedCgroup",
            "--system-reserved-cgroup",
            &s.system_reserved_cgroup,
        ),
        (
            "kube-reserved",
            "kubeReservedCgroup",
            "--kube-reserved-cgroup",
            &s.kube_reserved_cgroup,
        ),
    ] {
        if has(key) && cgroup.is_empty() {
            return Err(bad(
                path,
                field,
                &format!(
                    "a cgroup (invalid configuration: {field} ({flag}) must be specified when \"{key}\" contained in enforceNodeAllocatable (--enforce-node-allocatable))"
                ),
            ));
        }
    }
    Ok(())
}

// Readers of single fields, for `#[serde(deserialize_with)]`. Each reads the
// field's value as a JSON value first, so that the error is the field's
// (serde_path_to_error names the deepest path it sees), and fails with
// `expected …`, which `apply_file_text` prefixes with the field's name.

/// Reads a present field as `T`, then converts it with `check`, which gives
/// nothing for a value it refuses; fails with `expected {want}`.
fn read<'de, D, T, U>(
    d: D,
    want: &str,
    check: impl FnOnce(T) -> Option<U>,
) -> Result<Option<U>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let Some(v) = Option::<Value>::deserialize(d)? else {
        return Ok(None);
    };
    serde_json::from_value(v)
        .ok()
        .and_then(check)
        .map(Some)
        .ok_or_else(|| D::Error::custom(format_args!("expected {want}")))
}

/// A string.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    read(d, "a string", Some)
}

/// `true` or `false`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    read(d, "true or false", Some)
}

/// A Go duration string (`10s`, `1m30s`), as the kubelet's `metav1.Duration`;
/// not negative.
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<Value>::deserialize(d)?
        .map(|v| parse_duration(&v))
        .transpose()
        .map_err(D::Error::custom)
}

/// [`duration`] of one value.
fn parse_duration(v: &Value) -> Result<Duration, String> {
    let s = v
        .as_str()
        .ok_or("expected a duration string like \"10s\"")?;
    let nanos = go_parse_duration::parse_duration(s).map_err(|e| format!("{s:?}: {e:?}"))?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{s:?} is negative"))
}

/// `crashLoopBackOff.maxContainerRestartPeriod`: a duration from 1 s to
/// 300 s, as the kubelet's validation.
fn restart_period<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let Some(v) = Option::<Value>::deserialize(d)? else {
        return Ok(None);
    };
    let period = parse_duration(&v).map_err(D::Error::custom)?;
    if (Duration::from_secs(1)..=Duration::from_secs(300)).contains(&period) {
        Ok(Some(period))
    } else {
        Err(D::Error::custom(format_args!(
            "{} must be set between 1s and 300s",
            go_duration(period)
        )))
    }
}

/// `logging.format`: `json` (true) or `text` (false), the formats the
/// kubelet registers.
fn log_format<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    read(d, "one of: \"json\", \"text\"", |v: String| {
        match v.as_str() {
            "json" => Some(true),
            "text" => Some(false),
            _ => None,
        }
    })
}

/// `oomScoreAdj`: from -1000 to 1000, as the kubelet's validation.
fn oom_score<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    read(d, "a score from -1000 to 1000", |v: i32| {
        (-1000..=1000).contains(&v).then_some(v)
    })
}

/// `logging.verbosity`: klog's `-v`, 0 or more.
fn verbosity<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    read(d, "a verbosity, 0 or more", Some)
}

/// `memorySwap.swapBehavior`: `LimitedSwap` (true), or `NoSwap` or empty
/// (false), as the kubelet's validation allows.
fn swap_behavior<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    read(
        d,
        "one of: \"\", \"LimitedSwap\" or \"NoSwap\"",
        |v: String| match v.as_str() {
            "LimitedSwap" => Some(true),
            "NoSwap" | "" => Some(false),
            _ => None,
        },
    )
}

/// `maxPods`: a count.
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    read(d, "a count", Some)
}

/// `kubeAPIQPS`, `kubeAPIBurst`, `eventRecordQPS`, `eventBurst`: a
/// number of requests, not negative (the kubelet's validation).
fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    read(d, "a number of requests, 0 or more", Some)
}

/// `registryPullQPS`, `registryBurst`: a number of pulls, not negative (the
/// kubelet's validation).
fn pull_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    read(d, "a number of pulls, 0 or more", Some)
}

/// `podPidsLimit`: a number of processes (-1 for none).
fn pids_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    read(d, "a number of processes", Some)
}

/// `nodeLeaseDurationSeconds`: seconds.
fn lease_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    read(d, "seconds", Some)
}

/// `port`.
fn port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    read(d, "a port", Some)
}

/// `readOnlyPort`: a port, or 0.
fn read_only_port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    read(d, "a port, or 0 for none", Some)
}

/// `healthzPort`: 0 (none) or a port, as the kubelet's validation.
fn healthz_port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    read(
        d,
        "0 or a port between 1 and 65535, inclusive (the kubelet's healthzPort (--healthz-port) check)",
        |p: i64| u16::try_from(p).ok(),
    )
}

/// `address`, `healthzBindAddress`: an IP address, or empty (the default:
/// `Some(None)`).
fn ip_or_empty<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<std::net::IpAddr>>, D::Error> {
    read(d, "an IP address", |a: String| {
        if a.is_empty() {
            Some(None)
        } else {
            a.parse().ok().map(Some)
        }
    })
}

/// `clusterDNS`: a list of strings.
fn ips<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    read(d, "a list of IPs", Some)
}

/// `allowedUnsafeSysctls`: a list of strings.
fn sysctls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    read(d, "a list of sysctls", Some)
}

/// `cgroupDriver`: `cgroupfs` or `systemd`.
fn cgroup_driver<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    read(d, "cgroupfs or systemd", |s: String| {
        matches!(s.as_str(), "cgroupfs" | "systemd").then_some(s)
    })
}

/// `cgroupRoot`: an absolute path without `.` or `..`.
fn cgroup_root<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    read(d, "an absolute cgroup path", |root: String| {
        let safe = root.starts_with('/') && !root.split('/').any(|p| p == ".." || p == ".");
        safe.then_some(root)
    })
}

/// `systemReservedCgroup`, `kubeReservedCgroup`: empty (none), or as
/// `cgroupRoot`.
fn reserved_cgroup<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    read(d, "an absolute cgroup path", |c: String| {
        let safe = c.starts_with('/') && !c.split('/').any(|p| p == ".." || p == ".");
        (c.is_empty() || safe).then_some(c)
    })
}

/// `enforceNodeAllocatable`: the kubelet's enforcement keys.
fn allocatable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let known = |e: &String| {
        matches!(
            e.as_str(),
            "pods" | "system-reserved" | "kube-reserved" | "none"
        )
    };
    read(
        d,
        "a list of pods, system-reserved, kube-reserved, none",
        |list: Vec<String>| list.iter().all(known).then_some(list),
    )
}

/// `staticPodURL`: empty, or a URL.
fn url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    read(d, "a URL", |url: String| {
        (url.is_empty() || reqwest::Url::parse(&url).is_ok()).then_some(url)
    })
}

/// `staticPodURLHeader`: header names to lists of values, each valid in HTTP.
fn url_headers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, Vec<String>>>, D::Error> {
    let headers: Option<BTreeMap<String, Vec<String>>> =
        read(d, "a mapping of header names to lists of values", Some)?;
    let valid = |(name, values): (&String, &Vec<String>)| {
        reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_ok()
            && values
                .iter()
                .all(|x| reqwest::header::HeaderValue::from_str(x).is_ok())
    };
    if headers.iter().flatten().all(valid) {
        Ok(headers)
    } else {
        Err(D::Error::custom(
            "expected valid HTTP header names and values",
        ))
    }
}

/// `registerWithTaints`: taints with a key and an effect.
fn taints<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<k8s_openapi::api::core::v1::Taint>>, D::Error> {
    let Some(v) = Option::<Value>::deserialize(d)? else {
        return Ok(None);
    };
    let taints: Vec<k8s_openapi::api::core::v1::Taint> = serde_json::from_value(v)
        .map_err(|e| D::Error::custom(format_args!("expected a list of taints ({e})")))?;
    let effects = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
    if taints
        .iter()
        .any(|t| t.key.is_empty() || !effects.contains(&t.effect.as_str()))
    {
        return Err(D::Error::custom(
            "expected taints with a key and an effect of NoSchedule, PreferNoSchedule or NoExecute",
        ));
    }
    Ok(Some(taints))
}

/// `containerLogMaxSize`: a positive quantity, as bytes.
fn log_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    read(d, "a positive quantity like \"10Mi\"", |q: String| {
        kube_quantity::ParsedQuantity::try_from(q.as_str())
            .ok()
            .and_then(|p| p.to_bytes_u64())
            .filter(|b| *b > 0)
    })
}

/// `containerLogMaxFiles`: at least 2, the live file and one rotated.
fn log_files<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    read(d, "a count of at least 2", |n: usize| (n >= 2).then_some(n))
}

/// `maxParallelImagePulls`: at least 1.
fn parallel_pulls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    read(d, "a count of at least 1", |n: u32| (n >= 1).then_some(n))
}

/// `evictionMaxPodGracePeriod`: seconds.
fn grace_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    read(d, "a number of seconds", Some)
}

/// `nodeStatusMaxImages`: a count, or -1 for all.
fn max_images<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    read(d, "a number of images, or -1 for all", |n: i32| {
        (n >= -1).then_some(n)
    })
}

/// The image GC thresholds: a percentage.
fn percent<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
    read(d, "a percentage from 0 to 100", |n: u8| {
        (n <= 100).then_some(n)
    })
}

/// `featureGates`: gate names to values, checked gate by gate when applied.
fn gates<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, Value>>, D::Error> {
    read(d, "a mapping of gate names to true or false", Some)
}

/// Checks `reservedMemory` as the kubelet's `validateReservedMemoryConfiguration`:
/// only `memory` and `hugepages-<size>`, none zero, none twice for a node.
///
/// # Errors
/// The kubelet's message, without its `invalid configuration: ` prefix.
fn validate_reserved_memory(reserved: &[ReservedMemory]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for r in reserved {
        for (name, q) in &r.limits {
            if name != "memory" && !name.starts_with("hugepages-") {
                return Err(format!(
                    "the limit type {name:?} for NUMA node {} is not supported, only [memory hugepages-<HugePageSize>] is accepted",
                    r.numa_node
                ));
            }
            let zero = crate::resource::Quantity::parse(q)
                .map_or(true, crate::resource::Quantity::is_zero);
            if zero {
                return Err(format!(
                    "reserved memory may not be zero for NUMA node {} and resource {name:?}",
                    r.numa_node
                ));
            }
            if !seen.insert((r.numa_node, name.clone())) {
                return Err(format!(
                    "the reserved memory has a duplicate value for NUMA node {} and resource {name:?}",
                    r.numa_node
                ));
            }
        }
    }
    Ok(())
}

/// `cpuManagerPolicyOptions` and `topologyManagerPolicyOptions`: option
/// names to string values.
fn options<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    read(d, "a mapping of option names to strings", Some)
}

/// `kubeReserved` and `systemReserved`: resource names to non-negative
/// quantities (`cpu: 500m`).
fn quantities<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let map: Option<BTreeMap<String, String>> =
        read(d, "a mapping of resource names to quantities", Some)?;
    for (name, q) in map.iter().flatten() {
        let valid = crate::resource::Quantity::parse(q)
            .is_ok_and(|q| q >= crate::resource::Quantity::default());
        if !valid {
            return Err(D::Error::custom(format_args!(
                "expected a quantity for {name}, not {q:?}"
            )));
        }
    }
    Ok(map)
}

/// `evictionHard`, `evictionSoft` and `evictionMinimumReclaim`: signals to
/// [`Threshold`]s (`memory.available: 100Mi`).
fn thresholds<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let map: Option<BTreeMap<String, String>> =
        read(d, "a mapping of signals to thresholds", Some)?;
    for (signal, t) in map.iter().flatten() {
        Threshold::parse(t)
            .map_err(|e| D::Error::custom(format_args!("expected {signal}: {e}")))?;
    }
    Ok(map)
}

/// `evictionSoftGracePeriod`: signals to durations.
fn grace_periods<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, Duration>>, D::Error> {
    let map: Option<BTreeMap<String, Value>> = read(d, "a mapping", Some)?;
    map.map(|m| {
        m.into_iter()
            .map(|(signal, v)| {
                parse_duration(&v)
                    .map(|d| (signal.clone(), d))
                    .map_err(|e| D::Error::custom(format_args!("{signal}: {e}")))
            })
            .collect()
    })
    .transpose()
}

/// Applies a KubeletConfiguration document (YAML or JSON text) onto `settings`;
/// returns the names of the fields it ignored, sorted, nested ones dotted
/// (`authorization.extra`).
///
/// # Errors
/// [`Error::Parse`] when the text is not a mapping or a supported field has
/// the wrong type or a value the kubelet refuses (the message names the
/// field); [`Error::Unsupported`] for a security field or feature gate this
/// agent does not honour.
pub fn apply_file_text(
    settings: &mut Settings,
    path: &Path,
    text: &str,
) -> Result<Vec<String>, Error> {
    let parse_error = |message: String| Error::Parse {
        path: path.to_path_buf(),
        message,
    };
    let doc: Value = crate::yaml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
    let map = doc
        .as_object()
        .ok_or_else(|| parse_error("expected a KubeletConfiguration mapping".into()))?;
    check_security_fields(path, map)?;
    let file: KubeletConfiguration =
        serde_path_to_error::deserialize(&doc).map_err(|e| parse_error(e.to_string()))?;
    file.apply(path, settings)?;
    let ignored = file.ignored();
    let origin = format!("file {}", path.display());
    // Null is no value (as Go's decoding): such a field keeps its source.
    for (field, value) in map {
        let counted = !ignored.contains(field)
            && !matches!(field.as_str(), "apiVersion" | "kind")
            && !value.is_null();
        if counted {
            settings.sources.insert(field.clone(), origin.clone());
        }
    }
    Ok(ignored)
}

/// Reads a KubeletConfiguration file onto `settings`; returns the ignored fields.
///
/// # Errors
/// [`Error::Read`] or [`Error::Parse`].
pub fn apply_file(settings: &mut Settings, path: &Path) -> Result<Vec<String>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    apply_file_text(settings, path, &text)
}

/// When and how much container logs are rotated (the kubelet's
/// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerLogPolicy {
    /// A log file larger than this many bytes is rotated (default 10 MiB).
    pub max_bytes: u64,
    /// Files kept per container, the live one included (default 5, at least 2).
    pub max_files: usize,
    /// How often logs are checked (default 10 s).
    pub interval: Duration,
}

impl Default for ContainerLogPolicy {
    fn default() -> Self {
        Self {
            max_bytes: 10 * 1024 * 1024,
            max_files: 5,
            interval: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_blocks_are_read_and_unknown_auth_fields_reported() {
        let mut s = Settings::default();
        assert_eq!(s.authentication_cache_ttl, Duration::from_secs(120));
        assert_eq!(
            s.authorization_cache_authorized_ttl,
            Duration::from_secs(300)
        );
        assert_eq!(
            s.authorization_cache_unauthorized_ttl,
            Duration::from_secs(30)
        );
        let text = "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\n    cacheTTL: 10s\n  x509:\n    clientCAFile: /pki/ca.crt\n    other: 1\nauthorization:\n  mode: Webhook\n  webhook:\n    cacheAuthorizedTTL: 1m\n    cacheUnauthorizedTTL: 0s\n  extra: 1\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        // The values checked with the security fields are honoured, not ignored.
        assert_eq!(
            ignored,
            vec!["authentication.x509.other", "authorization.extra"]
        );
        assert_eq!(s.client_ca_file, Some(PathBuf::from("/pki/ca.crt")));
        assert_eq!(s.authentication_cache_ttl, Duration::from_secs(10));
        assert_eq!(
            s.authorization_cache_authorized_ttl,
            Duration::from_secs(60)
        );
        // 0s is the default, as the kubelet defaults a zero duration.
        assert_eq!(
            s.authorization_cache_unauthorized_ttl,
            Duration::from_secs(30)
        );
        let bad = "authorization:\n  webhook:\n    cacheAuthorizedTTL: -1s\n";
        assert!(apply_file_text(&mut s, Path::new("k.yaml"), bad).is_err());
    }

    /// The KubeletConfiguration `kubeadm init` and `kubeadm join` write
    /// (`/var/lib/kubelet/config.yaml`), zero durations and all.
    const KUBEADM_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: \"\"
cpuManagerReconcilePeriod: 0s
crashLoopBackOff: {}
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: \"0\"
    text:
      infoBufferSize: \"0\"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
";

    #[test]
    fn the_node_apis_address_and_the_health_endpoint_are_read_as_the_kubelets() {
        let read = |text: &str| {
            let mut s = Settings::default();
            apply_file_text(&mut s, Path::new("k.yaml"), text).map(|_| s)
        };
        let d = Settings::default();
        assert_eq!(d.address.to_string(), "0.0.0.0");
        assert_eq!(
            (d.healthz_port, d.healthz_bind_address.to_string().as_str()),
            (10248, "127.0.0.1")
        );
        let s = read("address: 10.0.0.7\nhealthzPort: 0\nhealthzBindAddress: \"::1\"\n").unwrap();
        assert_eq!(s.address.to_string(), "10.0.0.7");
        assert_eq!(s.healthz_port, 0);
        assert_eq!(s.healthz_bind_address.to_string(), "::1");
        // Empty is the default, as the kubelet's defaulting makes it.
        let s = read("address: \"\"\nhealthzBindAddress: \"\"\nhealthzPort: 11248\n").unwrap();
        assert_eq!(
            (s.address, s.healthz_bind_address),
            (d.address, d.healthz_bind_address)
        );
        assert_eq!(s.healthz_port, 11248);
        // /configz shows what is in effect.
        let doc = s.kubelet_configuration();
        assert_eq!(doc["healthzPort"], 11248);
        assert_eq!(doc["address"], "0.0.0.0");
        for (text, field, why) in [
            ("healthzPort: 65536\n", "healthzPort", "between 1 and 65535"),
            ("healthzPort: -1\n", "healthzPort", "between 1 and 65535"),
            (
                "healthzPort: \"10248\"\n",
                "healthzPort",
                "between 1 and 65535",
            ),
            ("address: localhost\n", "address", "an IP address"),
            ("address: 10.0.0.300\n", "address", "an IP address"),
            (
                "healthzBindAddress: [127.0.0.1]\n",
                "healthzBindAddress",
                "an IP address",
            ),
        ] {
            let e = read(text).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn tracing_is_read_as_component_bases_tracing_configuration() {
        let read = |text: &str| {
            let mut s = Settings::default();
            apply_file_text(&mut s, Path::new("k.yaml"), text).map(|_| s)
        };
        assert_eq!(Settings::default().tracing, None);
        let s = read("tracing:\n  endpoint: otel.example:4317\n  samplingRatePerMillion: 1000\n")
            .unwrap();
        let t = s.tracing.clone().unwrap();
        assert_eq!(
            (t.endpoint.as_str(), t.sampling_rate_per_million),
            ("otel.example:4317", 1000)
        );
        assert_eq!(t.endpoint_url(), "http://otel.example:4317");
        assert_eq!(
            s.kubelet_configuration()["tracing"]["samplingRatePerMillion"],
            1000
        );
        // Unset fields take component-base's defaults: OTLP gRPC's endpoint, no sampling.
        let t = read("tracing: {}\n").unwrap().tracing.unwrap();
        assert_eq!(
            (t.endpoint.as_str(), t.sampling_rate_per_million),
            ("localhost:4317", 0)
        );
        assert_eq!(
            read("tracing:\n  endpoint: https://otel:4317\n")
                .unwrap()
                .tracing
                .unwrap()
                .endpoint_url(),
            "https://otel:4317"
        );
        for bad in [
            "tracing:\n  samplingRatePerMillion: 1000001\n",
            "tracing:\n  samplingRatePerMillion: -1\n",
            "tracing:\n  endpoint: \"a b\"\n",
            "tracing:\n  endpoint: \"\"\n",
            "tracing: [localhost:4317]\n",
        ] {
            let Err(e) = read(bad).map(|s| s.tracing) else {
                panic!("{bad} was taken");
            };
            assert!(e.to_string().contains("tracing"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_kubeadm_nodes_configuration_is_honoured_with_zero_durations_as_defaults() {
        let mut s = Settings::default();
        let ignored = apply_file_text(&mut s, Path::new("config.yaml"), KUBEADM_CONFIG).unwrap();
        let d = Settings::default();
        // Every `0s` is the default, as the kubelet's defaulting makes it.
        assert_eq!(s.runtime_request_timeout, d.runtime_request_timeout);
        assert_eq!(
            s.node_status_update_frequency,
            d.node_status_update_frequency
        );
        assert_eq!(
            s.node_status_report_frequency,
            d.node_status_report_frequency
        );
        assert_eq!(s.file_check_frequency, Duration::from_secs(20));
        assert_eq!(s.http_check_frequency, Duration::from_secs(20));
        assert_eq!(s.image_gc, d.image_gc);
        assert_eq!(
            s.eviction.pressure_transition_period,
            d.eviction.pressure_transition_period
        );
        assert_eq!(s.authentication_cache_ttl, Duration::from_secs(120));
        assert_eq!(
            s.authorization_cache_authorized_ttl,
            Duration::from_secs(300)
        );
        assert_eq!(
            s.container_runtime_endpoint, d.container_runtime_endpoint,
            "empty is the default"
        );
        assert_eq!(
            s.static_pod_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert_eq!(
            s.client_ca_file,
            Some(PathBuf::from("/etc/kubernetes/pki/ca.crt"))
        );
        assert_eq!(s.cgroup_driver, "systemd");
        assert!(s.rotate_certificates);
        assert_eq!(s.cluster_dns, ["10.96.0.10"]);
        // What is left is named, each in docs/configuration.md.
        assert_eq!(
            s.sync_frequency,
            Duration::from_secs(60),
            "0s is the default"
        );
        assert_eq!(ignored, ["streamingConnectionIdleTimeout"]);
    }

    #[test]
    fn the_cpu_memory_and_topology_managers_are_read_with_the_kubelets_checks() {
        let mut s = Settings::default();
        let text = "cpuManagerPolicy: static\ncpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\n\
                    cpuManagerReconcilePeriod: 5s\nreservedSystemCPUs: \"0,2\"\nkubeReserved:\n  cpu: 500m\n\
                    topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n\
                    topologyManagerPolicyOptions:\n  prefer-closest-numa-nodes: \"true\"\n\
                    memoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 1Gi\n";
        assert!(
            apply_file_text(&mut s, Path::new("k.yaml"), text)
                .unwrap()
                .is_empty()
        );
        let r = &s.resource_managers;
        assert_eq!(r.cpu_policy, CpuManagerPolicy::Static);
        assert_eq!(r.cpu_policy_options["full-pcpus-only"], "true");
        assert_eq!(r.cpu_reconcile_period, Duration::from_secs(5));
        assert_eq!(r.reserved_system_cpus.as_ref().unwrap().to_string(), "0,2");
        assert_eq!(
            r.topology_policy,
            crate::topology_manager::Policy::SingleNumaNode
        );
        assert_eq!(r.topology_scope, crate::topology_manager::Scope::Pod);
        assert!(r.topology_options.prefer_closest_numa_nodes);
        assert_eq!(r.memory_policy, "Static");
        assert_eq!(r.reserved_memory[0].limits["memory"], "1Gi");
        assert!(r.cpu_beta_options);
        let mut off = Settings::default();
        let gates = "featureGates:\n  CPUManagerPolicyBetaOptions: false\n  TopologyManagerPolicyBetaOptions: false\n";
        apply_file_text(&mut off, Path::new("k.yaml"), gates).unwrap();
        assert!(!off.resource_managers.cpu_beta_options);
        assert_eq!(
            off.kubelet_configuration()["featureGates"]["CPUManagerPolicyBetaOptions"],
            false
        );
        // The CPUs named replace the cpu reservations, as --reserved-cpus.
        assert_eq!(s.reservations.system_reserved["cpu"], "2");
        assert!(!s.reservations.kube_reserved.contains_key("cpu"));
        let v = s.kubelet_configuration();
        assert_eq!(v["reservedSystemCPUs"], "0,2");
        assert_eq!(v["topologyManagerPolicy"], "single-numa-node");
        for (bad, says) in [
            ("cpuManagerPolicy: dynamic\n", "unknown policy: \"dynamic\""),
            ("reservedSystemCPUs: \"3-1\"\n", "reservedSystemCPUs"),
            ("topologyManagerPolicy: strict\n", "must be one of"),
            ("topologyManagerScope: node\n", "\"container\", or \"pod\""),
            (
                "topologyManagerPolicyOptions:\n  max-allowable-numa-nodes: \"4\"\n",
                "should not be less than 8",
            ),
            (
                "reservedMemory:\n- numaNode: 0\n  limits:\n    cpu: \"1\"\n",
                "only [memory hugepages-<HugePageSize>] is accepted",
            ),
            (
                "reservedMemory:\n- numaNode: 0\n  limits:\n    memory: \"0\"\n",
                "may not be zero",
            ),
            (
                "reservedMemory:\n- numaNode: 1\n  limits:\n    memory: 1Gi\n- numaNode: 1\n  limits:\n    memory: 2Gi\n",
                "duplicate value for NUMA node 1",
            ),
            ("memoryManagerPolicy: Dynamic\n", "unknown policy"),
            (
                "reservedSystemCPUs: \"0\"\nsystemReservedCgroup: /system.slice\n",
                "can't use reservedSystemCPUs",
            ),
        ] {
            let mut s = Settings::default();
            let e = apply_file_text(&mut s, Path::new("k.yaml"), bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn register_with_taints_and_static_pod_sources_are_read_and_checked() {
        let mut s = Settings::default();
        let text = "registerWithTaints:\n- key: node-role.kubernetes.io/control-plane\n  effect: NoSchedule\n\
                    staticPodPath: /m/\nstaticPodURL: http://127.0.0.1:8080/pods\n\
                    staticPodURLHeader:\n  X-Token: [a, b]\nhttpCheckFrequency: 5s\nregisterNode: true\n";
        assert!(
            apply_file_text(&mut s, Path::new("k.yaml"), text)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            s.register_with_taints[0].key,
            "node-role.kubernetes.io/control-plane"
        );
        assert_eq!(s.static_pod_path, Some(PathBuf::from("/m")));
        assert_eq!(
            s.static_pod_url.as_deref(),
            Some("http://127.0.0.1:8080/pods")
        );
        assert_eq!(s.static_pod_url_header["X-Token"], ["a", "b"]);
        assert_eq!(s.http_check_frequency, Duration::from_secs(5));
        let v = s.kubelet_configuration();
        assert_eq!(v["staticPodPath"], "/m");
        assert_eq!(v["registerWithTaints"][0]["effect"], "NoSchedule");
        for bad in [
            "registerWithTaints:\n- key: k\n  effect: Sometimes\n",
            "registerWithTaints: 3\n",
            "registerNode: false\n",
            "staticPodURL: \"not a url\"\n",
            "staticPodURLHeader:\n  \"bad header\": [x]\n",
            "cgroupDriver: other\n",
        ] {
            let mut s = Settings::default();
            assert!(
                apply_file_text(&mut s, Path::new("k.yaml"), bad).is_err(),
                "{bad}"
            );
        }
    }

    /// Every field of `KubeletConfiguration` (k8s.io/kubelet v0.37).
    const KUBELET_CONFIGURATION_FIELDS: &str = "enableServer staticPodPath podLogsDir syncFrequency \
        fileCheckFrequency httpCheckFrequency staticPodURL staticPodURLHeader address port readOnlyPort \
        tlsCertFile tlsPrivateKeyFile tlsCipherSuites tlsCurvePreferences tlsMinVersion rotateCertificates \
        serverTLSBootstrap authentication authorization registryPullQPS registryBurst \
        imagePullCredentialsVerificationPolicy preloadedImagesVerificationAllowlist eventRecordQPS eventBurst \
        enableDebuggingHandlers enableContentionProfiling healthzPort healthzBindAddress oomScoreAdj \
        clusterDomain clusterDNS streamingConnectionIdleTimeout nodeStatusUpdateFrequency \
        nodeStatusReportFrequency nodeLeaseDurationSeconds imageMinimumGCAge imageMaximumGCAge \
        imageGCHighThresholdPercent imageGCLowThresholdPercent volumeStatsAggPeriod kubeletCgroups \
        systemCgroups cgroupRoot cgroupsPerQOS cgroupDriver cpuManagerPolicy singleProcessOOMKill \
        cpuManagerPolicyOptions cpuManagerReconcilePeriod memoryManagerPolicy topologyManagerPolicy \
        topologyManagerScope topologyManagerPolicyOptions qosReserved runtimeRequestTimeout hairpinMode \
        maxPods podCIDR podPidsLimit resolvConf runOnce cpuCFSQuota cpuCFSQuotaPeriod nodeStatusMaxImages \
        maxOpenFiles contentType kubeAPIQPS kubeAPIBurst serializeImagePulls maxParallelImagePulls \
        evictionHard evictionSoft evictionSoftGracePeriod evictionPressureTransitionPeriod \
        evictionMaxPodGracePeriod evictionMinimumReclaim mergeDefaultEvictionSettings podsPerCore \
        enableControllerAttachDetach protectKernelDefaults makeIPTablesUtilChains iptablesMasqueradeBit \
        iptablesDropBit featureGates failSwapOn memorySwap containerLogMaxSize containerLogMaxFiles \
        containerLogMaxWorkers containerLogMonitorInterval configMapAndSecretChangeDetectionStrategy \
        systemReserved kubeReserved reservedSystemCPUs showHiddenMetricsForVersion systemReservedCgroup \
        kubeReservedCgroup enforceNodeAllocatable allowedUnsafeSysctls defaultPodSysctls volumePluginDir \
        providerID kernelMemcgNotification logging enableSystemLogHandler enableSystemLogQuery \
        shutdownGracePeriod shutdownGracePeriodCriticalPods shutdownGracePeriodByPodPriority \
        crashLoopBackOff reservedMemory enableProfilingHandler enableDebugFlagsHandler seccompDefault \
        memoryThrottlingFactor memoryReservationPolicy registerWithTaints registerNode tracing \
        localStorageCapacityIsolation containerRuntimeEndpoint imageServiceEndpoint failCgroupV1 \
        userNamespaces";

    #[test]
    fn configz_written_back_is_accepted() {
        // As the node suite restarts the agent: /configz, with every field
        // the suite's type serializes, written to a file and read again.
        let mut s = Settings::default();
        let mut doc = s.kubelet_configuration();
        let defaults = [
            ("defaultPodSysctls", serde_json::json!([])),
            ("tlsCipherSuites", serde_json::json!([])),
        ];
        for (k, v) in defaults {
            doc[k] = v;
        }
        let text = serde_json::to_string(&doc).unwrap();
        apply_file_text(&mut s, Path::new("kubelet-config"), &text).unwrap();
        for (field, accepted, _) in SECURITY_FIELDS {
            let mut v = &doc;
            for part in field.split('.') {
                v = &v[part];
            }
            let shown = security_text(v);
            assert!(
                accepted.contains(&shown.as_str()),
                "/configz shows {field} as {shown}"
            );
        }
    }

    #[test]
    fn image_pull_credentials_verification_policy_and_its_allowlist() {
        use crate::image_policy::VerificationPolicy;
        let read = |text: &str| {
            let mut s = Settings::default();
            apply_file_text(&mut s, Path::new("k.yaml"), text).map(|_| s)
        };
        assert_eq!(
            Settings::default().image_pull_verification,
            VerificationPolicy::NeverVerifyPreloadedImages
        );
        let s = read("imagePullCredentialsVerificationPolicy: AlwaysVerify\n").unwrap();
        assert_eq!(s.image_pull_verification, VerificationPolicy::AlwaysVerify);
        let s = read(
            "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\n\
             preloadedImagesVerificationAllowlist: [registry.example/base/*]\n",
        )
        .unwrap();
        let c = s.kubelet_configuration();
        assert_eq!(
            (
                &c["imagePullCredentialsVerificationPolicy"],
                &c["preloadedImagesVerificationAllowlist"]
            ),
            (
                &serde_json::json!("NeverVerifyAllowlistedImages"),
                &serde_json::json!(["registry.example/base/*"])
            )
        );
        for bad in [
            "imagePullCredentialsVerificationPolicy: Sometimes\n",
            "preloadedImagesVerificationAllowlist: [registry.example/a]\n",
            "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\n\
             preloadedImagesVerificationAllowlist: [busybox:1.36]\n",
        ] {
            let e = read(bad).unwrap_err().to_string();
            assert!(e.contains("k.yaml"), "{e}");
        }
    }

    #[test]
    fn docs_configuration_places_every_field() {
        let doc = include_str!("../docs/configuration.md");
        let fields: Vec<&str> = KUBELET_CONFIGURATION_FIELDS.split_whitespace().collect();
        assert_eq!(fields.len(), 126);
        let named = |f: &str| doc.contains(&format!("`{f}`"));
        let missing: Vec<&str> = fields
            .iter()
            .copied()
            .chain(
                SUPPORTED_FIELDS
                    .iter()
                    .copied()
                    .filter(|f| *f != "apiVersion" && *f != "kind"),
            )
            .chain(SECURITY_FIELDS.iter().map(|(f, _, _)| *f))
            .filter(|f| !named(f))
            .collect();
        assert!(
            missing.is_empty(),
            "not in docs/configuration.md: {missing:?}"
        );
        // A field read has an effect: none is listed as having none.
        let (_, no_effect) = doc
            .split_once("## Accepted, no effect")
            .expect("the no-effect section");
        let no_effect: String = no_effect
            .split("\n## ")
            .next()
            .unwrap_or_default()
            .lines()
            .filter_map(|row| row.split('|').nth(1))
            .collect();
        for f in SUPPORTED_FIELDS {
            assert!(
                !no_effect.contains(&format!("`{f}`")),
                "{f} is read, yet listed under \"Accepted, no effect\""
            );
        }
        // Each field read is one the type has.
        for f in SUPPORTED_FIELDS
            .iter()
            .filter(|f| **f != "apiVersion" && **f != "kind")
        {
            assert!(
                fields.contains(f),
                "{f} is not a KubeletConfiguration field"
            );
        }
    }

    #[test]
    fn the_document_type_reads_exactly_the_supported_fields() {
        // Every field of the kubelet's type, each null: those the type does
        // not read are left in `rest`, and named as ignored.
        let all = || {
            KUBELET_CONFIGURATION_FIELDS
                .split_whitespace()
                .chain(["apiVersion", "kind"])
        };
        let doc: serde_json::Map<String, Value> =
            all().map(|f| (f.to_string(), Value::Null)).collect();
        let file: KubeletConfiguration = serde_json::from_value(Value::Object(doc)).unwrap();
        let mut read: Vec<&str> = all().filter(|f| !file.rest.contains_key(*f)).collect();
        let mut supported = SUPPORTED_FIELDS.to_vec();
        read.sort_unstable();
        supported.sort_unstable();
        assert_eq!(read, supported);
    }

    #[test]
    fn a_null_field_keeps_its_default() {
        // As Go's decoding of the kubelet's type: null is no value.
        let mut s = Settings::default();
        let text = "maxPods: null\nclusterDNS: null\nfailSwapOn: null\nruntimeRequestTimeout: ~\n\
                    maxParallelImagePulls: null\nauthentication: {x509: null, webhook: null}\n\
                    featureGates: null\nevictionHard: null\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        // Only the block that is there counts as the file's.
        let sources = std::mem::take(&mut s.sources);
        assert_eq!(sources.keys().collect::<Vec<_>>(), ["authentication"]);
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn every_unknown_nested_field_is_named() {
        let mut s = Settings::default();
        let text = "authentication: {x509: {clientCAFile: /ca.crt, a: 1, b: 2}, webhook: {c: 3}, d: 4}\n\
                    authorization: {webhook: {enabled: true}}\nvolumePluginDir: /x\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(
            ignored,
            [
                "authentication.d",
                "authentication.webhook.c",
                "authentication.x509.a",
                "authentication.x509.b",
                "authorization.webhook.enabled",
                "volumePluginDir",
            ]
        );
        assert_eq!(s.client_ca_file, Some(PathBuf::from("/ca.crt")));
    }

    #[test]
    fn errors_name_the_field_dotted_and_what_it_takes() {
        let cases = [
            (
                "authorization:\n  webhook:\n    cacheAuthorizedTTL: -1s\n",
                "authorization.webhook.cacheAuthorizedTTL: \"-1s\" is negative",
            ),
            (
                "authentication: {x509: {clientCAFile: 3}}\n",
                "authentication.x509.clientCAFile: expected a string",
            ),
            (
                "featureGates: {UserNamespacesSupport: maybe}\n",
                "featureGates.UserNamespacesSupport: expected true or false",
            ),
            (
                "kubeReserved: {cpu: lots}\n",
                "kubeReserved: expected a quantity for cpu, not \"lots\"",
            ),
            (
                "evictionHard: {memory.available: 120%}\n",
                "evictionHard: expected memory.available: invalid percentage \"120%\"",
            ),
            (
                "evictionSoftGracePeriod: {memory.available: soon}\n",
                "evictionSoftGracePeriod: memory.available: \"soon\": ",
            ),
            ("clusterDNS: [1]\n", "clusterDNS: expected a list of IPs"),
            (
                "readOnlyPort: 70000\n",
                "readOnlyPort: expected a port, or 0 for none",
            ),
            (
                "imageGCHighThresholdPercent: 101\n",
                "imageGCHighThresholdPercent: expected a percentage from 0 to 100",
            ),
            (
                "runtimeRequestTimeout: 10\n",
                "runtimeRequestTimeout: expected a duration string like \"10s\"",
            ),
        ];
        for (text, want) in cases {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), text)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("parse config file k.yaml: {want}")),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn file_fields_apply_and_unknown_ones_are_named() {
        let mut s = Settings::default();
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 50\n\
                    runtimeRequestTimeout: 1m30s\nclusterDNS: [10.0.0.10]\ncgroupDriver: cgroupfs\nfailSwapOn: false\n\
                    allowedUnsafeSysctls: [kernel.msg*, net.core.somaxconn]\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(s.cgroup_driver, "cgroupfs");
        assert_eq!(s.fail_swap_on, Some(false));
        assert_eq!(s.max_pods, 50);
        assert_eq!(s.runtime_request_timeout, Duration::from_secs(90));
        assert_eq!(s.cluster_dns, vec!["10.0.0.10"]);
        assert_eq!(
            s.allowed_unsafe_sysctls,
            vec!["kernel.msg*", "net.core.somaxconn"]
        );
    }

    /// The gates this agent names are the kubelet's, and the honoured ones
    /// are on by default there (a new Kubernetes version that drops or
    /// turns one off shows here).
    #[test]
    fn the_named_gates_are_in_the_kubelets_table() {
        for name in HONOURED_GATES.iter().chain(SETTABLE_GATES) {
            let gate = crate::feature_gates::lookup(name)
                .unwrap_or_else(|| panic!("{name} is no gate of the kubelet"));
            assert!(
                gate.default || SETTABLE_GATES.contains(name),
                "{name} is off by default"
            );
        }
    }

    /// Feature gates as the kubelet's `SetFromMap` with its table: any gate
    /// at its default starts (a default-on one without its feature here is
    /// named for the warning); the settable ones take effect; an unknown
    /// gate, a locked one turned over, or another gate away from its
    /// default stops the agent, by name.
    #[test]
    fn feature_gates_are_read_as_the_kubelet_reads_them() {
        let locked_on = crate::feature_gates::all()
            .find(|g| g.locked && g.default && HONOURED_GATES.contains(&g.name))
            .expect("a gate locked on");
        let default_on_lacking = crate::feature_gates::all()
            .find(|g| {
                g.default
                    && !g.locked
                    && !HONOURED_GATES.contains(&g.name)
                    && !SETTABLE_GATES.contains(&g.name)
            })
            .expect("a default-on gate this agent lacks");
        let alpha = crate::feature_gates::all()
            .find(|g| !g.default && !g.locked && !SETTABLE_GATES.contains(&g.name))
            .expect("a default-off gate");
        // A kubeadm-style file: gates at their defaults, one turned off
        // that this agent can turn off.
        let text = format!(
            "featureGates:\n  {}: true\n  {}: true\n  {}: false\n  AllAlpha: false\n  RotateKubeletServerCertificate: false\n",
            locked_on.name, default_on_lacking.name, alpha.name
        );
        let mut s = Settings::default();
        apply_file_text(&mut s, Path::new("k.yaml"), &text).unwrap();
        assert!(!s.rotate_server_certificate);
        assert_eq!(s.gates_without_effect, [default_on_lacking.name]);

        for (text, message) in [
            (
                "featureGates: {NoSuchGate: true}\n".to_string(),
                "unrecognized feature gate: NoSuchGate".to_string(),
            ),
            (
                format!("featureGates: {{{}: false}}\n", locked_on.name),
                format!(
                    "cannot set feature gate {} to false, feature is locked to true",
                    locked_on.name
                ),
            ),
            (
                format!("featureGates: {{{}: true}}\n", alpha.name),
                format!("{}=true is not supported by this agent", alpha.name),
            ),
            (
                "featureGates: {AllAlpha: true}\n".to_string(),
                "AllAlpha=true is not supported by this agent".to_string(),
            ),
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(&message), "{text}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    /// The gates the node suite's CPU and memory manager tests turn off are
    /// read as the kubelet reads them: together they are accepted and take
    /// effect; a gate whose dependency is off, or a custom CFS period with
    /// its gate off, is refused with the kubelet's message.
    #[test]
    fn pod_level_resources_and_the_cfs_period_gates_go_off_with_their_dependents() {
        let suite = "featureGates:\n  CPUManagerPolicyAlphaOptions: true\n  CustomCPUCFSQuotaPeriod: false\n  PodLevelResources: false\n  \
            PodLevelResourcesFixDefaulting: false\n  PodLevelResourcesFixKubeletQOSClass: false\n  \
            InPlacePodLevelResourcesVerticalScaling: false\n";
        let mut s = Settings::default();
        assert!(s.pod_level_resources && s.pod_level_resize);
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), suite).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert!(!s.pod_level_resources && !s.pod_level_resize);
        assert!(s.resource_managers.cpu_alpha_options);
        assert!(s.gates_without_effect.is_empty());
        let doc = s.kubelet_configuration();
        assert_eq!(doc["featureGates"]["PodLevelResources"], false);
        // Shown as set, so that the document written back is accepted.
        assert_eq!(doc["featureGates"]["PodLevelResourcesFixDefaulting"], false);
        assert_eq!(doc["cpuCFSQuotaPeriod"], "100ms");
        let back = serde_json::to_string(&doc).unwrap();
        apply_file_text(&mut Settings::default(), Path::new("k.json"), &back).unwrap();
        // The default period passes with the gate off: it is the one in
        // effect.
        let with_period = format!("{suite}cpuCFSQuotaPeriod: 100ms\n");
        let ignored =
            apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &with_period).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        for (text, message) in [
            (
                "featureGates: {PodLevelResources: false}\n".to_string(),
                "featureGates: InPlacePodLevelResourcesVerticalScaling is enabled, but depends on features that are disabled: [PodLevelResources]",
            ),
            (
                format!("{suite}cpuCFSQuotaPeriod: 50ms\n"),
                "cpuCFSQuotaPeriod: invalid configuration: cpuCFSQuotaPeriod (--cpu-cfs-quota-period) 50ms requires feature gate CustomCPUCFSQuotaPeriod",
            ),
            (
                format!("{suite}cpuCFSQuotaPeriod: soon\n"),
                "cpuCFSQuotaPeriod: expected",
            ),
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{text}: {err}");
        }
        // With the gate off (its default) and not named, another period is
        // refused too.
        let err = apply_file_text(
            &mut Settings::default(),
            Path::new("k.yaml"),
            "cpuCFSQuotaPeriod: 50ms\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("requires feature gate CustomCPUCFSQuotaPeriod"),
            "{err}"
        );
        // With the gate on, a period from 1ms to 1s takes effect and is shown.
        let on = "featureGates: {CustomCPUCFSQuotaPeriod: true}\ncpuCFSQuotaPeriod: 50ms\n";
        let mut s = Settings::default();
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), on).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(s.cpu_cfs_quota_period, Duration::from_millis(50));
        assert_eq!(s.kubelet_configuration()["cpuCFSQuotaPeriod"], "50ms");
        for period in ["500us", "1500ms", "0s"] {
            let text = format!(
                "featureGates: {{CustomCPUCFSQuotaPeriod: true}}\ncpuCFSQuotaPeriod: {period}\n"
            );
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("must be between 1ms and 1sec, inclusive"),
                "{period}: {err}"
            );
        }
        // A period past any duration, or of another type: refused, whatever
        // the gate.
        for period in ["9999999999999999999h", "-5ms", "[1]", "100"] {
            let text = format!(
                "featureGates: {{CustomCPUCFSQuotaPeriod: true}}\ncpuCFSQuotaPeriod: {period}\n"
            );
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(err.contains("cpuCFSQuotaPeriod"), "{period}: {err}");
        }
        for period in ["1ms", "1s"] {
            let text = format!(
                "featureGates: {{CustomCPUCFSQuotaPeriod: true}}\ncpuCFSQuotaPeriod: {period}\n"
            );
            apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &text).unwrap();
        }
    }

    /// `podPidsLimit` is read as the kubelet reads it; an unset
    /// `nodeStatusReportFrequency` follows an explicit
    /// `nodeStatusUpdateFrequency`, as the kubelet's defaulting.
    #[test]
    fn shutdown_grace_periods_are_read_and_checked_as_the_kubelets() {
        let mut s = Settings::default();
        let text = "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n";
        assert!(
            apply_file_text(&mut s, Path::new("k.yaml"), text)
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.shutdown_grace_period, Duration::from_secs(30));
        assert_eq!(
            s.shutdown_grace_period_critical_pods,
            Duration::from_secs(10)
        );
        let doc = s.kubelet_configuration();
        assert_eq!(doc["shutdownGracePeriod"], "30s");
        assert_eq!(doc["shutdownGracePeriodCriticalPods"], "10s");
        assert_eq!(
            doc["shutdownGracePeriodByPodPriority"],
            serde_json::json!([])
        );
        let mut s = Settings::default();
        let text = "shutdownGracePeriodByPodPriority:\n- {priority: 100, shutdownGracePeriodSeconds: 10}\n- {priority: 0, shutdownGracePeriodSeconds: 20}\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(
            s.shutdown_grace_period_by_pod_priority,
            [
                PriorityPeriod {
                    priority: 100,
                    seconds: 10
                },
                PriorityPeriod {
                    priority: 0,
                    seconds: 20
                }
            ]
        );
        assert_eq!(
            s.kubelet_configuration()["shutdownGracePeriodByPodPriority"][1]["shutdownGracePeriodSeconds"],
            20
        );
        for (text, field, why) in [
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n",
                "shutdownGracePeriodCriticalPods",
                "must be <= shutdownGracePeriod 10s",
            ),
            (
                "shutdownGracePeriod: 500ms\n",
                "shutdownGracePeriod",
                "either zero or otherwise >= 1 sec",
            ),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: 5}\n",
                "shutdownGracePeriodByPodPriority",
                "Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod",
            ),
            (
                "shutdownGracePeriodByPodPriority:\n- {priority: 0, seconds: 5}\n",
                "shutdownGracePeriodByPodPriority",
                "unknown field",
            ),
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field) && err.contains(why), "{text}: {err}");
        }
    }

    /// `system-reserved` and `kube-reserved` take their cgroups, checked as
    /// the kubelet's validation checks them.
    #[test]
    fn reserved_enforcement_names_its_cgroups() {
        let mut s = Settings::default();
        let text = "enforceNodeAllocatable: [pods, system-reserved, kube-reserved]
systemReservedCgroup: /system.slice
kubeReservedCgroup: /kube
";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(
            (
                s.system_reserved_cgroup.as_str(),
                s.kube_reserved_cgroup.as_str()
            ),
            ("/system.slice", "/kube")
        );
        assert_eq!(s.kubelet_configuration()["kubeReservedCgroup"], "/kube");
        for (text, field, why) in [
            (
                "enforceNodeAllocatable: [system-reserved]\n",
                "systemReservedCgroup",
                "systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)",
            ),
            (
                "enforceNodeAllocatable: [kube-reserved]\nsystemReservedCgroup: /s\n",
                "kubeReservedCgroup",
                "kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\"",
            ),
            (
                "enforceNodeAllocatable: [none, pods]\n",
                "enforceNodeAllocatable",
                "may not contain additional enforcements when \"none\" is specified",
            ),
            (
                "kubeReservedCgroup: ../etc\n",
                "kubeReservedCgroup",
                "absolute cgroup path",
            ),
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field) && err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn sync_frequency_is_read_and_shown() {
        let mut s = Settings::default();
        assert_eq!(s.sync_frequency, Duration::from_secs(60));
        assert_eq!(s.kubelet_configuration()["syncFrequency"], "1m0s");
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), "syncFrequency: 90s\n").unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(s.sync_frequency, Duration::from_secs(90));
        assert_eq!(s.kubelet_configuration()["syncFrequency"], "1m30s");
        let err = apply_file_text(&mut s, Path::new("k.yaml"), "syncFrequency: -1s\n");
        assert!(err.is_err(), "{err:?}");
    }

    #[test]
    fn pod_pids_limit_and_the_report_frequency_default() {
        let mut s = Settings::default();
        assert_eq!(s.pod_pids_limit, -1);
        let text = "podPidsLimit: 4096\nnodeStatusUpdateFrequency: 4s\n";
        assert!(
            apply_file_text(&mut s, Path::new("k.yaml"), text)
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.pod_pids_limit, 4096);
        assert_eq!(s.node_status_report_frequency, Duration::from_secs(4));
        let mut s = Settings::default();
        let text = "nodeStatusUpdateFrequency: 4s\nnodeStatusReportFrequency: 1m\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(s.node_status_report_frequency, Duration::from_secs(60));
        let mut s = Settings::default();
        apply_file_text(&mut s, Path::new("k.yaml"), "maxPods: 9\n").unwrap();
        assert_eq!(s.node_status_report_frequency, Duration::from_secs(300));
        let err = apply_file_text(&mut s, Path::new("k.yaml"), "podPidsLimit: 1.5\n").unwrap_err();
        assert!(err.to_string().contains("podPidsLimit"), "{err}");
    }

    #[test]
    fn the_configuration_shown_holds_every_field_read_and_the_security_values() {
        // The node suite reconfigures an agent by writing its /configz
        // document back, changed, as the agent's configuration file: every
        // field the agent reads must be there, and the security fields with
        // the values the agent honours (else they come back as Go's zero
        // values).
        let shown = Settings::default().kubelet_configuration();
        let doc = shown.as_object().unwrap();
        // The server's own fields are added by /configz.
        let served = ["port", "authentication", "authorization"];
        for field in SUPPORTED_FIELDS.iter().filter(|f| !served.contains(f)) {
            assert!(doc.contains_key(*field), "/configz does not show {field}");
        }
        assert_eq!(doc["enableDebuggingHandlers"], true);
        check_security_fields(Path::new("k.json"), doc).unwrap();
    }

    #[test]
    fn out_of_range_ports_and_grace_periods_are_refused() {
        let mut s = Settings::default();
        let ok = "readOnlyPort: 10255\nevictionMaxPodGracePeriod: 30\n";
        apply_file_text(&mut s, Path::new("k.yaml"), ok).unwrap();
        assert_eq!(
            (s.read_only_port, s.eviction.max_pod_grace_period),
            (10255, 30)
        );
        for bad in [
            "readOnlyPort: 70000\n",
            "readOnlyPort: -1\n",
            "readOnlyPort: \"10255\"\n",
            "evictionMaxPodGracePeriod: 99999999999\n",
            "evictionMaxPodGracePeriod: 1.5\n",
        ] {
            let mut s = Settings::default();
            assert!(
                apply_file_text(&mut s, Path::new("k.yaml"), bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn image_gc_fields_are_read_and_validated_as_the_kubelet_does() {
        let mut s = Settings::default();
        assert_eq!(s.image_gc, ImageGcPolicy::default());
        assert_eq!(s.kubelet_configuration()["imageMaximumGCAge"], "0s");
        let text = "imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\n\
                    imageMinimumGCAge: 1s\nimageMaximumGCAge: 1m\n";
        assert!(
            apply_file_text(&mut s, Path::new("k.yaml"), text)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            s.image_gc,
            ImageGcPolicy {
                high_percent: 90,
                low_percent: 70,
                min_age: Duration::from_secs(1),
                max_age: Duration::from_secs(60),
            }
        );
        assert_eq!(s.kubelet_configuration()["imageMaximumGCAge"], "1m0s");
        for bad in [
            "imageGCHighThresholdPercent: 101\n",
            "imageGCLowThresholdPercent: 95\n",
            "imageMaximumGCAge: 1s\n",
            "imageMaximumGCAge: -1m\n",
        ] {
            let mut s = Settings::default();
            let text = format!("imageMinimumGCAge: 2m\n{bad}");
            assert!(
                apply_file_text(&mut s, Path::new("k.yaml"), &text).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn container_log_rotation_fields() {
        let mut s = Settings::default();
        assert_eq!(s.kubelet_configuration()["containerLogMaxSize"], "10Mi");
        let text =
            "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 1s\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(s.container_logs.max_bytes, 1024 * 1024);
        assert_eq!(s.container_logs.max_files, 3);
        assert_eq!(
            s.container_logs.interval,
            Duration::from_secs(3),
            "at least 3 s"
        );
        let c = s.kubelet_configuration();
        assert_eq!(
            (
                c["containerLogMaxSize"].as_str(),
                c["containerLogMaxFiles"].as_u64()
            ),
            (Some("1Mi"), Some(3))
        );
        for bad in ["containerLogMaxFiles: 1", "containerLogMaxSize: lots"] {
            let err = apply_file_text(&mut s, Path::new("k.yaml"), bad).unwrap_err();
            assert!(err.to_string().contains("containerLogMax"), "{err}");
        }
    }

    #[test]
    fn reservations_replace_the_eviction_defaults_and_bad_ones_are_named() {
        let mut s = Settings::default();
        assert_eq!(s.reservations.eviction_hard["nodefs.available"], "10%");
        let text = "kubeReserved: {cpu: 500m, memory: 1Gi}\nsystemReserved: {cpu: 100m}\nevictionHard: {memory.available: 5%}\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(s.reservations.kube_reserved["memory"], "1Gi");
        assert_eq!(s.reservations.system_reserved["cpu"], "100m");
        // Set in the file, evictionHard replaces the defaults whole.
        assert_eq!(s.reservations.eviction_hard.len(), 1);
        assert_eq!(
            s.kubelet_configuration()["evictionHard"]["memory.available"],
            "5%"
        );
        for bad in [
            "kubeReserved: {cpu: lots}",
            "systemReserved: {memory: -1Gi}",
            "evictionHard: {memory.available: 120%}",
            "evictionHard: [1]",
        ] {
            let err = apply_file_text(&mut s, Path::new("k.yaml"), bad).unwrap_err();
            assert!(
                err.to_string().contains("Reserved") || err.to_string().contains("evictionHard"),
                "{err}"
            );
        }
        assert_eq!(Threshold::parse("7.5%"), Ok(Threshold::Percent(7.5)));
    }

    #[test]
    fn image_pull_concurrency_fields() {
        let mut s = Settings::default();
        assert!(s.serialize_image_pulls, "serial by default, as the kubelet");
        let text = "serializeImagePulls: false\nmaxParallelImagePulls: 3\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(
            (s.serialize_image_pulls, s.max_parallel_image_pulls),
            (false, Some(3))
        );
        let c = s.kubelet_configuration();
        assert_eq!(c["maxParallelImagePulls"], 3);
        for bad in [
            "maxParallelImagePulls: 0",
            "maxParallelImagePulls: -1",
            "maxParallelImagePulls: 9999999999999",
            "serializeImagePulls: true\nmaxParallelImagePulls: 2",
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), bad);
            let err = err.unwrap_err().to_string();
            assert!(err.contains("maxParallelImagePulls"), "{bad}: {err}");
        }
    }

    #[test]
    fn crash_loop_maximum_restart_period() {
        let mut s = Settings::default();
        assert_eq!(s.crash_loop_max_restart_period, Duration::from_secs(300));
        let text = "crashLoopBackOff:\n  maxContainerRestartPeriod: 2s\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(s.crash_loop_max_restart_period, Duration::from_secs(2));
        let c = s.kubelet_configuration();
        assert_eq!(c["crashLoopBackOff"]["maxContainerRestartPeriod"], "2s");
        for bad in ["0s", "500ms", "301s", "10m", "-1s", "soon"] {
            let text = format!("crashLoopBackOff:\n  maxContainerRestartPeriod: {bad}\n");
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), &text);
            let err = err.unwrap_err().to_string();
            assert!(err.contains("maxContainerRestartPeriod"), "{bad}: {err}");
        }
        let text = "crashLoopBackOff:\n  someday: 1\n";
        let ignored = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), text);
        assert_eq!(ignored.unwrap(), ["crashLoopBackOff.someday"]);
    }

    #[test]
    fn the_agents_own_oom_score() {
        let mut s = Settings::default();
        assert_eq!(s.oom_score_adj, -999, "the kubelet's default");
        apply_file_text(&mut s, Path::new("k.yaml"), "oomScoreAdj: 0\n").unwrap();
        assert_eq!(s.oom_score_adj, 0);
        assert_eq!(s.kubelet_configuration()["oomScoreAdj"], 0);
        for bad in [
            "oomScoreAdj: 1001",
            "oomScoreAdj: -1001",
            "oomScoreAdj: low",
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), bad);
            assert!(
                err.unwrap_err().to_string().contains("oomScoreAdj"),
                "{bad}"
            );
        }
    }

    #[test]
    fn logging_format_and_verbosity() {
        let mut s = Settings::default();
        assert_eq!(s.logging, Logging::default());
        let text = "logging:\n  format: json\n  verbosity: 4\n  flushFrequency: 5s\n  options:\n    json:\n      infoBufferSize: \"0\"\n";
        let ignored = apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(
            s.logging,
            Logging {
                json: true,
                verbosity: 4
            }
        );
        let c = s.kubelet_configuration();
        assert_eq!(
            (&c["logging"]["format"], &c["logging"]["verbosity"]),
            (&"json".into(), &4.into())
        );
        let text = "logging:\n  vmodule:\n  - pattern: x\n    verbosity: 9\n";
        let ignored = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), text);
        assert_eq!(ignored.unwrap(), ["logging.vmodule"]);
        for bad in ["logging:\n  format: xml\n", "logging:\n  verbosity: -1\n"] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), bad);
            let err = err.unwrap_err().to_string();
            assert!(err.contains("logging."), "{bad}: {err}");
        }
    }

    #[test]
    fn memory_swap_behavior() {
        let mut s = Settings::default();
        assert!(!s.limited_swap, "NoSwap by default, as the kubelet");
        assert_eq!(
            s.kubelet_configuration()["memorySwap"]["swapBehavior"],
            "NoSwap"
        );
        let text = "memorySwap:\n  swapBehavior: LimitedSwap\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert!(s.limited_swap);
        assert_eq!(
            s.kubelet_configuration()["memorySwap"]["swapBehavior"],
            "LimitedSwap"
        );
        for (value, limited) in [("NoSwap", false), ("\"\"", false)] {
            let text = format!("memorySwap:\n  swapBehavior: {value}\n");
            let mut s = Settings::default();
            apply_file_text(&mut s, Path::new("k.yaml"), &text).unwrap();
            assert_eq!(s.limited_swap, limited, "{value}");
        }
        let text = "memorySwap:\n  swapBehavior: UnlimitedSwap\n";
        let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), text);
        let err = err.unwrap_err().to_string();
        assert!(
            err.contains("swapBehavior") && err.contains("LimitedSwap"),
            "{err}"
        );
    }

    #[test]
    fn image_pull_rate_fields() {
        let mut s = Settings::default();
        assert_eq!(
            (s.registry_pull_qps, s.registry_burst),
            (5, 10),
            "the kubelet's defaults"
        );
        let text = "registryPullQPS: 0\nregistryBurst: 3\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!((s.registry_pull_qps, s.registry_burst), (0, 3));
        let c = s.kubelet_configuration();
        assert_eq!(
            (&c["registryPullQPS"], &c["registryBurst"]),
            (&0.into(), &3.into())
        );
        for bad in [
            "registryPullQPS: -1",
            "registryBurst: -1",
            "registryPullQPS: 1.5",
            "registryBurst: 9999999999999",
        ] {
            let err = apply_file_text(&mut Settings::default(), Path::new("k.yaml"), bad);
            let err = err.unwrap_err().to_string();
            assert!(err.contains("registry"), "{bad}: {err}");
        }
    }

    #[test]
    fn durations_are_written_as_go_does() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(10), "10ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(120), "2m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(3600 * 26 + 61), "26h1m1s"),
            (Duration::from_millis(60_001), "1m0.001s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn settings_read_back_as_kubelet_configuration() {
        let mut s = Settings::default();
        let text = "maxPods: 50\nruntimeRequestTimeout: 1m30s\nclusterDNS: [10.0.0.10]\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        let v = s.kubelet_configuration();
        assert_eq!(v["kind"], "KubeletConfiguration");
        assert_eq!(v["maxPods"], 50);
        assert_eq!(v["runtimeRequestTimeout"], "1m30s");
        assert_eq!(v["nodeStatusReportFrequency"], "5m0s");
        assert_eq!(v["clusterDNS"], serde_json::json!(["10.0.0.10"]));
        // What /configz shows can be read back as the same settings.
        let mut again = Settings::default();
        let ignored = apply_file_text(&mut again, Path::new("k.json"), &v.to_string()).unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");
        // Every field now comes from that document.
        assert!(again.sources.values().all(|source| source == "file k.json"));
        assert_eq!(
            again
                .sources
                .keys()
                .collect::<std::collections::BTreeSet<_>>(),
            v.as_object()
                .unwrap()
                .iter()
                .filter(|(k, v)| *k != "apiVersion" && *k != "kind" && !v.is_null())
                .map(|(k, _)| k)
                .collect()
        );
        again.sources.clone_from(&s.sources);
        assert_eq!(again, s);
    }

    #[test]
    fn bad_values_are_named() {
        let mut s = Settings::default();
        let err = apply_file_text(&mut s, Path::new("k.yaml"), "maxPods: lots\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "parse config file k.yaml: maxPods: expected a count"
        );
        let err = apply_file_text(&mut s, Path::new("k.yaml"), "- a\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("expected a KubeletConfiguration mapping")
        );
        let err = apply_file_text(
            &mut s,
            Path::new("k.yaml"),
            "nodeStatusUpdateFrequency: soon\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("nodeStatusUpdateFrequency"));
    }

    #[test]
    fn security_fields_are_honoured_or_refused() {
        // (document, field named in the error; None: accepted)
        let cases = [
            ("seccompDefault: true\n", None),
            (
                "authentication: {anonymous: {enabled: false}, webhook: {enabled: true}}\n",
                None,
            ),
            ("authorization: {mode: Webhook}\n", None),
            (
                "readOnlyPort: 0\nprotectKernelDefaults: false\npodPidsLimit: 1024\n",
                None,
            ),
            (
                "featureGates: {UserNamespacesSupport: false}\n",
                Some("featureGates.UserNamespacesSupport"),
            ),
            (
                "featureGates: {ReloadKubeletClientCAFile: true, ReloadKubeletServerCertificateFile: false, RotateKubeletServerCertificate: false}\n",
                None,
            ),
            ("tlsMinVersion: VersionTLS12\ntlsCipherSuites: []\n", None),
            ("userNamespaces: {idsPerPod: 65536}\n", None),
            ("featureGates: {ImageMaximumGCAge: true}\n", None),
            (
                "featureGates: {ImageMaximumGCAge: false}\n",
                Some("featureGates.ImageMaximumGCAge"),
            ),
            (
                "authentication: {anonymous: {enabled: true}}\n",
                Some("authentication.anonymous.enabled"),
            ),
            (
                "authentication: {webhook: {enabled: false}}\n",
                Some("authentication.webhook.enabled"),
            ),
            (
                "authentication: {anonymous: yes-please}\n",
                Some("authentication.anonymous.enabled"),
            ),
            (
                "authorization: {mode: AlwaysAllow}\n",
                Some("authorization.mode"),
            ),
            (
                "protectKernelDefaults: true\n",
                Some("protectKernelDefaults"),
            ),
            (
                "enableDebuggingHandlers: false\n",
                Some("enableDebuggingHandlers"),
            ),
            ("tlsMinVersion: VersionTLS13\n", Some("tlsMinVersion")),
            (
                "tlsCipherSuites: [TLS_AES_128_GCM_SHA256]\n",
                Some("tlsCipherSuites"),
            ),
            ("tlsCipherSuites: {}\n", Some("tlsCipherSuites")),
            (
                "defaultPodSysctls: [{name: net.ipv4.ip_forward, value: \"1\"}]\n",
                Some("defaultPodSysctls"),
            ),
            ("defaultPodSysctls: []\n", None),
            ("registerNode: false\n", Some("registerNode")),
            (
                "userNamespaces: {idsPerPod: 1024}\n",
                Some("userNamespaces.idsPerPod"),
            ),
            (
                "featureGates: {AllAlpha: true}\n",
                Some("featureGates.AllAlpha"),
            ),
        ];
        for (text, want) in cases {
            let mut s = Settings::default();
            match (apply_file_text(&mut s, Path::new("k.yaml"), text), want) {
                (Ok(_), None) => {}
                (Err(e @ Error::Unsupported { .. }), Some(field)) => {
                    let line = e.to_string();
                    assert!(
                        line.starts_with(&format!("config file k.yaml: {field}: ")),
                        "{line}"
                    );
                    assert!(!line.contains('\n'), "one line: {line}");
                }
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
        let mut s = Settings::default();
        assert!(
            s.user_namespaces_support && !s.seccomp_default,
            "the kubelet's defaults"
        );
        let text =
            "seccompDefault: true\nfeatureGates: {UserNamespacesSupport: true}\nfailSwapOn: true\n";
        assert!(
            apply_file_text(&mut s, Path::new("k.yaml"), text)
                .unwrap()
                .is_empty()
        );
        assert!(s.seccomp_default && s.user_namespaces_support);
        assert_eq!(s.fail_swap_on, Some(true));
        let reloads = |s: &Settings| {
            (
                s.reload_client_ca_file,
                s.reload_server_certificate_file,
                s.rotate_server_certificate,
            )
        };
        assert_eq!(reloads(&s), (true, true, true), "the kubelet's defaults");
        let text = "featureGates: {ReloadKubeletClientCAFile: false, ReloadKubeletServerCertificateFile: false, RotateKubeletServerCertificate: false}\n";
        apply_file_text(&mut s, Path::new("k.yaml"), text).unwrap();
        assert_eq!(reloads(&s), (false, false, false));
    }
}
