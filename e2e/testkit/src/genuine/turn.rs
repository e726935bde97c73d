//! A test's turn on the shared genuine control plane: tests take turns on it (the controllers
//! under test watch cluster-wide), and each turn starts by deleting every object earlier turns
//! created, so a test sees a cluster as it was at start.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use tokio::sync::OwnedMutexGuard;

use super::{ControlPlane, HOW_TO_ENABLE, assets_dir};
use crate::error::Error;
use memory_apiserver::RequestLog;

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
            let Some(assets) = assets_dir() else { return Err(HOW_TO_ENABLE.to_string()) };
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
    (
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        false,
    ),
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", false),
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

/// One test's turn: held until the turn ends (when this is dropped).
pub(crate) struct GenuineTurn {
    shared: &'static Shared,
    config: kube::Config,
    log: RequestLog,
    _turn: OwnedMutexGuard<()>,
}

impl GenuineTurn {
    /// Waits for the turn (starting the control plane on first use) and purges what earlier
    /// turns left.
    pub(crate) async fn start() -> Result<GenuineTurn, Error> {
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
        let log = shared.plane.request_log();
        Ok(GenuineTurn { shared, config, log, _turn: turn })
    }

    /// The control plane.
    pub(crate) fn plane(&self) -> &ControlPlane {
        &self.shared.plane
    }

    /// The admin client config.
    pub(crate) fn admin_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// The audit log as a request log, from the start of this turn.
    pub(crate) fn request_log(&self) -> RequestLog {
        self.log.clone()
    }

    /// Installs a CRD and waits until its resources are served.
    pub(crate) async fn install_crd(&self, crd: &CustomResourceDefinition) -> Result<(), Error> {
        let api: Api<CustomResourceDefinition> = Api::all(Client::try_from(self.config.clone())?);
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut crd = crd.clone();
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.status = None;
        api.patch(&name, &PatchParams::apply("testkit").force(), &Patch::Apply(&crd)).await?;
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(api, &name, established))
            .await
            .map_err(|_| Error::Genuine(format!("CRD {name} not established in 30 s")))?
            .map_err(|e| Error::Genuine(format!("waiting for CRD {name}: {e}")))?;
        Ok(())
    }

    /// A client config and kubeconfig file authenticating as a ServiceAccount (which must exist).
    pub(crate) async fn service_account(&self, namespace: &str, name: &str) -> Result<(kube::Config, PathBuf), Error> {
        let plane = self.plane();
        let token = plane.service_account_token(namespace, name).await?;
        let path = plane.dir().join(format!("{namespace}-{name}-{}.kubeconfig", memory_apiserver::random_suffix()));
        plane.write_kubeconfig(&path, Some(&token))?;
        Ok((plane.config(Some(&token)).await?, path))
    }
}
