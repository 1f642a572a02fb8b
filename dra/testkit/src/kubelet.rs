//! A kubelet stand-in for tests only (no kubelet can be installed here), generated from the
//! same protos and behaving as kubelet does (kubernetes/kubernetes' `pkg/kubelet/cm/dra` and
//! `pkg/kubelet/pluginmanager/pluginwatcher`, whose README describes registration): it finds
//! the registration socket in its registry directory (names starting with `.` ignored),
//! calls `GetInfo` within 1 s and checks every field, picks the DRAPlugin version its own
//! release prefers (1.34+: v1; 1.33: v1beta1), dials the endpoint, and sends
//! `NotifyRegistrationStatus`; its prepare and unprepare calls require an entry for every
//! claim and none for a claim it did not send, and fail as kubelet fails them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use gpushare_dra::grpc::registration::{
    registration_client::RegistrationClient, InfoRequest, PluginInfo, RegistrationStatus,
};
use gpushare_dra::grpc::{v1, v1beta1};
use tonic::transport::Channel;

/// Which kubelet this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Kubernetes 1.33: prefers v1beta1.DRAPlugin.
    K133,
    /// Kubernetes 1.34+: prefers v1.DRAPlugin.
    K134,
}

/// A claim as kubelet sends it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// A device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// A registered plugin.
#[derive(Debug, Clone)]
pub struct Registered {
    pub info: PluginInfo,
    pub socket: PathBuf,
    pub socket_mtime: SystemTime,
    pub version: &'static str,
    channel: Channel,
}

/// The stand-in.
#[derive(Debug)]
pub struct Kubelet {
    pub registry_dir: PathBuf,
    pub release: Release,
}

async fn channel(path: &Path, timeout: Duration) -> Result<Channel, String> {
    gpushare_dra::sockets::channel(path, timeout).await
}

impl Kubelet {
    pub fn new(registry_dir: &Path, release: Release) -> Kubelet {
        Kubelet {
            registry_dir: registry_dir.into(),
            release,
        }
    }

    /// Waits (up to `timeout`) for a registration socket for `driver` and registers it.
    /// With `newer_than`, only a socket created after that time counts (a plugin restarted
    /// and recreated its socket: kubelet registers again).
    pub async fn register(
        &self,
        driver: &str,
        timeout: Duration,
        newer_than: Option<SystemTime>,
    ) -> Result<Registered, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut last = String::from("no socket");
            if let Ok(entries) = std::fs::read_dir(&self.registry_dir) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with('.') || !name.ends_with(".sock") {
                        continue;
                    }
                    let mtime = e
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    if newer_than.is_some_and(|t| mtime <= t) {
                        continue;
                    }
                    match self.try_register(&e.path(), driver).await {
                        Ok(Some(mut r)) => {
                            r.socket_mtime = mtime;
                            return Ok(r);
                        }
                        Ok(None) => {}
                        Err(err) => last = err,
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no plugin for {driver} registered: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_register(
        &self,
        socket: &Path,
        driver: &str,
    ) -> Result<Option<Registered>, String> {
        let ch = channel(socket, Duration::from_secs(10)).await?;
        let mut reg = RegistrationClient::new(ch);
        let info = tokio::time::timeout(Duration::from_secs(1), reg.get_info(InfoRequest {}))
            .await
            .map_err(|_| "GetInfo took more than 1 s".to_string())?
            .map_err(|s| format!("GetInfo: {}", s.message()))?
            .into_inner();
        if info.name != driver {
            return Ok(None);
        }
        let verdict = self.validate(&info);
        let (version, channel) = match verdict {
            Ok(v) => match channel(Path::new(&info.endpoint), Duration::from_secs(10)).await {
                Ok(c) => (v, c),
                Err(e) => {
                    let _ = reg
                        .notify_registration_status(RegistrationStatus {
                            plugin_registered: false,
                            error: format!("dialing {}: {e}", info.endpoint),
                        })
                        .await;
                    return Err(e);
                }
            },
            Err(e) => {
                let _ = reg
                    .notify_registration_status(RegistrationStatus {
                        plugin_registered: false,
                        error: e.clone(),
                    })
                    .await;
                return Err(e);
            }
        };
        tokio::time::timeout(
            Duration::from_secs(5),
            reg.notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            }),
        )
        .await
        .map_err(|_| "NotifyRegistrationStatus took more than 5 s".to_string())?
        .map_err(|s| format!("NotifyRegistrationStatus: {}", s.message()))?;
        Ok(Some(Registered {
            info,
            socket: socket.into(),
            socket_mtime: SystemTime::UNIX_EPOCH,
            version,
            channel,
        }))
    }

    /// kubelet's ValidatePlugin: type, absolute endpoint, a DRAPlugin version it speaks.
    fn validate(&self, info: &PluginInfo) -> Result<&'static str, String> {
        if info.r#type != "DRAPlugin" {
            return Err(format!("type {:?} is not DRAPlugin", info.r#type));
        }
        if !Path::new(&info.endpoint).is_absolute() {
            return Err(format!("endpoint {:?} is not absolute", info.endpoint));
        }
        let prefs: &[(&str, &'static str)] = match self.release {
            Release::K134 => &[("v1.DRAPlugin", "v1"), ("v1beta1.DRAPlugin", "v1beta1")],
            // 1.33 knows v1beta1 and the old v1alpha3.NodeService only; without either it
            // falls back to v1alpha4, which we do not serve: fail.
            Release::K133 => &[("v1beta1.DRAPlugin", "v1beta1")],
        };
        prefs
            .iter()
            .find(|(s, _)| info.supported_versions.iter().any(|v| v == s))
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                format!(
                    "none of the supported versions {:?} is served by this kubelet",
                    info.supported_versions
                )
            })
    }
}

fn check_keys<T>(
    method: &str,
    claims: &[Claim],
    map: &std::collections::HashMap<String, T>,
) -> Result<(), String> {
    let missing = claims.iter().filter(|c| !map.contains_key(&c.uid)).count();
    if missing > 0 {
        return Err(format!("{method} skipped {missing} ResourceClaims"));
    }
    if let Some(extra) = map.keys().find(|k| !claims.iter().any(|c| &c.uid == *k)) {
        return Err(format!(
            "{method} returned result for unknown claim UID {extra}"
        ));
    }
    Ok(())
}

/// A claim's answer: its devices, or its error string.
pub type Answer = Result<Vec<Device>, String>;

impl Registered {
    /// NodePrepareResources in the version kubelet picked (or `version` to force one),
    /// with kubelet's 45 s call timeout. `Err` is a failure of the whole call.
    pub async fn prepare(
        &self,
        claims: &[Claim],
        version: Option<&str>,
    ) -> Result<BTreeMap<String, Answer>, String> {
        let t = Duration::from_secs(45);
        match version.unwrap_or(self.version) {
            "v1" => {
                let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|c| v1::Claim {
                            namespace: c.namespace.clone(),
                            uid: c.uid.clone(),
                            name: c.name.clone(),
                        })
                        .collect(),
                };
                let r = tokio::time::timeout(t, c.node_prepare_resources(req))
                    .await
                    .map_err(|_| {
                        "NodePrepareResources: rpc error: code = DeadlineExceeded".to_string()
                    })?
                    .map_err(|s| format!("NodePrepareResources: {s}"))?
                    .into_inner();
                check_keys("NodePrepareResources", claims, &r.claims)?;
                Ok(r.claims
                    .into_iter()
                    .map(|(k, v)| {
                        let a = if v.error.is_empty() {
                            Ok(v.devices
                                .into_iter()
                                .map(|d| Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                })
                                .collect())
                        } else {
                            Err(v.error)
                        };
                        (k, a)
                    })
                    .collect())
            }
            _ => {
                let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1beta1::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|c| v1beta1::Claim {
                            namespace: c.namespace.clone(),
                            uid: c.uid.clone(),
                            name: c.name.clone(),
                        })
                        .collect(),
                };
                let r = tokio::time::timeout(t, c.node_prepare_resources(req))
                    .await
                    .map_err(|_| {
                        "NodePrepareResources: rpc error: code = DeadlineExceeded".to_string()
                    })?
                    .map_err(|s| format!("NodePrepareResources: {s}"))?
                    .into_inner();
                check_keys("NodePrepareResources", claims, &r.claims)?;
                Ok(r.claims
                    .into_iter()
                    .map(|(k, v)| {
                        let a = if v.error.is_empty() {
                            Ok(v.devices
                                .into_iter()
                                .map(|d| Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                })
                                .collect())
                        } else {
                            Err(v.error)
                        };
                        (k, a)
                    })
                    .collect())
            }
        }
    }

    /// NodeUnprepareResources; per-claim errors in the map.
    pub async fn unprepare(
        &self,
        claims: &[Claim],
        version: Option<&str>,
    ) -> Result<BTreeMap<String, Result<(), String>>, String> {
        let t = Duration::from_secs(45);
        let to = |e: String| if e.is_empty() { Ok(()) } else { Err(e) };
        match version.unwrap_or(self.version) {
            "v1" => {
                let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1::NodeUnprepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|c| v1::Claim {
                            namespace: c.namespace.clone(),
                            uid: c.uid.clone(),
                            name: c.name.clone(),
                        })
                        .collect(),
                };
                let r = tokio::time::timeout(t, c.node_unprepare_resources(req))
                    .await
                    .map_err(|_| "NodeUnprepareResources: DeadlineExceeded".to_string())?
                    .map_err(|s| format!("NodeUnprepareResources: {s}"))?
                    .into_inner();
                check_keys("NodeUnprepareResources", claims, &r.claims)?;
                Ok(r.claims
                    .into_iter()
                    .map(|(k, v)| (k, to(v.error)))
                    .collect())
            }
            _ => {
                let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1beta1::NodeUnprepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|c| v1beta1::Claim {
                            namespace: c.namespace.clone(),
                            uid: c.uid.clone(),
                            name: c.name.clone(),
                        })
                        .collect(),
                };
                let r = tokio::time::timeout(t, c.node_unprepare_resources(req))
                    .await
                    .map_err(|_| "NodeUnprepareResources: DeadlineExceeded".to_string())?
                    .map_err(|s| format!("NodeUnprepareResources: {s}"))?
                    .into_inner();
                check_keys("NodeUnprepareResources", claims, &r.claims)?;
                Ok(r.claims
                    .into_iter()
                    .map(|(k, v)| (k, to(v.error)))
                    .collect())
            }
        }
    }
}
