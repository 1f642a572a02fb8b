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

/// A check's outcome, serialized as `gpushare doctor -o json` writes its own (`ok`, `fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Passed.
    Ok,
    /// Failed; the check's hint says what to do.
    Fail,
}

/// One check's outcome: the shape of `gpushare doctor`'s checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name.
    pub name: &'static str,
    /// Passed or failed.
    pub status: Status,
    /// What was found, or what is wrong.
    pub detail: String,
    /// How to fix it; empty (and left out of the JSON) when it passed.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hint: String,
}

impl Check {
    fn pass(name: &'static str, detail: String) -> Check {
        Check {
            name,
            status: Status::Ok,
            detail,
            hint: String::new(),
        }
    }

    fn fail(name: &'static str, detail: String, hint: &str) -> Check {
        Check {
            name,
            status: Status::Fail,
            detail,
            hint: hint.to_string(),
        }
    }

    /// Whether it passed.
    pub fn ok(&self) -> bool {
        self.status == Status::Ok
    }
}

/// What to do when the plugin's sockets do not answer as expected.
const SOCKET_HINT: &str = "under the DaemonSet: kubectl -n gpushare get pods -o wide (the node's plugin pod) and its logs; as the host unit: systemctl status gpushare-dra; journalctl -u gpushare-dra (a plugin started by hand: give the probe its --plugins-dir and --registry-dir)";
/// What to do when gpushared does not answer.
const GPUSHARED_HINT: &str = "systemctl status gpushared; journalctl -u gpushared (a gpushared started by hand: give the probe its --gpushared-socket)";
/// What to do when the names disagree.
const NAMES_HINT: &str = "make node_name / driver_name in /etc/gpushare/dra.toml and gpushared's [node] name / drivers agree, then restart both";

/// The names the running plugin serves, where they were read from its process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningNames {
    /// Its node name (its `--node-name`, else its config file's, else its `NODE_NAME`,
    /// else the host's name: as it resolved it at its start).
    pub node_name: String,
    /// Its driver name.
    pub driver_name: String,
    /// Its pid, for the check's detail.
    pub pid: i32,
}

/// Runs the checks for the plugin configured by `cfg`. The names check compares
/// `running`'s names with gpushared's where the running plugin's were read (a flag given to
/// the plugin, e.g. through `GPUSHARE_DRA_ARGS`, that the probe was not given), else `cfg`'s.
pub async fn probe(cfg: &Config, running: Option<RunningNames>) -> Vec<Check> {
    let t = Duration::from_secs(2);
    let reg = cfg.registration_socket();
    let dra = cfg.dra_socket();
    let mut out = Vec::new();
    out.push(match sockets::get_info(&reg, t).await {
        Ok(i) if i.name == cfg.driver_name && i.endpoint == dra.display().to_string() => {
            Check::pass(
                "registration",
                format!(
                    "{} answers GetInfo: {} {} at {} ({})",
                    reg.display(),
                    i.r#type,
                    i.name,
                    i.endpoint,
                    i.supported_versions.join(", ")
                ),
            )
        }
        Ok(i) => Check::fail(
            "registration",
            format!(
                "{} answers for driver {:?} at {}, expected {:?} at {}",
                reg.display(),
                i.name,
                i.endpoint,
                cfg.driver_name,
                dra.display()
            ),
            SOCKET_HINT,
        ),
        Err(e) => Check::fail(
            "registration",
            format!("{}: {e} (is gpushare-dra running?)", reg.display()),
            SOCKET_HINT,
        ),
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
        Ok(()) => Check::pass(
            "dra-socket",
            format!("{} answers NodePrepareResources (v1)", dra.display()),
        ),
        Err(e) => Check::fail("dra-socket", format!("{}: {e}", dra.display()), SOCKET_HINT),
    });
    let g = Gpushared::new(&cfg.gpushared_socket, t);
    let (node, driver, whose) = match &running {
        Some(r) => (
            r.node_name.as_str(),
            r.driver_name.as_str(),
            format!(" (the running plugin's, pid {})", r.pid),
        ),
        None => (
            cfg.node_name.as_str(),
            cfg.driver_name.as_str(),
            // No plugin found: the names are the ones a plugin of this configuration would use.
            " (this configuration's; no running plugin found)".to_string(),
        ),
    };
    out.push(match g.health().await {
        Ok(h) => match Identity::of_health(&h).check(node, driver) {
            Ok(()) => Check::pass(
                "names",
                format!("node {node:?} and driver {driver:?}{whose} agree with gpushared"),
            ),
            Err(line) => Check::fail("names", format!("{line}{whose}"), NAMES_HINT),
        },
        Err(e) => Check::fail("names", e.to_string(), GPUSHARED_HINT),
    });
    out
}
