//! What a container's environment is read from besides the pod: the
//! ConfigMaps and Secrets its `env` and `envFrom` name (one `GET` each; a node
//! may read only the objects its pods reference) and the cluster's Services
//! (the kubelet's service lister), as the kubelet's `makeEnvironmentVariables`
//! gathers them. The pure [`super::env`] builds the environment from them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use tracing::warn;

use super::env::{self, EnvSources};
use super::translate::pod_identity;

/// How long a container start waits for the first list of Services.
const SERVICES_SYNC_WAIT: Duration = Duration::from_secs(5);

/// Reads the objects containers' environments come from.
#[derive(Clone)]
pub struct SourceReader {
    /// The API client (the node's credentials).
    pub client: Client,
    /// The reflector store of the cluster's Services.
    pub services: Store<Service>,
    /// True once the Services were listed. Waited on instead of the store's
    /// readiness, which wakes only one of its waiters (concurrent container
    /// starts would time out).
    pub services_listed: tokio::sync::watch::Receiver<bool>,
}

impl SourceReader {
    /// The sources of container `c`'s environment. ConfigMaps and Secrets
    /// that are missing or unreadable are left out ([`env::environment`]
    /// reports them).
    ///
    /// # Errors
    /// The kubelet's message while Services were never listed.
    pub async fn read(&self, pod: &Pod, c: &Container) -> Result<EnvSources, String> {
        let mut sources = self.objects(pod, c).await;
        sources.services = self.service_env(pod).await?;
        Ok(sources)
    }

    /// The ConfigMaps and Secrets container `c`'s environment names.
    async fn objects(&self, pod: &Pod, c: &Container) -> EnvSources {
        let (ns, _, _) = pod_identity(pod);
        let (cm_names, secret_names) = env::referenced_sources(&[c]);
        let mut sources = EnvSources::default();
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
        for name in cm_names {
            match cms.get_opt(&name).await {
                Ok(Some(cm)) => {
                    let mut data = cm.data.unwrap_or_default();
                    for (k, v) in cm.binary_data.unwrap_or_default() {
                        data.insert(k, String::from_utf8_lossy(&v.0).into_owned());
                    }
                    sources.config_maps.insert(name, data);
                }
                Ok(None) => {}
                Err(e) => warn!(error = %e, configmap = name, "get configmap"),
            }
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        for name in secret_names {
            match secrets.get_opt(&name).await {
                Ok(Some(s)) => {
                    let mut data: BTreeMap<String, String> = s
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
                    data.extend(s.string_data.unwrap_or_default());
                    sources.secrets.insert(name, data.into());
                }
                Ok(None) => {}
                Err(e) => warn!(error = %e, secret = name, "get secret"),
            }
        }
        sources
    }

    /// The service environment variables of `pod` (none when the pod opted
    /// out with `enableServiceLinks: false`, except the `kubernetes`
    /// service's), as the kubelet's `getServiceEnvVarMap`.
    async fn service_env(&self, pod: &Pod) -> Result<BTreeMap<String, String>, String> {
        let ready = self.services.wait_until_ready();
        if tokio::time::timeout(SERVICES_SYNC_WAIT, ready)
            .await
            .is_err()
        {
            return Err(
                "services have not yet been read at least once, cannot construct envvars".into(),
            );
        }
        let (ns, _, _) = pod_identity(pod);
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let all = self.services.state();
        Ok(env::service_env(env::visible_services(
            all.iter().map(AsRef::as_ref),
            &ns,
            links,
        )))
    }
}
