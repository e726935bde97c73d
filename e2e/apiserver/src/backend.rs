//! One API for tests to get an API server, local or genuine, so a scenario is written once and
//! runs on both (see [`backend_tests!`](crate::backend_tests)).
//!
//! - `Local`: a fresh in-memory [`TestApiServer`] per test.
//! - `Genuine`: the test binary's shared etcd and kube-apiserver ([`crate::genuine`]). Tests
//!   take turns on it (the controllers under test watch cluster-wide), and each turn starts by
//!   deleting every object earlier turns created, so a test sees a cluster as it was at start.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use tokio::sync::OwnedMutexGuard;

use crate::genuine::audit::AuditLog;
use crate::genuine::proxy::FaultProxy;
use crate::genuine::{self, ControlPlane};
use crate::{Error, Faults, RequestLog, TestApiServer};

/// Which API server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The in-memory API server of this crate.
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

/// The shared control plane of this test binary, and the turn lock.
struct Shared {
    plane: ControlPlane,
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Objects present before any test ran, by (group/kind, namespace, name): never purged.
    baseline: Mutex<Option<BTreeSet<(String, String, String)>>>,
}

static SHARED: OnceLock<Result<&'static Shared, String>> = OnceLock::new();

fn shared_blocking() -> Result<&'static Shared, Error> {
    SHARED
        .get_or_init(|| {
            let Some(assets) = genuine::assets_dir() else { return Err(genuine::HOW_TO_ENABLE.to_string()) };
            let (tx, rx) = std::sync::mpsc::channel();
            // The thread that starts the processes lives as long as the binary: the children's
            // parent-death signal is tied to it.
            let spawned = std::thread::Builder::new().name("genuine-control-plane".into()).spawn(move || {
                match ControlPlane::start_blocking(&assets) {
                    Ok(plane) => {
                        let shared: &'static Shared = Box::leak(Box::new(Shared {
                            plane,
                            turn: Arc::new(tokio::sync::Mutex::new(())),
                            baseline: Mutex::new(None),
                        }));
                        let _ = tx.send(Ok(shared));
                        loop {
                            std::thread::park();
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
            if let Err(e) = spawned {
                return Err(e.to_string());
            }
            rx.recv().unwrap_or_else(|e| Err(e.to_string()))
        })
        .clone()
        .map_err(Error::Genuine)
}

async fn shared() -> Result<&'static Shared, Error> {
    tokio::task::spawn_blocking(shared_blocking).await.map_err(|e| Error::Genuine(e.to_string()))?
}

/// The kinds a test may leave behind, purged between turns: (group, version, kind, plural, namespaced).
const PURGED: &[(&str, &str, &str, &str, bool)] = &[
    ("", "v1", "Node", "nodes", false),
    ("", "v1", "Service", "services", true),
    ("", "v1", "Secret", "secrets", true),
    ("", "v1", "ConfigMap", "configmaps", true),
    ("", "v1", "ServiceAccount", "serviceaccounts", true),
    ("", "v1", "Pod", "pods", true),
    ("", "v1", "Event", "events", true),
    ("", "v1", "Endpoints", "endpoints", true),
    ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true),
    ("coordination.k8s.io", "v1", "Lease", "leases", true),
    ("apps", "v1", "Deployment", "deployments", true),
    ("apps", "v1", "DaemonSet", "daemonsets", true),
    ("apps", "v1", "ReplicaSet", "replicasets", true),
    ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", true),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false),
];

/// The API group of the project's own custom resources, purged too (whatever CRDs a test installed).
const OWN_GROUP: &str = "ccm.rs";

async fn purge_kinds(client: &Client) -> Result<Vec<ApiResource>, Error> {
    let mut kinds: Vec<ApiResource> = PURGED
        .iter()
        .map(|(g, v, k, plural, _)| ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), plural))
        .collect();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds.list(&ListParams::default()).await? {
        if crd.spec.group == OWN_GROUP
            && let Some(version) = crd.spec.versions.iter().find(|v| v.storage)
        {
            let gvk = GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
            kinds.push(ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural));
        }
    }
    Ok(kinds)
}

fn key(ar: &ApiResource, obj: &DynamicObject) -> (String, String, String) {
    (
        format!("{}/{}", ar.group, ar.kind),
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

async fn snapshot(client: &Client) -> Result<BTreeSet<(String, String, String)>, Error> {
    let mut keys = BTreeSet::new();
    for ar in purge_kinds(client).await? {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        for obj in api.list(&ListParams::default()).await? {
            keys.insert(key(&ar, &obj));
        }
    }
    Ok(keys)
}

/// Objects kube-apiserver maintains itself (the `kubernetes` Service, its identity Lease, ...),
/// which may appear after the baseline was taken.
fn made_by_the_api_server(obj: &DynamicObject) -> bool {
    obj.metadata.managed_fields.iter().flatten().any(|m| m.manager.as_deref() == Some("kube-apiserver"))
}

/// Deletes every object of the purged kinds that is not in the baseline, finalizers first.
async fn purge(client: &Client, baseline: &BTreeSet<(String, String, String)>) -> Result<(), Error> {
    for ar in purge_kinds(client).await? {
        let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        for obj in all.list(&ListParams::default()).await? {
            if baseline.contains(&key(&ar, &obj)) || made_by_the_api_server(&obj) {
                continue;
            }
            let name = obj.metadata.name.clone().unwrap_or_default();
            let api: Api<DynamicObject> = match &obj.metadata.namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            if obj.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
                let patch = serde_json::json!({"metadata": {"finalizers": null}});
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
            }
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// An API server for one test.
pub struct TestCluster {
    backend: Backend,
    local: Option<TestApiServer>,
    genuine: Option<&'static Shared>,
    config: kube::Config,
    client: Client,
    log: RequestLog,
    /// Set when started with [`TestCluster::start_with_faults`] on the genuine backend.
    proxy: Option<FaultProxy>,
    kubeconfig: Option<PathBuf>,
    _turn: Option<OwnedMutexGuard<()>>,
}

impl TestCluster {
    /// Starts (local) or takes a turn on (genuine) an API server. Genuine needs
    /// `CCM_TEST_ASSETS`; check [`Backend::genuine_available`] first.
    pub async fn start(backend: Backend) -> Result<TestCluster, Error> {
        match backend {
            Backend::Local => {
                let server = TestApiServer::start().await?;
                Ok(TestCluster {
                    backend,
                    config: server.kube_config(),
                    client: server.client(),
                    log: server.request_log(),
                    local: Some(server),
                    genuine: None,
                    proxy: None,
                    kubeconfig: None,
                    _turn: None,
                })
            }
            Backend::Genuine => {
                let shared = shared().await?;
                let turn = shared.turn.clone().lock_owned().await;
                let config = shared.plane.admin_config().await?;
                let client = Client::try_from(config.clone())?;
                let baseline = {
                    let existing = shared.baseline.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    match existing {
                        Some(b) => b,
                        None => {
                            let b = snapshot(&client).await?;
                            *shared.baseline.lock().unwrap_or_else(|e| e.into_inner()) = Some(b.clone());
                            b
                        }
                    }
                };
                purge(&client, &baseline).await?;
                let log = RequestLog::audit(Arc::new(AuditLog::from_end(shared.plane.audit_log_path().to_path_buf())));
                Ok(TestCluster {
                    backend,
                    local: None,
                    genuine: Some(shared),
                    config,
                    client,
                    log,
                    proxy: None,
                    kubeconfig: None,
                    _turn: Some(turn),
                })
            }
        }
    }

    /// Like [`start`](Self::start), with fault injection: on the genuine backend every client
    /// and kubeconfig this cluster hands out goes through a fault-injecting proxy (as admin).
    pub async fn start_with_faults(backend: Backend) -> Result<TestCluster, Error> {
        let mut cluster = TestCluster::start(backend).await?;
        if let Some(shared) = cluster.genuine {
            let proxy = FaultProxy::start(cluster.client.clone()).await?;
            let uri: http::Uri = proxy.url().parse().map_err(|e: http::uri::InvalidUri| Error::Url(e.to_string()))?;
            let path = shared.plane.dir().join(format!("proxy-{}.kubeconfig", crate::util::random_suffix()));
            std::fs::write(&path, crate::kubeconfig_yaml(proxy.url()))?;
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
        match (&self.local, &self.proxy) {
            (Some(server), _) => server.faults(),
            (None, Some(proxy)) => proxy.faults(),
            (None, None) => panic!("fault injection on the genuine backend needs TestCluster::start_with_faults"),
        }
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether this is the genuine backend.
    pub fn is_genuine(&self) -> bool {
        self.backend == Backend::Genuine
    }

    /// Whether owned objects are garbage-collected after their owner goes: always on the local
    /// backend, on the genuine one when kube-controller-manager runs beside it.
    pub fn garbage_collects(&self) -> bool {
        match self.backend {
            Backend::Local => true,
            Backend::Genuine => {
                SHARED.get().and_then(|s| s.as_ref().ok()).is_some_and(|s| s.plane.has_controller_manager())
            }
        }
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
        if let Some(path) = &self.kubeconfig {
            return path.clone();
        }
        match (&self.local, self.genuine) {
            (Some(server), _) => server.kubeconfig_path().to_path_buf(),
            (None, Some(shared)) => shared.plane.admin_kubeconfig_path(),
            (None, None) => PathBuf::new(),
        }
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
        self.local.as_ref()
    }

    /// The genuine control plane; `None` on the local backend.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.genuine.map(|s| &s.plane)
    }

    /// Installs a CRD and waits until its resources are served.
    pub async fn install_crd(&self, crd: &CustomResourceDefinition) -> Result<(), Error> {
        if let Some(server) = &self.local {
            server.install_crd(crd).await?;
            return Ok(());
        }
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut crd = crd.clone();
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.status = None;
        api.patch(&name, &PatchParams::apply("e2e-apiserver").force(), &Patch::Apply(&crd)).await?;
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(api, &name, established))
            .await
            .map_err(|_| Error::Genuine(format!("CRD {name} not established in 30 s")))?
            .map_err(|e| Error::Genuine(format!("waiting for CRD {name}: {e}")))?;
        Ok(())
    }

    /// A client config and kubeconfig file authenticating as a ServiceAccount (which must exist).
    /// On the local backend (no authentication) these are the admin's.
    pub async fn service_account(&self, namespace: &str, name: &str) -> Result<(kube::Config, PathBuf), Error> {
        let Some(shared) = self.genuine else { return Ok((self.kube_config(), self.kubeconfig_path())) };
        let token = shared.plane.service_account_token(namespace, name).await?;
        let path = shared.plane.dir().join(format!("{namespace}-{name}-{}.kubeconfig", crate::util::random_suffix()));
        shared.plane.write_kubeconfig(&path, Some(&token))?;
        Ok((shared.plane.config(Some(&token)).await?, path))
    }

    /// A new namespace with a unique name starting with `prefix`.
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<String, Error> {
        use k8s_openapi::api::core::v1::Namespace;
        let name = format!("{prefix}-{}", crate::util::random_suffix());
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
/// e2e_apiserver::backend_tests! {
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
