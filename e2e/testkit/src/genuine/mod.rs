//! A genuine control plane for tests: etcd and kube-apiserver started from binaries, in the
//! spirit of controller-runtime's envtest.
//!
//! `CCM_TEST_ASSETS` names a directory holding `kube-apiserver` and `etcd`. One control plane
//! serves a whole test binary: it starts on first use and is killed when the binary exits
//! (an exit hook, and a parent-death signal for a binary that is killed). Tests take turns on it
//! (see [`crate::backend`]), and each turn starts by deleting what earlier turns created.

pub(crate) mod audit;
mod certs;
pub(crate) mod turn;

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tracing::info;

use crate::error::Error;

/// The environment variable naming the assets directory.
pub const ASSETS_ENV: &str = "CCM_TEST_ASSETS";

/// The one line printed when genuine runs are skipped.
pub const HOW_TO_ENABLE: &str = "genuine kube-apiserver runs skipped: set CCM_TEST_ASSETS to a directory holding \
     kube-apiserver and etcd (README: Testing on a genuine kube-apiserver)";

/// Where the binaries are, if configured and present.
pub fn assets_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(ASSETS_ENV).filter(|v| !v.is_empty())?);
    (dir.join("kube-apiserver").is_file() && dir.join("etcd").is_file()).then_some(dir)
}

/// Service ranges: room for 10,000 Services, dual-stack.
pub const SERVICE_CIDRS: &str = "10.0.0.0/16,fd00:10:96::/112";
/// The node port range (the Kubernetes default).
pub const NODE_PORTS: &str = "30000-32767";

/// A running etcd and kube-apiserver.
pub struct ControlPlane {
    dir: PathBuf,
    url: String,
    audit_log: PathBuf,
    ca_pem: String,
    admin_cert_pem: String,
    admin_key_pem: String,
    pids: Vec<u32>,
    /// Whether kube-controller-manager runs (garbage collector and namespace lifecycle).
    controller_manager: bool,
}

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Children die with the thread that started them (`PR_SET_PDEATHSIG`), so the control plane
/// never outlives a test binary that is killed.
fn spawn(mut cmd: Command, log: &Path) -> Result<Child, Error> {
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd.spawn()?)
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Removes directories of earlier runs whose process is gone (a killed test binary leaves them).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("ccm-envtest-").and_then(|r| r.split('-').next()) else { continue };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver from `assets` and waits until the API server is ready.
    /// Blocking; call it from a thread that lives as long as the control plane should.
    pub fn start_blocking(assets: &Path) -> Result<ControlPlane, Error> {
        remove_stale_dirs();
        let dir = std::env::temp_dir().join(format!(
            "ccm-envtest-{}-{}",
            std::process::id(),
            memory_apiserver::random_suffix()
        ));
        std::fs::create_dir_all(&dir)?;
        let pki = certs::Pki::generate()?;
        let write = |name: &str, content: &str| -> Result<PathBuf, Error> {
            let path = dir.join(name);
            std::fs::write(&path, content)?;
            Ok(path)
        };
        let ca = write("ca.crt", &pki.ca_cert)?;
        let serving_cert = write("serving.crt", &pki.serving_cert)?;
        let serving_key = write("serving.key", &pki.serving_key)?;
        let sa_key = write("sa.key", &pki.sa_key)?;
        let sa_pub = write("sa.pub", &pki.sa_pub)?;
        let policy = write("audit-policy.yaml", audit::POLICY)?;
        let audit_log = dir.join("audit.log");

        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let started = Instant::now();
        let mut etcd = Command::new(assets.join("etcd"));
        etcd.args([
            "--data-dir",
            &dir.join("etcd").to_string_lossy(),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{etcd_port}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{etcd_port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ]);
        let etcd = spawn(etcd, &dir.join("etcd.log"))?;
        let mut api = Command::new(assets.join("kube-apiserver"));
        let path = |p: &Path| p.to_string_lossy().to_string();
        api.args([
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={api_port}"),
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            // Compacts history within seconds (5 min in production) so that tests can see 410s.
            "--etcd-compaction-interval=10s".to_string(),
            format!("--tls-cert-file={}", path(&serving_cert)),
            format!("--tls-private-key-file={}", path(&serving_key)),
            format!("--client-ca-file={}", path(&ca)),
            "--authorization-mode=RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", path(&sa_pub)),
            format!("--service-account-signing-key-file={}", path(&sa_key)),
            format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
            format!("--service-node-port-range={NODE_PORTS}"),
            "--disable-admission-plugins=ServiceAccount".to_string(),
            // Added to the default plugins, as production clusters commonly run it: setting
            // blockOwnerDeletion then needs update on the owner's finalizers (an RBAC rule the
            // chart grants the operator, proven needed in e2e/tests/rbac.rs).
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".to_string(),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
            format!("--audit-policy-file={}", path(&policy)),
            format!("--audit-log-path={}", path(&audit_log)),
            "--audit-log-format=json".to_string(),
            "--audit-log-maxsize=0".to_string(),
            format!("--cert-dir={}", path(&dir.join("certs"))),
        ]);
        let mut api = match spawn(api, &dir.join("kube-apiserver.log")) {
            Ok(api) => api,
            Err(e) => {
                kill(etcd.id());
                return Err(e);
            }
        };
        let plane = ControlPlane {
            url: format!("https://127.0.0.1:{api_port}"),
            audit_log,
            ca_pem: pki.ca_cert,
            admin_cert_pem: pki.admin_cert,
            admin_key_pem: pki.admin_key,
            pids: vec![api.id(), etcd.id()],
            dir,
            controller_manager: false,
        };
        register_exit_cleanup(&plane);
        plane.write_kubeconfig(&plane.dir.join("admin.kubeconfig"), None)?;
        plane.wait_ready(started, &mut api)?;
        let mut plane = plane;
        if let Some(kcm) = plane.start_controller_manager(assets)? {
            plane.pids.push(kcm);
            plane.controller_manager = true;
            register_exit_cleanup(&plane);
        }
        info!(url = %plane.url, seconds = started.elapsed().as_secs_f64(), "genuine control plane ready");
        Ok(plane)
    }

    /// Starts kube-controller-manager with the garbage collector and the namespace controller
    /// when `assets` holds one (`e2e/envtest/setup.sh` adds it next to a real-cluster kit):
    /// what a cluster does after a deletion (children collected, namespaces finalized) then
    /// happens on this backend too. Its other controllers stay off: they would create objects
    /// (ServiceAccounts, Endpoints, ...) the tests do not expect.
    fn start_controller_manager(&self, assets: &Path) -> Result<Option<u32>, Error> {
        let binary = assets.join("kube-controller-manager");
        if !binary.is_file() {
            return Ok(None);
        }
        let kubeconfig = self.admin_kubeconfig_path().to_string_lossy().into_owned();
        let mut kcm = Command::new(binary);
        kcm.args([
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            // No serving: nothing scrapes it, and no port to choose.
            "--secure-port=0".to_string(),
            "--controllers=garbage-collector-controller,namespace-controller".to_string(),
            "--leader-elect=false".to_string(),
            "--v=1".to_string(),
        ]);
        let child = spawn(kcm, &self.dir.join("kube-controller-manager.log"))?;
        info!("kube-controller-manager started (garbage collector, namespace lifecycle)");
        Ok(Some(child.id()))
    }

    /// Whether kube-controller-manager runs beside the API server (garbage collector and
    /// namespace lifecycle).
    pub fn has_controller_manager(&self) -> bool {
        self.controller_manager
    }

    /// Polls `/readyz` as admin until it answers `ok`; fails early if kube-apiserver exits.
    fn wait_ready(&self, started: Instant, api: &mut Child) -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let client = self.admin_client().await?;
            loop {
                let req = http::Request::get("/readyz").body(Vec::new()).map_err(|e| Error::Genuine(e.to_string()))?;
                if let Ok(text) = client.request_text(req).await
                    && text.trim() == "ok"
                {
                    return Ok(());
                }
                let exited = api.try_wait().ok().flatten();
                if exited.is_some() || started.elapsed() > Duration::from_secs(90) {
                    return Err(Error::Genuine(format!(
                        "kube-apiserver {}; its log ends:\n{}\netcd's log ends:\n{}",
                        exited.map_or("not ready after 90 s".to_string(), |s| format!("exited ({s})")),
                        tail(&self.dir.join("kube-apiserver.log")),
                        tail(&self.dir.join("etcd.log"))
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }

    /// Process ids of kube-apiserver, etcd and (when it runs) kube-controller-manager, in that
    /// order: for drivers that account their CPU time.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Starts etcd and kube-apiserver from a thread of their own that lives until the returned
    /// sender is dropped: the processes are tied to the thread that started them (parent-death
    /// signal), so neither a runtime's threads nor its blocking pool may start them. Blocks.
    pub fn start_on_own_thread(assets: PathBuf) -> Result<(ControlPlane, std::sync::mpsc::Sender<()>), Error> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (keep_tx, keep_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let _ = ready_tx.send(ControlPlane::start_blocking(&assets));
            // Parked until the caller drops its sender.
            let _ = keep_rx.recv();
        });
        let plane = ready_rx.recv().map_err(|_| Error::Genuine("the control plane thread ended".into()))??;
        Ok((plane, keep_tx))
    }

    /// The audit log as a request log, from this moment on.
    pub fn request_log(&self) -> memory_apiserver::RequestLog {
        memory_apiserver::RequestLog::new(std::sync::Arc::new(audit::AuditLog::from_end(
            self.audit_log_path().to_path_buf(),
        )))
    }

    /// Path of the JSON audit log (one event per request).
    pub fn audit_log_path(&self) -> &Path {
        &self.audit_log
    }

    /// The admin kubeconfig file (`system:masters`).
    pub fn admin_kubeconfig_path(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The control plane's working directory (certificates, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn kubeconfig_yaml(&self, token: Option<&str>) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let user = match token {
            Some(token) => format!("    token: {token}\n"),
            None => format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(&self.admin_cert_pem),
                b64(&self.admin_key_pem)
            ),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: envtest\n    namespace: default\ncurrent-context: envtest\nusers:\n- name: envtest\n  user:\n{user}",
            self.url,
            b64(&self.ca_pem)
        )
    }

    /// Writes a kubeconfig: the admin's, or one authenticating with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: Option<&str>) -> Result<(), Error> {
        let mut file = std::fs::File::create(path)?;
        file.write_all(self.kubeconfig_yaml(token).as_bytes())?;
        Ok(())
    }

    /// The `kube::Config` of a kubeconfig this control plane wrote.
    pub async fn config(&self, token: Option<&str>) -> Result<kube::Config, Error> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml(token))
            .map_err(|e| Error::Genuine(format!("kubeconfig: {e}")))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| Error::Genuine(format!("kubeconfig: {e}")))
    }

    /// The admin's `kube::Config`.
    pub async fn admin_config(&self) -> Result<kube::Config, Error> {
        self.config(None).await
    }

    /// A client authenticated as admin (`system:masters`, exempt from API Priority and Fairness).
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        Ok(kube::Client::try_from(self.admin_config().await?)?)
    }

    /// A token for a ServiceAccount (TokenRequest; the ServiceAccount must exist), valid 1 h.
    pub async fn service_account_token(&self, namespace: &str, name: &str) -> Result<String, Error> {
        let api: Api<ServiceAccount> = Api::namespaced(self.admin_client().await?, namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
            ..Default::default()
        };
        let answer = api.create_token_request(name, &PostParams::default(), &request).await?;
        answer.status.map(|s| s.token).ok_or_else(|| Error::Genuine("TokenRequest answered no token".into()))
    }
}

fn kill(pid: u32) {
    // SAFETY: signalling a child we started.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

static EXIT_STATE: Mutex<Option<(Vec<u32>, PathBuf)>> = Mutex::new(None);
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);

extern "C" fn cleanup_at_exit() {
    if let Ok(mut state) = EXIT_STATE.lock()
        && let Some((pids, dir)) = state.take()
    {
        for pid in pids {
            kill(pid);
        }
        // Give the processes a moment to release their files before the directory goes.
        std::thread::sleep(Duration::from_millis(50));
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn register_exit_cleanup(plane: &ControlPlane) {
    if let Ok(mut state) = EXIT_STATE.lock() {
        *state = Some((plane.pids.clone(), plane.dir.clone()));
    }
    if !EXIT_HOOK.swap(true, Ordering::SeqCst) {
        // SAFETY: registering a plain extern "C" function.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for pid in &self.pids {
            kill(*pid);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Ok(mut state) = EXIT_STATE.lock() {
            state.take();
        }
    }
}
