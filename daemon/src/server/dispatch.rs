//! One request's answer: authorised by the peer's credentials, run on tokio's blocking pool
//! within the request timeout, its params decoded (objects only), its outcome counted in the
//! metrics and, for prepare and unprepare, logged in one line. `list_claims` is only checked
//! here: its answer is written as it is read ([`super::listing`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_proto::{
    AttachParams, Attachment, DetachParams, ErrorCode, Method, PrepareParams, Response, UidParams,
    VersionInfo, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::decode::{decode_request, error_response};
use super::listing::Listing;
use super::mig_audit::log_mig_apply;
use super::{authorize, shape, Peer, ServerConfig};
use crate::claim::wire::claim_info;
use crate::error::ServiceError;
use crate::service::Service;

/// Decodes `params` of `method`, an object (never serde's array form of a struct).
pub(super) fn params<T: DeserializeOwned>(
    method: Method,
    p: Option<Value>,
) -> Result<T, ServiceError> {
    if let Some(why) = shape::params_problem(p.as_ref()) {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("params of {method}: {why}"),
        ));
    }
    serde_json::from_value(p.unwrap_or(Value::Null)).map_err(|e| {
        ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("params of {method}: {e}"),
        )
    })
}

/// Methods without parameters accept none, `null` or `{}`: anything else is likely a mistake.
pub(super) fn no_params(method: Method, p: &Option<Value>) -> Result<(), ServiceError> {
    match p {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(o)) if o.is_empty() => Ok(()),
        Some(other) => Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("{method} takes no params, got {other}"),
        )),
    }
}

fn to_value<T: Serialize>(v: T) -> Result<Value, ServiceError> {
    serde_json::to_value(v).map_err(|e| ServiceError::internal(format!("encoding result: {e}")))
}

/// What a connection sends back for one request line.
#[derive(Debug)]
pub enum Answer {
    /// A whole response: every method but `list_claims`, and every refusal. Small: one claim,
    /// the node's GPUs, or less.
    Whole(Response),
    /// `list_claims`, checked and allowed: written as it is read ([`super::listing::write`]).
    Claims(Listing),
}

/// Answers one request line from `peer` (`None`: credentials unknown, so only refusals). The
/// answer carries the request's protocol version.
pub async fn handle(
    service: &Arc<Service>,
    cfg: &ServerConfig,
    peer: Option<&Peer>,
    line: &[u8],
) -> Answer {
    let (request, method) = match decode_request(line) {
        Ok(r) => r,
        Err(response) => return Answer::Whole(response),
    };
    let version = request.version;
    let mut answer = respond(service, cfg, peer, request, method).await;
    if let Answer::Whole(response) = &mut answer {
        response.version = version;
    }
    answer
}

/// [`handle`] once the line is a request: its answer, in version 1 when whole ([`handle`]
/// gives it the request's version).
async fn respond(
    service: &Arc<Service>,
    cfg: &ServerConfig,
    peer: Option<&Peer>,
    request: gpushare_proto::Request,
    method: Method,
) -> Answer {
    let id = request.id;
    if let Err(denied) = authorize(cfg, peer, method) {
        return Answer::Whole(error_response(
            id,
            ErrorCode::PermissionDenied,
            denied.to_string(),
        ));
    }
    let started = Instant::now();
    if method == Method::ListClaims {
        return match Listing::of(request.version, id, request.params) {
            Ok(listing) => Answer::Claims(listing),
            Err(e) => {
                if let Some(m) = &cfg.metrics {
                    m.observe(method, Some(e.code), started.elapsed());
                }
                Answer::Whole(error_response(id, e.code, e.message))
            }
        };
    }
    let claim_uid = claim_uid_of(method, request.params.as_ref());
    let service = Arc::clone(service);
    let p = request.params;
    let uid = claim_uid.clone();
    let work = tokio::task::spawn_blocking(move || {
        // What the claim was (unprepare removes it) or became, for the log line.
        let claim_info = |uid: &Option<String>| uid.as_deref().and_then(|u| service.claim(u).ok());
        let released = (method == Method::Unprepare)
            .then(|| claim_info(&uid))
            .flatten();
        let result = dispatch(&service, method, p);
        let info = match method {
            Method::Prepare if result.is_ok() => claim_info(&uid),
            _ => released,
        };
        (result, info)
    });
    let Ok(outcome) = tokio::time::timeout(cfg.request_timeout, work).await else {
        if let Some(m) = &cfg.metrics {
            m.observe(method, Some(ErrorCode::Internal), started.elapsed());
        }
        tracing::warn!(%method, id, timeout_ms = cfg.request_timeout.as_millis() as u64, "request exceeded its time; it finishes in the background");
        return Answer::Whole(error_response(
            id,
            ErrorCode::Internal,
            format!(
                "{method} did not finish within {:?}; it goes on in the background (ask get_claim, or retry: prepare and unprepare are idempotent)",
                cfg.request_timeout
            ),
        ));
    };
    let took = started.elapsed();
    let (outcome, info) = match outcome {
        Ok((result, info)) => (Ok(result), info),
        Err(join) => (Err(join), None),
    };
    let error = match &outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some((e.code, e.message.as_str())),
        Err(_) => Some((ErrorCode::Internal, "the request's task panicked")),
    };
    if let Some(m) = &cfg.metrics {
        m.observe(method, error.map(|e| e.0), took);
    }
    if matches!(method, Method::Prepare | Method::Unprepare) {
        let uid = claim_uid.as_deref().unwrap_or("?");
        log_claim_event(method, uid, info.as_deref(), error, took);
    }
    Answer::Whole(match outcome {
        Ok(Ok(result)) => Response {
            version: OLDEST_PROTOCOL_VERSION,
            id,
            result: Some(result),
            error: None,
        },
        Ok(Err(e)) => error_response(id, e.code, e.message),
        Err(join) => error_response(id, ErrorCode::Internal, format!("{method} failed: {join}")),
    })
}

/// Checks a claim UID given as the request parameter `field`, naming that parameter (the
/// service's own check names `metadata.uid`, which only a prepare's claim has).
fn claim_uid_param<'a>(method: Method, field: &str, uid: &'a str) -> Result<&'a str, ServiceError> {
    match crate::config::claim_uid_problem(uid) {
        None => Ok(uid),
        Some(why) => Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("params of {method}: {field}: {uid:?} is not a valid claim UID: it {why}"),
        )),
    }
}

/// Runs one request on the service (blocking).
fn dispatch(service: &Service, method: Method, p: Option<Value>) -> Result<Value, ServiceError> {
    match method {
        Method::Prepare => to_value(service.prepare(&params::<PrepareParams>(method, p)?.claim)?),
        Method::Unprepare => {
            let p = params::<UidParams>(method, p)?;
            to_value(service.unprepare(claim_uid_param(method, "uid", &p.uid)?)?)
        }
        Method::GetClaim => {
            let p = params::<UidParams>(method, p)?;
            to_value(claim_info(
                &*service.claim(claim_uid_param(method, "uid", &p.uid)?)?,
            ))
        }
        // Answered by `respond` as it is read, never as one value.
        Method::ListClaims => Err(ServiceError::internal(
            "list_claims is written as it is read, not dispatched",
        )),
        Method::ListGpus => {
            no_params(method, &p)?;
            to_value(service.list_gpus())
        }
        Method::Attach => {
            let p = params::<AttachParams>(method, p)?;
            claim_uid_param(method, "claim_uid", &p.claim_uid)?;
            to_value(Attachment::from(&service.attach(&p)?))
        }
        Method::Detach => {
            let p = params::<DetachParams>(method, p)?;
            claim_uid_param(method, "claim_uid", &p.claim_uid)?;
            to_value(service.detach(&p)?)
        }
        Method::Health => {
            no_params(method, &p)?;
            to_value(service.health())
        }
        Method::Version => {
            no_params(method, &p)?;
            to_value(VersionInfo {
                daemon: env!("CARGO_PKG_VERSION").to_string(),
                protocol: PROTOCOL_VERSION,
            })
        }
        Method::MigApply => {
            let p = params::<gpushare_proto::MigApplyParams>(method, p)?;
            // Logged where the work ends, not where the answer is sent: an apply that
            // outlives the request's time still changes the layout in the background.
            let started = Instant::now();
            let result = service.mig_apply(&p);
            log_mig_apply(&p, &result, started.elapsed());
            to_value(result?)
        }
    }
}

/// The claim UID a prepare (`claim.metadata.uid`) or unprepare (`uid`) request names.
fn claim_uid_of(method: Method, params: Option<&Value>) -> Option<String> {
    let pointer = match method {
        Method::Prepare => "/claim/metadata/uid",
        Method::Unprepare => "/uid",
        _ => return None,
    };
    params?.pointer(pointer)?.as_str().map(str::to_string)
}

/// The one log line of each prepare and unprepare: claim UID, strategy, devices, outcome
/// and duration (refusals at `warn`, host failures at `error`).
pub(super) fn log_claim_event(
    method: Method,
    uid: &str,
    info: Option<&crate::claim::Claim>,
    error: Option<(ErrorCode, &str)>,
    took: Duration,
) {
    let strategy = info.map_or_else(|| "-".to_string(), |c| claim_info(c).strategy_summary());
    let devices = info.map_or_else(
        || "-".to_string(),
        |c| {
            let d: Vec<&str> = c
                .groups
                .iter()
                .flat_map(|g| g.devices.iter().map(|d| d.device.as_str()))
                .collect();
            d.join(",")
        },
    );
    // To 0.1 ms, as gpushare-dra logs it: more digits are float noise, not precision.
    let duration_ms = format!("{:.1}", took.as_secs_f64() * 1000.0);
    // Under the server's target, as before the module was split: operators grep and filter
    // these lines by `gpushare::server` (docs/node.md, the log lines under "Config").
    match error {
        None => tracing::info!(
            target: "gpushare::server",
            claim = %uid, %strategy, %devices, outcome = %"ok", %duration_ms, "{method}"
        ),
        Some((code @ ErrorCode::Internal, message)) => tracing::error!(
            target: "gpushare::server",
            claim = %uid, %strategy, %devices, outcome = %code.as_str(), error = message, %duration_ms, "{method}"
        ),
        Some((code, message)) => tracing::warn!(
            target: "gpushare::server",
            claim = %uid, %strategy, %devices, outcome = %code.as_str(), error = message, %duration_ms, "{method}"
        ),
    }
}
