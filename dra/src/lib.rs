//! `gpushare-dra`, the DRA kubelet plugin: kubelet's gRPC (DRA v1 and v1beta1 on one
//! socket, plugin registration on another) and the API server on one side, `gpushared`'s
//! Unix socket on the other. It holds API credentials and no capabilities and no sharing
//! logic: every claim is prepared and released by `gpushared`, which holds no API
//! credentials and talks to no remote host.
//!
//! | module | what |
//! |---|---|
//! | [`config`] | the config file and flags (pure) |
//! | [`grpc`] | code generated from `dra/proto/` (kubelet's APIs) |
//! | [`service`] | the tonic services: DRAPlugin v1 / v1beta1, Registration |
//! | [`plugin`] | per-claim prepare / unprepare: concurrent, bounded, errors per claim |
//! | [`mapping`] | gpushared's answer as kubelet `Device`s; claim checks (pure) |
//! | [`api`], [`bounded`] | the API server through `kube`: claims with version fallback, slices, Node; every answer read within a bound |
//! | [`slices`] | the watch-driven ResourceSlice publisher and its pure planner |
//! | [`gpushared`] | gpushared's socket through the blocking `gpushare-proto` client |
//! | [`sockets`] | stale sockets, other plugins for the same driver |
//! | [`authority`] | any `:authority` on the plugin's sockets (gRPC clients send the socket's path) |
//! | [`health`] | the optional `v1alpha1.DRAResourceHealth` service |
//! | [`metrics`], [`state`] | Prometheus metrics, `/healthz`, shared state |
//! | [`run`] | the plugin's life from start to SIGTERM |
//! | [`probe`], [`running`] | `gpushare-dra probe`; the running plugin's process, read from `/proc` |

pub mod api;
pub mod authority;
pub mod bounded;
pub mod config;
pub mod gpushared;
pub mod grpc;
pub mod health;
pub mod mapping;
pub mod metrics;
pub mod plugin;
pub mod probe;
pub mod run;
pub mod running;
pub mod service;
pub mod slices;
pub mod sockets;
pub mod state;
