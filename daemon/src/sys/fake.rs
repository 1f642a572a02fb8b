//! A recording fake of the leaf for unit tests: an MPS control program that keeps its state in
//! memory, mounts that are only remembered, and processes that exist only here. Knobs make it
//! misbehave the ways the real programs do.
//!
//! The fake control daemon's answers come from the emulator's interpreter
//! (`gpushare_mps_emulator::command`, conformance-tested against NVIDIA's program), so that
//! production's read-back is checked against an independent reading of the commands, never
//! against its own formatting.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use gpushare_mps_emulator::command::{Action, Caller, ControlState, Output, StartEnv};

use super::{
    CommandOutput, CommandRunner, CommandSpec, DeviceFiles, HostOps, Mounter, NodeStat, Processes,
};

#[derive(Debug, Clone)]
pub(crate) struct FakeDaemon {
    pub pid: i32,
    pub alive: bool,
    /// Write ends of the pipes handed out as its "pidfds": dropped when it dies, which makes
    /// their read ends readable (hang-up), as a pidfd becomes readable at exit.
    pub watchers: Vec<Arc<std::os::fd::OwnedFd>>,
    pub env: BTreeMap<String, String>,
    /// Its state, as the emulator's interpreter keeps it.
    pub control: ControlState,
    /// Hung: it holds its pipe directory and runs, but answers nothing (every UI run on it
    /// ends at its timeout) until it is killed; `/proc` shows it running.
    pub hung: bool,
    /// SIGSTOPped: it answers nothing, as a hung one, and `/proc` shows it stopped.
    pub stopped: bool,
}

impl FakeDaemon {
    /// A running daemon (or any process the fake host knows) with this environment.
    pub fn new(pid: i32, env: BTreeMap<String, String>) -> FakeDaemon {
        let (control, _) = ControlState::new(&StartEnv {
            active_thread_percentage: env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").cloned(),
            client_priority: None,
            daemon_uid: 0,
        });
        FakeDaemon {
            pid,
            alive: true,
            watchers: Vec::new(),
            env,
            control,
            hung: false,
            stopped: false,
        }
    }

    /// Runs one control command as root would; returns what the UI prints.
    pub fn execute(&mut self, line: &str) -> (String, Action) {
        let outcome = self.control.execute(line, Caller { uid: 0 });
        let mut out = String::new();
        for o in outcome.outputs {
            if let Output::Reply(s) | Output::StdoutOnly(s) = o {
                out.push_str(&s);
                out.push('\n');
            }
        }
        (out, outcome.action)
    }

    /// Ends it as a crash would: gone, its pidfds readable.
    pub fn die(&mut self) {
        self.alive = false;
        self.watchers.clear();
    }
}

#[derive(Debug, Default)]
pub(crate) struct FakeState {
    pub next_pid: i32,
    pub daemons: BTreeMap<PathBuf, FakeDaemon>,
    pub mounts: BTreeSet<PathBuf>,
    /// Every command line run, with its stdin.
    pub calls: Vec<String>,
    pub killed: Vec<i32>,
    /// `-d` exits 1.
    pub fail_start: bool,
    /// `set_default_active_thread_percentage` is silently not applied.
    pub ignore_atp: bool,
    /// `quit` does not end the daemon.
    pub ignore_quit: bool,
    /// Unmounting fails (EBUSY).
    pub fail_unmount: bool,
    /// Asking for a lock holder fails (out of file descriptors).
    pub fail_proc: bool,
    /// Every program run takes this long (a slow or stuck control daemon).
    pub delay: Option<std::time::Duration>,
    /// A rendezvous: runs whose stdin contains this text wait until this many of them are in
    /// flight at once (then every such run passes at once), or 2 s at most. What work runs in
    /// parallel meets here; work done one after another never does.
    pub gate: Option<(String, usize)>,
    /// Most runs seen waiting at the gate at once.
    pub gate_peak: usize,
    gate_waiting: usize,
    gate_open: bool,
    /// Host device nodes that do not exist. Every other path is a character device with the
    /// number the NVIDIA driver gives a node of its name (see `gpu::nodes`), unless
    /// `node_stats` says otherwise.
    pub missing_nodes: BTreeSet<PathBuf>,
    /// Host paths answering with this kind and number instead.
    pub node_stats: BTreeMap<PathBuf, NodeStat>,
    /// What the host saw, in order: `run <stdin>` (`: timed out` when the run ended at its
    /// timeout), `holder? <pipe dir>` for every lock-holder query (what a wait for a
    /// daemon to exit polls), `SIGKILL <pid>`.
    pub timeline: Vec<String>,
}

/// The fake host; clone it to keep a handle for assertions.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeHost(pub Arc<Mutex<FakeState>>);

impl FakeHost {
    pub fn ops(&self) -> HostOps {
        HostOps {
            runner: Arc::new(self.clone()),
            mounter: Arc::new(self.clone()),
            processes: Arc::new(self.clone()),
            devices: Arc::new(self.clone()),
            machine: Arc::new(self.clone()),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn output(code: i32, stdout: String, stderr: &str) -> CommandOutput {
    CommandOutput {
        code: Some(code),
        stdout,
        stderr: stderr.into(),
        timed_out: false,
    }
}

impl FakeHost {
    fn pass_gate(&self, spec: &CommandSpec) {
        let Some((text, n)) = self.state().gate.clone() else {
            return;
        };
        if !String::from_utf8_lossy(&spec.stdin).contains(&text) {
            return;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        {
            let mut st = self.state();
            st.gate_waiting += 1;
            st.gate_peak = st.gate_peak.max(st.gate_waiting);
            if st.gate_waiting >= n {
                st.gate_open = true;
            }
        }
        while !self.state().gate_open && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.state().gate_waiting -= 1;
    }
}

impl CommandRunner for FakeHost {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        self.pass_gate(spec);
        let delay = self.state().delay;
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        let mut st = self.state();
        st.calls.push(format!(
            "{} {} <<{}",
            spec.program.display(),
            spec.args.join(" "),
            String::from_utf8_lossy(&spec.stdin).trim()
        ));
        let pipe = PathBuf::from(
            spec.env
                .get("CUDA_MPS_PIPE_DIRECTORY")
                .cloned()
                .unwrap_or_default(),
        );
        if spec.args.first().map(String::as_str) == Some("-d") {
            if st.fail_start {
                return Ok(output(1, String::new(), ""));
            }
            st.next_pid += 1;
            let pid = 900_000 + st.next_pid;
            st.daemons
                .insert(pipe, FakeDaemon::new(pid, spec.env.clone()));
            return Ok(output(0, String::new(), ""));
        }
        let (ignore_atp, ignore_quit) = (st.ignore_atp, st.ignore_quit);
        let stdin = String::from_utf8_lossy(&spec.stdin).trim().to_string();
        if st
            .daemons
            .get(&pipe)
            .is_some_and(|d| d.alive && (d.hung || d.stopped))
        {
            // The UI waits on a daemon that never answers until the runner's timeout ends it
            // (the fake does not sleep it out: the timeline counts it).
            st.timeline.push(format!("run {stdin}: timed out"));
            return Ok(CommandOutput {
                code: None,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            });
        }
        st.timeline.push(format!("run {stdin}"));
        let Some(d) = st.daemons.get_mut(&pipe).filter(|d| d.alive) else {
            return Ok(output(
                1,
                String::new(),
                "Cannot find MPS control daemon process\n",
            ));
        };
        let mut out = String::new();
        for line in String::from_utf8_lossy(&spec.stdin).lines() {
            if ignore_atp
                && line
                    .trim_start()
                    .starts_with("set_default_active_thread_percentage")
            {
                continue;
            }
            let (text, action) = d.execute(line);
            out += &text;
            if matches!(action, Action::Quit { .. }) && !ignore_quit {
                d.die();
            }
        }
        Ok(output(0, out, ""))
    }
}

impl Mounter for FakeHost {
    fn mount_tmpfs(&self, target: &Path, _size_bytes: u64) -> io::Result<()> {
        self.state().mounts.insert(target.to_path_buf());
        Ok(())
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        let mut st = self.state();
        if st.fail_unmount {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        st.mounts.remove(target);
        Ok(())
    }

    fn is_mounted(&self, target: &Path) -> io::Result<bool> {
        Ok(self.state().mounts.contains(target))
    }
}

impl Processes for FakeHost {
    fn lock_holder(&self, path: &Path) -> io::Result<Option<i32>> {
        let mut st = self.state();
        let asked = path.parent().unwrap_or(path).display().to_string();
        st.timeline.push(format!("holder? {asked}"));
        if st.fail_proc {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        // The kernel follows links on the way to the lock file, so a link to another pipe
        // directory names that directory's daemon here too.
        let pipe = path
            .parent()
            .map(|p| std::fs::canonicalize(p).unwrap_or(p.to_path_buf()));
        Ok(pipe
            .and_then(|pipe| st.daemons.get(&pipe))
            .filter(|d| d.alive)
            .map(|d| d.pid))
    }

    fn alive(&self, pid: i32) -> bool {
        self.state()
            .daemons
            .values()
            .any(|d| d.pid == pid && d.alive)
    }

    fn kill(&self, pid: i32) {
        let mut st = self.state();
        st.killed.push(pid);
        st.timeline.push(format!("SIGKILL {pid}"));
        for d in st.daemons.values_mut().filter(|d| d.pid == pid) {
            d.alive = false;
            d.watchers.clear();
        }
    }

    fn reap(&self, _pid: i32) {}

    fn with_env_under(&self, var: &str, dir: &Path) -> Vec<(i32, PathBuf)> {
        self.state()
            .daemons
            .values()
            .filter(|d| d.alive)
            .filter_map(|d| d.env.get(var).map(|v| (d.pid, PathBuf::from(v))))
            .filter(|(_, p)| p.starts_with(dir))
            .collect()
    }

    fn watch(&self, pid: i32) -> io::Result<std::os::fd::OwnedFd> {
        let mut st = self.state();
        let Some(d) = st.daemons.values_mut().find(|d| d.pid == pid && d.alive) else {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        };
        let (read, write) = nix::unistd::pipe().map_err(io::Error::from)?;
        d.watchers.push(Arc::new(write));
        Ok(read)
    }

    fn start_time(&self, pid: i32) -> Option<u64> {
        // A fake pid is never reused, so its number stands for its start time.
        self.alive(pid).then_some(pid as u64 * 100)
    }

    fn stopped(&self, pid: i32) -> bool {
        self.state()
            .daemons
            .values()
            .any(|d| d.pid == pid && d.alive && d.stopped)
    }
}

impl super::Machine for FakeHost {
    fn mem_total_kib(&self) -> Option<u64> {
        Some(2 << 20)
    }

    fn boot_id(&self) -> String {
        "fake-boot".into()
    }

    fn cgroup(&self, pid: i32) -> Option<String> {
        self.alive(pid).then(|| format!("/fake/{pid}"))
    }
}

impl DeviceFiles for FakeHost {
    fn stat(&self, path: &Path) -> io::Result<NodeStat> {
        let st = self.state();
        if st.missing_nodes.contains(path) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if let Some(s) = st.node_stats.get(path) {
            return Ok(*s);
        }
        // The simulated backend's dynamic major for MIG capability nodes.
        let majors = crate::gpu::nodes::DriverMajors::default()
            .with("nvidia-caps", crate::gpu::NVIDIA_CAPS_MAJOR);
        let (major, minor) = crate::gpu::nodes::expected_number(path, &majors)
            .map_or((1, 3), |(major, minor)| (major.unwrap_or(0), minor));
        Ok(NodeStat::char_device(major, minor))
    }
}
