//! The node's ResourceSlices, watch-driven: list and watch this node's slices of our driver
//! (field selector `spec.driver=<driver>,spec.nodeName=<node>`, the only list the Node
//! authorizer allows a node), poll gpushared's `list_gpus` every second, and whenever what
//! the server holds differs from what we want, apply [`plan::plan`]'s changes at once. So
//! slices someone deleted (kubelet wipes a node's slices when it starts) come back, and a
//! change of the node's devices (a MIG layout) is published, within a few seconds. Slices
//! are written in the highest `resource.k8s.io` version the server serves, owned by the
//! Node (`controller: true`) so they go with it. An ordinary stop leaves them (kubelet wipes
//! them 30 s after the plugin goes away); [`remove_all`] removes them.
//!
//! Where gpushared reports GPUs it can cut into MIG slices, the publisher first learns
//! ([`partitionable::learn`]) whether the server keeps partitionable devices' counters, and
//! publishes every slice with one counter set per GPU where it does (in the layout its
//! version wants), only the MIG devices that exist where it does not, saying once which and
//! why. A write that comes back without the counters it carried turns the publisher static.

pub mod partitionable;
pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use gpushare_proto::GpuInfo;
use gpushare_slice::{build_pool_in, ApiVersion, Layout, ResourceSlice};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::api::{Api, ApiError, WatchEvent};
use crate::gpushared::Gpushared;
use crate::metrics::Metrics;
use partitionable::{kept, learn, Learned};
use plan::{plan, Change};

/// How often gpushared's devices are read.
const POLL: Duration = Duration::from_secs(1);

/// Publishes one node's pool of one driver.
#[derive(Debug)]
pub struct Publisher {
    api: Arc<Api>,
    gpushared: Gpushared,
    metrics: Arc<Metrics>,
    driver: String,
    node: String,
}

/// Why one pass stopped; the loop lists again after a pause.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("{0}")]
    Other(String),
}

/// The layout learned from the server, and what was last said about it.
#[derive(Debug, Default)]
struct Learning {
    learned: Option<Learned>,
    said: Option<Learned>,
}

impl Learning {
    fn set(&mut self, l: Learned) {
        if self.said.as_ref() != Some(&l) {
            if l.layout == Layout::Static {
                tracing::warn!(layout = %l.layout, "{}", l.why);
            } else {
                tracing::info!(layout = %l.layout, "{}", l.why);
            }
            self.said = Some(l.clone());
        }
        self.learned = Some(l);
    }
}

struct Backoff(Duration);

impl Backoff {
    fn reset(&mut self) {
        self.0 = Duration::from_millis(250);
    }
    async fn wait(&mut self, shutdown: &mut watch::Receiver<bool>) {
        let jitter = Duration::from_millis(fastrand::u64(0..=self.0.as_millis() as u64 / 4));
        tokio::select! {
            () = tokio::time::sleep(self.0 + jitter) => {}
            _ = shutdown.changed() => {}
        }
        self.0 = (self.0 * 2).min(Duration::from_secs(10));
    }
}

impl Publisher {
    /// The publisher of `node`'s pool of `driver`.
    pub fn new(
        api: Arc<Api>,
        gpushared: Gpushared,
        metrics: Arc<Metrics>,
        driver: &str,
        node: &str,
    ) -> Publisher {
        Publisher {
            api,
            gpushared,
            metrics,
            driver: driver.into(),
            node: node.into(),
        }
    }

    /// Runs until `shutdown` turns true. Errors are logged and counted, then retried with
    /// backoff (250 ms doubling to 10 s).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Backoff(Duration::from_millis(250));
        let mut gpus: Option<Vec<GpuInfo>> = None;
        let mut learning = Learning::default();
        while !*shutdown.borrow() {
            match self
                .pass(&mut gpus, &mut learning, &mut shutdown, &mut backoff)
                .await
            {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "publishing ResourceSlices: retrying");
                    if let PassError::Api(a) = &e {
                        if a.is_not_served() {
                            self.api.forget_version();
                            // Another server version: learn it again.
                            learning.learned = None;
                        }
                    }
                    backoff.wait(&mut shutdown).await;
                }
            }
        }
    }

    async fn owner(&self) -> Result<Value, PassError> {
        let node = self.api.get_node(&self.node).await.inspect_err(|_| {
            self.metrics.api_error("get_node");
        })?;
        let uid = node
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .ok_or_else(|| PassError::Other(format!("Node {} has no metadata.uid", self.node)))?;
        Ok(
            json!({"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid, "controller": true}),
        )
    }

    /// One list, then watch until the watch ends or fails.
    async fn pass(
        &self,
        gpus: &mut Option<Vec<GpuInfo>>,
        learning: &mut Learning,
        shutdown: &mut watch::Receiver<bool>,
        backoff: &mut Backoff,
    ) -> Result<(), PassError> {
        let v = self
            .api
            .version()
            .await
            .inspect_err(|_| self.metrics.api_error("discovery"))?;
        let owner = self.owner().await?;
        // The node's devices bound the list of its slices: learn them first where gpushared
        // answers (else the list is bounded for none but the slack).
        if gpus.is_none() {
            *gpus = self.gpushared.list_gpus().await.ok();
        }
        let (items, rv) = self
            .api
            .list_slices(
                v,
                &self.driver,
                &self.node,
                self.slice_count(gpus.as_deref()),
            )
            .await
            .inspect_err(|_| self.metrics.api_error("list_slices"))?;
        let mut cache: BTreeMap<String, Value> = items
            .into_iter()
            .map(|s| (name_of(&s).to_string(), s))
            .collect();
        let mut events = Box::pin(
            self.api
                .watch_slices(v, &self.driver, &self.node, &rv)
                .await
                .inspect_err(|_| self.metrics.api_error("watch_slices"))?,
        );
        let mut ticker = tokio::time::interval(POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut dirty = true;
        loop {
            if dirty {
                if let Some(g) = gpus.as_deref() {
                    self.reconcile(v, &owner, g, learning, &mut cache).await?;
                    backoff.reset();
                }
                dirty = false;
            }
            tokio::select! {
                ev = events.next() => match ev {
                    None => return Ok(()),
                    Some(WatchEvent::Upsert(o)) => {
                        cache.insert(name_of(&o).to_string(), o);
                        dirty = true;
                    }
                    Some(WatchEvent::Deleted(o)) => {
                        if cache.remove(name_of(&o)).is_some() {
                            tracing::info!(slice = %name_of(&o), "ResourceSlice deleted by someone else; publishing again");
                        }
                        dirty = true;
                    }
                    Some(WatchEvent::Bookmark(_)) => {}
                    Some(WatchEvent::Error(e)) => {
                        return Err(PassError::Other(format!("watch: {e}")));
                    }
                },
                _ = ticker.tick() => {
                    match self.gpushared.list_gpus().await {
                        Ok(now) => {
                            let changed = gpus
                                .as_deref()
                                .is_none_or(|old| self.published(old) != self.published(&now));
                            if changed {
                                if gpus.is_some() {
                                    tracing::info!("the node's devices changed; publishing them");
                                }
                                *gpus = Some(now);
                                dirty = true;
                            }
                        }
                        // Keep what is published; publish nothing new until it answers.
                        Err(e) => tracing::debug!(error = %e, "list_gpus"),
                    }
                }
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }

    /// The most slices a pool of `gpus` is published in, in any layout (0 before gpushared
    /// has answered): what bounds the list of the node's slices.
    fn slice_count(&self, gpus: Option<&[GpuInfo]>) -> usize {
        gpus.map_or(0, |g| {
            [Layout::Static, Layout::Combined, Layout::Split]
                .map(|l| build_pool_in(g, &self.node, &self.driver, 0, l).len())
                .into_iter()
                .max()
                .unwrap_or(0)
        })
    }

    /// What a pool of `gpus` would be in either layout: a change of anything else (a
    /// claim's holders, a compute mode) publishes nothing.
    fn published(&self, gpus: &[GpuInfo]) -> [Vec<ResourceSlice>; 2] {
        [Layout::Static, Layout::Combined]
            .map(|l| build_pool_in(gpus, &self.node, &self.driver, 0, l))
    }

    /// The layout to publish `gpus` in: static where no GPU has counters to publish (nothing
    /// to learn), else what the server was found to keep.
    async fn layout(
        &self,
        v: ApiVersion,
        owner: &Value,
        gpus: &[GpuInfo],
        learning: &mut Learning,
    ) -> Result<Layout, PassError> {
        let has_counters = build_pool_in(gpus, &self.node, &self.driver, 0, Layout::Combined)
            .iter()
            .any(|s| !s.spec.shared_counters.is_empty());
        if !has_counters {
            return Ok(Layout::Static);
        }
        if let Some(l) = &learning.learned {
            return Ok(l.layout);
        }
        let l = learn(&self.api, v, &self.node, &self.driver, owner)
            .await
            .inspect_err(|_| self.metrics.api_error("learn_partitionable"))?;
        let layout = l.layout;
        learning.set(l);
        Ok(layout)
    }

    async fn reconcile(
        &self,
        v: ApiVersion,
        owner: &Value,
        gpus: &[GpuInfo],
        learning: &mut Learning,
        cache: &mut BTreeMap<String, Value>,
    ) -> Result<(), PassError> {
        let layout = self.layout(v, owner, gpus, learning).await?;
        let pool = build_pool_in(gpus, &self.node, &self.driver, 0, layout);
        let existing: Vec<Value> = cache.values().cloned().collect();
        let p = plan(&existing, &pool, &self.node, v);
        let slice_of = |index: usize| -> ResourceSlice {
            let mut s = pool[index].clone();
            s.spec.pool.generation = p.generation;
            s
        };
        // A write that lost the counters it carried: the server stopped keeping them.
        let dropped = |learning: &mut Learning, sent: &ResourceSlice, got: &Value| {
            if layout.is_partitionable() && !kept(sent, got, v) {
                learning.set(Learned {
                    layout: Layout::Static,
                    why: "the API server dropped the counters of a ResourceSlice it stored (its DRAPartitionableDevices feature was turned off): publishing only the MIG devices that exist".into(),
                });
                return Err(PassError::Other(
                    "counters dropped by the API server; publishing again without them".into(),
                ));
            }
            Ok(())
        };
        for change in &p.changes {
            match change {
                Change::Create { index } => {
                    let sent = slice_of(*index);
                    let obj = json!({
                        "apiVersion": v.api_version(),
                        "kind": "ResourceSlice",
                        "metadata": {
                            "generateName": format!("{}-{}-", self.node, self.driver),
                            "ownerReferences": [owner],
                        },
                        "spec": sent.to_api_object(v)["spec"],
                    });
                    let made = self
                        .api
                        .create_slice(v, &obj)
                        .await
                        .inspect_err(|_| self.metrics.api_error("create_slice"))?;
                    tracing::info!(slice = %name_of(&made), generation = p.generation, devices = sent.spec.devices.len(), counter_sets = sent.spec.shared_counters.len(), "ResourceSlice created");
                    cache.insert(name_of(&made).to_string(), made.clone());
                    dropped(learning, &sent, &made)?;
                }
                Change::Update { name, index } => {
                    let sent = slice_of(*index);
                    let mut obj = cache.get(name).cloned().unwrap_or_else(|| json!({}));
                    obj["apiVersion"] = json!(v.api_version());
                    obj["kind"] = json!("ResourceSlice");
                    obj["spec"] = sent.to_api_object(v)["spec"].clone();
                    let made = self
                        .api
                        .update_slice(v, &obj)
                        .await
                        .inspect_err(|_| self.metrics.api_error("update_slice"))?;
                    tracing::info!(slice = %name, generation = p.generation, devices = sent.spec.devices.len(), counter_sets = sent.spec.shared_counters.len(), "ResourceSlice updated");
                    cache.insert(name.clone(), made.clone());
                    dropped(learning, &sent, &made)?;
                }
                Change::Delete { name, uid } => {
                    self.api
                        .delete_slice(v, name, uid)
                        .await
                        .inspect_err(|_| self.metrics.api_error("delete_slice"))?;
                    tracing::info!(slice = %name, "obsolete ResourceSlice deleted");
                    cache.remove(name);
                }
            }
        }
        self.metrics
            .published_slices
            .set(i64::try_from(cache.len()).unwrap_or(i64::MAX));
        self.metrics.published_devices.set(
            i64::try_from(pool.iter().map(|s| s.spec.devices.len()).sum::<usize>())
                .unwrap_or(i64::MAX),
        );
        Ok(())
    }
}

fn name_of(o: &Value) -> &str {
    o.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Deletes this node's slices of `driver` (`gpushare-dra --remove-slices`, run by the RPM's
/// erase scriptlet); returns how many were deleted.
///
/// # Errors
/// The API server refused or could not be reached.
pub async fn remove_all(api: &Api, driver: &str, node: &str) -> Result<usize, ApiError> {
    let v = api.version().await?;
    let (items, _) = api.list_slices(v, driver, node, 0).await?;
    for s in &items {
        let uid = s
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        api.delete_slice(v, name_of(s), uid).await?;
    }
    Ok(items.len())
}
