//! The API server, through `kube`'s client (its kubeconfig handling, `exec` credential plugins
//! and in-cluster service accounts included). Only the calls the Node authorizer and
//! NodeRestriction allow a node
//! (<https://kubernetes.io/docs/reference/access-authn-authz/node/>; kubernetes/kubernetes'
//! `plugin/pkg/auth/authorizer/node/node_authorizer.go`): get a ResourceClaim, get its own
//! Node, discover `resource.k8s.io`'s versions, and list / watch (with the `spec.nodeName`
//! field selector) / create / update / delete its own ResourceSlices.
//!
//! Every answer is read within a bound, as it arrives ([`crate::bounded`]): one object at
//! [`OBJECT_LIMIT`], a list of the node's slices at their count times that, a watch one event
//! (one object) a line. An answer past its bound fails with [`ApiError::TooLarge`] naming the
//! URL, is counted in `gpushare_dra_api_oversized_answers_total`, and its connection is
//! dropped; the callers retry with back-off.

use std::path::Path;
use std::sync::Mutex;

use futures_util::{Stream, StreamExt};
use gpushare_slice::ApiVersion;
use http::Request;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::Value;

use crate::config::KUBELET_KUBECONFIG;

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error status.
    #[error("{verb} {path}: {code} {reason}: {message}")]
    Status {
        /// HTTP verb.
        verb: &'static str,
        /// Request path.
        path: String,
        /// HTTP status.
        code: u16,
        /// The Status reason (`NotFound`, `Forbidden`, …).
        reason: String,
        /// The Status message.
        message: String,
        /// `details.name` was set: the object, not the resource type, is missing.
        object_missing: bool,
    },
    /// The server could not be reached, or its answer was not readable.
    #[error("{verb} {path}: {message}")]
    Transport {
        /// HTTP verb.
        verb: &'static str,
        /// Request path.
        path: String,
        /// What failed.
        message: String,
    },
    /// The answer was longer than anything the call can legitimately get (a misbehaving
    /// server or proxy): read up to the bound, then dropped with its connection.
    #[error("{verb} {url}: the answer exceeds {limit} bytes, the most {what} can be (cut off at {seen} bytes)")]
    TooLarge {
        /// HTTP verb.
        verb: &'static str,
        /// Request path.
        path: String,
        /// The whole URL (the server's address and `path`).
        url: String,
        /// What the answer should have held, e.g. "a ResourceClaim".
        what: &'static str,
        /// The bound, bytes.
        limit: usize,
        /// Bytes read (or declared) when reading stopped.
        seen: u64,
    },
    /// The server serves none of `resource.k8s.io` v1, v1beta2, v1beta1.
    #[error("the API server serves no resource.k8s.io version this plugin speaks (v1, v1beta2, v1beta1): {0}")]
    NoVersion(String),
}

impl ApiError {
    /// The HTTP status, when the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// An answer past its bound ([`ApiError::TooLarge`]).
    pub fn is_too_large(&self) -> bool {
        matches!(self, ApiError::TooLarge { .. })
    }

    /// A 404 for a path whose resource type the server does not serve (as opposed to a
    /// missing object, whose Status names it in `details`).
    pub fn is_not_served(&self) -> bool {
        matches!(
            self,
            ApiError::Status {
                code: 404,
                object_missing: false,
                ..
            }
        )
    }
}

/// Builds the client from `kubeconfig`, or, when `None`, from the pod's service account
/// when running in a pod, else from kubelet's kubeconfig ([`KUBELET_KUBECONFIG`]).
///
/// # Errors
/// The kubeconfig cannot be read or used, as one line naming the file.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    Ok(connect(kubeconfig).await?.client)
}

/// The client of [`client`] wrapped in an [`Api`] that names, in every error of a call that
/// did not get an answer, the server's URL and where it came from (the kubeconfig file, or
/// the in-cluster service account).
///
/// # Errors
/// As [`client`].
pub async fn connect(kubeconfig: Option<&Path>) -> anyhow::Result<Api> {
    use anyhow::Context as _;
    let (config, source) = match kubeconfig {
        Some(path) => (
            from_file(path).await?,
            format!("kubeconfig {}", path.display()),
        ),
        None => match kube::Config::incluster() {
            Ok(c) => (c, "the in-cluster service account".to_string()),
            Err(_) => (
                from_file(Path::new(KUBELET_KUBECONFIG))
                    .await
                    .context("no in-cluster service account, and kubelet's kubeconfig")?,
                format!("kubeconfig {KUBELET_KUBECONFIG}"),
            ),
        },
    };
    let origin = format!("API server {} (from {source})", config.cluster_url);
    let base = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let client = kube::Client::try_from(config).context("building the API client")?;
    let mut api = Api::with_origin(client, origin);
    api.base = base;
    Ok(api)
}

async fn from_file(path: &Path) -> anyhow::Result<kube::Config> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| match e {
        // kube's message names the path again, in Debug quotes: ours names it once.
        kube::config::KubeconfigError::ReadConfig(io, _) => {
            anyhow::Error::new(io).context(format!("reading kubeconfig {}", path.display()))
        }
        other => anyhow::anyhow!(
            "reading kubeconfig {}: {}",
            path.display(),
            error_chain(&other)
        ),
    })?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("using kubeconfig {}: {}", path.display(), error_chain(&e)))
}

/// The API server, with the `resource.k8s.io` version in use remembered.
pub struct Api {
    client: kube::Client,
    /// The server as errors name it: `API server <url> (from <kubeconfig>)`.
    origin: String,
    /// The server's URL without a trailing `/` (empty when unknown), before each path in
    /// [`ApiError::TooLarge`].
    base: String,
    version: Mutex<Option<ApiVersion>>,
    oversized: OversizedAnswers,
}

/// Answers cut off past their bound, by `operation` (`get_claim`, `list_slices`, …): the
/// family behind `gpushare_dra_api_oversized_answers_total` ([`crate::metrics`] registers
/// it).
pub type OversizedAnswers = Family<Vec<(&'static str, String)>, Counter>;

/// The most one API object's JSON is read to, bytes: an object at its API maximum plus
/// slack. The server stores an object of at most 1.5 MiB (etcd's request limit, in protobuf,
/// which is more compact than JSON); 3 MiB, twice that, is also the most it takes as one JSON
/// write.
pub const OBJECT_LIMIT: usize = 3 * 1024 * 1024;

/// Slices a list of the node's own is bounded for beyond the count the publisher expects
/// ([`Api::list_slices`]): room for ones a layout change or another writer left.
pub const LIST_SLACK: usize = 2;

/// What one call reads: its name in the metric, what its answer holds, and its bound.
#[derive(Debug, Clone, Copy)]
struct Read {
    operation: &'static str,
    what: &'static str,
    limit: usize,
}

impl Read {
    const fn object(operation: &'static str, what: &'static str) -> Read {
        Read {
            operation,
            what,
            limit: OBJECT_LIMIT,
        }
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("origin", &self.origin)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// A watch event on ResourceSlices.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// `ADDED` or `MODIFIED`: the object as it is now.
    Upsert(Value),
    /// `DELETED`: the object as it was.
    Deleted(Value),
    /// `BOOKMARK`: only a newer resourceVersion.
    Bookmark(String),
    /// `ERROR` (e.g. 410 Gone: list again).
    Error(String),
}

const GROUP_PATH: &str = "/apis/resource.k8s.io";

/// `e` and its sources as one line, each once: kube's own message ("client error
/// (Connect)") says only which layer failed, the cause ("Connection refused") is further
/// down the chain; and kube's errors that print their source in their own message and
/// return it as `source()` too (a kubeconfig's OS error) say it once, not twice.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

fn status_error(verb: &'static str, path: &str, origin: &str, e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(s) => ApiError::Status {
            verb,
            path: path.into(),
            code: s.code,
            reason: s.reason.clone(),
            message: s.message.clone(),
            object_missing: s.details.as_ref().is_some_and(|d| !d.name.is_empty()),
        },
        other => ApiError::Transport {
            verb,
            path: path.into(),
            message: format!("{origin}: {}", error_chain(&other)),
        },
    }
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// Wraps a client; its errors call the server "the API server" ([`connect`] names it).
    pub fn new(client: kube::Client) -> Api {
        Api::with_origin(client, "the API server".into())
    }

    /// Wraps a client whose errors name the server as `origin`.
    pub fn with_origin(client: kube::Client, origin: String) -> Api {
        Api {
            client,
            origin,
            base: String::new(),
            version: Mutex::new(None),
            oversized: OversizedAnswers::default(),
        }
    }

    /// The counter family of answers cut off past their bound, to register.
    pub fn oversized_answers_family(&self) -> OversizedAnswers {
        self.oversized.clone()
    }

    /// Answers of `operation` cut off past their bound so far.
    pub fn oversized_answers(&self, operation: &'static str) -> u64 {
        self.oversized
            .get_or_create(&vec![("operation", operation.into())])
            .get()
    }

    /// The request for `verb` `path` with `body` (JSON), accepting JSON.
    fn request(
        verb: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Request<kube::client::Body>, ApiError> {
        let transport = |message: String| ApiError::Transport {
            verb,
            path: path.into(),
            message,
        };
        let mut req = Request::builder()
            .method(verb)
            .uri(path)
            .header("accept", "application/json");
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let bytes = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| transport(e.to_string()))?
            .unwrap_or_default();
        req.body(kube::client::Body::from(bytes))
            .map_err(|e| transport(e.to_string()))
    }

    /// Why reading an answer's body failed, as an [`ApiError`]; a cut-off one is counted.
    fn body_error(
        &self,
        verb: &'static str,
        path: &str,
        read: Read,
        e: crate::bounded::BodyError,
    ) -> ApiError {
        match e {
            crate::bounded::BodyError::TooLarge { limit, seen } => {
                self.oversized
                    .get_or_create(&vec![("operation", read.operation.into())])
                    .inc();
                ApiError::TooLarge {
                    verb,
                    path: path.into(),
                    url: format!("{}{path}", self.base),
                    what: read.what,
                    limit,
                    seen,
                }
            }
            crate::bounded::BodyError::Read(message) => ApiError::Transport {
                verb,
                path: path.into(),
                message: format!("{}: {message}", self.origin),
            },
        }
    }

    /// Sends `req`; an error status is read (within [`OBJECT_LIMIT`]) as the server's Status.
    async fn send(
        &self,
        verb: &'static str,
        path: &str,
        req: Request<kube::client::Body>,
        read: Read,
    ) -> Result<http::Response<kube::client::Body>, ApiError> {
        let res = self
            .client
            .send(req)
            .await
            .map_err(|e| status_error(verb, path, &self.origin, e))?;
        let code = res.status();
        if !(code.is_client_error() || code.is_server_error()) {
            return Ok(res);
        }
        let status_read = Read {
            limit: OBJECT_LIMIT,
            what: "a Status",
            ..read
        };
        let body = crate::bounded::read(res.into_body(), OBJECT_LIMIT)
            .await
            .map_err(|e| self.body_error(verb, path, status_read, e))?;
        Err(match serde_json::from_slice::<kube::core::Status>(&body) {
            Ok(s) => ApiError::Status {
                verb,
                path: path.into(),
                code: s.code,
                reason: s.reason,
                message: s.message,
                object_missing: s.details.as_ref().is_some_and(|d| !d.name.is_empty()),
            },
            // A proxy's or a bare path's answer: text, not a Status.
            Err(_) => ApiError::Status {
                verb,
                path: path.into(),
                code: code.as_u16(),
                reason: code.canonical_reason().unwrap_or_default().to_string(),
                message: String::from_utf8_lossy(&body)
                    .trim()
                    .chars()
                    .take(512)
                    .collect(),
                object_missing: false,
            },
        })
    }

    async fn call(
        &self,
        verb: &'static str,
        path: &str,
        body: Option<&Value>,
        read: Read,
    ) -> Result<Value, ApiError> {
        let req = Self::request(verb, path, body)?;
        let res = self.send(verb, path, req, read).await?;
        let bytes = crate::bounded::read(res.into_body(), read.limit)
            .await
            .map_err(|e| self.body_error(verb, path, read, e))?;
        serde_json::from_slice(&bytes).map_err(|e| ApiError::Transport {
            verb,
            path: path.into(),
            message: format!("{}: unreadable answer: {e}", self.origin),
        })
    }

    /// The `resource.k8s.io` version to use: the most preferred one the server serves
    /// (`GET /apis/resource.k8s.io`), remembered until [`Api::forget_version`].
    ///
    /// # Errors
    /// Discovery failed, or the server serves none of ours.
    pub async fn version(&self) -> Result<ApiVersion, ApiError> {
        if let Some(v) = *self
            .version
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            return Ok(v);
        }
        let group = self
            .call(
                "GET",
                GROUP_PATH,
                None,
                Read::object("discovery", "an APIGroup"),
            )
            .await?;
        let served: Vec<&str> = group["versions"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v["version"].as_str()).collect())
            .unwrap_or_default();
        let v = ApiVersion::best_of(served.iter().copied())
            .ok_or_else(|| ApiError::NoVersion(format!("served: {served:?}")))?;
        *self
            .version
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(v);
        Ok(v)
    }

    /// Forgets the remembered version (the server stopped serving it, e.g. after an
    /// upgrade or downgrade of the control plane).
    pub fn forget_version(&self) {
        *self
            .version
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// GETs a ResourceClaim: in the version in use, then, where the server says it does not
    /// serve that version, in the next of v1 → v1beta2 → v1beta1 (as the Go helper's client
    /// falls back). The object is returned as JSON, whole.
    ///
    /// # Errors
    /// The server's refusal (404 for a missing claim, 403 for one the Node authorizer
    /// refuses), or why it could not be reached.
    pub async fn get_claim(&self, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let first = self.version().await.unwrap_or(ApiVersion::V1);
        let mut last = None;
        for v in ApiVersion::PREFERENCE.into_iter().filter(|v| *v >= first) {
            let path = format!(
                "{GROUP_PATH}/{v}/namespaces/{}/resourceclaims/{}",
                encode(namespace),
                encode(name)
            );
            match self
                .call(
                    "GET",
                    &path,
                    None,
                    Read::object("get_claim", "a ResourceClaim"),
                )
                .await
            {
                Ok(obj) => {
                    if v != first {
                        *self
                            .version
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(v);
                    }
                    return Ok(obj);
                }
                Err(e) if e.is_not_served() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        self.forget_version();
        Err(last.unwrap_or_else(|| ApiError::NoVersion("nothing tried".into())))
    }

    /// GETs this node's Node object.
    ///
    /// # Errors
    /// As [`Api::get_claim`].
    pub async fn get_node(&self, node: &str) -> Result<Value, ApiError> {
        self.call(
            "GET",
            &format!("/api/v1/nodes/{}", encode(node)),
            None,
            Read::object("get_node", "a Node"),
        )
        .await
    }

    fn slices_path(v: ApiVersion) -> String {
        format!("{GROUP_PATH}/{v}/resourceslices")
    }

    fn selector(driver: &str, node: &str) -> String {
        encode(&format!("spec.driver={driver},spec.nodeName={node}"))
    }

    /// Lists this node's slices of `driver` (field selector `spec.driver=<driver>,
    /// spec.nodeName=<node>`), returning the items and the list's resourceVersion. The answer
    /// is read to (`expected` + [`LIST_SLACK`]) × [`OBJECT_LIMIT`] bytes: `expected` is how
    /// many slices the node publishes (0 when not known yet).
    ///
    /// # Errors
    /// As [`Api::get_claim`].
    pub async fn list_slices(
        &self,
        v: ApiVersion,
        driver: &str,
        node: &str,
        expected: usize,
    ) -> Result<(Vec<Value>, String), ApiError> {
        let path = format!(
            "{}?fieldSelector={}",
            Self::slices_path(v),
            Self::selector(driver, node)
        );
        let read = Read {
            operation: "list_slices",
            what: "this node's ResourceSlices",
            limit: expected
                .saturating_add(LIST_SLACK)
                .saturating_mul(OBJECT_LIMIT),
        };
        let list = self.call("GET", &path, None, read).await?;
        let rv = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let items = list["items"].as_array().cloned().unwrap_or_default();
        Ok((items, rv))
    }

    /// Watches this node's slices of `driver` from `resource_version`, with the same field
    /// selector as [`Api::list_slices`]. The stream ends when the server closes the watch.
    ///
    /// # Errors
    /// The watch could not be opened.
    pub async fn watch_slices(
        &self,
        v: ApiVersion,
        driver: &str,
        node: &str,
        resource_version: &str,
    ) -> Result<impl Stream<Item = WatchEvent> + use<>, ApiError> {
        let path = format!(
            "{}?watch=true&allowWatchBookmarks=true&timeoutSeconds=290&fieldSelector={}&resourceVersion={}",
            Self::slices_path(v),
            Self::selector(driver, node),
            encode(resource_version)
        );
        let read = Read::object("watch_slices", "one watch event");
        let req = Self::request("GET", &path, None).map_err(|e| match e {
            ApiError::Transport { message, .. } => ApiError::Transport {
                verb: "WATCH",
                path: path.clone(),
                message,
            },
            other => other,
        })?;
        let body = self.send("WATCH", &path, req, read).await?.into_body();
        let events = crate::bounded::lines(body, read.limit);
        // Each event's error is built once, from what the stream's closure owns.
        let (base, origin, oversized) = (
            self.base.clone(),
            self.origin.clone(),
            self.oversized.clone(),
        );
        Ok(events.map(move |line| match line {
            Err(crate::bounded::BodyError::TooLarge { limit, seen }) => {
                oversized
                    .get_or_create(&vec![("operation", read.operation.into())])
                    .inc();
                WatchEvent::Error(
                    ApiError::TooLarge {
                        verb: "WATCH",
                        path: path.clone(),
                        url: format!("{base}{path}"),
                        what: read.what,
                        limit,
                        seen,
                    }
                    .to_string(),
                )
            }
            Err(crate::bounded::BodyError::Read(e)) => WatchEvent::Error(format!("{origin}: {e}")),
            Ok(line) => match serde_json::from_slice::<Value>(&line) {
                Err(e) => WatchEvent::Error(format!("unreadable watch event: {e}")),
                Ok(ev) => {
                    let obj = ev["object"].clone();
                    match ev["type"].as_str() {
                        Some("ADDED" | "MODIFIED") => WatchEvent::Upsert(obj),
                        Some("DELETED") => WatchEvent::Deleted(obj),
                        Some("BOOKMARK") => WatchEvent::Bookmark(
                            obj.pointer("/metadata/resourceVersion")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string(),
                        ),
                        _ => WatchEvent::Error(
                            obj["message"].as_str().unwrap_or("watch error").to_string(),
                        ),
                    }
                }
            },
        }))
    }

    /// Creates a slice.
    ///
    /// # Errors
    /// As [`Api::get_claim`].
    pub async fn create_slice(&self, v: ApiVersion, slice: &Value) -> Result<Value, ApiError> {
        self.call(
            "POST",
            &Self::slices_path(v),
            Some(slice),
            Read::object("create_slice", "a ResourceSlice"),
        )
        .await
    }

    /// Creates a slice without storing it (`dryRun=All`): the server authorizes, defaults,
    /// validates and drops what it does not keep exactly as for a create, and answers with
    /// the object it would store. How the publisher learns whether the server keeps
    /// partitionable devices' fields, without publishing anything.
    ///
    /// # Errors
    /// As [`Api::get_claim`]; a 422 for a slice the server refuses.
    pub async fn create_slice_dry_run(
        &self,
        v: ApiVersion,
        slice: &Value,
    ) -> Result<Value, ApiError> {
        self.call(
            "POST",
            &format!("{}?dryRun=All", Self::slices_path(v)),
            Some(slice),
            Read::object("create_slice_dry_run", "a ResourceSlice"),
        )
        .await
    }

    /// The server's Kubernetes minor version (`GET /version`, which every authenticated user
    /// may read): `34` for 1.34. Managed control planes write `minor` as `34+`; the digits
    /// count.
    ///
    /// # Errors
    /// The call failed, or the answer has no `major` 1 and numeric `minor`.
    pub async fn server_minor(&self) -> Result<u32, ApiError> {
        let v = self
            .call(
                "GET",
                "/version",
                None,
                Read::object("version", "a version"),
            )
            .await?;
        let digits = |key: &str| -> Option<u32> {
            let s = v[key].as_str()?;
            let d: String = s.chars().take_while(char::is_ascii_digit).collect();
            d.parse().ok()
        };
        match (digits("major"), digits("minor")) {
            (Some(1), Some(minor)) => Ok(minor),
            _ => Err(ApiError::Transport {
                verb: "GET",
                path: "/version".into(),
                message: format!("not a Kubernetes 1.x version: {v}"),
            }),
        }
    }

    /// Replaces a slice (its `metadata.resourceVersion` makes the update conditional).
    ///
    /// # Errors
    /// As [`Api::get_claim`].
    pub async fn update_slice(&self, v: ApiVersion, slice: &Value) -> Result<Value, ApiError> {
        let name = slice["metadata"]["name"].as_str().unwrap_or_default();
        self.call(
            "PUT",
            &format!("{}/{}", Self::slices_path(v), encode(name)),
            Some(slice),
            Read::object("update_slice", "a ResourceSlice"),
        )
        .await
    }

    /// Deletes a slice, on condition that it still has `uid` (a NotFound is success).
    ///
    /// # Errors
    /// As [`Api::get_claim`].
    pub async fn delete_slice(&self, v: ApiVersion, name: &str, uid: &str) -> Result<(), ApiError> {
        let body = serde_json::json!({
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": uid}
        });
        match self
            .call(
                "DELETE",
                &format!("{}/{}", Self::slices_path(v), encode(name)),
                Some(&body),
                Read::object("delete_slice", "a ResourceSlice"),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
