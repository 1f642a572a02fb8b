//! The one log line of each `mig apply` (and its dry run, `mig plan`): which config, what it
//! changed on which GPUs, the outcome and how long it took. A layout change destroys and
//! makes MIG devices under every claim-less workload on those GPUs, so operators audit it as
//! they audit prepares (README, "What the log says").

use std::time::Duration;

use gpushare_proto::{ErrorCode, MigApplyResult};
use serde_json::Value;

/// What a `mig_apply` request asked, read from its params before they are decoded (a
/// request refused as malformed is logged too, with what could be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MigAsk {
    /// The config's name in the layout file; `-` where the params have none.
    pub(super) config: String,
    /// Whether it was a plan only.
    pub(super) dry_run: bool,
}

impl MigAsk {
    /// What `params` ask.
    pub(super) fn of(params: Option<&Value>) -> MigAsk {
        let field = |name: &str| params.and_then(|p| p.get(name));
        MigAsk {
            config: field("config")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string(),
            dry_run: field("dry_run").and_then(Value::as_bool).unwrap_or(false),
        }
    }
}

/// What a plan changes, in one field per kind: the GPUs it touches, MIG mode changes, MIG
/// devices destroyed and created (counts: the answer lists them).
fn summary(result: &MigApplyResult) -> (String, usize, usize, usize) {
    let touched: Vec<&str> = result
        .gpus
        .iter()
        .filter(|g| g.set_mig_mode.is_some() || !g.destroy.is_empty() || !g.create.is_empty())
        .map(|g| g.gpu.as_str())
        .collect();
    let modes = result
        .gpus
        .iter()
        .filter(|g| g.set_mig_mode.is_some())
        .count();
    let destroyed = result.gpus.iter().map(|g| g.destroy.len()).sum();
    let created = result.gpus.iter().map(|g| g.create.len()).sum();
    let gpus = if touched.is_empty() {
        "-".to_string()
    } else {
        touched.join(",")
    };
    (gpus, modes, destroyed, created)
}

/// Logs `ask`'s outcome: its answer (`result`) or `error`, and how long it took.
pub(super) fn log_mig_apply(
    ask: &MigAsk,
    result: Option<&Value>,
    error: Option<(ErrorCode, &str)>,
    took: Duration,
) {
    let duration_ms = format!("{:.1}", took.as_secs_f64() * 1000.0);
    let method = if ask.dry_run { "mig_plan" } else { "mig_apply" };
    let config = ask.config.as_str();
    let Some((code, message)) = error else {
        let answer = result.and_then(|v| serde_json::from_value::<MigApplyResult>(v.clone()).ok());
        let (gpus, mig_mode_changes, destroyed, created) =
            answer.as_ref().map_or(("?".to_string(), 0, 0, 0), summary);
        tracing::info!(
            target: "gpushare::server",
            config, %gpus, mig_mode_changes, destroyed, created, outcome = %"ok", %duration_ms, "{method}"
        );
        return;
    };
    if code == ErrorCode::Internal {
        tracing::error!(target: "gpushare::server", config, outcome = %code.as_str(), error = message, %duration_ms, "{method}");
    } else {
        tracing::warn!(target: "gpushare::server", config, outcome = %code.as_str(), error = message, %duration_ms, "{method}");
    }
}
