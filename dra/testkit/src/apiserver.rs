//! A kube-apiserver stand-in for tests only (no kube-apiserver can be installed here):
//! in-process HTTP on 127.0.0.1 serving what `gpushare-dra` may touch, with the Node
//! authorizer's and NodeRestriction's limits
//! (<https://kubernetes.io/docs/reference/access-authn-authz/node/>; kubernetes/kubernetes'
//! `plugin/pkg/auth/authorizer/node/node_authorizer.go` and
//! `plugin/pkg/admission/noderestriction/admission.go`) for the user `system:node:<name>`
//! (bearer token `node:<name>`):
//!
//! - `GET /apis/resource.k8s.io`: discovery of the served versions;
//! - `GET .../namespaces/<ns>/resourceclaims/<name>`: only claims of pods on the node
//!   (403 otherwise), 404 with `details` for a missing one; a version not served gets the
//!   404 without `details` that a real server gives for an unknown path;
//! - `GET /api/v1/nodes/<name>`: the node's own Node only;
//! - resourceslices: list and watch only with `spec.nodeName=<node>` in the field selector,
//!   create only with `spec.nodeName == node`, get/update/delete only of the node's own
//!   slices (403 otherwise, also for a missing one: no graph edge), conditional updates
//!   (resourceVersion) and deletes (uid precondition);
//! - `GET /version`: the Kubernetes version it plays (1.34 unless
//!   [`ApiServer::set_kubernetes_minor`]; every authenticated user may read it, so it is not
//!   recorded among the RBAC verbs);
//! - slices written (created, updated, or created with `dryRun=All`, which stores and tells
//!   nothing) go through [`crate::slice_rules`]: partitionable devices' fields dropped unless
//!   [`ApiServer::set_partitionable`], else that version's limits, a violation answered 422
//!   `Invalid` and recorded ([`ApiServer::invalid`]);
//! - faults: down (connections dropped), slow (every answer delayed), oversized
//!   ([`ApiServer::set_oversized`]: claim GETs, slice lists or watch events answered with a
//!   body of any size, streamed as it is sent and never held, which no real server can be
//!   asked for);
//! - [`ApiServer::wipe_node_slices`]: what kubelet's DeleteCollection does at its start.
//!
//! Every request is recorded (verb, resource) for the RBAC coverage test.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

#[derive(Default)]
struct Store {
    served: Vec<String>,
    claims: BTreeMap<(String, String), Value>,
    /// Claims referenced by pods on each node (the authorizer's graph).
    node_claims: BTreeMap<String, BTreeSet<(String, String)>>,
    nodes: BTreeMap<String, Value>,
    slices: BTreeMap<String, Value>,
    rv: u64,
    history: Vec<(u64, &'static str, Value)>,
    watchers: Vec<(String, String, mpsc::UnboundedSender<Bytes>)>,
    seen: BTreeSet<(String, String)>,
    down: bool,
    delay: Duration,
    refused: Vec<String>,
    claim_gets: Vec<String>,
    /// Kubernetes 1.<minor> played.
    minor: u32,
    /// `DRAPartitionableDevices` on: counters kept.
    partitionable: bool,
    invalid: Vec<String>,
    dry_runs: usize,
    /// The answers made oversized, and their size in bytes.
    oversized: Option<(BTreeSet<Oversize>, u64)>,
    oversized_sent: BTreeMap<Oversize, usize>,
    claim_get_times: Vec<std::time::Instant>,
}

/// Answers [`ApiServer::set_oversized`] can make too large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Oversize {
    /// A ResourceClaim GET the node may make: a claim object with a padding field.
    Claims,
    /// A ResourceSlice list: an empty list with a padding field.
    SliceLists,
    /// A ResourceSlice watch: after the events it owes, one `ADDED` event line that size.
    WatchEvents,
}

/// Padding inside JSON: `prefix`, `size` bytes of `a`, `suffix`, generated 64 KiB at a time
/// as the connection takes it (`u64::MAX`: never ends in any test's life).
fn padded(prefix: String, size: u64, suffix: &'static str) -> Body {
    const CHUNK: usize = 64 * 1024;
    let filler = Bytes::from(vec![b'a'; CHUNK]);
    let head = futures_util::stream::iter([Bytes::from(prefix)]);
    let body = futures_util::stream::unfold(size, move |left| {
        let filler = filler.clone();
        async move {
            (left > 0).then(|| {
                let n = usize::try_from(left).unwrap_or(CHUNK).min(CHUNK);
                (filler.slice(..n), left - n as u64)
            })
        }
    });
    let tail = futures_util::stream::iter([Bytes::from_static(suffix.as_bytes())]);
    let frames = futures_util::StreamExt::map(
        futures_util::StreamExt::chain(futures_util::StreamExt::chain(head, body), tail),
        |b| Ok::<_, Infallible>(Frame::data(b)),
    );
    BodyExt::boxed(StreamBody::new(frames))
}

/// The stand-in; cheap to clone.
#[derive(Clone)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
    /// Where it listens.
    pub addr: SocketAddr,
}

fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> (u16, Value) {
    let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    s["details"] = details.unwrap_or_else(|| json!({}));
    (code, s)
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn selector(fields: &str) -> BTreeMap<String, String> {
    fields
        .split(',')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.trim_end_matches('=').to_string(), v.to_string()))
        .collect()
}

fn slice_matches(s: &Value, sel: &BTreeMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| match k.as_str() {
        "spec.nodeName" => s["spec"]["nodeName"] == v.as_str(),
        "spec.driver" => s["spec"]["driver"] == v.as_str(),
        _ => false,
    })
}

impl ApiServer {
    /// Starts the stand-in serving every `resource.k8s.io` version (v1, v1beta2, v1beta1)
    /// and the Node `node`.
    pub async fn start(node: &str) -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut store = Store {
            served: vec!["v1".into(), "v1beta2".into(), "v1beta1".into()],
            rv: 100,
            minor: 34,
            ..Store::default()
        };
        store.nodes.insert(
            node.into(),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": format!("node-uid-{node}")}}),
        );
        let server = ApiServer {
            store: Arc::new(Mutex::new(store)),
            addr,
        };
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { s.handle(req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        server
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A kubeconfig for the node's identity (`system:node:<node>`).
    pub fn kubeconfig(&self, node: &str, path: &std::path::Path) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: node:{node}\n",
                self.addr
            ),
        )
        .unwrap();
    }

    /// Serves only these `resource.k8s.io` versions.
    pub fn serve_versions(&self, versions: &[&str]) {
        self.lock().served = versions.iter().map(|v| v.to_string()).collect();
    }

    /// Plays Kubernetes 1.`minor` (`GET /version`, and the slice rules of that version).
    pub fn set_kubernetes_minor(&self, minor: u32) {
        self.lock().minor = minor;
    }

    /// Keeps partitionable devices' fields (`DRAPartitionableDevices` on) or drops them (off,
    /// the default, as on a 1.34 server without alpha features).
    pub fn set_partitionable(&self, on: bool) {
        self.lock().partitionable = on;
    }

    /// Slice writes refused as invalid, one line each.
    pub fn invalid(&self) -> Vec<String> {
        self.lock().invalid.clone()
    }

    /// Slice creates made with `dryRun=All` so far.
    pub fn dry_runs(&self) -> usize {
        self.lock().dry_runs
    }

    /// What the server does to a slice it is asked to store: drops or checks the counters.
    fn admit(st: &mut Store, slice: &mut Value) -> Result<(), (u16, Value)> {
        if !st.partitionable {
            crate::slice_rules::drop_counters(slice);
            return Ok(());
        }
        let errs = crate::slice_rules::violations(slice, st.minor);
        if errs.is_empty() {
            return Ok(());
        }
        let message = format!(
            "ResourceSlice.resource.k8s.io {:?} is invalid: {}",
            slice["metadata"]["name"].as_str().unwrap_or_default(),
            errs.join(", ")
        );
        st.invalid.push(message.clone());
        Err(status(422, "Invalid", &message, None))
    }

    /// Adds a claim, referenced by a pod on `node` (or on no node of ours when `None`).
    pub fn add_claim(&self, claim: &Value, node: Option<&str>) {
        let ns = claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = claim["metadata"]["name"].as_str().unwrap().to_string();
        let mut st = self.lock();
        st.claims.insert((ns.clone(), name.clone()), claim.clone());
        if let Some(n) = node {
            st.node_claims
                .entry(n.into())
                .or_default()
                .insert((ns, name));
        }
    }

    /// Deletes a claim (its pods are gone too).
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        let mut st = self.lock();
        st.claims.remove(&(namespace.into(), name.into()));
    }

    /// Drops every connection (on) or serves again (off).
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Answers `what` with bodies of `size` bytes from now on (`None`: normal answers again).
    /// The bodies are chunked, without a length, as a misbehaving proxy or server streams
    /// them.
    pub fn set_oversized(&self, what: Option<(&[Oversize], u64)>) {
        self.lock().oversized = what.map(|(w, n)| (w.iter().copied().collect(), n));
    }

    /// Ends every open watch (as a server's restart does): watchers list again.
    pub fn end_watches(&self) {
        self.lock().watchers.clear();
    }

    /// Oversized answers begun so far, of `what`.
    pub fn oversized_sent(&self, what: Oversize) -> usize {
        self.lock().oversized_sent.get(&what).copied().unwrap_or(0)
    }

    /// When each claim GET arrived, in order.
    pub fn claim_get_times(&self) -> Vec<std::time::Instant> {
        self.lock().claim_get_times.clone()
    }

    /// The size of an oversized answer of `what` now due, counted as sent.
    fn oversize_due(&self, what: Oversize) -> Option<u64> {
        let mut st = self.lock();
        let size = st
            .oversized
            .as_ref()
            .filter(|(w, _)| w.contains(&what))
            .map(|(_, n)| *n)?;
        *st.oversized_sent.entry(what).or_default() += 1;
        Some(size)
    }

    /// Delays every answer by `d`.
    pub fn set_delay(&self, d: Duration) {
        self.lock().delay = d;
    }

    /// (verb, resource) pairs seen, e.g. ("list", "resourceslices").
    pub fn seen(&self) -> BTreeSet<(String, String)> {
        self.lock().seen.clone()
    }

    /// Requests refused by the authorizer, one line each.
    pub fn refused(&self) -> Vec<String> {
        self.lock().refused.clone()
    }

    /// Paths of the claim GETs, in order.
    pub fn claim_gets(&self) -> Vec<String> {
        self.lock().claim_gets.clone()
    }

    /// Every slice now stored.
    pub fn slices(&self) -> Vec<Value> {
        self.lock().slices.values().cloned().collect()
    }

    /// Stores a slice as another node's plugin would have (bypassing authorization).
    pub fn put_foreign_slice(&self, mut slice: Value) {
        let mut st = self.lock();
        st.rv += 1;
        let name = slice["metadata"]["name"].as_str().unwrap().to_string();
        slice["metadata"]["uid"] = json!(format!("uid-{name}"));
        slice["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.slices.insert(name, slice);
    }

    fn emit(st: &mut Store, kind: &'static str, obj: &Value) {
        st.history.push((st.rv, kind, obj.clone()));
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": obj})));
        st.watchers.retain(|(driver, node, tx)| {
            let sel = BTreeMap::from([
                ("spec.driver".to_string(), driver.clone()),
                ("spec.nodeName".to_string(), node.clone()),
            ]);
            !slice_matches(obj, &sel) || tx.send(line.clone()).is_ok()
        });
    }

    /// Deletes every slice of `node` (kubelet's DeleteCollection at its start); returns how
    /// many.
    pub fn wipe_node_slices(&self, node: &str) -> usize {
        let mut st = self.lock();
        let names: Vec<String> = st
            .slices
            .iter()
            .filter(|(_, s)| s["spec"]["nodeName"] == node)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &names {
            st.rv += 1;
            if let Some(obj) = st.slices.remove(n) {
                Self::emit(&mut st, "DELETED", &obj);
            }
        }
        names.len()
    }

    async fn handle(&self, req: Request<Incoming>) -> Result<Response<Body>, std::io::Error> {
        let (down, delay) = {
            let st = self.lock();
            (st.down, st.delay)
        };
        if down {
            return Err(std::io::Error::other("down"));
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let user = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer node:"))
            .map(str::to_string);
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let q = query(req.uri().query());
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(node) = user else {
            return Ok(reply(status(401, "Unauthorized", "Unauthorized", None)));
        };
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            return Ok(self.watch(&node, &path, &q));
        }
        let (code, answer) = self.serve(&node, &method, &path, &q, &body);
        let kind = answer["kind"].as_str().unwrap_or_default();
        let due = match (code, kind) {
            (200, "ResourceClaim") => self.oversize_due(Oversize::Claims),
            (200, "ResourceSliceList") => self.oversize_due(Oversize::SliceLists),
            _ => None,
        };
        if let Some(size) = due {
            let prefix = format!(
                "{{\"kind\":\"{kind}\",\"apiVersion\":{},\"metadata\":{},\"padding\":\"",
                answer["apiVersion"], answer["metadata"]
            );
            let mut r = Response::new(padded(prefix, size, "\"}"));
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            return Ok(r);
        }
        Ok(reply((code, answer)))
    }

    fn deny(&self, st: &mut Store, node: &str, what: String) -> (u16, Value) {
        let line = format!("system:node:{node}: {what}");
        st.refused.push(line.clone());
        status(
            403,
            "Forbidden",
            &format!("{line}: forbidden by the Node authorizer"),
            None,
        )
    }

    fn serve(
        &self,
        node: &str,
        method: &str,
        path: &str,
        q: &BTreeMap<String, String>,
        body: &Value,
    ) -> (u16, Value) {
        let mut st = self.lock();
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match parts.as_slice() {
            ["apis", "resource.k8s.io"] => {
                let versions: Vec<Value> = st
                    .served
                    .iter()
                    .map(|v| json!({"groupVersion": format!("resource.k8s.io/{v}"), "version": v}))
                    .collect();
                (
                    200,
                    json!({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
                    "versions": versions, "preferredVersion": versions.first()}),
                )
            }
            ["version"] => {
                let minor = st.minor;
                (
                    200,
                    json!({"major": "1", "minor": minor.to_string(),
                        "gitVersion": format!("v1.{minor}.0"), "platform": "linux/amd64"}),
                )
            }
            ["api", "v1", "nodes", name] => {
                st.seen.insert(("get".into(), "nodes".into()));
                if *name != node {
                    return self.deny(&mut st, node, format!("get nodes/{name}"));
                }
                match st.nodes.get(*name) {
                    Some(n) => (200, n.clone()),
                    None => status(
                        404,
                        "NotFound",
                        "not found",
                        Some(json!({"name": name, "kind": "nodes"})),
                    ),
                }
            }
            ["apis", "resource.k8s.io", v, rest @ ..] => {
                if !st.served.iter().any(|s| s == v) {
                    return status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                        None,
                    );
                }
                match rest {
                    ["namespaces", ns, "resourceclaims", name] if method == "GET" => {
                        st.seen.insert(("get".into(), "resourceclaims".into()));
                        st.claim_gets.push(path.to_string());
                        st.claim_get_times.push(std::time::Instant::now());
                        let key = (ns.to_string(), name.to_string());
                        if !st.node_claims.get(node).is_some_and(|s| s.contains(&key)) {
                            return self.deny(
                                &mut st,
                                node,
                                format!(
                                    "get resourceclaims {ns}/{name}: no pod on this node uses it"
                                ),
                            );
                        }
                        match st.claims.get(&key) {
                            Some(c) => (200, c.clone()),
                            None => status(
                                404,
                                "NotFound",
                                &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                                Some(
                                    json!({"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"}),
                                ),
                            ),
                        }
                    }
                    ["resourceslices"] if method == "GET" => {
                        st.seen.insert(("list".into(), "resourceslices".into()));
                        let sel =
                            selector(q.get("fieldSelector").map(String::as_str).unwrap_or(""));
                        if sel.get("spec.nodeName").map(String::as_str) != Some(node) {
                            return self.deny(
                                &mut st,
                                node,
                                "list resourceslices without fieldSelector spec.nodeName=<node>"
                                    .into(),
                            );
                        }
                        let items: Vec<Value> = st
                            .slices
                            .values()
                            .filter(|s| slice_matches(s, &sel))
                            .cloned()
                            .collect();
                        (
                            200,
                            json!({"kind": "ResourceSliceList", "apiVersion": format!("resource.k8s.io/{v}"),
                            "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
                        )
                    }
                    ["resourceslices"] if method == "POST" => {
                        st.seen.insert(("create".into(), "resourceslices".into()));
                        if body["spec"]["nodeName"] != node {
                            return self.deny(
                                &mut st,
                                node,
                                format!(
                                    "create a resourceslice for node {}",
                                    body["spec"]["nodeName"]
                                ),
                            );
                        }
                        let mut obj = body.clone();
                        if let Err(refused) = Self::admit(&mut st, &mut obj) {
                            return refused;
                        }
                        let name = match obj["metadata"]["name"].as_str() {
                            Some(n) => n.to_string(),
                            None => format!(
                                "{}{}",
                                obj["metadata"]["generateName"].as_str().unwrap_or("s-"),
                                fastrand::u32(10000..99999)
                            ),
                        };
                        if st.slices.contains_key(&name) {
                            return status(409, "AlreadyExists", "exists", None);
                        }
                        obj["metadata"]["name"] = json!(name);
                        if q.get("dryRun").is_some_and(|d| d == "All") {
                            // Everything a create does, but nothing stored or told.
                            st.dry_runs += 1;
                            obj["metadata"]["uid"] = json!(format!("uid-{name}-dry-run"));
                            return (201, obj);
                        }
                        st.rv += 1;
                        obj["metadata"]["uid"] = json!(format!("uid-{name}-{}", st.rv));
                        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                        st.slices.insert(name, obj.clone());
                        Self::emit(&mut st, "ADDED", &obj);
                        (201, obj)
                    }
                    ["resourceslices", name] => {
                        let verb = match method {
                            "PUT" => "update",
                            "DELETE" => "delete",
                            "GET" => "get",
                            _ => "patch",
                        };
                        st.seen.insert((verb.into(), "resourceslices".into()));
                        let Some(old) = st.slices.get(*name).cloned() else {
                            return self.deny(
                                &mut st,
                                node,
                                format!(
                                    "{verb} resourceslices/{name}: no relationship to this node"
                                ),
                            );
                        };
                        if old["spec"]["nodeName"] != node {
                            return self.deny(
                                &mut st,
                                node,
                                format!("{verb} resourceslices/{name} of another node"),
                            );
                        }
                        match method {
                            "GET" => (200, old),
                            "PUT" => {
                                if body["spec"]["nodeName"] != node {
                                    return self.deny(
                                        &mut st,
                                        node,
                                        format!("update resourceslices/{name} to another node"),
                                    );
                                }
                                if body["metadata"]["resourceVersion"]
                                    != old["metadata"]["resourceVersion"]
                                {
                                    return status(
                                        409,
                                        "Conflict",
                                        "the object has been modified",
                                        None,
                                    );
                                }
                                let mut obj = body.clone();
                                if let Err(refused) = Self::admit(&mut st, &mut obj) {
                                    return refused;
                                }
                                st.rv += 1;
                                obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                                obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                                st.slices.insert(name.to_string(), obj.clone());
                                Self::emit(&mut st, "MODIFIED", &obj);
                                (200, obj)
                            }
                            "DELETE" => {
                                if let Some(uid) =
                                    body.pointer("/preconditions/uid").and_then(Value::as_str)
                                {
                                    if old["metadata"]["uid"] != uid {
                                        return status(
                                            409,
                                            "Conflict",
                                            "precondition failed: uid",
                                            None,
                                        );
                                    }
                                }
                                st.rv += 1;
                                st.slices.remove(*name);
                                Self::emit(&mut st, "DELETED", &old);
                                (200, json!({"kind": "Status", "status": "Success"}))
                            }
                            _ => {
                                status(405, "MethodNotAllowed", "not served by the stand-in", None)
                            }
                        }
                    }
                    _ => status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                        None,
                    ),
                }
            }
            _ => status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            ),
        }
    }

    fn watch(&self, node: &str, path: &str, q: &BTreeMap<String, String>) -> Response<Body> {
        let mut st = self.lock();
        st.seen.insert(("watch".into(), "resourceslices".into()));
        let sel = selector(q.get("fieldSelector").map(String::as_str).unwrap_or(""));
        let v = path
            .trim_matches('/')
            .split('/')
            .nth(2)
            .unwrap_or_default()
            .to_string();
        if !st.served.contains(&v) {
            return reply(status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            ));
        }
        if sel.get("spec.nodeName").map(String::as_str) != Some(node) {
            return reply(self.deny(
                &mut st,
                node,
                "watch resourceslices without fieldSelector spec.nodeName=<node>".into(),
            ));
        }
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel();
        for (rv, kind, obj) in &st.history {
            if *rv > from && slice_matches(obj, &sel) {
                let _ = tx.send(Bytes::from(format!(
                    "{}\n",
                    json!({"type": kind, "object": obj})
                )));
            }
        }
        let driver = sel.get("spec.driver").cloned().unwrap_or_default();
        st.watchers.push((driver, node.to_string(), tx));
        let oversized = st
            .oversized
            .as_ref()
            .filter(|(w, _)| w.contains(&Oversize::WatchEvents))
            .map(|(_, n)| *n);
        if oversized.is_some() {
            *st.oversized_sent.entry(Oversize::WatchEvents).or_default() += 1;
        }
        drop(st);
        let body = match oversized {
            None => {
                let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv()
                        .await
                        .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
                });
                BodyExt::boxed(StreamBody::new(stream))
            }
            Some(size) => {
                // The events owed first (queued already), then the oversized one.
                let mut rx = rx;
                let mut head = String::new();
                while let Ok(b) = rx.try_recv() {
                    head.push_str(&String::from_utf8_lossy(&b));
                }
                padded(
                    format!("{head}{{\"type\":\"ADDED\",\"object\":{{\"padding\":\""),
                    size,
                    "\"}}\n",
                )
            }
        };
        let mut r = Response::new(body);
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        r
    }
}

fn reply((code, v): (u16, Value)) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed(Full::new(Bytes::from(v.to_string()))));
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}
