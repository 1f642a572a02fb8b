//! NodePrepareResources / NodeUnprepareResources, the same for kubelet's v1 and v1beta1:
//! each claim of a call is served concurrently and bounded on its own, and answered in the
//! response map (never by failing the whole call). Prepare GETs the ResourceClaim, checks
//! its UID and allocation, and hands the whole object to gpushared; unprepare goes to
//! gpushared by UID alone (it keeps its own state, so a deleted claim or a restarted plugin
//! changes nothing).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::api::{Api, ApiError};
use crate::gpushared::{Gpushared, GpusharedError};
use crate::mapping::{check_claim, kubelet_devices, KubeletDevice};
use crate::metrics::Metrics;

/// kubelet's reference to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
}

/// GETs of a claim whose answer is cut off past its bound, before the claim fails.
pub const GET_ATTEMPTS: u32 = 3;

/// Method names as metrics and logs give them.
pub const PREPARE: &str = "NodePrepareResources";
/// See [`PREPARE`].
pub const UNPREPARE: &str = "NodeUnprepareResources";

/// A claim's failure: a short outcome for metrics and the message kubelet shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimError {
    /// `ApiError`, `Replaced`, `NotAllocated`, `Unreachable`, `Timeout`, or gpushared's code.
    pub outcome: String,
    /// The claim's `error` string.
    pub message: String,
}

/// The plugin's claim handling, shared by both API versions.
#[derive(Debug)]
pub struct Plugin {
    api: Arc<Api>,
    gpushared: Gpushared,
    metrics: Arc<Metrics>,
    bound: Duration,
}

/// What a claim is waiting for, for the message of a claim past its bound.
#[derive(Debug, Default)]
struct Stage(Mutex<String>);

impl Stage {
    fn set(&self, s: String) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
    }
    fn get(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn gpushared_error(what: &str, c: &ClaimRef, e: GpusharedError) -> ClaimError {
    match e {
        GpusharedError::Refused(body) => ClaimError {
            outcome: body.code.as_str().into(),
            message: format!(
                "gpushared refused to {what} ResourceClaim {}/{} ({}): {}: {}",
                c.namespace, c.name, c.uid, body.code, body.message
            ),
        },
        GpusharedError::Unreachable(m) => ClaimError {
            outcome: "Unreachable".into(),
            message: format!(
                "cannot {what} ResourceClaim {}/{} ({}): gpushared is unreachable: {m}",
                c.namespace, c.name, c.uid
            ),
        },
    }
}

impl Plugin {
    /// The plugin over `api` and `gpushared`; each claim's answer takes at most `bound`.
    pub fn new(
        api: Arc<Api>,
        gpushared: Gpushared,
        metrics: Arc<Metrics>,
        bound: Duration,
    ) -> Plugin {
        Plugin {
            api,
            gpushared,
            metrics,
            bound,
        }
    }

    async fn bounded<T>(
        &self,
        c: &ClaimRef,
        what: &str,
        f: impl std::future::Future<Output = Result<T, ClaimError>>,
        stage: &Stage,
    ) -> Result<T, ClaimError> {
        match tokio::time::timeout(self.bound, f).await {
            Ok(r) => r,
            Err(_) => Err(ClaimError {
                outcome: "Timeout".into(),
                message: format!(
                    "{what} of ResourceClaim {}/{} ({}) timed out after {} s waiting for {}",
                    c.namespace,
                    c.name,
                    c.uid,
                    self.bound.as_secs(),
                    stage.get()
                ),
            }),
        }
    }

    async fn prepare_one(
        &self,
        c: &ClaimRef,
        stage: &Stage,
    ) -> Result<Vec<KubeletDevice>, ClaimError> {
        stage.set(format!(
            "the API server (GET ResourceClaim {}/{})",
            c.namespace, c.name
        ));
        let claim = self.get_claim(c, stage).await.map_err(|e| {
            self.metrics.api_error("get_claim");
            ClaimError {
                outcome: "ApiError".into(),
                message: format!(
                    "cannot read ResourceClaim {}/{} ({}) from the API server: {e}",
                    c.namespace, c.name, c.uid
                ),
            }
        })?;
        check_claim(&claim, &c.namespace, &c.name, &c.uid).map_err(|e| ClaimError {
            outcome: match e {
                crate::mapping::ClaimCheckError::Replaced { .. } => "Replaced".into(),
                crate::mapping::ClaimCheckError::NotAllocated { .. } => "NotAllocated".into(),
            },
            message: e.to_string(),
        })?;
        stage.set(format!(
            "gpushared's prepare at {}",
            self.gpushared.socket().display()
        ));
        let result = self
            .gpushared
            .prepare(claim.clone())
            .await
            .map_err(|e| gpushared_error("prepare", c, e))?;
        Ok(kubelet_devices(&result, &claim))
    }

    /// GETs the claim; an answer cut off past its bound (a misbehaving server or proxy,
    /// perhaps for a moment) is asked again after 250 ms, then 500 ms (plus up to a quarter
    /// of jitter), [`GET_ATTEMPTS`] times in all, the claim's bound permitting.
    async fn get_claim(&self, c: &ClaimRef, stage: &Stage) -> Result<serde_json::Value, ApiError> {
        let mut pause = Duration::from_millis(250);
        let mut attempt = 1;
        loop {
            match self.api.get_claim(&c.namespace, &c.name).await {
                Err(e) if e.is_too_large() && attempt < GET_ATTEMPTS => {
                    tracing::warn!(
                        claim = %c.uid, namespace = %c.namespace, name = %c.name, attempt,
                        error = %e, "reading the ResourceClaim: retrying with back-off"
                    );
                    stage.set(format!(
                        "the API server (GET ResourceClaim {}/{}, attempt {} after: {e})",
                        c.namespace,
                        c.name,
                        attempt + 1
                    ));
                    let jitter = fastrand::u64(0..=pause.as_millis() as u64 / 4);
                    tokio::time::sleep(pause + Duration::from_millis(jitter)).await;
                    pause *= 2;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    /// Prepares every claim, concurrently; the map has one entry per distinct claim UID.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<Vec<KubeletDevice>, ClaimError>> {
        let claims = dedup(claims);
        let answers = join_all(claims.iter().map(|c| async move {
            let start = Instant::now();
            let stage = Stage::default();
            let r = self
                .bounded(c, "prepare", self.prepare_one(c, &stage), &stage)
                .await;
            let took = start.elapsed();
            let outcome = r.as_ref().map_or_else(|e| e.outcome.clone(), |_| "ok".into());
            self.metrics.claim(PREPARE, &outcome, took);
            match &r {
                Ok(devices) => tracing::info!(
                    claim = %c.uid, namespace = %c.namespace, name = %c.name,
                    devices = %devices.iter().map(|d| d.device_name.as_str()).collect::<Vec<_>>().join(","),
                    outcome = %"ok", duration_ms = %format!("{:.1}", took.as_secs_f64() * 1e3),
                    "prepare"
                ),
                Err(e) => tracing::warn!(
                    claim = %c.uid, namespace = %c.namespace, name = %c.name,
                    outcome = %e.outcome, duration_ms = %format!("{:.1}", took.as_secs_f64() * 1e3),
                    error = %e.message, "prepare"
                ),
            }
            (c.uid.clone(), r)
        }))
        .await;
        answers.into_iter().collect()
    }

    /// Unprepares every claim by UID, concurrently; an unknown UID succeeds.
    pub async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<(), ClaimError>> {
        let claims = dedup(claims);
        let answers = join_all(claims.iter().map(|c| async move {
            let start = Instant::now();
            let stage = Stage::default();
            stage.set(format!(
                "gpushared's unprepare at {}",
                self.gpushared.socket().display()
            ));
            let work = async {
                self.gpushared
                    .unprepare(&c.uid)
                    .await
                    .map_err(|e| gpushared_error("unprepare", c, e))
            };
            let r = self.bounded(c, "unprepare", work, &stage).await;
            let took = start.elapsed();
            let outcome = r
                .as_ref()
                .map_or_else(|e| e.outcome.clone(), |_| "ok".into());
            self.metrics.claim(UNPREPARE, &outcome, took);
            match &r {
                Ok(u) => tracing::info!(
                    claim = %c.uid, namespace = %c.namespace, name = %c.name,
                    released = u.released, outcome = %"ok",
                    duration_ms = %format!("{:.1}", took.as_secs_f64() * 1e3), "unprepare"
                ),
                Err(e) => tracing::warn!(
                    claim = %c.uid, namespace = %c.namespace, name = %c.name,
                    outcome = %e.outcome, duration_ms = %format!("{:.1}", took.as_secs_f64() * 1e3),
                    error = %e.message, "unprepare"
                ),
            }
            (c.uid.clone(), r.map(|_| ()))
        }))
        .await;
        answers.into_iter().collect()
    }
}

/// One entry per UID (kubelet never repeats one, but a map cannot answer twice anyway).
fn dedup(mut claims: Vec<ClaimRef>) -> Vec<ClaimRef> {
    let mut seen = std::collections::BTreeSet::new();
    claims.retain(|c| seen.insert(c.uid.clone()));
    claims
}
