//! The one log line of each `mig apply` (and its dry run, `mig plan`): which config, what it
//! changed on which GPUs, the outcome and how long it took. A layout change destroys and
//! makes MIG devices under every claim-less workload on those GPUs, so operators audit it as
//! they audit prepares (docs/node.md, the log lines under "Config").

use std::time::Duration;

use gpushare_proto::{ErrorCode, MigApplyParams, MigApplyResult};

use crate::error::ServiceError;

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

/// Logs the outcome of `asked` (`mig_plan` for a dry run, else `mig_apply`): its `result`,
/// and how long it `took`. Refusals at `warn`, host failures at `error`, as prepares are.
pub(super) fn log_mig_apply(
    asked: &MigApplyParams,
    result: &Result<MigApplyResult, ServiceError>,
    took: Duration,
) {
    let duration_ms = format!("{:.1}", took.as_secs_f64() * 1000.0);
    let method = if asked.dry_run {
        "mig_plan"
    } else {
        "mig_apply"
    };
    let config = asked.config.as_str();
    match result {
        Ok(answer) => {
            let (gpus, mig_mode_changes, destroyed, created) = summary(answer);
            tracing::info!(
                target: "gpushare::server",
                config, %gpus, mig_mode_changes, destroyed, created, outcome = %"ok", %duration_ms, "{method}"
            );
        }
        Err(e) if e.code == ErrorCode::Internal => {
            tracing::error!(target: "gpushare::server", config, outcome = %e.code.as_str(), error = e.message.as_str(), %duration_ms, "{method}");
        }
        Err(e) => {
            tracing::warn!(target: "gpushare::server", config, outcome = %e.code.as_str(), error = e.message.as_str(), %duration_ms, "{method}");
        }
    }
}
