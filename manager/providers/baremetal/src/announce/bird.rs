//! The BIRD driver: writes the rendered config atomically and asks BIRD to reload it, speaking
//! BIRD's control protocol on its unix socket directly (no `birdc` needed in our image).
//!
//! The announcer process starts it in one place, beside the L2 responder, with what this node
//! advertises (every allowed address for `externalTrafficPolicy: Cluster`; for `Local`, those
//! with a ready endpoint on this node; and the pools' prefixes) in a `watch` channel:
//!
//! ```text
//! let bird = BirdAnnouncer::new(bgp_config, NodeFacts { ipv4: node_ipv4 }, BirdSettings::default());
//! tokio::spawn(bgp::bird::run(bird, addresses_rx.clone(), cancel.clone()));
//! ```
//!
//! or calls [`BirdAnnouncer::announce`] itself on every change.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Advertisement, BgpConfig, NodeFacts, Password, PasswordProblem, RenderError, render};
use crate::announce::bgp_sessions::{self, Session};

/// Where the announcer writes BIRD's config by default (BIRD runs with `-c` on it).
pub const DEFAULT_CONFIG_PATH: &str = "/run/bird/bird.conf";
/// BIRD's control socket by default (BIRD runs with `-s` on it).
pub const DEFAULT_SOCKET_PATH: &str = "/run/bird/bird.ctl";
/// How long one exchange with BIRD may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon [`run`] tries again after a failed announcement (BIRD not up yet, a password file
/// not mounted yet).
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How often the sessions' state is read from BIRD (`show protocols`).
pub const SESSION_POLL: Duration = Duration::from_secs(2);
/// The most a reply may hold; BIRD's answers to `configure` are two short lines.
const MAX_REPLY_BYTES: u64 = 256 * 1024;
/// A password file is read up to this many bytes (one more than a password may have).
const MAX_PASSWORD_FILE_BYTES: u64 = super::MAX_PASSWORD_BYTES as u64 + 2;

/// Where the config goes and how BIRD is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BirdSettings {
    /// The config file BIRD reads (`bird -c`); written as temp file + rename, mode 0640.
    pub config_path: PathBuf,
    /// BIRD's control socket (`bird -s`).
    pub socket_path: PathBuf,
    /// The bound on one exchange with BIRD (connect, command, answer).
    pub timeout: Duration,
}

impl Default for BirdSettings {
    fn default() -> Self {
        Self {
            config_path: DEFAULT_CONFIG_PATH.into(),
            socket_path: DEFAULT_SOCKET_PATH.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// What an [`BirdAnnouncer::announce`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    /// The rendered config equals the one BIRD already runs: nothing written, no reload.
    Unchanged,
    /// A new config was written and BIRD reloaded it.
    Reloaded,
}

/// Why an announcement did not reach BIRD. No variant carries a password or config text.
#[derive(Debug, thiserror::Error)]
pub enum BgpError {
    /// A peer's `passwordFile` could not be read.
    #[error(
        "loadBalancer.announcement.bgp.peers[{index}].passwordFile: cannot be read ({kind}); it must name a readable file holding the password"
    )]
    PasswordUnreadable {
        /// The peer's index in `peers`.
        index: usize,
        /// What went wrong.
        kind: io::ErrorKind,
    },
    /// A peer's password file holds something BIRD cannot take.
    #[error("loadBalancer.announcement.bgp.peers[{index}].passwordFile: the password {problem}")]
    PasswordInvalid {
        /// The peer's index in `peers`.
        index: usize,
        /// What is wrong with it.
        problem: PasswordProblem,
    },
    /// The config could not be rendered.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The config file could not be written.
    #[error("writing BIRD's config {path}: {source}")]
    Write {
        /// The config path.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// BIRD's control socket could not be used (BIRD not running yet, wrong path, ...).
    #[error("BIRD's control socket {path}: {source} (is BIRD running with -s {path}?)")]
    Control {
        /// The socket path.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// BIRD did not answer within the timeout.
    #[error("BIRD's control socket {path}: no complete answer within {timeout:?}")]
    Timeout {
        /// The socket path.
        path: PathBuf,
        /// The bound.
        timeout: Duration,
    },
    /// The answer was not BIRD's control protocol, or too long.
    #[error("BIRD's control socket {path}: not a BIRD control-protocol answer")]
    Protocol {
        /// The socket path.
        path: PathBuf,
    },
    /// BIRD answered `configure` with an error and keeps running its previous config.
    #[error(
        "BIRD refused the new config {path} (reply code {code}{}); it keeps the previous one. `bird -p -c {path}` shows why",
        .location.map(|(line, column)| format!(", at line {line}, column {column}")).unwrap_or_default()
    )]
    Refused {
        /// The config path.
        path: PathBuf,
        /// BIRD's reply code (8002: config file error).
        code: u16,
        /// Line and column of a config error, when BIRD gave them.
        location: Option<(u32, u32)>,
    },
}

/// Keeps BIRD announcing a set of addresses: renders, writes and reloads only on change.
pub struct BirdAnnouncer {
    config: BgpConfig,
    node: NodeFacts,
    settings: BirdSettings,
    /// The text BIRD confirmed it runs; `None` until the first successful reload, so a failed
    /// write or reload is retried by the next call.
    applied: Option<String>,
}

impl fmt::Debug for BirdAnnouncer {
    // The applied text may hold passwords: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BirdAnnouncer")
            .field("settings", &self.settings)
            .field("applied", &self.applied.is_some())
            .finish_non_exhaustive()
    }
}

impl BirdAnnouncer {
    /// An announcer for validated `config` on the node described by `node`; it touches nothing
    /// until the first [`announce`](Self::announce).
    pub fn new(config: BgpConfig, node: NodeFacts, settings: BirdSettings) -> Self {
        Self { config, node, settings, applied: None }
    }

    /// Make BIRD advertise exactly the addresses of `advertisement` inside its pool prefixes
    /// (host routes; loopback, unspecified and multicast ones are left out) to every configured
    /// peer of the address's family, with an export filter admitting only host routes of those
    /// prefixes. Reads the peers' password files, renders the config, and when it differs from
    /// the one BIRD runs, writes it (temp + rename) and sends `configure`; BIRD keeps
    /// established sessions across that reload. Call it whenever the set changes and again
    /// after an error (BIRD may not be up yet); an unchanged set costs the password reads and a
    /// render, and no I/O towards BIRD.
    pub async fn announce(&mut self, advertisement: &Advertisement) -> Result<Changed, BgpError> {
        let files: Vec<(usize, PathBuf)> = (self.config.peers.iter().enumerate())
            .filter_map(|(i, peer)| Some((i, peer.password_file.clone()?)))
            .collect();
        let passwords = blocking(move || read_passwords(&files)).await?;
        let text = render(&self.config, &self.node, &passwords, advertisement)?;
        if !needs_reload(self.applied.as_deref(), &text) {
            return Ok(Changed::Unchanged);
        }
        // A failed write or reload leaves `applied` as it was (None after a write), so the
        // next call tries again.
        self.applied = None;
        let path = self.settings.config_path.clone();
        let content = text.clone();
        blocking(move || {
            write_atomically(&path, content.as_bytes()).map_err(|source| BgpError::Write { path, source })
        })
        .await?;
        let reply = control(&self.settings.socket_path, "configure", self.settings.timeout).await?;
        configure_outcome(&reply, &self.settings.config_path)?;
        self.applied = Some(text);
        Ok(Changed::Reloaded)
    }

    /// What reads the peers' sessions: BIRD's control socket and the configured peers, apart
    /// from the announcer so the reading never waits on a reload (nor a reload on it).
    pub fn session_reader(&self) -> SessionReader {
        SessionReader {
            socket_path: self.settings.socket_path.clone(),
            timeout: self.settings.timeout,
            peers: self.config.peers.iter().map(|p| p.address).collect(),
        }
    }
}

/// Reads the configured peers' sessions from BIRD (`show protocols`).
#[derive(Debug, Clone)]
pub struct SessionReader {
    socket_path: PathBuf,
    timeout: Duration,
    peers: Vec<std::net::IpAddr>,
}

impl SessionReader {
    /// Each configured peer's session as BIRD reports it; every peer `Unknown`, saying why,
    /// when BIRD cannot be reached.
    pub async fn read(&self) -> Vec<Session> {
        match control(&self.socket_path, "show protocols", self.timeout).await {
            Ok(reply) => bgp_sessions::parse(&reply, &self.peers),
            Err(error) => {
                let detail: String = error.to_string().chars().take(bgp_sessions::MAX_DETAIL).collect();
                let unknown = |peer: &std::net::IpAddr| Session {
                    peer: *peer,
                    state: "Unknown".into(),
                    since: String::new(),
                    detail: detail.clone(),
                };
                self.peers.iter().map(unknown).collect()
            }
        }
    }

    /// Publish the sessions in `sessions` every [`SESSION_POLL`] when they changed, until `cancel`.
    async fn publish(self, sessions: watch::Sender<Vec<Session>>, cancel: CancellationToken) {
        let mut poll = tokio::time::interval(SESSION_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = poll.tick() => {}
            }
            let now = self.read().await;
            crate::announce::publish::if_changed(&sessions, now);
        }
    }
}

/// Keep BIRD announcing the latest advertisement in `addresses` until `cancel` fires or the
/// sender goes: announces on every change and retries a failure every [`RETRY_AFTER`]; and
/// publishes the peers' sessions in `sessions` every [`SESSION_POLL`] when they changed. Logs
/// outcomes and errors (never the config text). Routes are withdrawn by the peers when BIRD
/// stops with the pod, so stopping leaves BIRD as it is.
pub async fn run(
    mut bird: BirdAnnouncer,
    mut addresses: watch::Receiver<Advertisement>,
    sessions: watch::Sender<Vec<Session>>,
    cancel: CancellationToken,
) {
    // Its own task: a slow `show protocols` never delays an announce.
    let readers = cancel.child_token();
    let reader = tokio::spawn(bird.session_reader().publish(sessions, readers.clone()));
    loop {
        let set = addresses.borrow_and_update().clone();
        let retry_at = match bird.announce(&set).await {
            Ok(Changed::Reloaded) => {
                tracing::info!(addresses = set.addresses.len(), "BGP announcement: BIRD reloaded");
                None
            }
            Ok(Changed::Unchanged) => None,
            Err(error) => {
                tracing::warn!(%error, "BGP announcement failed; retrying");
                Some(tokio::time::Instant::now() + RETRY_AFTER)
            }
        };
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => break,
            changed = addresses.changed() => if changed.is_err() {
                break;
            },
            () = retry => {}
        }
    }
    readers.cancel();
    let _ = reader.await;
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BgpError> + Send + 'static,
) -> Result<T, BgpError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|join| {
        Err(BgpError::Write { path: PathBuf::new(), source: io::Error::other(join.to_string()) })
    })
}

/// Whether BIRD must load `rendered`: only when it differs from what it runs.
pub fn needs_reload(applied: Option<&str>, rendered: &str) -> bool {
    applied != Some(rendered)
}

fn read_passwords(files: &[(usize, PathBuf)]) -> Result<BTreeMap<usize, Password>, BgpError> {
    let mut passwords = BTreeMap::new();
    for (index, path) in files {
        let index = *index;
        let mut content = Vec::new();
        let read = std::fs::File::open(path)
            .and_then(|file| io::Read::read_to_end(&mut io::Read::take(file, MAX_PASSWORD_FILE_BYTES), &mut content));
        read.map_err(|e| BgpError::PasswordUnreadable { index, kind: e.kind() })?;
        let password =
            Password::from_file_content(&content).map_err(|problem| BgpError::PasswordInvalid { index, problem })?;
        passwords.insert(index, password);
    }
    Ok(passwords)
}

/// The config file's mode: it may hold passwords, so no one else; group-readable because BIRD
/// runs as another user than a root (L2) announcer and reads it through the volume's group.
pub const CONFIG_MODE: u32 = 0o640;

/// Replace `path` with `content` so that BIRD never reads a half-written file: write a
/// temporary file beside it (mode [`CONFIG_MODE`], group of its directory), flush it to disk,
/// rename it.
pub fn write_atomically(path: &Path, content: &[u8]) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let result = (|| {
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(CONFIG_MODE).open(&temp)?;
        // Set explicitly: the mode given at creation is narrowed by the umask.
        file.set_permissions(std::fs::Permissions::from_mode(CONFIG_MODE))?;
        share_with_directory_group(&file, &temp)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Give the still-empty `file` its directory's group, which BIRD shares: the pod's fsGroup
/// (kubelet makes that volume setgid, so this is usually already so). A writer that is not in
/// that group keeps its own, and BIRD then reads the file only as the same user.
fn share_with_directory_group(file: &std::fs::File, path: &Path) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let group = std::fs::metadata(dir)?.gid();
    if file.metadata()?.gid() == group {
        return Ok(());
    }
    match std::os::unix::fs::fchown(file, None, Some(group)) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
        other => other,
    }
}

/// One answer of BIRD's control protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The code of the last line (0000 OK, 0003 Reconfigured, 8xxx/9xxx errors, ...).
    pub code: u16,
    /// Every line's text without its code, with the code it belongs to.
    pub lines: Vec<(u16, String)>,
}

/// One line of the control protocol, as BIRD writes it: `CODE-text` (more lines follow),
/// `CODE text` (the last line) or ` text` (continues the previous code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// `CODE-text`.
    More(u16, &'a str),
    /// `CODE text`.
    Last(u16, &'a str),
    /// ` text`.
    Continued(&'a str),
}

/// Classify one line (without its newline); `None` when it is not the control protocol.
pub fn parse_line(line: &str) -> Option<Line<'_>> {
    if let Some(text) = line.strip_prefix(' ') {
        return Some(Line::Continued(text));
    }
    let bytes = line.as_bytes();
    if bytes.len() < 5 || !bytes[..4].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let code: u16 = line[..4].parse().ok()?;
    match bytes[4] {
        b'-' => Some(Line::More(code, &line[5..])),
        b' ' => Some(Line::Last(code, &line[5..])),
        _ => None,
    }
}

/// Whether a `configure` answer means BIRD took the config: 0003 (reconfigured), 0004 (in
/// progress: protocols are being adjusted) or 0005 (queued behind a running one).
pub fn configure_outcome(reply: &Reply, path: &Path) -> Result<(), BgpError> {
    match reply.code {
        3..=5 => Ok(()),
        code => {
            // 8002 reads `<file>:<line>:<column> <message>`; only the numbers are kept, as the
            // message might quote the config.
            let location = reply.lines.iter().find(|(c, _)| *c == code).and_then(|(_, text)| config_location(text));
            Err(BgpError::Refused { path: path.to_path_buf(), code, location })
        }
    }
}

fn config_location(text: &str) -> Option<(u32, u32)> {
    let place = text.split(' ').next()?;
    let mut parts = place.rsplitn(3, ':');
    let column = parts.next()?.parse().ok()?;
    let line = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((line, column))
}

/// Send one command (a single line) to BIRD's control socket and read its whole answer,
/// bounded by `timeout` and by a maximum answer size.
pub async fn control(socket: &Path, command: &str, timeout: Duration) -> Result<Reply, BgpError> {
    let protocol = || BgpError::Protocol { path: socket.to_path_buf() };
    if command.contains('\n') {
        return Err(protocol());
    }
    let exchange = async {
        let broken = |source| BgpError::Control { path: socket.to_path_buf(), source };
        let stream = UnixStream::connect(socket).await.map_err(broken)?;
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read.take(MAX_REPLY_BYTES));
        // The greeting (0001 BIRD x.y ready.) is a reply of its own.
        let greeting = read_reply(&mut reader).await.map_err(broken)?.ok_or_else(protocol)?;
        if greeting.code != 1 {
            return Err(protocol());
        }
        write.write_all(format!("{command}\n").as_bytes()).await.map_err(broken)?;
        read_reply(&mut reader).await.map_err(broken)?.ok_or_else(protocol)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(BgpError::Timeout { path: socket.to_path_buf(), timeout }))
}

/// Read lines up to the last one of a reply; `None` when the stream breaks the protocol or ends
/// first.
async fn read_reply<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<Option<Reply>> {
    let mut lines = Vec::new();
    let mut current = None;
    let mut buffer = String::new();
    loop {
        buffer.clear();
        if reader.read_line(&mut buffer).await? == 0 {
            return Ok(None);
        }
        let Some(line) = buffer.strip_suffix('\n') else { return Ok(None) };
        match parse_line(line) {
            Some(Line::More(code, text)) => {
                current = Some(code);
                lines.push((code, text.to_string()));
            }
            Some(Line::Continued(text)) => match current {
                Some(code) => lines.push((code, text.to_string())),
                None => return Ok(None),
            },
            Some(Line::Last(code, text)) => {
                lines.push((code, text.to_string()));
                return Ok(Some(Reply { code, lines }));
            }
            None => return Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines_are_classified_as_bird_writes_them() {
        assert_eq!(parse_line("0001 BIRD 2.0.12 ready."), Some(Line::Last(1, "BIRD 2.0.12 ready.")));
        assert_eq!(
            parse_line("0002-Reading configuration from t.conf"),
            Some(Line::More(2, "Reading configuration from t.conf"))
        );
        assert_eq!(parse_line(" ccm_v4     Static"), Some(Line::Continued("ccm_v4     Static")));
        assert_eq!(parse_line("0000 "), Some(Line::Last(0, "")));
        for bad in ["", "001 x", "abcd x", "0001x", "HTTP/1.1 200 OK"] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    async fn reply_of(bytes: &'static [u8]) -> Option<Reply> {
        read_reply(&mut BufReader::new(bytes)).await.expect("in memory")
    }

    #[tokio::test]
    async fn a_reload_is_accepted_on_reconfigured_in_progress_or_queued_only() {
        let path = Path::new("/run/bird/bird.conf");
        let ok = reply_of(b"0002-Reading configuration from /run/bird/bird.conf\n0003 Reconfigured\n").await;
        let ok = ok.expect("reply");
        assert_eq!(ok.code, 3);
        assert!(configure_outcome(&ok, path).is_ok());
        for code in [4, 5] {
            assert!(configure_outcome(&Reply { code, lines: vec![] }, path).is_ok());
        }
        let refused = reply_of(
            b"0002-Reading configuration from /run/bird/bird.conf\n8002 /run/bird/bird.conf:23:16 syntax error, unexpected CF_SYM_UNDEFINED\n",
        )
        .await
        .expect("reply");
        match configure_outcome(&refused, path) {
            Err(error @ BgpError::Refused { code: 8002, location: Some((23, 16)), .. }) => {
                let text = error.to_string();
                assert!(text.contains("line 23, column 16") && !text.contains("CF_SYM"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let shutting_down = Reply { code: 6, lines: vec![(6, "Reconfiguration ignored, shutting down".into())] };
        assert!(matches!(
            configure_outcome(&shutting_down, path),
            Err(BgpError::Refused { code: 6, location: None, .. })
        ));
    }

    #[tokio::test]
    async fn a_reply_cut_short_or_not_birds_is_no_reply() {
        assert_eq!(reply_of(b"0002-Reading configuration\n").await, None);
        assert_eq!(reply_of(b" orphan continuation\n0000 \n").await, None);
        assert_eq!(reply_of(b"0003 Reconfigured").await, None, "no newline: cut short");
        let multi = reply_of(b"2002-Name Proto\n1002-device1 Device\n ccm_v4 Static\n0000 \n").await.expect("reply");
        assert_eq!(multi.code, 0);
        assert_eq!(multi.lines[2], (1002, "ccm_v4 Static".to_string()));
    }

    #[test]
    fn an_unchanged_text_needs_no_reload_and_nothing_applied_yet_always_does() {
        assert!(needs_reload(None, "x"));
        assert!(!needs_reload(Some("x"), "x"));
        assert!(needs_reload(Some("x"), "y"));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ccm-bird-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn the_config_is_replaced_whole_readable_by_owner_and_the_directorys_group_only_and_no_temp_file_left() {
        let dir = scratch("write");
        let path = dir.join("bird.conf");
        write_atomically(&path, b"old").expect("write");
        write_atomically(&path, b"new").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        let meta = std::fs::metadata(&path).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o777, 0o640, "owner rw, group r (BIRD), others nothing");
        assert_eq!(meta.gid(), std::fs::metadata(&dir).expect("stat dir").gid(), "the volume's group");
        let names: Vec<_> = std::fs::read_dir(&dir).expect("list").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("bird.conf")]);
        assert!(write_atomically(&dir.join("missing").join("bird.conf"), b"x").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_config_takes_its_directorys_group_when_the_writer_may_give_it_and_is_still_written_when_not() {
        let dir = scratch("group");
        let path = dir.join("bird.conf");
        // A directory of BIRD's group without setgid, as an fsGroup volume would be without it.
        let shared = std::os::unix::fs::chown(&dir, None, Some(65532));
        write_atomically(&path, b"x").expect("write");
        let gid = std::fs::metadata(&path).expect("stat").gid();
        match shared {
            Ok(()) => assert_eq!(gid, 65532, "a writer allowed to (root) gives the file the volume's group"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "unprivileged test run: {e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn password_file_problems_name_the_peer_and_never_the_content() {
        let dir = scratch("passwords");
        let long = dir.join("long");
        std::fs::write(&long, [b'x'; 200]).expect("write");
        let quoted = dir.join("quoted");
        std::fs::write(&quoted, b"hunter\"2\n").expect("write");
        let good = dir.join("good");
        std::fs::write(&good, b"hunter2\n").expect("write");
        let files = vec![(0, good.clone()), (3, long)];
        match read_passwords(&files) {
            Err(e @ BgpError::PasswordInvalid { index: 3, problem: PasswordProblem::TooLong }) => {
                assert!(e.to_string().starts_with("loadBalancer.announcement.bgp.peers[3].passwordFile:"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        match read_passwords(&[(1, quoted)]) {
            Err(e @ BgpError::PasswordInvalid { index: 1, problem: PasswordProblem::BadCharacter }) => {
                assert!(!e.to_string().contains("hunter"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let missing = read_passwords(&[(2, dir.join("absent"))]);
        assert!(matches!(missing, Err(BgpError::PasswordUnreadable { index: 2, kind: io::ErrorKind::NotFound })));
        let read = read_passwords(&[(0, good)]).expect("readable");
        assert_eq!(read.get(&0), Some(&Password("hunter2".into())));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn settings_in(dir: &Path) -> BirdSettings {
        BirdSettings {
            config_path: dir.join("bird.conf"),
            socket_path: dir.join("bird.ctl"),
            timeout: Duration::from_secs(5),
        }
    }

    fn one_peer() -> BgpConfig {
        BgpConfig {
            local_asn: 64512,
            peers: vec![super::super::PeerConfig {
                address: "192.0.2.1".parse().expect("ip"),
                asn: 64513,
                port: None,
                password_file: None,
                hold_time: None,
                multihop: None,
                bfd: None,
                graceful_restart: None,
            }],
            ..BgpConfig::default()
        }
    }

    fn node() -> NodeFacts {
        NodeFacts { ipv4: Some("10.0.0.1".parse().expect("ip")) }
    }

    fn advertisement(address: &str) -> Advertisement {
        Advertisement {
            addresses: [address.parse().expect("ip")].into(),
            prefixes: vec!["203.0.113.0/24".parse().expect("prefix")],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn without_bird_the_announcer_reports_the_socket_and_retries_the_reload_next_time() {
        let dir = scratch("nobird");
        let settings = settings_in(&dir);
        let mut bird = BirdAnnouncer::new(one_peer(), node(), settings.clone());
        let set = advertisement("203.0.113.1");
        for _ in 0..2 {
            match bird.announce(&set).await {
                Err(BgpError::Control { path, source }) => {
                    assert_eq!(path, settings.socket_path);
                    assert_eq!(source.kind(), io::ErrorKind::NotFound);
                }
                other => panic!("{other:?}"),
            }
        }
        let written = std::fs::read_to_string(&settings.config_path).expect("written before the reload");
        assert!(written.contains("route 203.0.113.1/32 blackhole;"));
        assert!(!format!("{bird:?}").contains("203.0.113.1"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn run_follows_the_latest_set_and_stops_on_cancel_or_when_the_sender_goes() {
        let dir = scratch("run");
        let settings = settings_in(&dir);
        let (tx, rx) = watch::channel(Advertisement::default());
        let cancel = CancellationToken::new();
        let (sessions, mut read) = watch::channel(Vec::new());
        let task =
            tokio::spawn(run(BirdAnnouncer::new(one_peer(), node(), settings.clone()), rx, sessions, cancel.clone()));
        let _ = tx.send(advertisement("203.0.113.9"));
        let path = settings.config_path.clone();
        let written = async {
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text.contains("route 203.0.113.9/32 blackhole;") {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), written).await.expect("the new set is written");
        // No BIRD here: the peer's session is published as unknown, saying why.
        let unknown = tokio::time::timeout(Duration::from_secs(10), read.wait_for(|s| !s.is_empty()))
            .await
            .expect("sessions published")
            .expect("sender alive")
            .clone();
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].state, "Unknown");
        assert!(unknown[0].detail.starts_with("BIRD's control socket"), "{unknown:?}");
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops on cancel").expect("no panic");

        let (tx, rx) = watch::channel(Advertisement::default());
        let (sessions, _read) = watch::channel(Vec::new());
        let task =
            tokio::spawn(run(BirdAnnouncer::new(one_peer(), node(), settings), rx, sessions, CancellationToken::new()));
        drop(tx);
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops without a sender").expect("no panic");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
