//! A fake API server behind a real `kube::Client`, for tests: it keeps Pods,
//! ConfigMaps, Secrets, claims and volumes, Nodes and CSINodes in memory,
//! answers the requests the pod worker and the plugin manager make as the
//! API server does (service account TokenRequests, merge patches of `pods/status` with the UID
//! precondition and of Nodes, deletes with preconditions, `get`s, CSINode
//! creates and replaces, Events, ConfigMap creates and merge patches, the
//! `approval` subresource of CertificateSigningRequests), and records each request so a test can
//! assert the exact API traffic. Anything else is answered 404 and recorded
//! as unexpected.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// One request the fake API server received.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The query, decoded (`fieldSelector=spec.nodeName=n`), empty without one.
    pub query: String,
    /// The JSON body (`null` without one).
    pub body: Value,
}

impl Seen {
    /// `"<METHOD> <path>"`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

#[derive(Default)]
struct State {
    /// Objects by (resource, namespace, name), as JSON.
    objects: BTreeMap<(String, String, String), Value>,
    requests: Vec<Seen>,
    revision: u64,
    /// TokenRequests still to be refused with 403 before tokens are issued.
    tokens_refused: u32,
    /// ResourceSlice deletions still to be refused with 401.
    slice_deletes_refused: u32,
}

/// The fake API server; cheap to clone.
#[derive(Clone, Default)]
pub struct FakeApi(Arc<Mutex<State>>);

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// RFC 7386 JSON merge patch of `patch` onto `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> (StatusCode, Value) {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, body)
}

impl FakeApi {
    /// A client whose every request this fake answers.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let query = parts.uri.query().unwrap_or_default();
                let query: String = form_urlencoded::parse(query.as_bytes())
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("&");
                let (code, out) = api.answer(&parts.method, parts.uri.path(), &query, body);
                let resp = Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(out.to_string())))
                    .unwrap_or_default();
                Ok::<_, Infallible>(resp)
            }
        });
        kube::Client::new(service, "default")
    }

    /// Stores `pod` (with the next resourceVersion); returns it as stored.
    pub fn put_pod(&self, mut pod: Pod) -> Pod {
        let mut st = lock(&self.0);
        st.revision += 1;
        pod.metadata.resource_version = Some(st.revision.to_string());
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let v = serde_json::to_value(&pod).unwrap_or_default();
        st.objects.insert(("pods".into(), ns, name), v);
        pod
    }

    /// Stores an object of `resource` (`configmaps`, `secrets`) in `default`.
    pub fn put(&self, resource: &str, name: &str, object: Value) {
        let key = (
            resource.to_string(),
            "default".to_string(),
            name.to_string(),
        );
        lock(&self.0).objects.insert(key, object);
    }

    /// Stores a cluster-scoped object of `resource` (`persistentvolumes`).
    pub fn put_cluster(&self, resource: &str, name: &str, object: Value) {
        let key = (resource.to_string(), String::new(), name.to_string());
        lock(&self.0).objects.insert(key, object);
    }

    /// The object `name` of `resource` in namespace `ns`.
    pub fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        lock(&self.0).objects.get(&key).cloned()
    }

    /// Replaces (or stores) the object `name` of `resource` in namespace `ns`.
    pub fn put_in(&self, resource: &str, ns: &str, name: &str, object: Value) {
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        lock(&self.0).objects.insert(key, object);
    }

    /// The cluster-scoped object `name` of `resource` (`nodes`, `csinodes`).
    pub fn cluster_object(&self, resource: &str, name: &str) -> Option<Value> {
        let key = (resource.to_string(), String::new(), name.to_string());
        lock(&self.0).objects.get(&key).cloned()
    }

    /// Stores Node `name`.
    pub fn put_node(&self, name: &str) {
        let node = json!({
            "kind": "Node", "apiVersion": "v1",
            "metadata": { "name": name, "uid": format!("node-uid-{name}") },
        });
        let key = ("nodes".to_string(), String::new(), name.to_string());
        lock(&self.0).objects.insert(key, node);
    }

    /// True while Node `name` is stored.
    pub fn has_node(&self, name: &str) -> bool {
        let key = ("nodes".to_string(), String::new(), name.to_string());
        lock(&self.0).objects.contains_key(&key)
    }

    /// Removes pod `name` of `default` (a deletion the agent did not make).
    pub fn remove_pod(&self, name: &str) {
        let key = ("pods".to_string(), "default".to_string(), name.to_string());
        lock(&self.0).objects.remove(&key);
    }

    /// Pod `name` of `default` as stored, if it exists.
    pub fn pod(&self, name: &str) -> Option<Pod> {
        let key = ("pods".to_string(), "default".to_string(), name.to_string());
        let st = lock(&self.0);
        st.objects
            .get(&key)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// Refuses the next `n` TokenRequests with 403, as the API server's Node
    /// authorizer does before it has seen the pod's binding.
    pub fn refuse_tokens(&self, n: u32) {
        lock(&self.0).tokens_refused = n;
    }

    /// Refuses the next `n` deletions of ResourceSlices with 401, as the API
    /// server does while the node's credentials are not yet known.
    pub fn refuse_slice_deletes(&self, n: u32) {
        lock(&self.0).slice_deletes_refused = n;
    }

    /// Every request but Event writes, in order, drained.
    pub fn take_requests(&self) -> Vec<Seen> {
        let mut st = lock(&self.0);
        let all = std::mem::take(&mut st.requests);
        let (events, rest): (Vec<Seen>, Vec<Seen>) =
            all.into_iter().partition(|s| s.path.contains("/events"));
        st.requests = events;
        rest
    }

    /// The Events written so far, as `(reason, message)`.
    pub fn events(&self) -> Vec<(String, String)> {
        let st = lock(&self.0);
        st.objects
            .iter()
            .filter(|((r, _, _), _)| r == "events")
            .map(|(_, v)| {
                let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                (s("reason"), s("message"))
            })
            .collect()
    }

    fn answer(&self, method: &Method, path: &str, query: &str, body: Value) -> (StatusCode, Value) {
        let mut st = lock(&self.0);
        st.requests.push(Seen {
            method: method.to_string(),
            path: path.to_string(),
            query: query.to_string(),
            body: body.clone(),
        });
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method.as_str(), parts.as_slice()) {
            // Every pod (all are this node's): a list across namespaces.
            ("GET", ["api", "v1", "pods"]) => {
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|((r, _, _), _)| r == "pods")
                    .map(|(_, v)| v.clone())
                    .collect();
                let list = json!({
                    "kind": "PodList", "apiVersion": "v1",
                    "metadata": { "resourceVersion": st.revision.to_string() },
                    "items": items,
                });
                return (StatusCode::OK, list);
            }
            // A collection of ResourceSlices, by field selector (`spec.nodeName`,
            // `spec.driver`; every field must match).
            ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                if st.slice_deletes_refused > 0 {
                    st.slice_deletes_refused -= 1;
                    return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
                }
                let fields: Vec<(String, String)> = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("fieldSelector="))
                    .into_iter()
                    .flat_map(|sel| sel.split(','))
                    .filter_map(|f| f.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let selected = |v: &Value| {
                    fields.iter().all(|(path, want)| {
                        let got = path.split('.').fold(v, |at, key| &at[key]);
                        got.as_str() == Some(want.as_str())
                    })
                };
                let gone: Vec<Value> = st
                    .objects
                    .extract_if(.., |(r, _, _), v| r == "resourceslices" && selected(v))
                    .map(|(_, v)| v)
                    .collect();
                let list = json!({ "kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                    "metadata": {}, "items": gone });
                return (StatusCode::OK, list);
            }
            // A PodCertificateRequest, named from its `generateName`.
            (
                "POST",
                [
                    "apis",
                    "certificates.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "podcertificaterequests",
                ],
            ) => {
                st.revision += 1;
                let prefix = body["metadata"]["generateName"].as_str().unwrap_or("pcr-");
                let name = format!("{prefix}{}", st.revision);
                let mut created = body.clone();
                created["metadata"]["name"] = json!(name);
                created["metadata"]["namespace"] = json!(ns);
                created["metadata"]["resourceVersion"] = json!(st.revision.to_string());
                let key = (
                    "podcertificaterequests".to_string(),
                    (*ns).to_string(),
                    name,
                );
                st.objects.insert(key, created.clone());
                return (StatusCode::CREATED, created);
            }
            ("DELETE", ["api", "v1", "nodes", name]) => {
                let key = ("nodes".to_string(), String::new(), (*name).to_string());
                return match st.objects.remove(&key) {
                    Some(node) => (StatusCode::OK, node),
                    None => status(StatusCode::NOT_FOUND, "NotFound", "node not found"),
                };
            }
            ("PATCH", ["api", "v1", "nodes", name]) => {
                let key = ("nodes".to_string(), String::new(), (*name).to_string());
                st.revision += 1;
                let revision = st.revision.to_string();
                let Some(stored) = st.objects.get_mut(&key) else {
                    return status(StatusCode::NOT_FOUND, "NotFound", "node not found");
                };
                merge(stored, &body);
                stored["metadata"]["resourceVersion"] = json!(revision);
                return (StatusCode::OK, stored.clone());
            }
            // Cluster-scoped objects of API groups (csinodes, csidrivers,
            // volumeattachments).
            ("GET", ["apis", _, _, resource, name]) => {
                let key = ((*resource).to_string(), String::new(), (*name).to_string());
                return match st.objects.get(&key) {
                    Some(v) => (StatusCode::OK, v.clone()),
                    None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
                };
            }
            ("POST", ["apis", "storage.k8s.io", "v1", "csinodes"]) => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let key = ("csinodes".to_string(), String::new(), name.to_string());
                if st.objects.contains_key(&key) {
                    return status(StatusCode::CONFLICT, "AlreadyExists", "csinode exists");
                }
                st.revision += 1;
                let mut created = body.clone();
                created["metadata"]["resourceVersion"] = json!(st.revision.to_string());
                st.objects.insert(key, created.clone());
                return (StatusCode::CREATED, created);
            }
            ("PUT", ["apis", "storage.k8s.io", "v1", "csinodes", name]) => {
                let key = ("csinodes".to_string(), String::new(), (*name).to_string());
                let Some(stored) = st.objects.get(&key) else {
                    return status(StatusCode::NOT_FOUND, "NotFound", "csinode not found");
                };
                if body["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"] {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        "the object has been modified",
                    );
                }
                st.revision += 1;
                let mut replaced = body.clone();
                replaced["metadata"]["resourceVersion"] = json!(st.revision.to_string());
                st.objects.insert(key, replaced.clone());
                return (StatusCode::OK, replaced);
            }
            // The approver's decisions, kept as sent.
            (
                "PUT",
                [
                    "apis",
                    "certificates.k8s.io",
                    "v1",
                    "certificatesigningrequests",
                    name,
                    "approval",
                ],
            ) => {
                let key = (
                    "certificatesigningrequests".to_string(),
                    String::new(),
                    (*name).to_string(),
                );
                st.objects.insert(key, body.clone());
                return (StatusCode::OK, body);
            }
            ("GET", ["api", "v1", resource, name]) if *resource != "namespaces" => {
                let key = ((*resource).to_string(), String::new(), (*name).to_string());
                return match st.objects.get(&key) {
                    Some(v) => (StatusCode::OK, v.clone()),
                    None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
                };
            }
            _ => {}
        }
        // /api/v1/namespaces/{ns}/{resource}/{name}[/{sub}], and a named
        // object of a group (`resourceclaims`), kept under its resource.
        let (ns, resource, name, sub) = match parts.as_slice() {
            ["apis", _, _, "namespaces", ns, r, n] => (*ns, *r, *n, ""),
            ["api", "v1", "namespaces", ns, r] => (*ns, *r, "", ""),
            ["api", "v1", "namespaces", ns, r, n] => (*ns, *r, *n, ""),
            ["api", "v1", "namespaces", ns, r, n, s] => (*ns, *r, *n, *s),
            _ => return status(StatusCode::NOT_FOUND, "NotFound", "unexpected path"),
        };
        if resource == "events" {
            let name = body["metadata"]["name"]
                .as_str()
                .map_or_else(|| format!("event-{}", st.requests.len()), str::to_string);
            let key = ("events".to_string(), ns.to_string(), name);
            let name = key.2.clone();
            let stored = st.objects.entry(key).or_insert(Value::Null);
            merge(stored, &body);
            stored["metadata"]["name"] = json!(name);
            return (StatusCode::CREATED, stored.clone());
        }
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        match (method.as_str(), resource, sub) {
            ("GET", _, "") => match st.objects.get(&key) {
                Some(v) => (StatusCode::OK, v.clone()),
                None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
            },
            ("PATCH", "pods", "status") => {
                st.revision += 1;
                let revision = st.revision.to_string();
                let Some(stored) = st.objects.get_mut(&key) else {
                    return status(StatusCode::NOT_FOUND, "NotFound", "pod not found");
                };
                let want = body["metadata"]["uid"].as_str();
                if want.is_some() && want != stored["metadata"]["uid"].as_str() {
                    return status(StatusCode::CONFLICT, "Conflict", "UID precondition failed");
                }
                let mut patch = body.clone();
                if let Some(m) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("uid");
                }
                merge(stored, &patch);
                stored["metadata"]["resourceVersion"] = json!(revision);
                (StatusCode::OK, stored.clone())
            }
            ("POST", "pods", "") => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let key = ("pods".to_string(), ns.to_string(), name);
                if st.objects.contains_key(&key) {
                    return status(StatusCode::CONFLICT, "AlreadyExists", "pod already exists");
                }
                st.revision += 1;
                let mut created = body.clone();
                created["metadata"]["uid"] = json!(format!("api-uid-{}", st.revision));
                created["metadata"]["resourceVersion"] = json!(st.revision.to_string());
                st.objects.insert(key, created.clone());
                (StatusCode::CREATED, created)
            }
            ("POST", "configmaps", "") => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let key = ("configmaps".to_string(), ns.to_string(), name);
                if st.objects.contains_key(&key) {
                    return status(StatusCode::CONFLICT, "AlreadyExists", "configmap exists");
                }
                st.revision += 1;
                let mut created = body.clone();
                created["metadata"]["namespace"] = json!(ns);
                created["metadata"]["resourceVersion"] = json!(st.revision.to_string());
                st.objects.insert(key, created.clone());
                (StatusCode::CREATED, created)
            }
            ("PATCH", "configmaps", "") => {
                st.revision += 1;
                let revision = st.revision.to_string();
                let Some(stored) = st.objects.get_mut(&key) else {
                    return status(StatusCode::NOT_FOUND, "NotFound", "configmap not found");
                };
                merge(stored, &body);
                stored["metadata"]["resourceVersion"] = json!(revision);
                (StatusCode::OK, stored.clone())
            }
            ("POST", "serviceaccounts", "token") => {
                if st.tokens_refused > 0 {
                    st.tokens_refused -= 1;
                    let message = format!(
                        "serviceaccounts \"{name}\" is forbidden: no relationship found between node and this object"
                    );
                    return status(StatusCode::FORBIDDEN, "Forbidden", &message);
                }
                let seconds = body["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
                let expires = k8s_openapi::jiff::Timestamp::now()
                    .saturating_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
                    .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
                let mut issued = body.clone();
                issued["status"] = json!({
                    "token": format!("token-{}-{}", name, st.requests.len()),
                    "expirationTimestamp": expires.round(k8s_openapi::jiff::Unit::Second).unwrap_or(expires).to_string(),
                });
                (StatusCode::CREATED, issued)
            }
            ("DELETE", "pods", "") => {
                let Some(stored) = st.objects.get(&key) else {
                    return status(StatusCode::NOT_FOUND, "NotFound", "pod not found");
                };
                let want = body["preconditions"]["uid"].as_str();
                if want.is_some() && want != stored["metadata"]["uid"].as_str() {
                    return status(StatusCode::CONFLICT, "Conflict", "UID precondition failed");
                }
                let removed = st.objects.remove(&key).unwrap_or_default();
                (StatusCode::OK, removed)
            }
            _ => status(StatusCode::NOT_FOUND, "NotFound", "unexpected request"),
        }
    }
}
