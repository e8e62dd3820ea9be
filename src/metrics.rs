//! The agent's Prometheus metrics, under the kubelet's names, label names and
//! histogram buckets (pkg/kubelet/metrics/metrics.go), served on `/metrics` of
//! the node API in the text exposition format.
//!
//! One process-wide registry, as the kubelet's legacy registry: the pod
//! worker, the PLEG and the CRI client record into [`metrics()`] wherever they
//! run, and the server encodes it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{
    Histogram, exponential_buckets, exponential_buckets_range,
};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// The Prometheus client's default buckets (`prometheus.DefBuckets`), seconds.
const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// `podStartupDurationBuckets` of the kubelet, seconds.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// Label `operation_type`: a pod worker operation (`create`, `update`, `sync`)
/// or a CRI call (`run_podsandbox`, `create_container`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    /// The operation.
    pub operation_type: String,
}

/// Label `container_state` of `kubelet_running_containers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerState {
    /// `created`, `running`, `exited` or `unknown` (CRI states, lower case).
    pub container_state: String,
}

/// Labels of `prober_probe_total`, as the kubelet's prober metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: String,
    /// `successful`, `failed` or `unknown`.
    pub result: String,
    /// The container's name.
    pub container: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub pod_uid: String,
}

/// Labels of `kubelet_working_pods`, as the kubelet's `HandlePodCleanups`
/// sets them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingLabels {
    /// The pod worker's state: `sync`, `terminating` or `terminated`.
    pub lifecycle: String,
    /// `desired` (its source defines it), `orphan` (its source no longer
    /// does, it is being stopped) or `runtime_only` (only the runtime has it).
    pub config: String,
    /// `true` for a static pod, empty for another, `unknown` for a pod only
    /// the runtime has.
    pub r#static: String,
}

/// Label `static` of `kubelet_desired_pods` and `kubelet_active_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaticLabel {
    /// `true` for static pods, empty for the others.
    pub r#static: String,
}

/// The pods of housekeeping's census, counted for the gauges of
/// [`Metrics::set_pod_counts`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// `(lifecycle, config, static)` → pods, for `kubelet_working_pods`;
    /// the label values as [`WorkingLabels`]. Combinations not named are 0.
    pub working: HashMap<(&'static str, &'static str, &'static str), usize>,
    /// Pods the sources define, regular and static (`kubelet_desired_pods`).
    pub desired: (usize, usize),
    /// Desired pods neither finished nor being stopped, regular and static
    /// (`kubelet_active_pods`).
    pub active: (usize, usize),
    /// Mirror pods in the API server (`kubelet_mirror_pods`).
    pub mirrors: usize,
}

/// Label `server_api_version` of the pod resources API's metrics: `v1` or
/// `v1alpha1`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiVersion {
    /// The API version the call was made to.
    pub server_api_version: String,
}

/// A call of the pod resources API v1 with counters of its own
/// ([`Metrics::pod_resources_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodResourcesCall {
    /// `List` (`kubelet_pod_resources_endpoint_requests_list`).
    List,
    /// `GetAllocatableResources`
    /// (`kubelet_pod_resources_endpoint_requests_get_allocatable`).
    GetAllocatable,
    /// `Get` (`kubelet_pod_resources_endpoint_requests_get`).
    Get,
}

/// A counter exposed under its name as it is, without the `_total` suffix
/// the text encoder gives counters: the kubelet's counters whose name does
/// not end in `_total` (`kubelet_pod_resources_endpoint_requests_list`)
/// keep that name, with the type `counter`, as the kubelet's text format
/// shows them. A strict OpenMetrics parser wants `_total` on a counter's
/// samples; Prometheus and the Go text parsers accept the name as it is.
#[derive(Clone, Debug, Default)]
pub struct PlainCounter(Counter);

impl PlainCounter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.inc();
    }

    /// The count.
    #[must_use]
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl TypedMetric for PlainCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for PlainCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The `(config, static)` pairs of `kubelet_working_pods` the kubelet
/// reports, each for every lifecycle.
const WORKING_CONFIGS: [(&str, &str); 5] = [
    ("desired", ""),
    ("desired", "true"),
    ("orphan", ""),
    ("orphan", "true"),
    ("runtime_only", "unknown"),
];

/// The lifecycles of `kubelet_working_pods`.
const LIFECYCLES: [&str; 3] = ["sync", "terminating", "terminated"];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Labels of `dra_operations_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraOperation {
    /// `PrepareResources` or `UnprepareResources`.
    pub operation_name: String,
    /// `true` or `false`.
    pub is_error: String,
}

/// Labels of `dra_grpc_operations_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraCall {
    /// The DRA driver called.
    pub driver_name: String,
    /// The full gRPC method
    /// (`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`).
    pub method_name: String,
    /// The gRPC status code's name (`OK`, `DeadlineExceeded`).
    pub grpc_status_code: String,
}

/// Label `driver_name` of `dra_resource_claims_in_use` (`<any>`: all
/// drivers together).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriverName {
    /// The driver's name, or `<any>`.
    pub driver_name: String,
}

/// Label `plugin_name` of the credential provider plugins' metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginName {
    /// The provider's name in the credential provider configuration.
    pub plugin_name: String,
}

/// Label `hash` of `kubelet_credential_provider_config_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigHash {
    /// `sha256:<hex>` of the configuration files' content.
    pub hash: String,
}

/// The kubelet's `DRADurationBuckets`: `ExponentialBucketsRange(.1, 40, 15)`.
fn dra_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(0.1, 40.0, 15))
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `kubelet_pod_start_duration_seconds`: from the agent first seeing a pod
    /// to all its containers running, seconds.
    pub pod_start_duration: Histogram,
    /// `kubelet_pod_worker_duration_seconds{operation_type}`: one pod sync, seconds.
    pub pod_worker_duration: HistogramFamily<Operation>,
    /// `kubelet_running_pods`: pods with a ready sandbox.
    pub running_pods: Gauge,
    /// `kubelet_running_containers{container_state}`: containers by CRI state.
    pub running_containers: Family<ContainerState, Gauge>,
    /// `kubelet_runtime_operations_total{operation_type}`: CRI calls made.
    pub runtime_operations: Family<Operation, Counter>,
    /// `kubelet_runtime_operations_errors_total{operation_type}`: CRI calls that failed.
    pub runtime_operations_errors: Family<Operation, Counter>,
    /// `kubelet_runtime_operations_duration_seconds{operation_type}`: CRI call latency, seconds.
    pub runtime_operations_duration: HistogramFamily<Operation>,
    /// `kubelet_pleg_last_seen_seconds`: Unix time of the PLEG's last activity, seconds.
    pub pleg_last_seen: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `kubelet_working_pods{lifecycle,config,static}`: pods the pod workers
    /// have, from housekeeping.
    pub working_pods: Family<WorkingLabels, Gauge>,
    /// `kubelet_desired_pods{static}`: pods the sources define.
    pub desired_pods: Family<StaticLabel, Gauge>,
    /// `kubelet_active_pods{static}`: desired pods not finished or stopping.
    pub active_pods: Family<StaticLabel, Gauge>,
    /// `kubelet_mirror_pods`: mirror pods in the API server.
    pub mirror_pods: Gauge,
    /// `kubelet_pod_resources_endpoint_requests_total{server_api_version}`:
    /// calls of the pod resources API.
    pub pod_resources_requests: Family<ApiVersion, Counter>,
    /// `kubelet_pod_resources_endpoint_requests_list{server_api_version}`.
    pub pod_resources_requests_list: Family<ApiVersion, PlainCounter>,
    /// `kubelet_pod_resources_endpoint_requests_get_allocatable{server_api_version}`.
    pub pod_resources_requests_get_allocatable: Family<ApiVersion, PlainCounter>,
    /// `kubelet_pod_resources_endpoint_requests_get{server_api_version}`.
    pub pod_resources_requests_get: Family<ApiVersion, PlainCounter>,
    /// `kubelet_pod_resources_endpoint_errors_get{server_api_version}`:
    /// `Get` calls that failed (the pod was not found).
    pub pod_resources_errors_get: Family<ApiVersion, PlainCounter>,
    /// The registry of the metrics the kubelet exports without its
    /// `kubelet_` prefix (the DRA manager's).
    unprefixed: Registry,
    /// `dra_operations_duration_seconds{operation_name,is_error}`: handling
    /// all of a pod's claims when it starts or stops, seconds.
    pub dra_operations_duration: HistogramFamily<DraOperation>,
    /// `dra_grpc_operations_duration_seconds{driver_name,method_name,grpc_status_code}`:
    /// calls to DRA drivers, seconds.
    pub dra_grpc_operations_duration: HistogramFamily<DraCall>,
    /// `dra_resource_claims_in_use{driver_name}`: claims prepared or being
    /// prepared on the node, by driver and (`<any>`) in all.
    pub dra_resource_claims_in_use: Family<DriverName, Gauge>,
    /// `kubelet_graceful_shutdown_start_time_seconds`: when the last
    /// graceful node shutdown began, Unix seconds (0: never).
    pub graceful_shutdown_start_time: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `kubelet_graceful_shutdown_end_time_seconds`: when it ended.
    pub graceful_shutdown_end_time: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `kubelet_credential_provider_plugin_duration{plugin_name}`: runs of
    /// a credential provider plugin, seconds.
    pub credential_provider_plugin_duration: HistogramFamily<PluginName>,
    /// `kubelet_credential_provider_plugin_errors_total{plugin_name}`: runs
    /// that failed (exit status, timeout).
    pub credential_provider_plugin_errors: Family<PluginName, Counter>,
    /// `kubelet_credential_provider_config_info{hash}`: 1 for the
    /// configuration in use.
    pub credential_provider_config_info: Family<ConfigHash, Gauge>,
    /// `kubelet_cpu_manager_pinning_requests_total`: allocations of
    /// exclusive CPUs asked of the static policy.
    pub cpu_manager_pinning_requests: Counter,
    /// `kubelet_cpu_manager_pinning_errors_total`: those that failed.
    pub cpu_manager_pinning_errors: Counter,
    /// `kubelet_memory_manager_pinning_requests_total`: allocations of
    /// NUMA-pinned memory asked of the static policy.
    pub memory_manager_pinning_requests: Counter,
    /// `kubelet_memory_manager_pinning_errors_total`: those that failed.
    pub memory_manager_pinning_errors: Counter,
    /// `kubelet_cpu_manager_shared_pool_size_millicores`: the shared pool
    /// less the reserved CPUs, millicores.
    pub cpu_manager_shared_pool_size_millicores: Gauge,
    /// `kubelet_cpu_manager_exclusive_cpu_allocation_count`: CPUs given to
    /// containers alone.
    pub cpu_manager_exclusive_cpu_allocation_count: Gauge,
    /// `kubelet_topology_manager_admission_requests_total`: pods the
    /// topology manager admitted or rejected.
    pub topology_manager_admission_requests: Counter,
    /// `kubelet_topology_manager_admission_errors_total`: pods it rejected.
    pub topology_manager_admission_errors: Counter,
    /// Pod UID → when the pod worker first saw it, and whether its start was recorded.
    first_seen: Mutex<HashMap<String, (Instant, bool)>>,
    /// The registry of `/metrics/probes`.
    probes_registry: Registry,
    /// `prober_probe_total{probe_type,result,container,pod,namespace,pod_uid}`:
    /// probe runs by result.
    pub probe_total: Family<ProbeLabels, Counter>,
    /// Pod UID → the label sets it has in `probe_total` (removed with the pod).
    probe_series: Mutex<HashMap<String, std::collections::HashSet<ProbeLabels>>>,
    /// Probe workers alive per series (labels with an empty `result`): a
    /// restarted container's new worker overlaps its old one.
    probe_workers: Mutex<HashMap<ProbeLabels, usize>>,
}

fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}

fn runtime_histogram() -> Histogram {
    // metrics.ExponentialBuckets(.005, 2.5, 14)
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("kubelet");
        let m = Self {
            registry: Registry::default(),
            pod_start_duration: Histogram::new(POD_START_BUCKETS),
            pod_worker_duration: Family::new_with_constructor(def_histogram),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            runtime_operations: Family::default(),
            runtime_operations_errors: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(runtime_histogram),
            pleg_last_seen: Gauge::default(),
            working_pods: Family::default(),
            desired_pods: Family::default(),
            active_pods: Family::default(),
            mirror_pods: Gauge::default(),
            pod_resources_requests: Family::default(),
            pod_resources_requests_list: Family::default(),
            pod_resources_requests_get_allocatable: Family::default(),
            pod_resources_requests_get: Family::default(),
            pod_resources_errors_get: Family::default(),
            unprefixed: Registry::default(),
            dra_operations_duration: Family::new_with_constructor(dra_histogram),
            dra_grpc_operations_duration: Family::new_with_constructor(dra_histogram),
            dra_resource_claims_in_use: Family::default(),
            graceful_shutdown_start_time: Gauge::default(),
            graceful_shutdown_end_time: Gauge::default(),
            credential_provider_plugin_duration: Family::new_with_constructor(def_histogram),
            credential_provider_plugin_errors: Family::default(),
            credential_provider_config_info: Family::default(),
            cpu_manager_pinning_requests: Counter::default(),
            cpu_manager_pinning_errors: Counter::default(),
            memory_manager_pinning_requests: Counter::default(),
            memory_manager_pinning_errors: Counter::default(),
            cpu_manager_shared_pool_size_millicores: Gauge::default(),
            cpu_manager_exclusive_cpu_allocation_count: Gauge::default(),
            topology_manager_admission_requests: Counter::default(),
            topology_manager_admission_errors: Counter::default(),
            first_seen: Mutex::default(),
            probes_registry: Registry::default(),
            probe_total: Family::default(),
            probe_series: Mutex::default(),
            probe_workers: Mutex::default(),
        };
        let mut probes_registry = Registry::default();
        probes_registry.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            m.probe_total.clone(),
        );
        registry.register(
            "pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            m.pod_start_duration.clone(),
        );
        registry.register(
            "pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            m.pod_worker_duration.clone(),
        );
        registry.register(
            "running_pods",
            "Number of pods that have a running pod sandbox",
            m.running_pods.clone(),
        );
        registry.register(
            "running_containers",
            "Number of containers currently running",
            m.running_containers.clone(),
        );
        registry.register(
            "runtime_operations",
            "Cumulative number of runtime operations by operation type.",
            m.runtime_operations.clone(),
        );
        registry.register(
            "runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type.",
            m.runtime_operations_errors.clone(),
        );
        registry.register(
            "runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            m.runtime_operations_duration.clone(),
        );
        registry.register(
            "pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
            m.pleg_last_seen.clone(),
        );
        registry.register(
            "working_pods",
            "Number of pods the pod workers have, by lifecycle, by whether their source still defines them (desired), no longer does (orphan) or only the runtime has them (runtime_only), and by whether they are static",
            m.working_pods.clone(),
        );
        registry.register(
            "desired_pods",
            "Number of pods the pod sources define, by whether they are static",
            m.desired_pods.clone(),
        );
        registry.register(
            "active_pods",
            "Number of desired pods that have neither finished nor been asked to stop, by whether they are static",
            m.active_pods.clone(),
        );
        registry.register(
            "mirror_pods",
            "Number of mirror pods of this node in the API server",
            m.mirror_pods.clone(),
        );
        registry.register(
            "pod_resources_endpoint_requests",
            "Cumulative number of requests to the PodResource endpoint. Broken down by server api version.",
            m.pod_resources_requests.clone(),
        );
        registry.register(
            "pod_resources_endpoint_requests_list",
            "Number of requests to the PodResource List endpoint. Broken down by server api version.",
            m.pod_resources_requests_list.clone(),
        );
        registry.register(
            "pod_resources_endpoint_requests_get_allocatable",
            "Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version.",
            m.pod_resources_requests_get_allocatable.clone(),
        );
        registry.register(
            "pod_resources_endpoint_requests_get",
            "Number of requests to the PodResource Get endpoint. Broken down by server api version.",
            m.pod_resources_requests_get.clone(),
        );
        registry.register(
            "pod_resources_endpoint_errors_get",
            "Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version.",
            m.pod_resources_errors_get.clone(),
        );
        m.register_shutdown_and_credential_providers(&mut registry);
        let unprefixed = m.unprefixed_registry();
        let m = Self {
            registry,
            probes_registry,
            unprefixed,
            ..m
        };
        m.set_dra_claims_in_use(0, &BTreeMap::new());
        // Every series exists from the start, at 0, as the kubelet sets them all.
        m.set_pod_counts(&PodCounts::default());
        m
    }

    /// Registers the node shutdown manager's and the credential providers'
    /// metrics in `registry` (the `kubelet_` one).
    fn register_shutdown_and_credential_providers(&self, registry: &mut Registry) {
        registry.register(
            "graceful_shutdown_start_time_seconds",
            "Last graceful shutdown start time since unix epoch in seconds",
            self.graceful_shutdown_start_time.clone(),
        );
        registry.register(
            "graceful_shutdown_end_time_seconds",
            "Last graceful shutdown end time since unix epoch in seconds",
            self.graceful_shutdown_end_time.clone(),
        );
        registry.register(
            "credential_provider_plugin_duration",
            "Duration of execution in seconds for credential provider plugin",
            self.credential_provider_plugin_duration.clone(),
        );
        registry.register(
            "credential_provider_plugin_errors",
            "Number of errors from credential provider plugin",
            self.credential_provider_plugin_errors.clone(),
        );
        registry.register(
            "credential_provider_config_info",
            "Information about the last applied credential provider configuration with hash as label",
            self.credential_provider_config_info.clone(),
        );
        registry.register(
            "cpu_manager_pinning_requests",
            "The number of cpu core allocations which required pinning.",
            self.cpu_manager_pinning_requests.clone(),
        );
        registry.register(
            "cpu_manager_pinning_errors",
            "The number of cpu core allocations which required pinning failed.",
            self.cpu_manager_pinning_errors.clone(),
        );
        registry.register(
            "memory_manager_pinning_requests",
            "The number of memory pages allocations which required pinning.",
            self.memory_manager_pinning_requests.clone(),
        );
        registry.register(
            "memory_manager_pinning_errors",
            "The number of memory pages allocations which required pinning that failed.",
            self.memory_manager_pinning_errors.clone(),
        );
        registry.register(
            "cpu_manager_shared_pool_size_millicores",
            "The size of the shared CPU pool for non-guaranteed QoS pods, in millicores.",
            self.cpu_manager_shared_pool_size_millicores.clone(),
        );
        registry.register(
            "cpu_manager_exclusive_cpu_allocation_count",
            "The total number of CPUs exclusively allocated to containers running on this node",
            self.cpu_manager_exclusive_cpu_allocation_count.clone(),
        );
        registry.register(
            "topology_manager_admission_requests",
            "The number of admission requests where resources have to be aligned.",
            self.topology_manager_admission_requests.clone(),
        );
        registry.register(
            "topology_manager_admission_errors",
            "The number of admission request failures where resources could not be aligned.",
            self.topology_manager_admission_errors.clone(),
        );
    }

    /// The registry of the metrics the kubelet exports without its prefix:
    /// the DRA manager's.
    fn unprefixed_registry(&self) -> Registry {
        let mut unprefixed = Registry::default();
        unprefixed.register(
            "dra_operations_duration_seconds",
            "Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count.",
            self.dra_operations_duration.clone(),
        );
        unprefixed.register(
            "dra_grpc_operations_duration_seconds",
            "Duration in seconds of the DRA gRPC operations",
            self.dra_grpc_operations_duration.clone(),
        );
        unprefixed.register(
            "dra_resource_claims_in_use",
            "The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name.",
            self.dra_resource_claims_in_use.clone(),
        );
        unprefixed
    }

    /// Counts one call of the pod resources API `version` (`v1`,
    /// `v1alpha1`), and `call` on its own counter when given, as the
    /// kubelet's pod resources servers count their calls.
    pub fn pod_resources_request(&self, version: &str, call: Option<PodResourcesCall>) {
        let label = ApiVersion {
            server_api_version: version.to_string(),
        };
        self.pod_resources_requests.get_or_create(&label).inc();
        let family = match call {
            Some(PodResourcesCall::List) => &self.pod_resources_requests_list,
            Some(PodResourcesCall::GetAllocatable) => &self.pod_resources_requests_get_allocatable,
            Some(PodResourcesCall::Get) => &self.pod_resources_requests_get,
            None => return,
        };
        family.get_or_create(&label).inc();
    }

    /// Records one `PrepareResources` or `UnprepareResources` of a pod's
    /// claims (`operation`), its duration and whether it failed.
    pub fn record_dra_operation(&self, operation: &str, took: Duration, failed: bool) {
        self.dra_operations_duration
            .get_or_create(&DraOperation {
                operation_name: operation.to_string(),
                is_error: failed.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one call of DRA driver `driver`: its full gRPC `method`, the
    /// name of its status `code` and its duration.
    pub fn record_dra_call(&self, driver: &str, method: &str, code: &str, took: Duration) {
        self.dra_grpc_operations_duration
            .get_or_create(&DraCall {
                driver_name: driver.to_string(),
                method_name: method.to_string(),
                grpc_status_code: code.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one run of credential provider plugin `plugin`: its duration
    /// and whether it failed.
    pub fn record_credential_provider_run(&self, plugin: &str, took: Duration, failed: bool) {
        let label = PluginName {
            plugin_name: plugin.to_string(),
        };
        self.credential_provider_plugin_duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        if failed {
            self.credential_provider_plugin_errors
                .get_or_create(&label)
                .inc();
        }
    }

    /// Sets `kubelet_credential_provider_config_info` to the configuration
    /// with `hash`.
    pub fn set_credential_provider_config(&self, hash: &str) {
        self.credential_provider_config_info.clear();
        self.credential_provider_config_info
            .get_or_create(&ConfigHash {
                hash: hash.to_string(),
            })
            .set(1);
    }

    /// Sets `dra_resource_claims_in_use`: `all` claims in use, `by_driver`
    /// those with devices of each driver (drivers not listed are dropped).
    pub fn set_dra_claims_in_use(&self, all: usize, by_driver: &BTreeMap<String, usize>) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.dra_resource_claims_in_use.clear();
        self.dra_resource_claims_in_use
            .get_or_create(&DriverName {
                driver_name: "<any>".into(),
            })
            .set(gauge(all));
        for (driver, n) in by_driver {
            self.dra_resource_claims_in_use
                .get_or_create(&DriverName {
                    driver_name: driver.clone(),
                })
                .set(gauge(*n));
        }
    }

    /// Counts one failed `Get` call of the pod resources API `version`.
    pub fn pod_resources_get_failed(&self, version: &str) {
        self.pod_resources_errors_get
            .get_or_create(&ApiVersion {
                server_api_version: version.to_string(),
            })
            .inc();
    }

    /// Records one CRI call: its count, its latency and, if it failed, an error.
    /// `call` is the CRI method name (`RunPodSandbox`); the label is the
    /// kubelet's `operation_type` for it (`run_podsandbox`).
    pub fn record_runtime_operation(&self, call: &str, took: Duration, failed: bool) {
        let op = Operation {
            operation_type: runtime_operation_type(call),
        };
        self.runtime_operations.get_or_create(&op).inc();
        self.runtime_operations_duration
            .get_or_create(&op)
            .observe(took.as_secs_f64());
        if failed {
            self.runtime_operations_errors.get_or_create(&op).inc();
        }
    }

    /// Records one pod worker sync of `operation_type` (`create`, `update` or `sync`).
    pub fn record_pod_worker(&self, operation_type: &str, took: Duration) {
        self.pod_worker_duration
            .get_or_create(&Operation {
                operation_type: operation_type.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Notes a pod worker pass over pod `uid`; true the first time the pod is
    /// seen (the kubelet's `create` operation), false after (`sync`).
    pub fn pod_seen(&self, uid: &str) -> bool {
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let new = !seen.contains_key(uid);
        seen.entry(uid.to_string())
            .or_insert_with(|| (Instant::now(), false));
        new
    }

    /// Pod `uid` was seen running: the first time, its time since
    /// [`pod_seen`](Self::pod_seen) goes into `kubelet_pod_start_duration_seconds`.
    pub fn pod_running(&self, uid: &str) {
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((since, recorded)) = seen.get_mut(uid)
            && !*recorded
        {
            *recorded = true;
            self.pod_start_duration
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// Pod `uid` is gone from this node: forget it.
    pub fn pod_gone(&self, uid: &str) {
        self.first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    /// Counts one probe run of `labels.probe_type` with `labels.result`.
    pub fn record_probe(&self, labels: ProbeLabels) {
        self.probe_total.get_or_create(&labels).inc();
        self.probe_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(labels.pod_uid.clone())
            .or_default()
            .insert(labels);
    }

    /// Drops the probe series of the pod with `uid` (its probes stopped).
    pub fn forget_probes(&self, uid: &str) {
        let series = self
            .probe_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid)
            .unwrap_or_default();
        for labels in &series {
            self.probe_total.remove(labels);
        }
    }

    /// A probe worker for the series of `worker` (its `result` not looked
    /// at) starts.
    pub fn probe_worker_started(&self, worker: &ProbeLabels) {
        let key = ProbeLabels {
            result: String::new(),
            ..worker.clone()
        };
        let mut workers = self
            .probe_workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = workers.entry(key).or_default();
        *n = n.saturating_add(1);
    }

    /// A probe worker for the series of `worker` stopped: when it was the
    /// last one (the container did not just restart under a new worker),
    /// its series go ([`Metrics::forget_probe`]), as the kubelet's worker
    /// deletes its metrics when it stops.
    pub fn probe_worker_stopped(&self, worker: &ProbeLabels) {
        let key = ProbeLabels {
            result: String::new(),
            ..worker.clone()
        };
        let last = {
            let mut workers = self
                .probe_workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match workers.get_mut(&key) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    workers.remove(&key);
                    true
                }
            }
        };
        if last {
            self.forget_probe(worker);
        }
    }

    /// Drops the series of one probe worker: every result of
    /// `worker.probe_type` for its container and pod (`worker.result` is not
    /// looked at), as the kubelet's probe worker deletes its metrics when it
    /// stops.
    pub fn forget_probe(&self, worker: &ProbeLabels) {
        let same = |l: &ProbeLabels| {
            l.probe_type == worker.probe_type
                && l.container == worker.container
                && l.pod == worker.pod
                && l.namespace == worker.namespace
        };
        let mut series = self
            .probe_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(of_pod) = series.get_mut(&worker.pod_uid) else {
            return;
        };
        of_pod.retain(|l| {
            if same(l) {
                self.probe_total.remove(l);
                false
            } else {
                true
            }
        });
        if of_pod.is_empty() {
            series.remove(&worker.pod_uid);
        }
    }

    /// Forgets every pod whose UID `keep` rejects: its start timing and its
    /// probe series (the pods no longer bound to this node).
    pub fn retain_pods(&self, keep: impl Fn(&str) -> bool) {
        self.first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid, _| keep(uid));
        let gone: Vec<String> = self
            .probe_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .filter(|uid| !keep(uid))
            .cloned()
            .collect();
        for uid in gone {
            self.forget_probes(&uid);
        }
    }

    /// Whether pod `uid` has probe series or a start being timed.
    #[must_use]
    pub fn tracks_pod(&self, uid: &str) -> bool {
        self.probe_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(uid)
            || self
                .first_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(uid)
    }

    /// `/metrics/probes` in the Prometheus text format.
    ///
    /// # Errors
    /// Only if formatting fails, which writing to a `String` does not.
    pub fn encode_probes(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.probes_registry)?;
        Ok(out)
    }

    /// Sets the running pod and container gauges from a runtime listing:
    /// `pods` with a ready sandbox, and the containers' CRI states (lower case).
    pub fn set_running(&self, pods: usize, containers: &[(String, usize)]) {
        self.running_pods
            .set(i64::try_from(pods).unwrap_or(i64::MAX));
        for state in ["created", "running", "exited", "unknown"] {
            let n = containers
                .iter()
                .find(|(s, _)| s == state)
                .map_or(0, |(_, n)| *n);
            self.running_containers
                .get_or_create(&ContainerState {
                    container_state: state.to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the pod census gauges (`kubelet_working_pods`,
    /// `kubelet_desired_pods`, `kubelet_active_pods`, `kubelet_mirror_pods`),
    /// every label combination the kubelet reports, 0 where `counts` has none.
    pub fn set_pod_counts(&self, counts: &PodCounts) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for lifecycle in LIFECYCLES {
            for (config, stat) in WORKING_CONFIGS {
                let n = counts
                    .working
                    .get(&(lifecycle, config, stat))
                    .copied()
                    .unwrap_or(0);
                self.working_pods
                    .get_or_create(&WorkingLabels {
                        lifecycle: lifecycle.to_string(),
                        config: config.to_string(),
                        r#static: stat.to_string(),
                    })
                    .set(gauge(n));
            }
        }
        for (family, (regular, stat)) in [
            (&self.desired_pods, counts.desired),
            (&self.active_pods, counts.active),
        ] {
            for (label, n) in [("", regular), ("true", stat)] {
                family
                    .get_or_create(&StaticLabel {
                        r#static: label.to_string(),
                    })
                    .set(gauge(n));
            }
        }
        self.mirror_pods.set(gauge(counts.mirrors));
    }

    /// The whole registry in the Prometheus text format (version 0.0.4 compatible
    /// OpenMetrics text, ending in `# EOF`).
    ///
    /// # Errors
    /// Only if formatting fails, which writing to a `String` does not.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)?;
        encode_registry(&mut out, &self.unprefixed)?;
        encode_eof(&mut out)?;
        Ok(out)
    }
}

/// The kubelet's `operation_type` for a CRI method name, as its instrumented
/// runtime service labels them: `RunPodSandbox` → `run_podsandbox`,
/// `ListContainers` → `list_containers`, `ExecSync` → `exec_sync`.
#[must_use]
pub fn runtime_operation_type(call: &str) -> String {
    let mut out = String::with_capacity(call.len() + 4);
    for (i, ch) in call.char_indices() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    // The kubelet writes "podsandbox" as one word.
    out.replace("pod_sandbox", "podsandbox")
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_types_are_the_kubelets() {
        for (call, want) in [
            ("RunPodSandbox", "run_podsandbox"),
            ("StopPodSandbox", "stop_podsandbox"),
            ("PodSandboxStatus", "podsandbox_status"),
            ("ListPodSandbox", "list_podsandbox"),
            ("CreateContainer", "create_container"),
            ("ListContainers", "list_containers"),
            ("ExecSync", "exec_sync"),
            ("PullImage", "pull_image"),
            ("Version", "version"),
        ] {
            assert_eq!(runtime_operation_type(call), want, "{call}");
        }
    }

    #[test]
    fn a_probe_series_goes_with_its_last_worker_and_a_pod_with_its_uid() {
        let m = Metrics::new();
        let labels = |kind: &str, result: &str, uid: &str| ProbeLabels {
            probe_type: kind.into(),
            result: result.into(),
            container: "c".into(),
            pod: "p".into(),
            namespace: "ns".into(),
            pod_uid: uid.into(),
        };
        let count = |m: &Metrics| {
            m.encode_probes()
                .expect("encode")
                .lines()
                .filter(|l| l.starts_with("prober_probe_total{"))
                .count()
        };
        // A container restarted: its new worker starts before the old stops.
        m.probe_worker_started(&labels("Liveness", "", "u1"));
        m.record_probe(labels("Liveness", "successful", "u1"));
        m.record_probe(labels("Liveness", "failed", "u1"));
        m.probe_worker_started(&labels("Liveness", "", "u1"));
        m.record_probe(labels("Readiness", "successful", "u1"));
        m.probe_worker_stopped(&labels("Liveness", "", "u1"));
        assert_eq!(count(&m), 3, "the series stay with the new worker");
        m.probe_worker_stopped(&labels("Liveness", "", "u1"));
        assert_eq!(count(&m), 1, "both results of the last liveness worker go");
        assert!(m.tracks_pod("u1"));
        // A pod gone: everything of it, its start timing too.
        m.pod_seen("u1");
        m.record_probe(labels("Startup", "successful", "u2"));
        m.retain_pods(|uid| uid == "u2");
        assert!(!m.tracks_pod("u1"));
        assert!(m.tracks_pod("u2"));
        assert_eq!(count(&m), 1);
    }

    #[test]
    fn encodes_kubelet_names_and_buckets() {
        let m = Metrics::new();
        m.record_runtime_operation("CreateContainer", Duration::from_millis(30), false);
        m.record_runtime_operation("CreateContainer", Duration::from_millis(30), true);
        m.record_pod_worker("sync", Duration::from_millis(200));
        assert!(m.pod_seen("u1"));
        assert!(!m.pod_seen("u1"));
        m.pod_running("u1");
        m.pod_running("u1");
        m.set_running(3, &[("running".into(), 4), ("exited".into(), 1)]);
        let text = m.encode().expect("encode");
        let probe = |result: &str| ProbeLabels {
            probe_type: "Readiness".into(),
            result: result.into(),
            container: "c".into(),
            pod: "p".into(),
            namespace: "ns".into(),
            pod_uid: "u1".into(),
        };
        m.record_probe(probe("successful"));
        m.record_probe(probe("successful"));
        m.record_probe(probe("failed"));
        let probes = m.encode_probes().expect("encode probes");
        assert!(
            probes.contains("prober_probe_total{probe_type=\"Readiness\",result=\"successful\",container=\"c\",pod=\"p\",namespace=\"ns\",pod_uid=\"u1\"} 2"),
            "{probes}"
        );
        m.forget_probes("u1");
        assert!(
            !m.encode_probes()
                .expect("encode")
                .contains("pod_uid=\"u1\"")
        );
        for want in [
            "kubelet_runtime_operations_total{operation_type=\"create_container\"} 2",
            "kubelet_runtime_operations_errors_total{operation_type=\"create_container\"} 1",
            "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.03125\",operation_type=\"create_container\"} 2",
            "kubelet_pod_worker_duration_seconds_count{operation_type=\"sync\"} 1",
            "kubelet_pod_start_duration_seconds_count 1",
            "kubelet_pod_start_duration_seconds_bucket{le=\"0.5\"} 1",
            "kubelet_running_pods 3",
            "kubelet_running_containers{container_state=\"running\"} 4",
            "kubelet_running_containers{container_state=\"created\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn the_pod_census_reports_every_series_the_kubelet_does() {
        let m = Metrics::new();
        let series = |m: &Metrics, name: &str| -> Vec<String> {
            m.encode()
                .expect("encode")
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))
                })
                .map(str::to_string)
                .collect()
        };
        // Before any housekeeping: the 15 + 2 + 2 + 1 series, all 0.
        let working = series(&m, "kubelet_working_pods");
        assert_eq!(working.len(), 15, "{working:#?}");
        assert!(working.iter().all(|l| l.ends_with(" 0")), "{working:#?}");
        assert_eq!(series(&m, "kubelet_desired_pods").len(), 2);
        assert_eq!(series(&m, "kubelet_active_pods").len(), 2);
        assert_eq!(series(&m, "kubelet_mirror_pods"), ["kubelet_mirror_pods 0"]);

        // A static pod being stopped after its manifest went, its mirror pod
        // still there, and one regular pod running.
        let counts = PodCounts {
            working: HashMap::from([
                (("terminating", "orphan", "true"), 1),
                (("sync", "desired", ""), 1),
            ]),
            desired: (1, 0),
            active: (1, 0),
            mirrors: 1,
        };
        m.set_pod_counts(&counts);
        let text = m.encode().expect("encode");
        for want in [
            "kubelet_working_pods{lifecycle=\"terminating\",config=\"orphan\",static=\"true\"} 1",
            "kubelet_working_pods{lifecycle=\"sync\",config=\"desired\",static=\"\"} 1",
            "kubelet_working_pods{lifecycle=\"sync\",config=\"desired\",static=\"true\"} 0",
            "kubelet_working_pods{lifecycle=\"terminated\",config=\"runtime_only\",static=\"unknown\"} 0",
            "kubelet_desired_pods{static=\"\"} 1",
            "kubelet_desired_pods{static=\"true\"} 0",
            "kubelet_active_pods{static=\"\"} 1",
            "kubelet_mirror_pods 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // The next census replaces the last one: what it does not name is 0.
        m.set_pod_counts(&PodCounts::default());
        assert!(
            series(&m, "kubelet_working_pods")
                .iter()
                .all(|l| l.ends_with(" 0")),
            "{:#?}",
            series(&m, "kubelet_working_pods")
        );
    }
}
