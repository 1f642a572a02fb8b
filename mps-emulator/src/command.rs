//! The control daemon's state and command interpreter, free of any I/O.
//!
//! Everything observable about a command (stdout text, control.log lines, side effects on
//! the defaults) is decided here so it can be tested exhaustively against the behaviour of
//! NVIDIA's 535 daemon. The daemon module only moves bytes and spawns the simulated servers
//! this module asks for.

use crate::cnum::{is_c_space, scan_f64, scan_i64, scan_int, scan_u64, scan_uint};

/// Device ordinals the 535 daemon accepts for pinned-memory limits (0..=31); others log
/// `Invalid device ordinal!`.
pub const MAX_DEVICES: usize = 32;

/// Default active thread percentage when the environment does not set one.
pub const DEFAULT_PERCENTAGE: f64 = 100.0;

const INVALID_PERCENTAGE: &str = "Invalid percentage, expected between (0.0, 100.0]";
const NO_LIMIT: &str = "No default pinned memory limit set for the device!";
const INVALID_ORDINAL: &str = "Invalid device ordinal!";
const INVALID_PRIORITY: &str = "Invalid priority value - must be 0 or 1!";
const UID_REQUIRED: &str = "A user id (UID) is required to start a new server";

/// One piece of a command's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Printed by the UI (with a newline) and appended to control.log.
    Reply(String),
    /// Printed by the UI only (535 prints an empty line after `ps -p` failures).
    StdoutOnly(String),
    /// Appended to control.log only; many validation errors are reported only this way.
    LogOnly(String),
}

/// Side effect the daemon must carry out after printing a command's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing beyond the outputs.
    None,
    /// Spawn a (simulated) MPS server for this user id, then report it with
    /// [`ControlState::server_started`].
    StartServer {
        /// User id as the daemon parsed it (`%d`, so possibly negative).
        uid: i32,
    },
    /// Stop the daemon: wait for the servers, then [`ControlState::finish_quit`].
    Quit {
        /// The `-t` value when one was given and parsed.
        timeout: Option<u32>,
    },
}

/// Result of [`ControlState::execute`].
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Answer pieces, in order.
    pub outputs: Vec<Output>,
    /// What the daemon must do next.
    pub action: Action,
}

impl Outcome {
    fn new(outputs: Vec<Output>) -> Self {
        Outcome {
            outputs,
            action: Action::None,
        }
    }
}

/// Who sent a command, from the socket's peer credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// Effective user id of the UI process.
    pub uid: u32,
}

/// Pinned device memory limits in bytes, one slot per device ordinal; 0 = no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedLimits([u64; MAX_DEVICES]);

impl Default for PinnedLimits {
    fn default() -> Self {
        PinnedLimits([0; MAX_DEVICES])
    }
}

impl PinnedLimits {
    /// Applies the argument text `DEV VALUE` exactly like 535's
    /// `set_default_device_pinned_mem_limit`.
    ///
    /// Mirrors an `sscanf(args, "%d %llu%c")` over the whole text: when the device is not
    /// an integer, device and value stay 0, so device 0 is cleared; the value is read right
    /// after the device's digits (`2abc 1G` reads no value), a missing or malformed value
    /// clears the device; the unit is GiB for a `G`/`g` right after the value's digits and
    /// MiB otherwise, and the byte count wraps modulo 2^64 like the C arithmetic.
    fn set(&mut self, args: &str) -> Vec<Output> {
        let (device, bytes) = match scan_i64(args) {
            None => (0, 0),
            // Truncation to int is what sscanf's %d store does.
            Some((device, after)) => (device as i32, parse_limit_bytes(after)),
        };
        match ordinal(device) {
            Some(slot) => {
                self.0[slot] = bytes;
                Vec::new()
            }
            None => vec![Output::LogOnly(INVALID_ORDINAL.into())],
        }
    }

    /// Answers `DEV` like `get_default_device_pinned_mem_limit`; a non-integer reads device 0.
    fn get(&self, args: &str) -> Vec<Output> {
        let device = scan_int(args).unwrap_or(0);
        match ordinal(device) {
            None => vec![Output::LogOnly(INVALID_ORDINAL.into())],
            Some(slot) if self.0[slot] == 0 => vec![Output::LogOnly(NO_LIMIT.into())],
            Some(slot) => vec![Output::Reply(format_limit(self.0[slot]))],
        }
    }

    /// Limit of one device in bytes (0 = none); `None` for an ordinal the daemon rejects.
    pub fn bytes(&self, device: i32) -> Option<u64> {
        ordinal(device).map(|slot| self.0[slot])
    }
}

fn ordinal(device: i32) -> Option<usize> {
    usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES)
}

/// Bytes for a pinned-limit value (leading blanks skipped): number of MiB, or GiB with a
/// `G`/`g` right after the digits; any other suffix (even `T`, or a blank before `G`) means
/// MiB, and text without digits means 0 (no limit).
pub fn parse_limit_bytes(text: &str) -> u64 {
    match scan_u64(text) {
        None => 0,
        Some((value, rest)) => {
            let shift = if rest.starts_with(['G', 'g']) { 30 } else { 20 };
            value.wrapping_mul(1u64 << shift)
        }
    }
}

/// 535's lossy display: whole GiB (floored) from 1 GiB up, whole MiB below.
pub fn format_limit(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{}G", bytes >> 30)
    } else {
        format!("{}M", bytes >> 20)
    }
}

/// `%.1f` of a percentage (Rust rounds the exact binary value half-to-even, like glibc).
pub fn format_percentage(value: f64) -> String {
    format!("{value:.1}")
}

/// A percentage as 535 accepts it: strtod of the text, in (0, 100]; NaN and empty fail.
pub fn parse_percentage(text: &str) -> Option<f64> {
    let value = scan_f64(text).unwrap_or(0.0);
    (value > 0.0 && value <= 100.0).then_some(value)
}

/// A simulated MPS server known to the daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// Process id reported by `get_server_list`.
    pub pid: i32,
    /// User the server runs for.
    pub uid: i32,
    /// Active thread percentage for its new clients (copied from the default at start).
    pub percentage: f64,
    /// Pinned limits for its new clients (copied from the defaults at start).
    pub limits: PinnedLimits,
}

/// What the daemon reads from its environment at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartEnv {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, if set.
    pub active_thread_percentage: Option<String>,
    /// `CUDA_MPS_CLIENT_PRIORITY`, if set.
    pub client_priority: Option<String>,
    /// Effective uid of the daemon (the owner may quit it besides root).
    pub daemon_uid: u32,
}

/// Result of [`ControlState::finish_quit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuitReport {
    /// control.log lines, ending with `Exit with status N`.
    pub log: Vec<String>,
    /// Status returned to the UI that sent `quit`.
    pub ui_status: i32,
    /// Exit status of the daemon process.
    pub exit_status: i32,
}

/// The daemon's in-memory state: defaults for new servers and the live servers.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlState {
    default_percentage: f64,
    default_limits: PinnedLimits,
    default_priority: i32,
    servers: Vec<Server>,
    /// Set once any server exits non-zero; 535 then logs `Exit with status 1` at quit.
    server_failed: bool,
    daemon_uid: u32,
}

impl ControlState {
    /// State of a freshly started daemon, plus the control.log warnings its environment causes
    /// (logged right after the two start lines).
    pub fn new(env: &StartEnv) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let default_percentage = match &env.active_thread_percentage {
            None => DEFAULT_PERCENTAGE,
            Some(text) => parse_percentage(text).unwrap_or_else(|| {
                warnings.push(
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE should be between (0.0, 100.0]".into(),
                );
                DEFAULT_PERCENTAGE
            }),
        };
        let default_priority = match &env.client_priority {
            None => 0,
            // atoi semantics: text without digits is 0 and accepted silently.
            Some(text) => match scan_int(text).unwrap_or(0) {
                p @ (0 | 1) => p,
                _ => {
                    warnings.push("CUDA_MPS_CLIENT_PRIORITY should be between [0,1]".into());
                    0
                }
            },
        };
        let state = ControlState {
            default_percentage,
            default_limits: PinnedLimits::default(),
            default_priority,
            servers: Vec::new(),
            server_failed: false,
            daemon_uid: env.daemon_uid,
        };
        (state, warnings)
    }

    /// Default active thread percentage for new servers.
    pub fn default_percentage(&self) -> f64 {
        self.default_percentage
    }

    /// Default pinned limits for new servers.
    pub fn default_limits(&self) -> &PinnedLimits {
        &self.default_limits
    }

    /// Default client priority (0 normal, 1 below normal).
    pub fn default_priority(&self) -> i32 {
        self.default_priority
    }

    /// Live servers, oldest first.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// Interprets one line exactly as received from the UI (without its newline).
    ///
    /// The command name is the first blank-separated word, matched case-sensitively.
    /// Numbers are scanned from the text after it the way 535's `sscanf` calls do (so a
    /// value is read right where the previous one stopped), while the flags `-uid` and
    /// `-t` must be whole words.
    pub fn execute(&mut self, line: &str, caller: Caller) -> Outcome {
        let trimmed = line.trim_start_matches(is_c_space);
        let name_end = trimmed.find(is_c_space).unwrap_or(trimmed.len());
        let (name, rest) = trimmed.split_at(name_end);
        let words: Vec<&str> = rest.split(is_c_space).filter(|t| !t.is_empty()).collect();
        let args = words.as_slice();
        match name {
            "get_server_list" => Outcome::new(
                self.servers
                    .iter()
                    .map(|s| Output::Reply(s.pid.to_string()))
                    .collect(),
            ),
            "start_server" => self.start_server(args, caller),
            "shutdown_server" => self.with_server(rest, |_, _| Vec::new()),
            "get_client_list" => self.with_server(rest, |_, _| Vec::new()),
            "get_device_client_list" => {
                // PID 0 (also: missing or not a number) lists every server's devices; the
                // simulated servers have no clients, so there is nothing to list.
                if scan_int(rest).unwrap_or(0) == 0 {
                    Outcome::new(Vec::new())
                } else {
                    self.with_server(rest, |_, _| Vec::new())
                }
            }
            "set_default_active_thread_percentage" => {
                let mut outputs = Vec::new();
                match parse_percentage(rest) {
                    Some(value) => self.default_percentage = value,
                    None => outputs.push(Output::LogOnly(INVALID_PERCENTAGE.into())),
                }
                outputs.push(Output::Reply(format_percentage(self.default_percentage)));
                Outcome::new(outputs)
            }
            "get_default_active_thread_percentage" => Outcome::new(vec![Output::Reply(
                format_percentage(self.default_percentage),
            )]),
            "set_active_thread_percentage" => self.with_server(rest, |server, after| {
                let mut outputs = Vec::new();
                match parse_percentage(after) {
                    Some(value) => server.percentage = value,
                    None => outputs.push(Output::LogOnly(INVALID_PERCENTAGE.into())),
                }
                outputs.push(Output::Reply(format_percentage(server.percentage)));
                outputs
            }),
            "get_active_thread_percentage" => self.with_server(rest, |server, _| {
                vec![Output::Reply(format_percentage(server.percentage))]
            }),
            "set_default_device_pinned_mem_limit" => Outcome::new(self.default_limits.set(rest)),
            "get_default_device_pinned_mem_limit" => Outcome::new(self.default_limits.get(rest)),
            "set_device_pinned_mem_limit" => {
                self.with_server(rest, |server, after| server.limits.set(after))
            }
            "get_device_pinned_mem_limit" => {
                self.with_server(rest, |server, after| server.limits.get(after))
            }
            "terminate_client" => self.terminate_client(rest),
            "ps" => self.ps(rest),
            "set_default_client_priority" => {
                // atoi semantics: no digits reads as 0, which is valid.
                match scan_int(rest).unwrap_or(0) {
                    p @ (0 | 1) => {
                        self.default_priority = p;
                        Outcome::new(Vec::new())
                    }
                    _ => Outcome::new(vec![Output::Reply(INVALID_PRIORITY.into())]),
                }
            }
            "get_default_client_priority" => {
                Outcome::new(vec![Output::Reply(self.default_priority.to_string())])
            }
            "quit" => self.quit(args, caller),
            other => Outcome::new(vec![Output::Reply(format!("Unknown command \"{other}\""))]),
        }
    }

    fn not_found(pid: i32) -> Output {
        Output::Reply(format!("Server {pid} not found"))
    }

    /// Runs `f` on the server whose PID leads `args` (`%d`; 0 when absent or not a
    /// number) with the text after the PID, or answers `Server N not found`.
    fn with_server(
        &mut self,
        args: &str,
        f: impl FnOnce(&mut Server, &str) -> Vec<Output>,
    ) -> Outcome {
        let (pid, after) = match scan_i64(args) {
            // Truncation to int is what sscanf's %d store does.
            Some((pid, after)) => (pid as i32, after),
            None => (0, ""),
        };
        match self.servers.iter_mut().find(|s| s.pid == pid) {
            Some(server) => Outcome::new(f(server, after)),
            None => Outcome::new(vec![Self::not_found(pid)]),
        }
    }

    fn start_server(&mut self, args: &[&str], caller: Caller) -> Outcome {
        let uid = match args {
            [flag, value, ..] if *flag == "-uid" => scan_int(value),
            _ => None,
        };
        let Some(uid) = uid else {
            return Outcome::new(vec![Output::Reply(UID_REQUIRED.into())]);
        };
        // 535 lets any user start a server for itself; only root may start one for others.
        // A uid is compared as the unsigned value the kernel would use.
        if caller.uid != 0 && caller.uid != uid as u32 {
            return Outcome::new(vec![Output::Reply(format!(
                "Insufficient privileges for UID {}",
                caller.uid
            ))]);
        }
        // While a server is alive 535 starts no other one and says nothing.
        if !self.servers.is_empty() {
            return Outcome::new(Vec::new());
        }
        Outcome {
            outputs: Vec::new(),
            action: Action::StartServer { uid },
        }
    }

    fn terminate_client(&mut self, args: &str) -> Outcome {
        let (pid, after) = match scan_i64(args) {
            Some((pid, after)) => (pid as i32, after),
            None => (0, ""),
        };
        if self.servers.iter().any(|s| s.pid == pid) {
            // The simulated servers never have clients.
            let client = scan_int(after).unwrap_or(0);
            return Outcome::new(vec![Output::Reply(format!("Invalid process {client}!"))]);
        }
        Outcome::new(vec![
            Self::not_found(pid),
            Output::Reply(format!("Server {pid} not found!")),
            Output::Reply("1".into()),
        ])
    }

    fn ps(&mut self, args: &str) -> Outcome {
        // 535 reads the option as `sscanf(args, " -%c %d")`: `-p55` and `-px` (PID 0) count.
        if let Some(after) = args.trim_start_matches(is_c_space).strip_prefix("-p") {
            let pid = scan_int(after).unwrap_or(0);
            if self.servers.iter().any(|s| s.pid == pid) {
                return Outcome::new(Vec::new());
            }
            return Outcome::new(vec![
                Self::not_found(pid),
                Self::not_found(pid),
                Output::StdoutOnly(String::new()),
            ]);
        }
        if self.servers.is_empty() {
            Outcome::new(vec![Output::Reply("Server not found".into())])
        } else {
            // Servers without clients list nothing.
            Outcome::new(Vec::new())
        }
    }

    fn quit(&mut self, args: &[&str], caller: Caller) -> Outcome {
        if caller.uid != 0 && caller.uid != self.daemon_uid {
            return Outcome::new(vec![Output::Reply(
                "Not enough privilege to execute quit command".into(),
            )]);
        }
        let timeout = match args {
            [flag, value, ..] if *flag == "-t" => scan_uint(value),
            _ => None,
        };
        let outputs = timeout
            .map(|t| Output::LogOnly(format!("quit command issued with timeout of {t}")))
            .into_iter()
            .collect();
        Outcome {
            outputs,
            action: Action::Quit { timeout },
        }
    }

    /// Records a server the daemon spawned for [`Action::StartServer`]; returns its log line.
    pub fn server_started(&mut self, pid: i32, uid: i32) -> String {
        self.servers.push(Server {
            pid,
            uid,
            percentage: self.default_percentage,
            limits: self.default_limits,
        });
        format!("Starting new server {pid} for user {uid}")
    }

    /// Forgets a server that exited; returns its control.log lines (535 names no shm file
    /// when the server never created one, hence the bare `Removed Shm file at `).
    pub fn server_exited(&mut self, pid: i32, status: i32) -> Vec<String> {
        self.servers.retain(|s| s.pid != pid);
        if status != 0 {
            self.server_failed = true;
        }
        vec![
            format!("Server {pid} exited with status {status}"),
            "Removed Shm file at ".into(),
        ]
    }

    /// Ends the daemon after `quit`, given the `(pid, status)` of the servers that were still
    /// alive and have now exited.
    ///
    /// 535 reports a failure of those servers to the quitting UI, while its own exit status
    /// (the `Exit with status` line) also remembers servers that failed earlier.
    pub fn finish_quit(&mut self, reaped: &[(i32, i32)]) -> QuitReport {
        let mut log = Vec::new();
        let mut ui_status = 0;
        for &(pid, status) in reaped {
            log.extend(self.server_exited(pid, status));
            if status != 0 {
                ui_status = 1;
            }
        }
        let exit_status = i32::from(self.server_failed);
        log.push(format!("Exit with status {exit_status}"));
        QuitReport {
            log,
            ui_status,
            exit_status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: Caller = Caller { uid: 0 };

    fn fresh() -> ControlState {
        ControlState::new(&StartEnv::default()).0
    }

    fn reply(s: &str) -> Output {
        Output::Reply(s.into())
    }

    fn log(s: &str) -> Output {
        Output::LogOnly(s.into())
    }

    fn run(state: &mut ControlState, line: &str) -> Vec<Output> {
        let outcome = state.execute(line, ROOT);
        assert_eq!(outcome.action, Action::None, "{line}");
        outcome.outputs
    }

    /// Sets `DEV VALUE` on a fresh state and reads `DEV_READ` back.
    fn limit_roundtrip(set_args: &str, read: &str) -> Vec<Output> {
        let mut s = fresh();
        assert_eq!(
            run(
                &mut s,
                &format!("set_default_device_pinned_mem_limit {set_args}")
            ),
            vec![]
        );
        run(
            &mut s,
            &format!("get_default_device_pinned_mem_limit {read}"),
        )
    }

    fn unset() -> Vec<Output> {
        vec![log(NO_LIMIT)]
    }

    #[test]
    fn percentage_defaults_and_formatting() {
        let mut s = fresh();
        let get = "get_default_active_thread_percentage";
        assert_eq!(run(&mut s, get), vec![reply("100.0")]);
        let set = |s: &mut ControlState, v: &str| {
            run(s, &format!("set_default_active_thread_percentage {v}"))
        };
        assert_eq!(set(&mut s, "50"), vec![reply("50.0")]);
        assert_eq!(run(&mut s, get), vec![reply("50.0")]);
        assert_eq!(set(&mut s, "12.345"), vec![reply("12.3")]);
        assert_eq!(set(&mut s, "33.35"), vec![reply("33.4")]);
        assert_eq!(set(&mut s, "33.25"), vec![reply("33.2")]);
        assert_eq!(set(&mut s, "99.99"), vec![reply("100.0")]);
        assert_eq!(set(&mut s, "0.01"), vec![reply("0.0")]);
        assert_eq!(set(&mut s, ".5"), vec![reply("0.5")]);
        assert_eq!(set(&mut s, "+7"), vec![reply("7.0")]);
        assert_eq!(set(&mut s, "1e2"), vec![reply("100.0")]);
        assert_eq!(set(&mut s, "1e-1"), vec![reply("0.1")]);
        assert_eq!(set(&mut s, "0x10"), vec![reply("16.0")]);
        assert_eq!(set(&mut s, "50abc"), vec![reply("50.0")]);
        assert_eq!(set(&mut s, "100"), vec![reply("100.0")]);
        // Extra trailing arguments are ignored.
        assert_eq!(set(&mut s, "40 50"), vec![reply("40.0")]);
        assert_eq!(run(&mut s, &format!("{get} extra")), vec![reply("40.0")]);
    }

    #[test]
    fn invalid_percentages_echo_the_unchanged_value() {
        let mut s = fresh();
        run(&mut s, "set_default_active_thread_percentage 12.345");
        for bad in [
            "0", "101", "abc", "-5", "nan", "inf", "100.04", "100.06", "", "0x", "-0",
        ] {
            assert_eq!(
                run(
                    &mut s,
                    &format!("set_default_active_thread_percentage {bad}")
                ),
                vec![log(INVALID_PERCENTAGE), reply("12.3")],
                "{bad:?}"
            );
        }
        assert_eq!(
            run(&mut s, "get_default_active_thread_percentage"),
            vec![reply("12.3")]
        );
    }

    #[test]
    fn pinned_limit_suffixes_and_display() {
        let cases = [
            ("0 1G", "1G"),
            ("0 1g", "1G"),
            ("0 512M", "512M"),
            ("0 1m", "1M"),
            ("0 800", "800M"),
            ("0 1024", "1G"),
            ("0 1536M", "1G"),
            ("0 2047M", "1G"),
            ("0 1023M", "1023M"),
            ("0 4096M", "4G"),
            ("0 2T", "2M"),
            ("0 3T", "3M"),
            ("0 2k", "2M"),
            ("0 1GB", "1G"),
            ("0 3GiB", "3G"),
            ("0 +3G", "3G"),
            ("0 1.5G", "1M"),
            ("0 1.9G", "1M"),
            ("0 1e3M", "1M"),
            ("0 2 G", "2M"),
            ("0 1G 2G", "1G"),
            ("0 1048576", "1024G"),
            ("0 5000G", "5000G"),
            ("0 9000000000G", "9000000000G"),
            ("0 4294967297M", "4194304G"),
            ("0 -1G", "17179869183G"),
            ("0 99999999999999999999M", "17179869183G"),
            ("3 4G", "4G"),
            ("31 2G", "2G"),
            ("4294967296 1G", "1G"),
        ];
        for (set, want) in cases {
            // Read back the device the set addressed (4294967296 truncates to device 0).
            let read = match scan_int(set) {
                Some(d) => d.to_string(),
                None => "0".to_string(),
            };
            assert_eq!(limit_roundtrip(set, &read), vec![reply(want)], "{set}");
        }
    }

    #[test]
    fn pinned_limit_zero_and_malformed_values_clear() {
        for set in [
            "0 0.5G",
            "0 0M",
            "0 0G",
            "0 0x10M",
            "0 G",
            "0 17592186044416M",
        ] {
            assert_eq!(limit_roundtrip(set, "0"), unset(), "{set}");
        }
        assert_eq!(
            run(&mut fresh(), "get_default_device_pinned_mem_limit 0"),
            unset()
        );
    }

    /// Device 0 = 3G and device 1 = 5G, then `args`; returns what devices 0 and 1 read.
    fn after_malformed(args: &str) -> (Vec<Output>, Vec<Output>) {
        let mut s = fresh();
        run(&mut s, "set_default_device_pinned_mem_limit 0 3G");
        run(&mut s, "set_default_device_pinned_mem_limit 1 5G");
        let line = format!("set_default_device_pinned_mem_limit {args}");
        assert_eq!(run(&mut s, line.trim_end()), vec![], "{args}");
        (
            run(&mut s, "get_default_device_pinned_mem_limit 0"),
            run(&mut s, "get_default_device_pinned_mem_limit 1"),
        )
    }

    #[test]
    fn malformed_device_tokens_clear_device_zero() {
        for args in [
            "abc 1G",
            "GPU-5f3c0c52-0000-0000-0000-000000000001 4G",
            "MIG-5f3c0c52-0000-0000-0000-000000000001 8192M",
            "0=1G",
            "0x1 1G",
            "",
        ] {
            assert_eq!(
                after_malformed(args),
                (unset(), vec![reply("5G")]),
                "{args:?}"
            );
        }
    }

    #[test]
    fn malformed_values_clear_that_device() {
        for args in ["1 xyz", "1=2G", "1", "1 G", "1 -0"] {
            assert_eq!(
                after_malformed(args),
                (vec![reply("3G")], unset()),
                "{args:?}"
            );
        }
    }

    #[test]
    fn uuid_key_never_reads_back() {
        let mut s = fresh();
        run(
            &mut s,
            "set_default_device_pinned_mem_limit GPU-5f3c0c52-0000-0000-0000-000000000001 4G",
        );
        assert_eq!(
            run(
                &mut s,
                "get_default_device_pinned_mem_limit GPU-5f3c0c52-0000-0000-0000-000000000001"
            ),
            unset()
        );
    }

    #[test]
    fn device_ordinals_outside_0_to_31_are_rejected() {
        let invalid = vec![log(INVALID_ORDINAL)];
        for dev in ["-1", "32", "100000", "2147483647", "4294967295", "-5"] {
            let mut s = fresh();
            run(&mut s, "set_default_device_pinned_mem_limit 0 3G");
            assert_eq!(
                run(
                    &mut s,
                    &format!("set_default_device_pinned_mem_limit {dev} 1G")
                ),
                invalid,
                "{dev}"
            );
            assert_eq!(
                run(
                    &mut s,
                    &format!("get_default_device_pinned_mem_limit {dev}")
                ),
                invalid,
                "{dev}"
            );
            // Nothing else changed.
            assert_eq!(
                run(&mut s, "get_default_device_pinned_mem_limit 0"),
                vec![reply("3G")]
            );
        }
    }

    #[test]
    fn get_limit_device_token_defaults_to_zero() {
        let mut s = fresh();
        run(&mut s, "set_default_device_pinned_mem_limit 0 1G");
        run(&mut s, "set_default_device_pinned_mem_limit 2 7G");
        for get in ["", " abc", " 0 extra", " 0x5"] {
            assert_eq!(
                run(&mut s, &format!("get_default_device_pinned_mem_limit{get}")),
                vec![reply("1G")],
                "{get:?}"
            );
        }
        assert_eq!(
            run(&mut s, "get_default_device_pinned_mem_limit 2abc"),
            vec![reply("7G")]
        );
        assert_eq!(s.default_limits().bytes(2), Some(7 << 30));
        assert_eq!(s.default_limits().bytes(32), None);
    }

    #[test]
    fn server_commands_without_servers() {
        let mut s = fresh();
        assert_eq!(run(&mut s, "get_server_list"), vec![]);
        assert_eq!(run(&mut s, "get_server_list extra"), vec![]);
        let not_found = |n: &str| vec![reply(&format!("Server {n} not found"))];
        for (cmd, n) in [
            ("get_client_list 1234", "1234"),
            ("get_client_list", "0"),
            ("get_client_list abc", "0"),
            ("get_client_list -5", "-5"),
            ("get_client_list 4294967297", "1"),
            ("shutdown_server 1234", "1234"),
            ("shutdown_server", "0"),
            ("shutdown_server 12 -f", "12"),
            ("set_active_thread_percentage 12 50", "12"),
            ("set_active_thread_percentage", "0"),
            ("get_active_thread_percentage 12", "12"),
            ("set_device_pinned_mem_limit 12 0 1G", "12"),
            ("get_device_pinned_mem_limit 12 0", "12"),
            ("get_device_pinned_mem_limit", "0"),
            ("get_device_client_list 55", "55"),
        ] {
            assert_eq!(run(&mut s, cmd), not_found(n), "{cmd}");
        }
        assert_eq!(run(&mut s, "get_device_client_list"), vec![]);
    }

    #[test]
    fn terminate_client_unknown_server_three_lines() {
        let mut s = fresh();
        for (cmd, n) in [
            ("terminate_client 1234 5678", "1234"),
            ("terminate_client", "0"),
            ("terminate_client 5", "5"),
            ("terminate_client abc 7", "0"),
        ] {
            assert_eq!(
                run(&mut s, cmd),
                vec![
                    reply(&format!("Server {n} not found")),
                    reply(&format!("Server {n} not found!")),
                    reply("1"),
                ],
                "{cmd}"
            );
        }
    }

    #[test]
    fn ps_without_servers() {
        let mut s = fresh();
        assert_eq!(run(&mut s, "ps"), vec![reply("Server not found")]);
        assert_eq!(run(&mut s, "ps foo"), vec![reply("Server not found")]);
        for (cmd, n) in [("ps -p 55", "55"), ("ps -p", "0"), ("ps -p abc", "0")] {
            let line = format!("Server {n} not found");
            assert_eq!(
                run(&mut s, cmd),
                vec![
                    reply(&line),
                    reply(&line),
                    Output::StdoutOnly(String::new())
                ],
                "{cmd}"
            );
        }
    }

    #[test]
    fn client_priority() {
        let mut s = fresh();
        let get = |s: &mut ControlState| run(s, "get_default_client_priority");
        assert_eq!(get(&mut s), vec![reply("0")]);
        let invalid = vec![reply(INVALID_PRIORITY)];
        for (value, outputs, now) in [
            ("1", vec![], "1"),
            ("7", invalid.clone(), "1"),
            ("abc", vec![], "0"),
            ("1x", vec![], "1"),
            ("", vec![], "0"),
            ("1.5", vec![], "1"),
            ("0x1", vec![], "0"),
            ("-1", invalid.clone(), "0"),
            ("2", invalid.clone(), "0"),
            ("4294967297", vec![], "1"),
            ("4294967296", vec![], "0"),
            ("+1", vec![], "1"),
            ("99999999999999999999", invalid.clone(), "1"),
            ("010", invalid.clone(), "1"),
            ("-0", vec![], "0"),
            ("0 5", vec![], "0"),
        ] {
            let line = format!("set_default_client_priority {value}");
            assert_eq!(run(&mut s, line.trim_end()), outputs, "{value:?}");
            assert_eq!(get(&mut s), vec![reply(now)], "{value:?}");
        }
        assert_eq!(s.default_priority(), 0);
    }

    #[test]
    fn unknown_commands_and_whitespace() {
        let mut s = fresh();
        for (line, name) in [
            ("GET_SERVER_LIST", "GET_SERVER_LIST"),
            ("set_default_chunk_size 4", "set_default_chunk_size"),
            ("get_server_status 5", "get_server_status"),
            ("", ""),
            ("   ", ""),
            ("quit_", "quit_"),
            ("Unknown \"x\"", "Unknown"),
            ("get_server_list;", "get_server_list;"),
        ] {
            assert_eq!(
                run(&mut s, line),
                vec![reply(&format!("Unknown command \"{name}\""))],
                "{line:?}"
            );
        }
        assert_eq!(
            run(&mut s, "  get_default_client_priority   "),
            vec![reply("0")]
        );
        assert_eq!(run(&mut s, "\tget_server_list\tx"), vec![]);
        assert_eq!(run(&mut s, "get_server_list\r"), vec![]);
    }

    #[test]
    fn start_server_parsing() {
        let uid_required = vec![reply(UID_REQUIRED)];
        for line in [
            "start_server",
            "start_server -uid",
            "start_server -uid abc",
            "start_server -u 5",
            "start_server -UID 5",
            "start_server -uid=5",
            "start_server extra -uid 5",
        ] {
            let outcome = fresh().execute(line, ROOT);
            assert_eq!(outcome.outputs, uid_required, "{line}");
            assert_eq!(outcome.action, Action::None, "{line}");
        }
        for (line, uid) in [
            ("start_server -uid 0", 0),
            ("start_server -uid 12abc", 12),
            ("start_server -uid -1", -1),
            ("start_server -uid 4294967296", 0),
            ("start_server -uid +5", 5),
            ("start_server -uid 0x10", 0),
            ("start_server -uid 5 extra", 5),
            ("start_server -uid 99999999999", 1_215_752_191),
            ("start_server -uid   7", 7),
        ] {
            let outcome = fresh().execute(line, ROOT);
            assert_eq!(outcome.outputs, vec![], "{line}");
            assert_eq!(outcome.action, Action::StartServer { uid }, "{line}");
        }
    }

    #[test]
    fn start_server_privileges() {
        let user = Caller { uid: 1000 };
        let outcome = fresh().execute("start_server -uid 1000", user);
        assert_eq!(outcome.action, Action::StartServer { uid: 1000 });
        let outcome = fresh().execute("start_server -uid 0", user);
        assert_eq!(
            outcome.outputs,
            vec![reply("Insufficient privileges for UID 1000")]
        );
        assert_eq!(outcome.action, Action::None);
    }

    #[test]
    fn server_lifecycle() {
        let mut s = fresh();
        run(&mut s, "set_default_active_thread_percentage 40");
        run(&mut s, "set_default_device_pinned_mem_limit 0 2G");
        assert_eq!(
            s.server_started(4122, 0),
            "Starting new server 4122 for user 0"
        );
        assert_eq!(run(&mut s, "get_server_list"), vec![reply("4122")]);
        // One server at a time: a second start is silently ignored.
        assert_eq!(
            s.execute("start_server -uid 1000", ROOT),
            Outcome::new(vec![])
        );
        assert_eq!(run(&mut s, "get_client_list 4122"), vec![]);
        assert_eq!(
            run(&mut s, "get_active_thread_percentage 4122"),
            vec![reply("40.0")]
        );
        assert_eq!(
            run(&mut s, "set_active_thread_percentage 4122 30"),
            vec![reply("30.0")]
        );
        assert_eq!(
            run(&mut s, "set_active_thread_percentage 4122 300"),
            vec![log(INVALID_PERCENTAGE), reply("30.0")]
        );
        assert_eq!(
            run(&mut s, "get_device_pinned_mem_limit 4122 0"),
            vec![reply("2G")]
        );
        assert_eq!(run(&mut s, "get_device_pinned_mem_limit 4122 1"), unset());
        assert_eq!(run(&mut s, "set_device_pinned_mem_limit 4122 1 3G"), vec![]);
        assert_eq!(
            run(&mut s, "get_device_pinned_mem_limit 4122 1"),
            vec![reply("3G")]
        );
        // Per-server settings leave the defaults alone.
        assert_eq!(
            run(&mut s, "get_default_active_thread_percentage"),
            vec![reply("40.0")]
        );
        assert_eq!(
            run(&mut s, "get_default_device_pinned_mem_limit 1"),
            unset()
        );
        assert_eq!(run(&mut s, "get_device_client_list"), vec![]);
        assert_eq!(run(&mut s, "get_device_client_list 4122"), vec![]);
        assert_eq!(run(&mut s, "ps"), vec![]);
        assert_eq!(run(&mut s, "ps -p 4122"), vec![]);
        assert_eq!(
            run(&mut s, "terminate_client 4122 5"),
            vec![reply("Invalid process 5!")]
        );
        assert_eq!(run(&mut s, "shutdown_server 4122"), vec![]);
        assert_eq!(
            s.server_exited(4122, 1),
            vec![
                "Server 4122 exited with status 1".to_string(),
                "Removed Shm file at ".to_string()
            ]
        );
        assert_eq!(run(&mut s, "get_server_list"), vec![]);
        assert!(s.servers().is_empty());
    }

    #[test]
    fn quit_parsing() {
        for (line, timeout) in [
            ("quit", None),
            ("quit -t 5", Some(5)),
            ("quit -t 0", Some(0)),
            ("quit -t -2", Some(4_294_967_294)),
            ("quit -t 3abc", Some(3)),
            ("quit -t 2.5", Some(2)),
            ("quit  -t 4", Some(4)),
            ("quit -t 7 9", Some(7)),
            ("quit -t", None),
            ("quit -t abc", None),
            ("quit -x 3", None),
            ("quit foo -t 4", None),
        ] {
            let outcome = fresh().execute(line, ROOT);
            assert_eq!(outcome.action, Action::Quit { timeout }, "{line}");
            let want: Vec<Output> = timeout
                .map(|t| log(&format!("quit command issued with timeout of {t}")))
                .into_iter()
                .collect();
            assert_eq!(outcome.outputs, want, "{line}");
        }
    }

    #[test]
    fn quit_needs_root_or_owner() {
        let mut s = ControlState::new(&StartEnv {
            daemon_uid: 0,
            ..StartEnv::default()
        })
        .0;
        let outcome = s.execute("quit", Caller { uid: 1000 });
        assert_eq!(
            outcome,
            Outcome::new(vec![reply("Not enough privilege to execute quit command")])
        );
        let mut owned = ControlState::new(&StartEnv {
            daemon_uid: 1000,
            ..StartEnv::default()
        })
        .0;
        assert_eq!(
            owned.execute("quit", Caller { uid: 1000 }).action,
            Action::Quit { timeout: None }
        );
    }

    #[test]
    fn quit_status() {
        let mut s = fresh();
        assert_eq!(
            s.finish_quit(&[]),
            QuitReport {
                log: vec!["Exit with status 0".into()],
                ui_status: 0,
                exit_status: 0
            }
        );
        // A server that failed before quit: the log says 1, the UI still gets 0.
        let mut s = fresh();
        s.server_started(10, 0);
        s.server_exited(10, 1);
        let report = s.finish_quit(&[]);
        assert_eq!(report.log, vec!["Exit with status 1".to_string()]);
        assert_eq!((report.ui_status, report.exit_status), (0, 1));
        // A server still alive at quit that fails: both say 1.
        let mut s = fresh();
        s.server_started(11, 0);
        let report = s.finish_quit(&[(11, 1)]);
        assert_eq!(
            report.log,
            vec![
                "Server 11 exited with status 1".to_string(),
                "Removed Shm file at ".to_string(),
                "Exit with status 1".to_string()
            ]
        );
        assert_eq!((report.ui_status, report.exit_status), (1, 1));
    }

    #[test]
    fn environment_defaults() {
        let env = |atp: Option<&str>, prio: Option<&str>| StartEnv {
            active_thread_percentage: atp.map(String::from),
            client_priority: prio.map(String::from),
            daemon_uid: 0,
        };
        let atp_warning = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE should be between (0.0, 100.0]";
        let prio_warning = "CUDA_MPS_CLIENT_PRIORITY should be between [0,1]";
        for (atp, value, warn) in [
            (Some("25"), 25.0, false),
            (Some("33.333"), 33.333, false),
            (Some("abc"), 100.0, true),
            (Some(""), 100.0, true),
            (Some("101"), 100.0, true),
            (Some("0"), 100.0, true),
            (None, 100.0, false),
        ] {
            let (s, warnings) = ControlState::new(&env(atp, None));
            assert_eq!(s.default_percentage(), value, "{atp:?}");
            let want: Vec<String> = warn.then(|| atp_warning.to_string()).into_iter().collect();
            assert_eq!(warnings, want, "{atp:?}");
        }
        for (prio, value, warn) in [
            (Some("1"), 1, false),
            (Some("0"), 0, false),
            (Some("abc"), 0, false),
            (Some(""), 0, false),
            (Some("5"), 0, true),
            (Some("-1"), 0, true),
            (None, 0, false),
        ] {
            let (s, warnings) = ControlState::new(&env(None, prio));
            assert_eq!(s.default_priority(), value, "{prio:?}");
            let want: Vec<String> = warn.then(|| prio_warning.to_string()).into_iter().collect();
            assert_eq!(warnings, want, "{prio:?}");
        }
        let (_, warnings) = ControlState::new(&env(Some("x"), Some("9")));
        assert_eq!(
            warnings,
            vec![atp_warning.to_string(), prio_warning.to_string()]
        );
    }

    /// Splits outputs into what the UI prints and what control.log gets.
    fn render(outputs: &[Output]) -> (String, Vec<String>) {
        let mut stdout = String::new();
        let mut log = Vec::new();
        for output in outputs {
            match output {
                Output::Reply(text) => {
                    stdout.push_str(text);
                    stdout.push('\n');
                    log.push(text.clone());
                }
                Output::StdoutOnly(text) => {
                    stdout.push_str(text);
                    stdout.push('\n');
                }
                Output::LogOnly(text) => log.push(text.clone()),
            }
        }
        (stdout, log)
    }

    #[test]
    fn golden_535_transcript() {
        // Every step of shared/cases/mps/golden-535.309.01.json before `quit`: the UI's
        // stdout and the reply lines of control.log, in one daemon's lifetime.
        let steps: &[(&str, &str, &[&str])] = &[
            (
                "get_default_active_thread_percentage",
                "100.0\n",
                &["100.0"],
            ),
            (
                "set_default_active_thread_percentage 50",
                "50.0\n",
                &["50.0"],
            ),
            ("get_default_active_thread_percentage", "50.0\n", &["50.0"]),
            (
                "set_default_active_thread_percentage 12.345",
                "12.3\n",
                &["12.3"],
            ),
            (
                "set_default_active_thread_percentage 0",
                "12.3\n",
                &["Invalid percentage, expected between (0.0, 100.0]", "12.3"],
            ),
            (
                "set_default_active_thread_percentage 101",
                "12.3\n",
                &["Invalid percentage, expected between (0.0, 100.0]", "12.3"],
            ),
            (
                "set_default_active_thread_percentage abc",
                "12.3\n",
                &["Invalid percentage, expected between (0.0, 100.0]", "12.3"],
            ),
            ("get_default_active_thread_percentage", "12.3\n", &["12.3"]),
            (
                "get_default_device_pinned_mem_limit 0",
                "",
                &["No default pinned memory limit set for the device!"],
            ),
            ("set_default_device_pinned_mem_limit 0 1G", "", &[]),
            ("get_default_device_pinned_mem_limit 0", "1G\n", &["1G"]),
            ("set_default_device_pinned_mem_limit 0 1536M", "", &[]),
            ("get_default_device_pinned_mem_limit 0", "1G\n", &["1G"]),
            ("set_default_device_pinned_mem_limit 0 800", "", &[]),
            ("get_default_device_pinned_mem_limit 0", "800M\n", &["800M"]),
            ("set_default_device_pinned_mem_limit 1 5G", "", &[]),
            ("set_default_device_pinned_mem_limit 0 3G", "", &[]),
            (
                "set_default_device_pinned_mem_limit GPU-5f3c0c52-0000-0000-0000-000000000001 4G",
                "",
                &[],
            ),
            (
                "get_default_device_pinned_mem_limit 0",
                "",
                &["No default pinned memory limit set for the device!"],
            ),
            ("get_default_device_pinned_mem_limit 1", "5G\n", &["5G"]),
            ("set_default_device_pinned_mem_limit 1 xyz", "", &[]),
            (
                "get_default_device_pinned_mem_limit 1",
                "",
                &["No default pinned memory limit set for the device!"],
            ),
            ("set_default_device_pinned_mem_limit 0 2T", "", &[]),
            ("get_default_device_pinned_mem_limit 0", "2M\n", &["2M"]),
            ("get_server_list", "", &[]),
            (
                "get_client_list 1234",
                "Server 1234 not found\n",
                &["Server 1234 not found"],
            ),
            (
                "shutdown_server 1234",
                "Server 1234 not found\n",
                &["Server 1234 not found"],
            ),
            (
                "terminate_client 1234 5678",
                "Server 1234 not found\nServer 1234 not found!\n1\n",
                &["Server 1234 not found", "Server 1234 not found!", "1"],
            ),
            ("set_default_client_priority 1", "", &[]),
            ("get_default_client_priority", "1\n", &["1"]),
            (
                "set_default_client_priority 7",
                "Invalid priority value - must be 0 or 1!\n",
                &["Invalid priority value - must be 0 or 1!"],
            ),
            (
                "GET_SERVER_LIST",
                "Unknown command \"GET_SERVER_LIST\"\n",
                &["Unknown command \"GET_SERVER_LIST\""],
            ),
            (
                "set_default_chunk_size 4",
                "Unknown command \"set_default_chunk_size\"\n",
                &["Unknown command \"set_default_chunk_size\""],
            ),
            ("ps", "Server not found\n", &["Server not found"]),
            (
                "start_server",
                "A user id (UID) is required to start a new server\n",
                &["A user id (UID) is required to start a new server"],
            ),
        ];
        let mut s = fresh();
        for (line, stdout, log) in steps {
            let outcome = s.execute(line, ROOT);
            assert_eq!(outcome.action, Action::None, "{line}");
            let (got_stdout, got_log) = render(&outcome.outputs);
            assert_eq!(got_stdout, *stdout, "{line}");
            assert_eq!(got_log, log.to_vec(), "{line}");
        }
        let outcome = s.execute("quit", ROOT);
        assert_eq!(
            outcome,
            Outcome {
                outputs: vec![],
                action: Action::Quit { timeout: None }
            }
        );
        assert_eq!(
            s.finish_quit(&[]).log,
            vec!["Exit with status 0".to_string()]
        );
    }

    #[test]
    fn values_are_scanned_where_the_previous_one_stopped() {
        // `%d %llu`: the value is read right after the device's digits.
        let mut s = fresh();
        run(&mut s, "set_default_device_pinned_mem_limit 2 7G");
        assert_eq!(
            run(&mut s, "set_default_device_pinned_mem_limit 2abc 1G"),
            vec![]
        );
        assert_eq!(
            run(&mut s, "get_default_device_pinned_mem_limit 2"),
            unset()
        );
        run(&mut s, "set_default_device_pinned_mem_limit 3 4G");
        run(&mut s, "set_default_device_pinned_mem_limit 3 ,5G");
        assert_eq!(
            run(&mut s, "get_default_device_pinned_mem_limit 3"),
            unset()
        );
        for line in [
            "set_default_device_pinned_mem_limit  3   5G",
            "set_default_device_pinned_mem_limit\t3\t5G",
            "  set_default_device_pinned_mem_limit 3 5G  ",
        ] {
            run(&mut s, "set_default_device_pinned_mem_limit 3 1G");
            assert_eq!(run(&mut s, line), vec![], "{line:?}");
            assert_eq!(
                run(&mut s, "get_default_device_pinned_mem_limit 3"),
                vec![reply("5G")],
                "{line:?}"
            );
        }
        // A blank between value and unit means MiB, whatever the blank.
        for line in [
            "set_default_device_pinned_mem_limit 3 6 G",
            "set_default_device_pinned_mem_limit 3 6\tG",
        ] {
            run(&mut s, line);
            assert_eq!(
                run(&mut s, "get_default_device_pinned_mem_limit 3"),
                vec![reply("6M")],
                "{line:?}"
            );
        }
        assert_eq!(
            run(&mut s, "set_default_active_thread_percentage\t25"),
            vec![reply("25.0")]
        );
        run(&mut s, "set_default_client_priority\t1 0");
        assert_eq!(run(&mut s, "get_default_client_priority"), vec![reply("1")]);
    }

    #[test]
    fn ps_option_and_device_client_list_pid_zero() {
        let mut s = fresh();
        let twice = |n: &str| {
            let line = format!("Server {n} not found");
            vec![
                reply(&line),
                reply(&line),
                Output::StdoutOnly(String::new()),
            ]
        };
        assert_eq!(run(&mut s, "ps -p55"), twice("55"));
        assert_eq!(run(&mut s, "ps  -p 55"), twice("55"));
        assert_eq!(run(&mut s, "ps -p 55abc"), twice("55"));
        assert_eq!(run(&mut s, "ps -px"), twice("0"));
        assert_eq!(run(&mut s, "ps -x 5"), vec![reply("Server not found")]);
        assert_eq!(run(&mut s, "ps - p"), vec![reply("Server not found")]);
        // PID 0, spelled any way, means "all servers": nothing to list.
        for line in [
            "get_device_client_list 0",
            "get_device_client_list 0abc",
            "get_device_client_list -0",
            "get_device_client_list abc",
        ] {
            assert_eq!(run(&mut s, line), vec![], "{line}");
        }
    }

    #[test]
    fn flags_must_be_whole_words() {
        for line in ["start_server -uid5", "start_server -uidx 5"] {
            assert_eq!(
                fresh().execute(line, ROOT).outputs,
                vec![reply(UID_REQUIRED)],
                "{line}"
            );
        }
        for line in ["quit -t4", "quit -tx 4"] {
            assert_eq!(
                fresh().execute(line, ROOT),
                Outcome {
                    outputs: vec![],
                    action: Action::Quit { timeout: None }
                },
                "{line}"
            );
        }
    }
}
