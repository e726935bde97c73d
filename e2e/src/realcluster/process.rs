//! The cluster's processes: daemons started with their output in a log and their pid in a
//! file, checked, signalled and stopped; and the launcher thread that starts the daemons of
//! the Nodes added after the start.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use super::write;
use crate::Error;

/// What to start: a program, its arguments, where its output and pid go, and optionally the
/// network namespace and host name it runs with (a Node in a namespace).
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Standard output and error.
    pub log: PathBuf,
    /// `pid\nprogram\n`, for [`recorded_pid`].
    pub pid_file: PathBuf,
    /// A namespace file (`/run/netns/NAME`) to enter before the program starts.
    pub netns: Option<PathBuf>,
    /// A host name of its own (a new UTS namespace), so host-network Pods on the Node see the
    /// Node's name as a machine's would.
    pub hostname: Option<String>,
}

/// Starts a daemon as `spec` says. It gets SIGKILL when the thread that started it ends, so a
/// killed test binary takes its cluster along (the next start cleans up what that leaves).
pub(crate) fn spawn(spec: &Spec) -> Result<u32, Error> {
    let log = std::fs::File::create(&spec.log).map_err(|e| Error::io(format!("creating {}", spec.log.display()), e))?;
    let err = log.try_clone().map_err(|e| Error::io("creating a log", e))?;
    // Opened here, entered in the child: setns needs only the descriptor.
    let netns = match &spec.netns {
        Some(path) => Some(std::fs::File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?),
        None => None,
    };
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    let hostname = spec.hostname.clone().map(String::into_bytes);
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args).stdin(Stdio::null()).stdout(log).stderr(err);
    // SAFETY: only async-signal-safe calls (setsid, prctl, setns, unshare, sethostname) run
    // between fork and exec, on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = netns_fd
                && libc::setns(fd, libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(name) = &hostname
                && (libc::unshare(libc::CLONE_NEWUTS) != 0 || libc::sethostname(name.as_ptr().cast(), name.len()) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| Error::io(format!("starting {}", spec.program.display()), e))?;
    write(&spec.pid_file, &format!("{}\n{}\n", child.id(), spec.program.display()))?;
    Ok(child.id())
}

/// Starts a daemon of the host's Node (no namespace) with its output in `logs/<name>.log` and
/// its pid in `<run_dir>/<name>.pid`.
pub(crate) fn daemon(name: &str, program: &Path, args: &[String], logs: &Path, run_dir: &Path) -> Result<u32, Error> {
    spawn(&Spec {
        program: program.to_path_buf(),
        args: args.to_vec(),
        log: logs.join(format!("{name}.log")),
        pid_file: run_dir.join(format!("{name}.pid")),
        netns: None,
        hostname: None,
    })
}

type Job = (Spec, mpsc::Sender<Result<u32, Error>>);

/// A thread that starts daemons for the cluster's whole life. A daemon dies with the thread
/// that started it (PR_SET_PDEATHSIG is per thread), so daemons started for a scenario from a
/// tokio worker or a blocking-pool thread (which ends after 10 s idle) would die with it.
pub(crate) struct Launcher {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl Launcher {
    /// Starts the thread; it ends when the launcher is dropped, and its daemons with it.
    pub(crate) fn new() -> Result<Launcher, Error> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("realcluster-launcher".into())
            .spawn(move || {
                for (spec, reply) in rx {
                    let _ = reply.send(spawn(&spec));
                }
            })
            .map_err(|e| Error::io("starting the launcher thread", e))?;
        Ok(Launcher { jobs: Mutex::new(tx) })
    }

    /// Starts `spec` from the launcher's thread; returns its pid.
    pub(crate) fn launch(&self, spec: Spec) -> Result<u32, Error> {
        let (tx, rx) = mpsc::channel();
        let jobs = self.jobs.lock().map_err(|_| Error::Other("the launcher's lock is poisoned".into()))?;
        jobs.send((spec, tx)).map_err(|_| Error::Other("the launcher thread ended".into()))?;
        drop(jobs);
        rx.recv().map_err(|_| Error::Other("the launcher thread ended".into()))?
    }
}

/// Whether `pid` still runs. Our own exited children are reaped here (a zombie would answer
/// signal 0 for ever); others' are read from `/proc`.
pub(crate) fn alive(pid: u32) -> bool {
    let mut status = 0;
    // SAFETY: a non-blocking wait; it fails harmlessly (ECHILD) for a process not our child.
    if unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) } == pid as libc::pid_t {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name in parentheses; Z is a zombie, X dead.
    stat.rsplit_once(')').is_some_and(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X') | None))
}

/// The last `lines` lines of a log.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until `check` answers true, failing early when the process `pid` exits.
pub(crate) fn wait_for(
    what: &str,
    pid: Option<u32>,
    within: Duration,
    log: &Path,
    check: impl Fn() -> bool,
) -> Result<(), Error> {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return Ok(());
        }
        let dead = pid.is_some_and(|p| !alive(p));
        if dead || Instant::now() > deadline {
            return Err(Error::Other(format!(
                "{what}: {}; {} ends:\n{}",
                if dead { "the process exited" } else { "timed out" },
                log.display(),
                tail(log, 20)
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends `sig` to `pid`.
pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: signalling a process of the cluster (callers found it by its pid file, its
    // namespace or its cgroup).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Pid of a component from its pid file, if that process still runs the recorded program.
pub(crate) fn recorded_pid(pid_file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pid_file).ok()?;
    let mut lines = text.lines();
    let pid: u32 = lines.next()?.parse().ok()?;
    let program = lines.next()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let target = std::fs::canonicalize(program).unwrap_or_else(|_| PathBuf::from(program));
    (exe == target).then_some(pid)
}

/// SIGTERM to the components of `run_dir` named `names`, SIGKILL after `grace`.
pub(crate) fn stop_components(run_dir: &Path, names: &[&str], grace: Duration) {
    let pids: Vec<u32> = names.iter().filter_map(|n| recorded_pid(&run_dir.join(format!("{n}.pid")))).collect();
    for pid in &pids {
        signal(*pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in pids.iter().filter(|p| alive(**p)) {
        signal(*pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL to whatever `pids` lists, again until it lists nothing (a process may fork while
/// being killed) or `within` has passed; then waits until each has exited (reaping our own
/// children). A killed process leaves its namespaces before its files are closed, so a
/// namespace found empty does not yet mean its sockets are. Returns how many it killed.
pub(crate) fn kill_all(pids: impl Fn() -> Vec<u32>, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut killed = std::collections::BTreeSet::new();
    loop {
        let now = pids();
        if now.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in &now {
            signal(*pid, libc::SIGKILL);
            killed.insert(*pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    while killed.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    killed.len()
}

/// The RSS of `pid` in KiB (0 when it is gone).
pub(crate) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
