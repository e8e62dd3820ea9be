//! What a container's environment is read from besides the pod: the
//! ConfigMaps and Secrets its `env` and `envFrom` name (one `GET` each; a node
//! may read only the objects its pods reference) and the cluster's Services
//! (the kubelet's service lister), as the kubelet's `makeEnvironmentVariables`
//! gathers them. The pure [`crate::pod_core::env`] builds the environment from them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use tracing::warn;

use crate::pod_core::env::{self, EnvSources};
use crate::pod_core::facts::pod_identity;
use crate::redact::Redacted;

/// How long a container start waits for the first list of Services.
const SERVICES_SYNC_WAIT: Duration = Duration::from_secs(5);

/// Most bytes of an env file a `fileKeyRef` names: 1 MiB. The kubelet reads
/// any size (its line reader fails a line past 64 KiB); the container's
/// writable emptyDir is the pod's, so the node bounds what it loads.
pub const MAX_ENV_FILE_BYTES: u64 = 1 << 20;

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

    /// The env files container `c`'s `fileKeyRef`s name, read beneath
    /// their emptyDir volumes in `volumes` ([`crate::volume::subpath::read_beneath`],
    /// at most [`MAX_ENV_FILE_BYTES`]), as the kubelet's
    /// `makeEnvironmentVariables` reads them at each container start. A
    /// volume that is not one of the pod's emptyDirs is left out: the
    /// kubelet reads only emptyDirs (the API server refuses other kinds).
    pub async fn read_files(
        pod: &Pod,
        c: &Container,
        volumes: &crate::volume::mounts::PodVolumes,
    ) -> BTreeMap<(String, String), Result<Redacted<String>, String>> {
        let empty_dirs: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter(|v| v.empty_dir.is_some())
            .map(|v| v.name.as_str())
            .collect();
        let mut files = BTreeMap::new();
        for (volume, path) in env::file_key_refs(c) {
            let Some(mounted) = volumes
                .get(&volume)
                .filter(|_| empty_dirs.contains(&volume.as_str()))
            else {
                continue;
            };
            let (root, rel) = (mounted.host_path.clone(), path.clone());
            let read = tokio::task::spawn_blocking(move || {
                crate::volume::subpath::read_beneath(&root, "path", &rel, MAX_ENV_FILE_BYTES)
            })
            .await;
            let text = match read {
                Ok(Ok(bytes)) => Ok(Redacted::new(String::from_utf8_lossy(&bytes).into_owned())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("read {path:?}: {e}")),
            };
            files.insert((volume, path), text);
        }
        files
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
    /// service's), as the kubelet's `getServiceEnvVarMap`. A static pod
    /// does not wait for the services to be read (it may be the API server
    /// itself): it gets those known so far, as the kubelet's
    /// `makeEnvironmentVariables`.
    async fn service_env(&self, pod: &Pod) -> Result<BTreeMap<String, String>, String> {
        let mut listed = self.services_listed.clone();
        if !crate::pod_core::kind::PodKind::of(pod).is_static
            && !matches!(
                tokio::time::timeout(SERVICES_SYNC_WAIT, listed.wait_for(|l| *l)).await,
                Ok(Ok(_))
            )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader whose Services were listed or not, and the sender of that
    /// signal (kept: a closed channel would end the wait at once).
    fn reader(listed: bool) -> (SourceReader, tokio::sync::watch::Sender<bool>) {
        let (_, writer) = kube::runtime::reflector::store::<Service>();
        let (tx, services_listed) = tokio::sync::watch::channel(listed);
        let reader = SourceReader {
            client: Client::new(
                tower::service_fn(|_req: hyper::Request<kube::client::Body>| async {
                    Err::<hyper::Response<kube::client::Body>, _>(std::io::Error::other("no API"))
                }),
                "default",
            ),
            services: writer.as_reader(),
            services_listed,
        };
        (reader, tx)
    }

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        );
        pod
    }

    #[tokio::test]
    async fn a_static_pod_does_not_wait_for_the_services_and_an_api_pod_does() {
        let (r, _listed) = reader(false);
        let api_pod = pod(&[]);
        let waiting = tokio::spawn({
            let (r, api_pod) = (r.clone(), api_pod.clone());
            async move { r.service_env(&api_pod).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a pod from the API waits");
        waiting.abort();
        let static_pod = pod(&[("kubernetes.io/config.source", "file")]);
        assert!(
            crate::pod_core::kind::PodKind::of(&static_pod).is_static,
            "the annotation makes a static pod"
        );
        let env = tokio::time::timeout(Duration::from_millis(1), r.service_env(&static_pod))
            .await
            .expect("at once")
            .unwrap();
        assert!(env.is_empty(), "no services known yet");
        // Once listed, pods from the API go on (many at a time).
        let (r, _listed) = reader(true);
        let waits = (0..8).map(|_| r.service_env(&api_pod));
        for got in futures::future::join_all(waits).await {
            assert!(got.unwrap().is_empty());
        }
    }
}
