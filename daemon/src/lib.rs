//! `gpushared`'s library: everything the daemon is made of. The operators' CLI (`gpushare`,
//! its demo and doctor) is the `gpushare-cli` crate (`cli/`); it uses only [`cli_api`].
//!
//! Pure logic and effects live apart, so that most of the code runs in tests without
//! privileges:
//!
//! | module | what | kind |
//! |---|---|---|
//! | [`config`] | claim input: ResourceClaim objects, NVIDIA `GpuConfig`, the short form | pure |
//! | [`daemon_config`] | `gpushared`'s own config file (`/etc/gpushare/config.toml`) | pure |
//! | [`admission`] | the one owner of the sharing rules: claims admitted to GPUs by their lock-free mode words, settings restored by the last holder | lock-free |
//! | [`placement`] | which claims hold which GPU (a record, no rules) | pure |
//! | [`cdi`] | CDI spec building (and the atomic writer) | pure + file |
//! | [`driver_spec`] | the NVIDIA driver's CDI spec from NVIDIA's toolkit (`nvidia-ctk cdi generate`, or its simulation) | leaf + file |
//! | [`mig`] | MIG profiles, placements, DRA device names, mig-parted layouts | pure |
//! | [`gpu`] | GPU backends behind one trait: NVML, simulated node profiles, `nvidia-smi` | leaf |
//! | [`sys`] | process spawning and mounting behind narrow traits | leaf |
//! | [`strategy`] | sharing strategies, one file each (exclusive, time-slicing, MPS control daemons, MIG slices); the `Strategy` trait, each one's GPU setting; the group traits, what each makes for a claim's device group and what a release undoes | effects |
//! | [`mps_program`] | which MPS control program an empty `[mps] control` means | pure |
//! | [`supervise`] | watching MPS control daemons (pidfd) so dead ones are restarted | effects |
//! | [`parallel`] | a start's per-claim file work on a few threads (results in order), and work that waits on MPS control daemons on a thread each | plumbing |
//! | [`crash`] | named crash points for the fault-injection suite (debug builds only) | test support |
//! | [`privileges`] | the capabilities `gpushared` keeps, and dropping the rest | leaf |
//! | [`claim`] | a claim's lifecycle (one transition function), its on-disk record, its wire view | pure |
//! | [`registry`] | claims that remember what changed; transactions that undo themselves unless committed | pure |
//! | [`store`] | one durable record per claim and tombstone, written in O(1) per change; the v2 migration and downgrade export | file |
//! | [`checkpoint`] | the version 2 whole-node checkpoint (migrated from, exported for a downgrade) and tombstones | file |
//! | [`service`] | the claim service: prepare, unprepare, attach and detach (`service/ops/`), the start-up reconcile, the graceful stop | orchestration |
//! | [`metrics`] | Prometheus metrics: recorded per request, gathered from the service at scrape | async I/O |
//! | [`notify`] | systemd readiness, watchdog and reload notifications | leaf |
//! | [`server`] | the Unix-socket server speaking `gpushare-proto` | async I/O |
//! | [`cli_api`] | what the operators' CLI (`gpushare-cli`) takes from this library: config, checkpoint and catalog readers, the daemon's own choices | re-exports |

pub mod admission;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod cli_api;
pub mod config;
pub mod crash;
pub mod daemon_config;
pub mod driver_spec;
pub mod error;
pub mod fsutil;
pub mod gpu;
pub mod metrics;
pub mod mig;
pub mod mps_program;
pub mod notify;
pub mod parallel;
pub mod placement;
pub mod privileges;
pub mod registry;
pub mod server;
// Operations are short named steps, enforced (threshold 60 lines in clippy.toml).
#[deny(clippy::too_many_lines)]
pub mod service;
pub mod store;
#[deny(clippy::too_many_lines)]
pub mod strategy;
pub mod supervise;
pub mod sys;
