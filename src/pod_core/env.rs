//! A container's environment and its `$(VAR)` references, as the kubelet's
//! `makeEnvironmentVariables` (kubelet_pods.go) and the forked Go `expansion`
//! package: `envFrom` sources, then `env` entries in order (values expanded
//! against what is defined so far, `valueFrom` resolved from the pod, its
//! resources, ConfigMaps and Secrets), then `command`/`args` expanded against
//! the result. Pure: the ConfigMaps and Secrets arrive as data.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::facts::{NodeContext, PodFacts, pod_identity};
use crate::expansion::{expand, expand_at_most};
use crate::redact::Redacted;

/// Most bytes a container's environment (`NAME=value` and a terminating NUL
/// per variable) and its expanded `command` and `args` (each with a NUL) may
/// take together: 6 MiB. Linux's `execve` refuses arguments and environment
/// that take more than three quarters of the kernel's default 8 MiB stack
/// (`_STK_LIM`), whatever the stack rlimit, so no container beyond it could
/// start its process; the cap
/// also keeps the CRI `CreateContainer` request below the 16 MiB gRPC message
/// limit of the kubelet's runtime client and of containerd, and bounds what
/// building one environment may allocate however large the ConfigMaps and
/// Secrets behind `envFrom`, or however often a value refers to another. The
/// kubelet has no such check: its runtime or the kernel fails the container
/// later, less clearly.
pub const MAX_ENVIRONMENT_BYTES: usize = 6 << 20;

/// The bytes `name` and `value` take in a process's environment.
fn entry_size(name: &str, value: &str) -> usize {
    name.len().saturating_add(value.len()).saturating_add(2)
}

/// The error of an environment that has grown past [`MAX_ENVIRONMENT_BYTES`].
fn too_large(container: &str, at: &str) -> EnvError {
    EnvError(format!(
        "the environment of container {container:?} takes more than {MAX_ENVIRONMENT_BYTES} bytes \
         with {at}: no process can be started with it"
    ))
}

/// A container's environment being built: variables in definition order, a
/// later definition replacing an earlier one in place, found by name in
/// constant time, with the running size checked against
/// [`MAX_ENVIRONMENT_BYTES`].
struct Env<'a> {
    container: &'a str,
    vars: Vec<(String, String)>,
    index: std::collections::HashMap<String, usize>,
    size: usize,
}

impl<'a> Env<'a> {
    fn new(container: &'a str) -> Self {
        Self {
            container,
            vars: Vec::new(),
            index: std::collections::HashMap::new(),
            size: 0,
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|i| self.vars[*i].1.as_str())
    }

    /// Room left for one more value of variable `name`.
    fn room(&self, name: &str) -> usize {
        let freed = self.get(name).map_or(0, |v| entry_size(name, v));
        MAX_ENVIRONMENT_BYTES
            .saturating_add(freed)
            .saturating_sub(self.size)
            .saturating_sub(entry_size(name, ""))
    }

    fn set(&mut self, name: String, value: String) -> Result<(), EnvError> {
        let added = entry_size(&name, &value);
        let size = match self.index.get(&name) {
            Some(i) => {
                let slot = &mut self.vars[*i];
                let size = self
                    .size
                    .saturating_sub(entry_size(&slot.0, &slot.1))
                    .saturating_add(added);
                slot.1 = value;
                size
            }
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name.clone(), value));
                self.size.saturating_add(added)
            }
        };
        self.size = size;
        if size > MAX_ENVIRONMENT_BYTES {
            return Err(too_large(self.container, &format!("variable {name:?}")));
        }
        Ok(())
    }
}

/// ConfigMaps and Secrets of the pod's namespace that its containers reference,
/// by name; a name that is absent was not found in the API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvSources {
    /// ConfigMap name → data.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Secret name → decoded data (never shown by `Debug`).
    pub secrets: BTreeMap<String, Redacted<BTreeMap<String, String>>>,
    /// The service environment variables the pod sees (from [`service_env`]).
    pub services: BTreeMap<String, String>,
    /// The env files `fileKeyRef`s name, by (volume name, path in the
    /// volume): the file's text, or why it could not be read. A volume that
    /// is not one of the pod's emptyDirs has no entry.
    pub files: BTreeMap<(String, String), Result<Redacted<String>, String>>,
}

/// The (volume name, path) of every `fileKeyRef` in `c`'s `env`, once each.
#[must_use]
pub fn file_key_refs(c: &Container) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value_from.as_ref()?.file_key_ref.as_ref())
        .map(|f| (f.volume_name.clone(), f.path.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The value of `key` in env file `text`, as the kubelet's `ParseEnv`
/// (`pkg/kubelet/util/env`): lines `NAME='value'`, the value single-quoted
/// and taken literally (it may span lines), a `#` comment after it allowed;
/// blank lines and lines starting with `#` skipped; leading blanks of a line
/// ignored; a blank between `=` and the value makes the value empty, as in
/// a shell. The first definition of `key` wins; lines after it are not read.
/// `None` when `key` is not defined.
///
/// # Errors
/// The kubelet's messages, with the line number: `missing '='`, `empty
/// variable name`, `whitespace before '=' is not allowed`, `value must be
/// enclosed in single quotes`, `unexpected content after closing quote`,
/// `unclosed single quote`.
pub fn parse_env_file(text: &str, key: &str) -> Result<Option<String>, String> {
    let invalid = |line: usize, why: &str| {
        format!("invalid environment variable format at line {line}: {why}")
    };
    // Lines as Go's bufio.ScanLines gives them: split at '\n', a trailing '\r' dropped.
    let mut lines = text
        .split_inclusive('\n')
        .map(|l| l.strip_suffix('\n').unwrap_or(l))
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .enumerate()
        .map(|(i, l)| (i.saturating_add(1), l));
    while let Some((n, line)) = lines.next() {
        let line = line.trim_start_matches([' ', '\t']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name_part, value_part)) = line.split_once('=') else {
            return Err(invalid(n, "missing '='"));
        };
        let name = name_part.trim_end_matches([' ', '\t']);
        if name.is_empty() {
            return Err(invalid(n, "empty variable name"));
        }
        if name != name_part {
            return Err(invalid(n, "whitespace before '=' is not allowed"));
        }
        let value = value_part.trim_start_matches([' ', '\t']);
        if value != value_part {
            if name == key {
                return Ok(Some(String::new()));
            }
            continue;
        }
        let Some(mut rest) = value.strip_prefix('\'') else {
            return Err(invalid(n, "value must be enclosed in single quotes"));
        };
        let (start, mut at) = (n, n);
        let mut found = String::new();
        loop {
            if let Some((inside, after)) = rest.split_once('\'') {
                found.push_str(inside);
                let after = after.trim_start_matches([' ', '\t']);
                if !after.is_empty() && !after.starts_with('#') {
                    return Err(invalid(at, "unexpected content after closing quote"));
                }
                if name == key {
                    return Ok(Some(found));
                }
                break;
            }
            found.push_str(rest);
            found.push('\n');
            let Some((n, next)) = lines.next() else {
                return Err(format!(
                    "invalid environment variable format starting at line {start}: unclosed single quote"
                ));
            };
            (at, rest) = (n, next);
        }
    }
    Ok(None)
}

/// The services whose variables a pod of namespace `ns` sees, as the kubelet's
/// `getServiceEnvVarMap`: those with a cluster IP in `ns` when `enableServiceLinks`
/// is true, and always the `kubernetes` service of `default`.
#[must_use]
pub fn visible_services<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    ns: &str,
    enable_service_links: bool,
) -> Vec<&'a Service> {
    let mut by_name: BTreeMap<String, &Service> = BTreeMap::new();
    for svc in services {
        let ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let name = svc.metadata.name.clone().unwrap_or_default();
        let svc_ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        if svc_ns == "default" && name == "kubernetes" {
            by_name.entry(name).or_insert(svc);
        } else if svc_ns == ns && enable_service_links {
            by_name.insert(name, svc);
        }
    }
    by_name.into_values().collect()
}

/// A service name as a variable prefix: upper case, `-` as `_` (`makeEnvVariableName`).
fn env_name(s: &str) -> String {
    s.to_uppercase().replace('-', "_")
}

/// The environment variables of `services`, as the kubelet's `envvars.FromServices`:
/// `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (first port),
/// `<NAME>_SERVICE_PORT_<PORT NAME>` for named ports, and the Docker link
/// variables `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`.
#[must_use]
pub fn service_env<'a>(
    services: impl IntoIterator<Item = &'a Service>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let ports = spec.ports.clone().unwrap_or_default();
        if ip.is_empty() || ip == "None" || ports.is_empty() {
            continue;
        }
        let prefix = env_name(svc.metadata.name.as_deref().unwrap_or_default());
        env.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        let port_var = format!("{prefix}_SERVICE_PORT");
        env.insert(port_var.clone(), ports[0].port.to_string());
        for p in &ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                env.insert(format!("{port_var}_{}", env_name(n)), p.port.to_string());
            }
        }
        let host_port = |port: i32| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        };
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let url = format!("{}://{}", proto.to_lowercase(), host_port(p.port));
            if i == 0 {
                env.insert(format!("{prefix}_PORT"), url.clone());
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            env.insert(format!("{pp}_PROTO"), proto.to_lowercase());
            env.insert(format!("{pp}_PORT"), p.port.to_string());
            env.insert(format!("{pp}_ADDR"), ip.clone());
            env.insert(pp, url);
        }
    }
    env
}

/// Why an environment could not be built: the container waits with
/// `CreateContainerConfigError` and this message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// The names of the ConfigMaps and Secrets the containers' environments read
/// (`env[].valueFrom` and `envFrom[]`), for fetching before the sync.
#[must_use]
pub fn referenced_sources(containers: &[&Container]) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                cms.extend(from.config_map_key_ref.as_ref().map(|r| r.name.clone()));
                secrets.extend(from.secret_key_ref.as_ref().map(|r| r.name.clone()));
            }
        }
        for f in c.env_from.iter().flatten() {
            cms.extend(f.config_map_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(f.secret_ref.as_ref().map(|r| r.name.clone()));
        }
    }
    for v in [&mut cms, &mut secrets] {
        v.sort();
        v.dedup();
    }
    (cms, secrets)
}

fn field_ref(pod: &Pod, path: &str, node: &NodeContext, facts: &PodFacts) -> Option<String> {
    let (ns, name, uid) = pod_identity(pod);
    let spec = pod.spec.as_ref();
    let keyed = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|k| k.strip_prefix("['").and_then(|k| k.strip_suffix("']")))
            .map(|k| {
                map.as_ref()
                    .and_then(|m| m.get(k).cloned())
                    .unwrap_or_default()
            })
    };
    Some(match path {
        "metadata.name" => name,
        "metadata.namespace" => ns,
        "metadata.uid" => uid,
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| node.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => facts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => facts.pod_ips.join(","),
        "status.hostIP" => facts.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => facts.host_ips.join(","),
        p if p.starts_with("metadata.labels") => keyed(&pod.metadata.labels, "metadata.labels")?,
        p if p.starts_with("metadata.annotations") => {
            keyed(&pod.metadata.annotations, "metadata.annotations")?
        }
        _ => return None,
    })
}

/// The value of a `resourceFieldRef` (`limits.cpu`, `requests.memory`, …) of
/// `container`, as [`crate::resource::container_resource_value`] with the
/// node's allocatable resources for unset limits.
///
/// # Errors
/// An unknown resource or container name, or a bad quantity.
pub fn resource_field(
    pod: &Pod,
    container: &str,
    resource: &str,
    divisor: Option<&Quantity>,
    node: &NodeContext,
) -> Result<String, EnvError> {
    crate::resource::container_resource_value(pod, container, resource, divisor, &node.allocatable)
        .map_err(|e| EnvError(format!("resourceFieldRef: {e}")))
}

/// True for a valid environment variable name (C identifier-like, as the
/// API's `IsEnvVarName`: letters, digits, `_`, `-`, `.`, not starting with a digit).
#[must_use]
pub fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The container's environment, in definition order (a later definition of a
/// name replaces the earlier value in place), then the service variables of
/// [`EnvSources::services`] the container does not define (values may refer to
/// those too, as the kubelet's `MappingFuncFor(tmpEnv, serviceEnv)`).
///
/// # Errors
/// A non-optional ConfigMap/Secret or key that is missing, or a bad field path,
/// with the kubelet's messages (e.g. `configmap "x" not found`); an
/// environment, command and args that take more than
/// [`MAX_ENVIRONMENT_BYTES`] once expanded, naming the variable that crossed it.
pub fn environment(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
    facts: &PodFacts,
    sources: &EnvSources,
) -> Result<Vec<(String, String)>, EnvError> {
    let (ns, _, _) = pod_identity(pod);
    let mut env = Env::new(&c.name);
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (data, kind, name, optional) = if let Some(r) = &from.config_map_ref {
            (
                sources.config_maps.get(&r.name),
                "configmap",
                &r.name,
                r.optional.unwrap_or(false),
            )
        } else if let Some(r) = &from.secret_ref {
            (
                sources.secrets.get(&r.name).map(|d| d.expose()),
                "secret",
                &r.name,
                r.optional.unwrap_or(false),
            )
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    let key = format!("{prefix}{k}");
                    if is_env_var_name(&key) {
                        env.set(key, v.clone())?;
                    }
                }
            }
            None if optional => {}
            None => return Err(EnvError(format!("{kind} \"{name}\" not found"))),
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(from) = &e.value_from {
            if let Some(f) = &from.field_ref {
                field_ref(pod, &f.field_path, node, facts)
                    .ok_or_else(|| EnvError(format!("unsupported fieldPath {:?}", f.field_path)))?
            } else if let Some(r) = &from.resource_field_ref {
                let container = r
                    .container_name
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&c.name);
                resource_field(pod, container, &r.resource, r.divisor.as_ref(), node)?
            } else if let Some(r) = &from.config_map_key_ref {
                match sources.config_maps.get(&r.name).map(|d| d.get(&r.key)) {
                    Some(Some(v)) => v.clone(),
                    _ if r.optional.unwrap_or(false) => continue,
                    Some(None) => {
                        return Err(EnvError(format!(
                            "couldn't find key {} in ConfigMap {ns}/{}",
                            r.key, r.name
                        )));
                    }
                    None => return Err(EnvError(format!("configmap \"{}\" not found", r.name))),
                }
            } else if let Some(r) = &from.file_key_ref {
                let at = (r.volume_name.clone(), r.path.clone());
                let text = match sources.files.get(&at) {
                    Some(Ok(text)) => text,
                    Some(Err(e)) => {
                        return Err(EnvError(format!("couldn't parse env file: {e}")));
                    }
                    None => {
                        return Err(EnvError(format!(
                            "cannot find the volume {:?} referenced by FileKeyRef",
                            r.volume_name
                        )));
                    }
                };
                let value = parse_env_file(text.expose(), &r.key)
                    .map_err(|e| EnvError(format!("couldn't parse env file {:?}: {e}", r.path)))?;
                // As the kubelet: an empty value counts as a missing key.
                match value.filter(|v| !v.is_empty()) {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(EnvError(format!(
                            "environment variable key {:?} not found in file {:?}",
                            r.key, r.path
                        )));
                    }
                }
            } else if let Some(r) = &from.secret_key_ref {
                match sources.secrets.get(&r.name).map(|d| d.get(&r.key)) {
                    Some(Some(v)) => v.clone(),
                    _ if r.optional.unwrap_or(false) => continue,
                    Some(None) => {
                        return Err(EnvError(format!(
                            "couldn't find key {} in Secret {ns}/{}",
                            r.key, r.name
                        )));
                    }
                    None => return Err(EnvError(format!("secret \"{}\" not found", r.name))),
                }
            } else {
                String::new()
            }
        } else {
            let raw = e.value.as_deref().unwrap_or_default();
            let lookup = |name: &str| {
                env.get(name)
                    .or_else(|| sources.services.get(name).map(String::as_str))
                    .map(str::to_string)
            };
            expand_at_most(raw, lookup, env.room(&e.name))
                .ok_or_else(|| too_large(&c.name, &format!("variable {:?}", e.name)))?
        };
        env.set(e.name.clone(), value)?;
    }
    // Service variables come last, unless the container defines the name itself.
    for (k, v) in &sources.services {
        if env.get(k).is_none() {
            env.set(k.clone(), v.clone())?;
        }
    }
    // The command and arguments share the limit with the environment.
    let mut left = MAX_ENVIRONMENT_BYTES.saturating_sub(env.size);
    for arg in c.command.iter().flatten().chain(c.args.iter().flatten()) {
        let lookup = |name: &str| env.get(name).map(str::to_string);
        let expanded = expand_at_most(arg, lookup, left.saturating_sub(1))
            .ok_or_else(|| too_large(&c.name, "its command and arguments"))?;
        left = left.saturating_sub(expanded.len().saturating_add(1));
    }
    Ok(env.vars)
}

/// `command` and `args` with `$(VAR)` expanded against the final environment,
/// as the kubelet's `ExpandContainerCommandAndArgs`.
#[must_use]
pub fn command_and_args(c: &Container, env: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let all = |v: &Option<Vec<String>>| v.iter().flatten().map(|s| expand(s, lookup)).collect();
    (all(&c.command), all(&c.args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
        ResourceRequirements,
    };

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn build(c: &Container, sources: &EnvSources) -> Result<Vec<(String, String)>, EnvError> {
        let p = pod("web").container("c", "busybox").build();
        environment(
            &p,
            c,
            &NodeContext::default(),
            &PodFacts::default(),
            sources,
        )
    }

    fn container(env: Vec<EnvVar>, env_from: Vec<EnvFromSource>) -> Container {
        Container {
            name: "c".into(),
            env: Some(env),
            env_from: Some(env_from),
            ..Default::default()
        }
    }

    fn from_cm(name: &str, prefix: &str) -> EnvFromSource {
        EnvFromSource {
            prefix: Some(prefix.into()),
            config_map_ref: Some(ConfigMapEnvSource {
                name: name.into(),
                optional: None,
            }),
            secret_ref: None,
        }
    }

    #[test]
    fn references_that_double_a_value_are_refused_within_the_cap() {
        // V40 would be 2^40 bytes; V0 to V21 take 4 MiB, V22 as much again.
        let mut vars = vec![var("V0", "x")];
        for i in 1..=40 {
            vars.push(var(&format!("V{i}"), &format!("$(V{0})$(V{0})", i - 1)));
        }
        let err = build(&container(vars, vec![]), &EnvSources::default()).unwrap_err();
        assert_eq!(
            err.0,
            format!(
                "the environment of container \"c\" takes more than {MAX_ENVIRONMENT_BYTES} \
                 bytes with variable \"V22\": no process can be started with it"
            )
        );
    }

    #[test]
    fn a_large_config_map_used_many_times_is_refused_at_the_cap() {
        // 1 MiB, the most the API stores in one object, under 100 prefixes.
        let big = BTreeMap::from([("K".to_string(), "v".repeat(1 << 20))]);
        let sources = EnvSources {
            config_maps: BTreeMap::from([("big".to_string(), big)]),
            ..Default::default()
        };
        let from = (0..100)
            .map(|i| from_cm("big", &format!("P{i}_")))
            .collect();
        let err = build(&container(vec![], from), &sources).unwrap_err();
        assert!(err.0.contains("variable \"P5_K\""), "{}", err.0);
        // Five times is 5 MiB: allowed.
        let from = (0..5).map(|i| from_cm("big", &format!("P{i}_"))).collect();
        assert_eq!(build(&container(vec![], from), &sources).unwrap().len(), 5);
    }

    #[test]
    fn the_command_and_arguments_share_the_cap() {
        let mut c = container(vec![var("A", &"a".repeat(1 << 20))], vec![]);
        c.args = Some(vec!["$(A)".into(); 4]);
        assert!(
            build(&c, &EnvSources::default()).is_ok(),
            "5 MiB and a little"
        );
        c.args = Some(vec!["$(A)".into(); 5]);
        let err = build(&c, &EnvSources::default()).unwrap_err();
        assert!(
            err.0.contains("with its command and arguments"),
            "{}",
            err.0
        );
        c.args = None;
        c.command = Some(vec!["$(A)$(A)$(A)$(A)$(A)$(A)".into()]);
        assert!(build(&c, &EnvSources::default()).is_err());
    }

    #[test]
    fn many_keys_are_set_in_linear_time() {
        // 200,000 variables from one config map, then as many redefinitions.
        let data: BTreeMap<String, String> = (0..200_000)
            .map(|i| (format!("K{i}"), String::new()))
            .collect();
        let sources = EnvSources {
            config_maps: BTreeMap::from([("many".to_string(), data)]),
            ..Default::default()
        };
        let c = container(vec![], vec![from_cm("many", ""), from_cm("many", "")]);
        let started = std::time::Instant::now();
        assert_eq!(build(&c, &sources).unwrap().len(), 200_000);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn env_files_parse_as_the_kubelets_parse_env() {
        let text = "# comment\n\n  A='one'\nB='two' # trailing\nM='line1\nline2'\nE= 'ignored'\nQ=''\nR='x\r\ny'\r\n";
        let get = |k: &str| parse_env_file(text, k);
        assert_eq!(get("A"), Ok(Some("one".into())), "leading blanks skipped");
        assert_eq!(get("B"), Ok(Some("two".into())), "comment after the quote");
        assert_eq!(get("M"), Ok(Some("line1\nline2".into())), "spans lines");
        assert_eq!(get("E"), Ok(Some(String::new())), "blank after '='");
        assert_eq!(get("Q"), Ok(Some(String::new())));
        assert_eq!(get("R"), Ok(Some("x\ny".into())), "CRLF as LF");
        assert_eq!(get("NONE"), Ok(None));
        assert_eq!(
            parse_env_file("A='1'\nA='2'\n", "A"),
            Ok(Some("1".into())),
            "the first wins"
        );
        assert_eq!(
            parse_env_file("A='1'\nnot a line\n", "A"),
            Ok(Some("1".into())),
            "lines after the key are not read"
        );
        let err = |text: &str| parse_env_file(text, "Z").unwrap_err();
        assert_eq!(
            err("A='1'\nnonsense\n"),
            "invalid environment variable format at line 2: missing '='"
        );
        assert!(err("='x'").ends_with("line 1: empty variable name"));
        assert!(err("A ='x'").ends_with("line 1: whitespace before '=' is not allowed"));
        assert!(err("A=x").ends_with("line 1: value must be enclosed in single quotes"));
        assert!(err("A=\"x\"").ends_with("value must be enclosed in single quotes"));
        assert!(err("A='x'y").ends_with("line 1: unexpected content after closing quote"));
        assert!(err("\nA='a\nb'c").ends_with("line 3: unexpected content after closing quote"));
        assert_eq!(
            err("\nA='never closed\nB=x"),
            "invalid environment variable format starting at line 2: unclosed single quote"
        );
        assert_eq!(parse_env_file("", "A"), Ok(None));
    }

    #[test]
    fn file_key_refs_read_the_files_given_with_the_kubelets_errors() {
        use k8s_openapi::api::core::v1::FileKeySelector;
        let file = |name: &str, key: &str, volume: &str, optional: Option<bool>| EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                file_key_ref: Some(FileKeySelector {
                    volume_name: volume.into(),
                    path: "config.env".into(),
                    key: key.into(),
                    optional,
                }),
                ..Default::default()
            }),
        };
        let at = |volume: &str| (volume.to_string(), "config.env".to_string());
        let sources = EnvSources {
            files: BTreeMap::from([
                (
                    at("data"),
                    Ok(Redacted::new("CONFIG_1='value1'\nEMPTY=''\n".to_string())),
                ),
                (
                    at("broken"),
                    Ok(Redacted::new("CONFIG_1=value1\n".to_string())),
                ),
                (
                    at("gone"),
                    Err("open \"config.env\": No such file".to_string()),
                ),
            ]),
            ..Default::default()
        };
        let c = container(
            vec![
                file("ONE", "CONFIG_1", "data", None),
                file("MISSING", "CONFIG_2", "data", Some(true)),
                var("DERIVED", "$(ONE)!"),
            ],
            vec![],
        );
        assert_eq!(
            file_key_refs(&c),
            vec![at("data")],
            "each file once, for reading"
        );
        let env = build(&c, &sources).unwrap();
        assert_eq!(
            env,
            vec![
                ("ONE".to_string(), "value1".to_string()),
                ("DERIVED".to_string(), "value1!".to_string())
            ],
            "an optional key that is missing is left out"
        );
        let fails = |var: EnvVar| {
            build(&container(vec![var], vec![]), &sources)
                .unwrap_err()
                .0
        };
        assert_eq!(
            fails(file("X", "CONFIG_2", "data", None)),
            "environment variable key \"CONFIG_2\" not found in file \"config.env\""
        );
        assert_eq!(
            fails(file("X", "EMPTY", "data", Some(false))),
            "environment variable key \"EMPTY\" not found in file \"config.env\"",
            "as the kubelet, an empty value is a missing key"
        );
        assert_eq!(
            fails(file("X", "CONFIG_1", "nope", Some(true))),
            "cannot find the volume \"nope\" referenced by FileKeyRef",
            "optional covers the key, not the volume"
        );
        assert!(
            fails(file("X", "CONFIG_1", "broken", Some(true)))
                .starts_with("couldn't parse env file \"config.env\": invalid environment variable format at line 1")
        );
        assert_eq!(
            fails(file("X", "CONFIG_1", "gone", Some(true))),
            "couldn't parse env file: open \"config.env\": No such file"
        );
        let printed = format!("{sources:?}");
        assert!(!printed.contains("value1"), "{printed}");
    }

    #[test]
    fn secret_data_never_shows_in_a_debug_print() {
        let sources = EnvSources {
            secrets: BTreeMap::from([(
                "db".to_string(),
                BTreeMap::from([("password".to_string(), "secret-value".to_string())]).into(),
            )]),
            ..Default::default()
        };
        let printed = format!("{sources:?} {sources:#?}");
        assert!(
            printed.contains("db") && !printed.contains("secret-value"),
            "{printed}"
        );
    }

    #[test]
    fn env_values_see_earlier_values_and_sources() {
        let mut p = pod("web").container("c", "busybox").build();
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.env_from = Some(vec![EnvFromSource {
            prefix: Some("CM_".into()),
            config_map_ref: Some(ConfigMapEnvSource {
                name: "cfg".into(),
                optional: None,
            }),
            secret_ref: None,
        }]);
        c.env = Some(vec![
            var("FIRST", "one"),
            var("SECOND", "$(FIRST)-two-$(CM_k)"),
            var("LATER", "$(THIRD)"),
            var("THIRD", "three"),
            EnvVar {
                name: "KEY".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: "cfg".into(),
                        key: "k".into(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
            },
        ]);
        c.command = Some(vec!["echo".into(), "$(SECOND)".into(), "$$(SECOND)".into()]);
        let c = c.clone();
        let sources = EnvSources {
            config_maps: BTreeMap::from([(
                "cfg".to_string(),
                BTreeMap::from([
                    ("k".to_string(), "v".to_string()),
                    ("1bad".to_string(), "x".to_string()),
                ]),
            )]),
            ..Default::default()
        };
        let env = environment(
            &p,
            &c,
            &NodeContext::default(),
            &PodFacts::default(),
            &sources,
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SECOND"), Some("one-two-v"));
        assert_eq!(
            get("LATER"),
            Some("$(THIRD)"),
            "only earlier definitions expand"
        );
        assert_eq!(get("KEY"), Some("v"));
        assert_eq!(get("CM_1bad"), Some("x"), "a prefix can make a key valid");
        let (command, _) = command_and_args(&c, &env);
        assert_eq!(command, vec!["echo", "one-two-v", "$(SECOND)"]);

        let missing = environment(
            &p,
            &c,
            &NodeContext::default(),
            &PodFacts::default(),
            &EnvSources::default(),
        );
        assert_eq!(missing, Err(EnvError("configmap \"cfg\" not found".into())));
    }

    #[test]
    fn resource_fields_round_up_and_default_to_allocatable() {
        let mut p = pod("web").container("c", "busybox").build();
        let q = |s: &str| Quantity(s.into());
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([("memory".to_string(), q("64Mi"))])),
            requests: Some(BTreeMap::from([("cpu".to_string(), q("250m"))])),
            ..Default::default()
        });
        let node = NodeContext {
            allocatable: BTreeMap::from([
                ("cpu".to_string(), q("2")),
                ("memory".to_string(), q("1Gi")),
            ]),
            ..Default::default()
        };
        let f = |res: &str, div: Option<&str>| {
            resource_field(&p, "c", res, div.map(q).as_ref(), &node).unwrap()
        };
        assert_eq!(f("limits.memory", None), "67108864");
        assert_eq!(f("limits.memory", Some("1Mi")), "64");
        assert_eq!(f("requests.cpu", None), "1", "250m rounds up to one core");
        assert_eq!(f("requests.cpu", Some("1m")), "250");
        assert_eq!(f("limits.cpu", None), "2", "unset limit: node allocatable");
    }

    fn service(
        ns: &str,
        name: &str,
        ip: &str,
        ports: &[(Option<&str>, i32, Option<&str>)],
    ) -> Service {
        use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
        Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, port, proto)| ServicePort {
                            name: n.map(str::to_string),
                            port: *port,
                            protocol: proto.map(str::to_string),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn service_env_table() {
        let fooservice = service("ns1", "fooservice", "10.0.0.11", &[(None, 8765, None)]);
        let want: BTreeMap<String, String> = [
            ("FOOSERVICE_SERVICE_HOST", "10.0.0.11"),
            ("FOOSERVICE_SERVICE_PORT", "8765"),
            ("FOOSERVICE_PORT", "tcp://10.0.0.11:8765"),
            ("FOOSERVICE_PORT_8765_TCP", "tcp://10.0.0.11:8765"),
            ("FOOSERVICE_PORT_8765_TCP_PROTO", "tcp"),
            ("FOOSERVICE_PORT_8765_TCP_PORT", "8765"),
            ("FOOSERVICE_PORT_8765_TCP_ADDR", "10.0.0.11"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(service_env([&fooservice]), want);

        let multi = service(
            "ns1",
            "my-svc",
            "fd00::1",
            &[(Some("http"), 80, None), (Some("dns-udp"), 53, Some("UDP"))],
        );
        let env = service_env([&multi]);
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("MY_SVC_SERVICE_PORT"), Some("80"));
        assert_eq!(get("MY_SVC_SERVICE_PORT_HTTP"), Some("80"));
        assert_eq!(get("MY_SVC_SERVICE_PORT_DNS_UDP"), Some("53"));
        assert_eq!(get("MY_SVC_PORT"), Some("tcp://[fd00::1]:80"));
        assert_eq!(get("MY_SVC_PORT_53_UDP"), Some("udp://[fd00::1]:53"));
        assert_eq!(get("MY_SVC_PORT_53_UDP_PROTO"), Some("udp"));

        let headless = service("ns1", "headless", "None", &[(None, 80, None)]);
        assert!(service_env([&headless]).is_empty());
    }

    #[test]
    fn visible_services_table() {
        let all = [
            service(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, None)],
            ),
            service("ns1", "a", "10.0.0.2", &[(None, 80, None)]),
            service("ns2", "b", "10.0.0.3", &[(None, 80, None)]),
            service("ns1", "headless", "None", &[(None, 80, None)]),
            service("ns1", "kubernetes", "10.0.0.4", &[(None, 80, None)]),
        ];
        let names = |ns: &str, links: bool| {
            visible_services(&all, ns, links)
                .iter()
                .map(|s| {
                    format!(
                        "{}/{}",
                        s.metadata.namespace.as_deref().unwrap_or_default(),
                        s.metadata.name.as_deref().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names("ns1", true),
            vec!["ns1/a", "ns1/kubernetes"],
            "the namespace's own service wins"
        );
        assert_eq!(names("ns1", false), vec!["default/kubernetes"]);
        assert_eq!(names("ns2", true), vec!["ns2/b", "default/kubernetes"]);
    }

    #[test]
    fn service_variables_come_last_and_expand() {
        let mut p = pod("web").container("c", "busybox").build();
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.env = Some(vec![
            var("URL", "http://$(A_SERVICE_HOST):80"),
            var("A_SERVICE_PORT", "mine"),
        ]);
        let c = c.clone();
        let sources = EnvSources {
            services: BTreeMap::from([
                ("A_SERVICE_HOST".to_string(), "10.0.0.2".to_string()),
                ("A_SERVICE_PORT".to_string(), "80".to_string()),
            ]),
            ..Default::default()
        };
        let env = environment(
            &p,
            &c,
            &NodeContext::default(),
            &PodFacts::default(),
            &sources,
        )
        .unwrap();
        assert_eq!(
            env,
            vec![
                ("URL".to_string(), "http://10.0.0.2:80".to_string()),
                ("A_SERVICE_PORT".to_string(), "mine".to_string()),
                ("A_SERVICE_HOST".to_string(), "10.0.0.2".to_string()),
            ]
        );
    }

    #[test]
    fn env_var_names() {
        for ok in ["A", "a_b", "A.B-c", "_x"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1A", "a b", "a=b"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
