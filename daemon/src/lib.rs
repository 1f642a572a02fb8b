//! `gpushared`'s library: everything the daemon and the `gpushare` CLI are made of.
//!
//! Pure logic and effects live apart, so that most of the code runs in tests without
//! privileges:
//!
//! | module | what | kind |
//! |---|---|---|
//! | [`config`] | claim input: ResourceClaim objects, NVIDIA `GpuConfig`, the short form | pure |
//! | [`daemon_config`] | `gpushared`'s own config file (`/etc/gpushare/config.toml`) | pure |
//! | [`placement`] | which claims hold which GPU, and the conflict rules | pure |
//! | [`cdi`] | CDI spec building (and the atomic writer) | pure + file |
//! | [`gpu`] | GPU backends behind one trait (simulated node profiles) | leaf |
//! | [`sys`] | process spawning and mounting behind narrow traits | leaf |
//! | [`strategy`] | sharing strategies: MPS control daemons, time-slicing | effects |
//! | [`checkpoint`] | claims on disk, written atomically | file |
//! | [`service`] | the claim service: prepare, unprepare, attach, detach | orchestration |
//! | [`metrics`] | Prometheus metrics: recorded per request, gathered from the service at scrape | async I/O |
//! | [`notify`] | systemd readiness, watchdog and reload notifications | leaf |
//! | [`server`] | the Unix-socket server speaking `gpushare-proto` | async I/O |
//! | [`cli`] | the operators' CLI (`gpushare`) and its demo | binary support |

pub mod cdi;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod daemon_config;
pub mod error;
pub mod fsutil;
pub mod gpu;
pub mod metrics;
pub mod notify;
pub mod placement;
pub mod server;
pub mod service;
pub mod strategy;
pub mod sys;
