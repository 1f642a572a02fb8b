//! `gpushare-dra probe`: is the running plugin answering as kubelet expects? Its
//! registration socket answers `GetInfo` with our driver and endpoint, its DRA socket
//! answers an empty `NodePrepareResources` (what NVIDIA's health probe calls), and
//! gpushared's node (and drivers, where it reports them) agree with ours. `gpushare doctor`
//! runs it.

use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use crate::gpushared::{Gpushared, Identity};
use crate::grpc::v1;
use crate::sockets;

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name.
    pub name: &'static str,
    /// Passed.
    pub ok: bool,
    /// What was found, or what is wrong.
    pub detail: String,
}

/// Runs the checks for the plugin configured by `cfg`.
pub async fn probe(cfg: &Config) -> Vec<Check> {
    let t = Duration::from_secs(2);
    let reg = cfg.registration_socket();
    let dra = cfg.dra_socket();
    let mut out = Vec::new();
    out.push(match sockets::get_info(&reg, t).await {
        Ok(i) if i.name == cfg.driver_name && i.endpoint == dra.display().to_string() => Check {
            name: "registration",
            ok: true,
            detail: format!(
                "{} answers GetInfo: {} {} at {} ({})",
                reg.display(),
                i.r#type,
                i.name,
                i.endpoint,
                i.supported_versions.join(", ")
            ),
        },
        Ok(i) => Check {
            name: "registration",
            ok: false,
            detail: format!(
                "{} answers for driver {:?} at {}, expected {:?} at {}",
                reg.display(),
                i.name,
                i.endpoint,
                cfg.driver_name,
                dra.display()
            ),
        },
        Err(e) => Check {
            name: "registration",
            ok: false,
            detail: format!("{}: {e} (is gpushare-dra running?)", reg.display()),
        },
    });
    let dra_check = async {
        let ch = sockets::channel(&dra, t).await?;
        let mut c = v1::dra_plugin_client::DraPluginClient::new(ch);
        c.node_prepare_resources(v1::NodePrepareResourcesRequest { claims: Vec::new() })
            .await
            .map_err(|s| s.message().to_string())?;
        Ok::<_, String>(())
    };
    out.push(match dra_check.await {
        Ok(()) => Check {
            name: "dra-socket",
            ok: true,
            detail: format!("{} answers NodePrepareResources (v1)", dra.display()),
        },
        Err(e) => Check {
            name: "dra-socket",
            ok: false,
            detail: format!("{}: {e}", dra.display()),
        },
    });
    let g = Gpushared::new(&cfg.gpushared_socket, t);
    out.push(match g.health().await {
        Ok(h) => match Identity::of_health(&h).check(&cfg.node_name, &cfg.driver_name) {
            Ok(()) => Check {
                name: "names",
                ok: true,
                detail: format!(
                    "node {:?} and driver {:?} agree with gpushared",
                    cfg.node_name, cfg.driver_name
                ),
            },
            Err(line) => Check {
                name: "names",
                ok: false,
                detail: line,
            },
        },
        Err(e) => Check {
            name: "names",
            ok: false,
            detail: e.to_string(),
        },
    });
    out
}
