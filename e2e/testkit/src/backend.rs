//! One API for tests to get an API server, local or genuine, so a scenario is written once and
//! runs on both (see the `backend_tests!` macro below).
//!
//! - `Local`: a fresh in-memory [`TestApiServer`] (crate `memory-apiserver`) per test.
//! - `Genuine`: a turn on the test binary's shared etcd and kube-apiserver
//!   ([`crate::genuine`]); each turn starts from the cluster as it was at start.
//!
//! Both stand behind one trait, `ClusterBackend`; [`Backend`] only chooses which to start.

use std::path::PathBuf;
use std::sync::Once;

use futures::future::BoxFuture;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams};

use memory_apiserver::{FaultProxy, Faults, RequestLog, TestApiServer, kubeconfig_yaml};

use crate::error::Error;
use crate::genuine::turn::GenuineTurn;
use crate::genuine::{self, ControlPlane};

/// Which API server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The in-memory API server (crate `memory-apiserver`).
    Local,
    /// etcd and kube-apiserver from `CCM_TEST_ASSETS`.
    Genuine,
}

static SKIP_NOTICE: Once = Once::new();

impl Backend {
    /// Whether the genuine backend can run here; prints how to enable it, once per process,
    /// when it cannot.
    pub fn genuine_available() -> bool {
        let available = genuine::assets_dir().is_some();
        if !available {
            // Straight to the stream: the test harness captures `eprintln!`.
            SKIP_NOTICE.call_once(|| {
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "{}", genuine::HOW_TO_ENABLE);
            });
        }
        available
    }

    /// `local` or `genuine`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Genuine => "genuine",
        }
    }
}

impl Backend {
    async fn start(self) -> Result<Box<dyn ClusterBackend>, Error> {
        Ok(match self {
            Backend::Local => Box::new(TestApiServer::start().await?),
            Backend::Genuine => Box::new(GenuineTurn::start().await?),
        })
    }
}

/// What a test's API server offers beyond a client: the local server and a turn on the genuine
/// control plane each answer for themselves, so [`TestCluster`] never asks which it holds.
trait ClusterBackend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> Backend;
    /// The admin client config.
    fn admin_config(&self) -> kube::Config;
    /// An admin kubeconfig file.
    fn admin_kubeconfig_path(&self) -> PathBuf;
    /// Requests made since the test began.
    fn request_log(&self) -> RequestLog;
    /// Built-in fault injection; `None` where a fault proxy has to stand in front.
    fn faults(&self) -> Option<Faults>;
    /// Where this test's own files (kubeconfigs) go.
    fn files_dir(&self) -> PathBuf;
    /// Whether owned objects are garbage-collected after their owner goes.
    fn garbage_collects(&self) -> bool;
    /// Installs a CRD; its resources are served when this returns.
    fn install_crd<'a>(&'a self, crd: &'a CustomResourceDefinition) -> BoxFuture<'a, Result<(), Error>>;
    /// A config and kubeconfig authenticating as a ServiceAccount; `None` where there is no
    /// authentication, so the admin's serve.
    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<(kube::Config, PathBuf)>, Error>>;
    /// The local server.
    fn local(&self) -> Option<&TestApiServer> {
        None
    }
    /// The genuine control plane.
    fn control_plane(&self) -> Option<&ControlPlane> {
        None
    }
}

impl ClusterBackend for TestApiServer {
    fn kind(&self) -> Backend {
        Backend::Local
    }

    fn admin_config(&self) -> kube::Config {
        self.kube_config()
    }

    fn admin_kubeconfig_path(&self) -> PathBuf {
        self.kubeconfig_path().to_path_buf()
    }

    fn request_log(&self) -> RequestLog {
        TestApiServer::request_log(self)
    }

    fn faults(&self) -> Option<Faults> {
        Some(TestApiServer::faults(self))
    }

    fn files_dir(&self) -> PathBuf {
        self.kubeconfig_path().parent().map(PathBuf::from).unwrap_or_else(std::env::temp_dir)
    }

    fn garbage_collects(&self) -> bool {
        true
    }

    fn install_crd<'a>(&'a self, crd: &'a CustomResourceDefinition) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { TestApiServer::install_crd(self, crd).await.map(|_| ()).map_err(Error::from) })
    }

    fn service_account<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<(kube::Config, PathBuf)>, Error>> {
        Box::pin(async { Ok(None) })
    }

    fn local(&self) -> Option<&TestApiServer> {
        Some(self)
    }
}

impl ClusterBackend for GenuineTurn {
    fn kind(&self) -> Backend {
        Backend::Genuine
    }

    fn admin_config(&self) -> kube::Config {
        GenuineTurn::admin_config(self)
    }

    fn admin_kubeconfig_path(&self) -> PathBuf {
        self.plane().admin_kubeconfig_path()
    }

    fn request_log(&self) -> RequestLog {
        GenuineTurn::request_log(self)
    }

    fn faults(&self) -> Option<Faults> {
        None
    }

    fn files_dir(&self) -> PathBuf {
        self.plane().dir().to_path_buf()
    }

    fn garbage_collects(&self) -> bool {
        // Only when kube-controller-manager runs beside the API server.
        self.plane().has_controller_manager()
    }

    fn install_crd<'a>(&'a self, crd: &'a CustomResourceDefinition) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(GenuineTurn::install_crd(self, crd))
    }

    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<(kube::Config, PathBuf)>, Error>> {
        Box::pin(async move { GenuineTurn::service_account(self, namespace, name).await.map(Some) })
    }

    fn control_plane(&self) -> Option<&ControlPlane> {
        Some(self.plane())
    }
}

/// An API server for one test.
pub struct TestCluster {
    inner: Box<dyn ClusterBackend>,
    config: kube::Config,
    client: Client,
    log: RequestLog,
    /// Set when started with [`TestCluster::start_with_faults`] where the backend has no fault
    /// injection of its own.
    proxy: Option<FaultProxy>,
    kubeconfig: Option<PathBuf>,
}

impl TestCluster {
    /// Starts (local) or takes a turn on (genuine) an API server. Genuine needs
    /// `CCM_TEST_ASSETS`; check [`Backend::genuine_available`] first.
    pub async fn start(backend: Backend) -> Result<TestCluster, Error> {
        let inner = backend.start().await?;
        let config = inner.admin_config();
        let client = Client::try_from(config.clone())?;
        let log = inner.request_log();
        Ok(TestCluster { inner, config, client, log, proxy: None, kubeconfig: None })
    }

    /// Like [`start`](Self::start), with fault injection: on the genuine backend every client
    /// and kubeconfig this cluster hands out goes through a fault-injecting proxy (as admin).
    pub async fn start_with_faults(backend: Backend) -> Result<TestCluster, Error> {
        let mut cluster = TestCluster::start(backend).await?;
        if cluster.inner.faults().is_none() {
            let proxy = FaultProxy::start(cluster.client.clone()).await?;
            let uri: http::Uri =
                proxy.url().parse().map_err(|e: http::uri::InvalidUri| memory_apiserver::Error::Url(e.to_string()))?;
            let path =
                cluster.inner.files_dir().join(format!("proxy-{}.kubeconfig", memory_apiserver::random_suffix()));
            std::fs::write(&path, kubeconfig_yaml(proxy.url()))?;
            cluster.config = kube::Config::new(uri);
            cluster.client = Client::try_from(cluster.config.clone())?;
            cluster.kubeconfig = Some(path);
            cluster.proxy = Some(proxy);
        }
        Ok(cluster)
    }

    /// Fault injection: the local server's, or the proxy's on the genuine backend.
    ///
    /// # Panics
    /// On the genuine backend when the cluster was not started with
    /// [`start_with_faults`](Self::start_with_faults).
    pub fn faults(&self) -> Faults {
        match (self.inner.faults(), &self.proxy) {
            (Some(faults), _) => faults,
            (None, Some(proxy)) => proxy.faults(),
            (None, None) => panic!("fault injection on the genuine backend needs TestCluster::start_with_faults"),
        }
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.inner.kind()
    }

    /// Whether this is the genuine backend.
    pub fn is_genuine(&self) -> bool {
        self.backend() == Backend::Genuine
    }

    /// Whether owned objects are garbage-collected after their owner goes: always on the local
    /// backend, on the genuine one when kube-controller-manager runs beside it.
    pub fn garbage_collects(&self) -> bool {
        self.inner.garbage_collects()
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin `kube::Config`, to build clients with other settings.
    pub fn kube_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// An admin kubeconfig file for kubectl and child processes.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.kubeconfig.clone().unwrap_or_else(|| self.inner.admin_kubeconfig_path())
    }

    /// The server URL.
    pub fn url(&self) -> String {
        self.config.cluster_url.to_string().trim_end_matches('/').to_string()
    }

    /// Requests made since this test's turn began: the local server's log, or the genuine
    /// server's audit log read as the same records.
    pub fn request_log(&self) -> RequestLog {
        self.log.clone()
    }

    /// The local server, for what only it offers (its fault injection, its statistics).
    pub fn local(&self) -> Option<&TestApiServer> {
        self.inner.local()
    }

    /// The genuine control plane; `None` on the local backend.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.inner.control_plane()
    }

    /// Installs a CRD and waits until its resources are served.
    pub async fn install_crd(&self, crd: &CustomResourceDefinition) -> Result<(), Error> {
        self.inner.install_crd(crd).await
    }

    /// A client config and kubeconfig file authenticating as a ServiceAccount (which must exist).
    /// On the local backend (no authentication) these are the admin's.
    pub async fn service_account(&self, namespace: &str, name: &str) -> Result<(kube::Config, PathBuf), Error> {
        match self.inner.service_account(namespace, name).await? {
            Some(account) => Ok(account),
            None => Ok((self.kube_config(), self.kubeconfig_path())),
        }
    }

    /// The Events (`events.k8s.io/v1`, every namespace) with `reason`.
    pub async fn events(&self, reason: &str) -> Result<Vec<Event>, Error> {
        let list = Api::<Event>::all(self.client()).list(&ListParams::default()).await?;
        Ok(list.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect())
    }

    /// A new namespace with a unique name starting with `prefix`.
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<String, Error> {
        use k8s_openapi::api::core::v1::Namespace;
        let name = format!("{prefix}-{}", memory_apiserver::random_suffix());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta { name: Some(name.clone()), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client()).create(&Default::default(), &ns).await?;
        Ok(name)
    }
}

/// Defines each scenario twice, as `<name>::local` and `<name>::genuine`; the body gets the
/// backend as the named parameter. The genuine variant returns at once (printing how to enable
/// it, once per binary) when `CCM_TEST_ASSETS` is unset.
///
/// ```ignore
/// testkit::backend_tests! {
///     /// A Node gets its provider ID.
///     async fn n1_sets_provider_id(backend) {
///         let cluster = TestCluster::start(backend).await.expect("cluster");
///         // ...
///     }
/// }
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($($(#[$meta:meta])* async fn $name:ident($backend:ident) $body:block)*) => {$(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                let $backend = $crate::backend::Backend::Local;
                $body
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn genuine() {
                if !$crate::backend::Backend::genuine_available() {
                    return;
                }
                let $backend = $crate::backend::Backend::Genuine;
                $body
            }
        }
    )*};
}
