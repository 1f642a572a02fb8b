//! The plugin's life: check gpushared's names (when it answers) and the sockets, serve the
//! DRA socket, then the registration socket, watch gpushared, publish slices, and on SIGTERM
//! or SIGINT remove our sockets (slices are left: kubelet wipes them 30 s after a plugin goes
//! away, so a restart keeps them).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::api::Api;
use crate::authority::AnyAuthority;
use crate::config::Config;
use crate::gpushared::{Gpushared, Identity};
use crate::grpc::{
    registration as reg, v1, v1beta1, DRA_PLUGIN_TYPE, HEALTH_SERVICE, V1BETA1_SERVICE, V1_SERVICE,
};
use crate::metrics::Metrics;
use crate::plugin::Plugin;
use crate::service::{DraService, RegistrationService};
use crate::slices::Publisher;
use crate::sockets;
use crate::state::{Gpushared as GpusharedState, State};

/// How the plugin ended, when it ended on its own.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    /// The configuration contradicts gpushared's (exit status 2: no restart can fix it).
    #[error("{0}")]
    Config(String),
}

/// The `supported_versions` this plugin advertises.
pub fn supported_versions(device_health: bool) -> Vec<String> {
    let mut v = vec![V1_SERVICE.to_string(), V1BETA1_SERVICE.to_string()];
    if device_health {
        v.push(HEALTH_SERVICE.to_string());
    }
    v
}

/// Refuses to start beside another plugin for the same driver name: every live socket in
/// the registry directory is asked for `GetInfo`.
///
/// # Errors
/// One line naming the other plugin's socket and endpoint.
pub async fn check_no_other_plugin(cfg: &Config) -> anyhow::Result<()> {
    let others = sockets::plugins_for_driver(&cfg.registry_dir, &cfg.driver_name).await;
    if let Some((path, info)) = others.first() {
        anyhow::bail!(
            "another kubelet plugin already serves driver {:?}: {} (endpoint {}); stop it \
             first (for NVIDIA's DRA driver: its GPU kubelet plugin) or choose another \
             --driver-name",
            cfg.driver_name,
            path.display(),
            info.endpoint
        );
    }
    Ok(())
}

/// The connections `listener` accepts, each read through [`AnyAuthority`]: a gRPC client
/// that names the socket by its path is served as kubelet is.
fn any_authority(
    listener: UnixListener,
) -> impl futures_util::Stream<Item = std::io::Result<AnyAuthority<tokio::net::UnixStream>>> {
    futures_util::StreamExt::map(UnixListenerStream::new(listener), |c| {
        c.map(AnyAuthority::new)
    })
}

fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// gpushared's `health` answer `h` checked against our configuration: the node and driver
/// names it serves, and our claim timeout against its bound on a generation of the driver's
/// CDI spec.
///
/// # Errors
/// [`Fatal::Config`], one line naming both sides.
fn check_against(h: &serde_json::Value, cfg: &Config) -> Result<(), Fatal> {
    Identity::of_health(h)
        .check(&cfg.node_name, &cfg.driver_name)
        .map_err(Fatal::Config)?;
    crate::config::check_generate_timeout(cfg.claim_timeout, h).map_err(Fatal::Config)
}

/// How long the start waits for gpushared's first answer before it makes its sockets.
const FIRST_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// The check of [`check_against`] once at start, before any socket or directory is made:
/// a mismatch then ends the plugin before kubelet could see a registration socket of it.
/// A gpushared that does not answer within [`FIRST_HEALTH_TIMEOUT`] is not waited for (the
/// plugin starts as before and its watch checks once gpushared answers).
///
/// # Errors
/// [`Fatal::Config`], as [`check_against`].
async fn check_gpushared_first(cfg: &Config) -> Result<(), Fatal> {
    let g = Gpushared::new(&cfg.gpushared_socket, FIRST_HEALTH_TIMEOUT);
    match tokio::time::timeout(FIRST_HEALTH_TIMEOUT, g.health()).await {
        Ok(Ok(h)) => check_against(&h, cfg),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "gpushared does not answer at start; its watch checks it once it does");
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

/// Watches gpushared: `health` every 2 s while it answers, with backoff (250 ms doubling to
/// 10 s) while it does not. Every answer's node and driver are checked against ours, and our
/// claim timeout against its bound on a generation of the driver's CDI spec (so a gpushared
/// restarted with another configuration is caught too); a mismatch ends the plugin with one
/// line. Whether it can generate that spec is kept for `/healthz`.
async fn watch_gpushared(
    g: Gpushared,
    cfg: Arc<Config>,
    state: Arc<State>,
    fatal: tokio::sync::mpsc::Sender<Fatal>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(250);
    let mut was_up = None;
    loop {
        let wait = match g.health().await {
            Ok(h) => {
                if let Err(f) = check_against(&h, &cfg) {
                    let _ = fatal.send(f).await;
                    return;
                }
                let id = Identity::of_health(&h);
                if was_up != Some(true) {
                    tracing::info!(node = %id.node_name, socket = %g.socket().display(), "gpushared answers");
                }
                was_up = Some(true);
                let driver_spec_error = crate::state::driver_spec_error(&h);
                match (&driver_spec_error, state.gpushared()) {
                    (
                        Some(e),
                        GpusharedState::Up {
                            driver_spec_error: None,
                            ..
                        }
                        | GpusharedState::Unknown
                        | GpusharedState::Down(_),
                    ) => {
                        tracing::warn!(error = %e, "gpushared cannot generate the NVIDIA driver's CDI spec: every prepare fails until it can (/healthz says so meanwhile)");
                    }
                    (
                        None,
                        GpusharedState::Up {
                            driver_spec_error: Some(_),
                            ..
                        },
                    ) => {
                        tracing::info!("gpushared generates the NVIDIA driver's CDI spec again");
                    }
                    _ => {}
                }
                state.set_gpushared(GpusharedState::Up {
                    node_name: id.node_name,
                    driver_spec_error,
                });
                backoff = Duration::from_millis(250);
                Duration::from_secs(2)
            }
            Err(e) => {
                if was_up != Some(false) {
                    tracing::warn!(error = %e, "gpushared does not answer; prepares fail until it does (retrying with backoff)");
                }
                was_up = Some(false);
                state.set_gpushared(GpusharedState::Down(e.to_string()));
                let w = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                w
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

fn stop_signal() -> std::io::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Runs the plugin until a stop signal (Ok) or a fatal configuration error.
///
/// # Errors
/// Start-up failures (a socket in use, another plugin for the driver, no credentials) and
/// [`Fatal`] mismatches with gpushared, each one line.
pub async fn run(cfg: Config, api: Arc<Api>) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let state = Arc::new(State::default());
    let metrics = Arc::new(Metrics::with_api(&api));
    let dra_path = cfg.dra_socket();
    let reg_path = cfg.registration_socket();

    // Every check that can fail comes before any socket or directory is made: a plugin
    // that cannot run must leave nothing behind for kubelet to find.
    check_gpushared_first(&cfg).await?;
    let stop = stop_signal().context("installing signal handlers")?;
    // Our own registration socket first: a live one means another instance runs (it would
    // also be found by the driver check, which names it the same way).
    sockets::clear_stale(&reg_path).await?;
    check_no_other_plugin(&cfg).await?;
    sockets::clear_stale(&dra_path).await?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::channel(1);

    if let Some(addr) = cfg.metrics_address {
        match crate::metrics::bind(addr).await {
            Ok(l) => {
                tokio::spawn(crate::metrics::serve(
                    l,
                    Arc::clone(&metrics),
                    Arc::clone(&state),
                ));
            }
            Err(e) => {
                tracing::warn!(address = %addr, error = %e, "cannot serve metrics; going on without them")
            }
        }
    }

    let gpushared = Gpushared::new(
        &cfg.gpushared_socket,
        cfg.claim_timeout + Duration::from_secs(5),
    );
    let plugin = Arc::new(Plugin::new(
        Arc::clone(&api),
        gpushared.clone(),
        Arc::clone(&metrics),
        cfg.claim_timeout,
    ));
    let dra = DraService::new(plugin, Arc::clone(&metrics));

    // The DRA socket serves before the registration socket appears, so kubelet never sees
    // a registration without a working endpoint.
    let dra_listener = bind(&dra_path)?;
    let mut router = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(dra));
    if cfg.device_health {
        router = router.add_service(
            crate::grpc::health::dra_resource_health_server::DraResourceHealthServer::new(
                crate::health::HealthService::new(gpushared.clone(), cfg.node_name.clone()),
            ),
        );
    }
    let mut rx = shutdown_rx.clone();
    let dra_server = tokio::spawn(router.serve_with_incoming_shutdown(
        any_authority(dra_listener),
        async move {
            let _ = rx.changed().await;
        },
    ));

    let info = reg::PluginInfo {
        r#type: DRA_PLUGIN_TYPE.into(),
        name: cfg.driver_name.clone(),
        endpoint: dra_path.display().to_string(),
        supported_versions: supported_versions(cfg.device_health),
    };
    let reg_listener = bind(&reg_path)?;
    let mut rx = shutdown_rx.clone();
    let reg_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                RegistrationService::new(info, Arc::clone(&state)),
            ))
            .serve_with_incoming_shutdown(any_authority(reg_listener), async move {
                let _ = rx.changed().await;
            }),
    );
    tracing::info!(
        driver = %cfg.driver_name, node = %cfg.node_name,
        dra_socket = %dra_path.display(), registration_socket = %reg_path.display(),
        versions = %supported_versions(cfg.device_health).join(","),
        "gpushare-dra serving"
    );

    tokio::spawn(watch_gpushared(
        gpushared.clone(),
        Arc::clone(&cfg),
        Arc::clone(&state),
        fatal_tx,
        shutdown_rx.clone(),
    ));
    let publisher = tokio::spawn(
        Publisher::new(api, gpushared, metrics, &cfg.driver_name, &cfg.node_name).run(shutdown_rx),
    );

    let outcome = tokio::select! {
        sig = stop => {
            tracing::info!(signal = sig, "stopping: removing our sockets, leaving the ResourceSlices");
            Ok(())
        }
        f = fatal_rx.recv() => match f {
            Some(f) => Err(anyhow::Error::new(f)),
            None => Ok(()),
        },
    };
    // Registration socket first: kubelet deregisters, then the endpoint goes.
    let _ = std::fs::remove_file(&reg_path);
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), reg_server).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), dra_server).await;
    let _ = std::fs::remove_file(&dra_path);
    let _ = tokio::time::timeout(Duration::from_secs(2), publisher).await;
    outcome
}
