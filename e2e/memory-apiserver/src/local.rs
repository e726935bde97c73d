//! The in-memory API server: [`TestApiServer`], started with [`TestApiServerBuilder`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch as tokio_watch};
use tokio::task::JoinHandle;
use tracing::info;

use crate::control::Stats;
use crate::core::{Core, Options};
use crate::error::Error;
use crate::faults::{FaultConfig, Faults};
use crate::request_log::{LogData, RequestLog};
use crate::{resources, server, services, store, util};

/// Namespaces every server starts with, as a real cluster has.
const DEFAULT_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Options for [`TestApiServer`]; start with [`TestApiServer::builder`].
#[derive(Debug, Clone)]
pub struct TestApiServerBuilder {
    address: IpAddr,
    port: u16,
    history_size: usize,
    bookmark_interval: Duration,
    request_log_capacity: usize,
    service_cidr: (Ipv4Addr, u8),
    node_ports: (u16, u16),
    kubeconfig_path: Option<PathBuf>,
}

impl Default for TestApiServerBuilder {
    fn default() -> Self {
        TestApiServerBuilder {
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            history_size: 10_000,
            bookmark_interval: Duration::from_secs(5),
            request_log_capacity: 200_000,
            service_cidr: (Ipv4Addr::new(10, 96, 0, 0), 12),
            node_ports: (30000, 32767),
            kubeconfig_path: None,
        }
    }
}

impl TestApiServerBuilder {
    /// Listen on this port (0, the default, picks a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Listen on this address (default 127.0.0.1).
    pub fn bind_address(mut self, address: IpAddr) -> Self {
        self.address = address;
        self
    }

    /// Events kept per resource for watch resume; older versions get 410 Gone (default 10,000).
    pub fn event_history_size(mut self, events: usize) -> Self {
        self.history_size = events;
        self
    }

    /// How often watches that asked for bookmarks get one (default 5 s).
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Requests kept in the request log (default 200,000; the oldest are dropped).
    pub fn request_log_capacity(mut self, records: usize) -> Self {
        self.request_log_capacity = records;
        self
    }

    /// Range Service cluster IPs come from (default 10.96.0.0/12).
    pub fn service_cluster_ip_range(mut self, base: Ipv4Addr, prefix_len: u8) -> Self {
        self.service_cidr = (base, prefix_len);
        self
    }

    /// Range node ports come from (default 30000-32767).
    pub fn node_port_range(mut self, first: u16, last: u16) -> Self {
        self.node_ports = (first.min(last), first.max(last));
        self
    }

    /// Write the kubeconfig here instead of a fresh temporary directory.
    pub fn kubeconfig_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig_path = Some(path.into());
        self
    }

    /// Binds, starts serving and writes the kubeconfig.
    pub async fn start(self) -> Result<TestApiServer, Error> {
        let listener = TcpListener::bind(SocketAddr::new(self.address, self.port)).await?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let state = store::State::new(
            resources::Registry::with_builtins(),
            services::Allocator::new(self.service_cidr.0, self.service_cidr.1, self.node_ports),
            self.history_size,
        );
        let (watch_close, _) = tokio_watch::channel(0u64);
        let core = Arc::new(Core {
            state: Mutex::new(state),
            opts: Options {
                bookmark_interval: self.bookmark_interval.max(Duration::from_millis(10)),
                request_log_capacity: self.request_log_capacity.max(1),
            },
            faults: Mutex::new(FaultConfig::default()),
            log: Mutex::new(LogData::default()),
            watch_close,
            gc_wake: Notify::new(),
            open_watches: AtomicUsize::new(0),
            runtime: tokio::runtime::Handle::current(),
            close_every: Mutex::new(None),
            addr: addr.to_string(),
        });
        let ns_type = core.lock().registry.get("", "v1", "namespaces");
        if let Some(rt) = ns_type {
            for ns in DEFAULT_NAMESPACES {
                let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                core.create(&rt, None, body, "memory-apiserver", false)
                    .map_err(|e| Error::Control(format!("creating namespace {ns}: {}", e.message)))?;
            }
        }

        let (shutdown, shutdown_rx) = tokio_watch::channel(false);
        let serve_task = tokio::spawn(server::serve(listener, core.clone(), shutdown_rx));
        let gc_core = core.clone();
        let gc_task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = gc_core.gc_wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                gc_core.gc_sweep();
            }
        });

        let (kubeconfig, temp_dir) = match self.kubeconfig_path {
            Some(p) => (p, None),
            None => {
                let dir = std::env::temp_dir().join(format!(
                    "memory-apiserver-{}-{}-{}",
                    std::process::id(),
                    addr.port(),
                    util::random_suffix()
                ));
                (dir.join("kubeconfig"), Some(dir))
            }
        };
        if let Some(parent) = kubeconfig.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url))?;
        let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| Error::Url(e.to_string()))?;
        let client = kube::Client::try_from(kube::Config::new(uri))?;
        info!(%url, kubeconfig = %kubeconfig.display(), "test API server started");
        Ok(TestApiServer { core, addr, url, client, kubeconfig, temp_dir, shutdown, tasks: vec![serve_task, gc_task] })
    }
}

/// A kubeconfig pointing at `url` with no credentials (kubectl and kube-rs accept it).
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {url}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: e2e\n    namespace: default\ncurrent-context: e2e\nusers:\n- name: e2e\n  user: {{}}\npreferences: {{}}\n"
    )
}

/// A running in-memory API server. Stops when dropped or on [`shutdown`](Self::shutdown).
pub struct TestApiServer {
    core: Arc<Core>,
    addr: SocketAddr,
    url: String,
    client: kube::Client,
    kubeconfig: PathBuf,
    temp_dir: Option<PathBuf>,
    shutdown: tokio_watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl TestApiServer {
    /// Starts a server on an ephemeral port of 127.0.0.1 with default options.
    pub async fn start() -> Result<TestApiServer, Error> {
        TestApiServerBuilder::default().start().await
    }

    /// Options for a server.
    pub fn builder() -> TestApiServerBuilder {
        TestApiServerBuilder::default()
    }

    /// A client for the server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The `kube::Config` the client uses, to build clients with other settings.
    pub fn kube_config(&self) -> kube::Config {
        // The URL parsed at start, so it parses again.
        kube::Config::new(self.url.parse().unwrap_or_default())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig file for kubectl and child processes.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The request log.
    pub fn request_log(&self) -> RequestLog {
        RequestLog::new(self.core.clone())
    }

    /// Fault injection.
    pub fn faults(&self) -> Faults {
        Faults::new(self.core.clone())
    }

    /// The current global resource version.
    pub fn resource_version(&self) -> u64 {
        self.core.lock().rv
    }

    /// Statistics (objects, open watches, requests, RSS).
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }

    /// Creates (or replaces) a CRD; its resources are served when this returns.
    pub async fn install_crd(&self, crd: &CustomResourceDefinition) -> Result<CustomResourceDefinition, Error> {
        use kube::api::{Api, Patch, PatchParams};
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut crd = crd.clone();
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.status = None;
        let applied = api.patch(&name, &PatchParams::apply("memory-apiserver").force(), &Patch::Apply(&crd)).await?;
        Ok(applied)
    }

    /// Stops serving: closes every connection and watch.
    pub async fn shutdown(mut self) {
        self.stop();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }

    fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        self.core.close_watches();
        for t in &self.tasks {
            t.abort();
        }
        if let Some(t) = self.core.close_every.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
