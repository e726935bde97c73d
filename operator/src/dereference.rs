//! Dereference: read what a CloudControllerManager points at (its Secret, its Lease, its
//! workload, the other CRs) into plain values for the pure steps.
//!
//! Everything comes from watch caches except the Secret's data: the operator watches only the
//! metadata of Secrets labelled `ccm.rs/cloud-config=true`, and reads (then remembers) a referenced key only when the Secret's
//! `resourceVersion` moved, so an idle operator makes no requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ccm_framework::registry::Registry;
use crds::CloudControllerManager;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PartialObjectMeta;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};

use crate::status::{DaemonSetObservation, DeploymentObservation, FailingContainer, LeaseObservation, PodsObservation};
use crate::validate::{Peer, SecretState};

/// How far a Lease's renew time may lag the operator's clock before the holder counts as gone,
/// beyond the Lease's own duration (clock skew between nodes).
pub const LEASE_SKEW: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct CachedKey {
    resource_version: String,
    value: Option<Vec<u8>>,
}

/// Remembers referenced Secret keys by `resourceVersion`.
#[derive(Default)]
pub struct SecretReader {
    cache: Mutex<HashMap<(String, String, String), CachedKey>>,
}

impl std::fmt::Debug for SecretReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretReader").finish_non_exhaustive()
    }
}

impl SecretReader {
    /// Read `key` of Secret `namespace/name`. `metadata` is the watch cache of the metadata of
    /// Secrets labelled as cloud-configs: a Secret it does not hold is not read at all (it is
    /// missing or not meant for a manager, and the two look alike); when it shows the remembered
    /// `resourceVersion`, no request is made.
    pub async fn read(
        &self,
        client: &Client,
        metadata: &Store<PartialObjectMeta<Secret>>,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> SecretState {
        let cache_key = (namespace.to_string(), name.to_string(), key.to_string());
        let Some(current_rv) =
            metadata.get(&ObjectRef::new(name).within(namespace)).map(|m| m.metadata.resource_version.clone())
        else {
            self.forget(namespace, name);
            return SecretState::NotFound { name: name.to_string() };
        };
        if let Some(rv) = &current_rv {
            let cached = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&cache_key).cloned();
            if let Some(c) = cached
                && &c.resource_version == rv
            {
                return state(name, key, c.value);
            }
        }
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        match api.get_opt(name).await {
            // Unlabelled since the cache saw it: not read, as if it were not there.
            Ok(Some(secret)) if !crate::names::is_cloud_config(secret.metadata.labels.as_ref()) => {
                self.forget(namespace, name);
                SecretState::NotFound { name: name.to_string() }
            }
            Ok(Some(secret)) => {
                let value = secret.data.as_ref().and_then(|d| d.get(key)).map(|v| v.0.clone());
                if let Some(rv) = secret.metadata.resource_version.clone() {
                    self.cache
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(cache_key, CachedKey { resource_version: rv, value: value.clone() });
                }
                state(name, key, value)
            }
            Ok(None) => {
                self.forget(namespace, name);
                SecretState::NotFound { name: name.to_string() }
            }
            Err(e) => SecretState::Unreadable { name: name.to_string(), error: e.to_string() },
        }
    }

    /// Drop every remembered key of a Secret.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).retain(|(ns, n, _), _| !(ns == namespace && n == name));
    }
}

fn state(name: &str, key: &str, value: Option<Vec<u8>>) -> SecretState {
    match value {
        Some(data) => SecretState::Found { name: name.to_string(), key: key.to_string(), data, extra: Vec::new() },
        None => SecretState::KeyNotFound { name: name.to_string(), key: key.to_string() },
    }
}

/// The conflict view of every CR in the watch cache, each worked out once per version of the
/// CR (by UID and `resourceVersion`) rather than at every reconcile of every CR.
#[derive(Default)]
pub struct PeerCache {
    views: Mutex<HashMap<String, (String, Option<Peer>)>>,
}

impl std::fmt::Debug for PeerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCache").finish_non_exhaustive()
    }
}

impl PeerCache {
    /// The conflict view of every CR in `store`; views of CRs gone from it are forgotten.
    pub fn peers(&self, store: &Store<DeserializeGuard<CloudControllerManager>>, registry: &Registry) -> Vec<Peer> {
        let crs = store.state();
        let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = HashMap::with_capacity(crs.len());
        let mut out = Vec::with_capacity(crs.len());
        for cr in crs.iter().filter_map(|o| o.0.as_ref().ok()) {
            let view = match (cr.uid(), cr.resource_version()) {
                (Some(uid), Some(version)) => {
                    let view = match views.remove(&uid) {
                        Some((seen, view)) if seen == version => view,
                        _ => Peer::from_cr(cr, registry),
                    };
                    kept.insert(uid, (version, view.clone()));
                    view
                }
                _ => Peer::from_cr(cr, registry),
            };
            out.extend(view);
        }
        *views = kept;
        out
    }
}

/// What the Lease `namespace/name` says, judged against `now`.
pub fn lease(store: &Store<Lease>, namespace: &str, name: &str, now: &Time) -> Option<LeaseObservation> {
    let lease = store.get(&ObjectRef::new(name).within(namespace))?;
    Some(observe_lease(&lease, now))
}

/// Whether a Lease's holder renewed recently enough (pure).
pub fn observe_lease(lease: &Lease, now: &Time) -> LeaseObservation {
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let fresh = match (&holder, &spec.renew_time, spec.lease_duration_seconds) {
        (Some(_), Some(renewed), Some(secs)) if secs > 0 => {
            let deadline = Duration::from_secs(u64::try_from(secs).unwrap_or(0)) + LEASE_SKEW;
            let age = Duration::try_from(now.0.duration_since(renewed.0)).unwrap_or_default();
            age <= deadline
        }
        _ => false,
    };
    LeaseObservation { holder, fresh }
}

/// How long until a fresh Lease would expire unrenewed, to check it again then.
pub fn lease_expiry(lease: &Lease, now: &Time) -> Option<Duration> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?;
    let secs = u64::try_from(spec.lease_duration_seconds?).ok()?;
    let age = Duration::try_from(now.0.duration_since(renewed.0)).ok()?;
    (Duration::from_secs(secs) + LEASE_SKEW).checked_sub(age)
}

/// The Deployment's rollout state (pure).
pub fn observe_deployment(d: &Deployment) -> DeploymentObservation {
    let status = d.status.clone().unwrap_or_default();
    let deadline_exceeded = status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing" && c.status == "False" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    DeploymentObservation {
        generation: d.metadata.generation.unwrap_or(0),
        observed_generation: status.observed_generation.unwrap_or(0),
        desired: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: status.replicas.unwrap_or(0),
        updated: status.updated_replicas.unwrap_or(0),
        ready: status.ready_replicas.unwrap_or(0),
        available: status.available_replicas.unwrap_or(0),
        deadline_exceeded,
    }
}

/// The DaemonSet's rollout state (pure).
pub fn observe_daemon_set(d: &DaemonSet) -> DaemonSetObservation {
    let status = d.status.clone().unwrap_or_default();
    DaemonSetObservation {
        generation: d.metadata.generation.unwrap_or(0),
        observed_generation: status.observed_generation.unwrap_or(0),
        desired: status.desired_number_scheduled,
        current: status.current_number_scheduled,
        updated: status.updated_number_scheduled.unwrap_or(0),
        ready: status.number_ready,
        available: status.number_available.unwrap_or(0),
    }
}

/// Waiting reasons of a container that cannot start (the kubelet retries, with backoff).
const CANNOT_START: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// What the manager Pods' container statuses say (pure): crash loops (`CrashLoopBackOff`, or
/// restarted and not ready) and containers that cannot start. Pods being deleted are left out.
pub fn observe_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> PodsObservation {
    use crds::reasons::degraded;
    let mut out = PodsObservation::default();
    for pod in pods {
        out.managers.push(crate::status::ManagerPod {
            name: pod.metadata.name.clone().unwrap_or_default(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            upstream_profile: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::names::LABEL_UPSTREAM_PROFILE).cloned()),
        });
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        out.pods += 1;
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
        for c in statuses.into_iter().flatten() {
            let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.clone());
            let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
            let last_exit = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| {
                let reason = t.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
                format!(", last exit code {}{reason}", t.exit_code)
            });
            let restarts = format!("{} restart{}", c.restart_count, if c.restart_count == 1 { "" } else { "s" });
            let reason = match waiting.as_deref() {
                Some("CrashLoopBackOff") => Some(degraded::MANAGER_CRASH_LOOPING),
                Some(w) if CANNOT_START.contains(&w) => Some(degraded::MANAGER_CANNOT_START),
                // Restarted and down again; one running but not ready yet (just restarted,
                // probes pending) is not flagged, so one restart does not flap Degraded.
                _ if c.restart_count > 0 && !c.ready && !running => Some(degraded::MANAGER_CRASH_LOOPING),
                _ => None,
            };
            if let Some(reason) = reason {
                let state = waiting.unwrap_or_else(|| "not ready".to_string());
                out.failing.push(FailingContainer {
                    name: format!("{pod_name}/{}", c.name),
                    reason,
                    detail: format!("{state}, {restarts}{}", last_exit.unwrap_or_default()),
                });
            }
        }
    }
    out.failing.sort_by(|a, b| a.name.cmp(&b.name));
    out.managers.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Keep of a manager Pod only what [`observe_pods`] and the teardown need: its identity,
/// labels, deletion, Node and container statuses (no other spec, no image IDs, no conditions).
pub fn strip_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{ContainerStatus, PodSpec, PodStatus};
    pod.spec = pod.spec.take().map(|s| PodSpec { node_name: s.node_name, ..Default::default() });
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    let statuses = pod.status.take().and_then(|s| s.container_statuses).map(|cs| {
        cs.into_iter()
            .map(|c| ContainerStatus {
                name: c.name,
                ready: c.ready,
                restart_count: c.restart_count,
                state: c.state,
                last_state: c.last_state,
                ..Default::default()
            })
            .collect()
    });
    pod.status = Some(PodStatus { container_statuses: statuses, ..Default::default() });
}

/// `namespace/name` of a CR.
pub fn cr_key(cr: &impl ResourceExt) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    fn lease(holder: Option<&str>, renewed: i64, secs: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn holder_is_fresh_within_the_lease_duration_plus_skew() {
        assert!(observe_lease(&lease(Some("a"), 100, 15), &at(110)).fresh);
        assert!(observe_lease(&lease(Some("a"), 100, 15), &at(120)).fresh);
        assert!(!observe_lease(&lease(Some("a"), 100, 15), &at(121)).fresh);
        assert_eq!(lease_expiry(&lease(Some("a"), 100, 15), &at(110)), Some(Duration::from_secs(10)));
    }

    #[test]
    fn released_lease_has_no_holder() {
        let o = observe_lease(&lease(Some(""), 100, 1), &at(100));
        assert_eq!(o, LeaseObservation { holder: None, fresh: false });
    }

    #[test]
    fn deadline_exceeded_is_read_from_the_deployment_conditions() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "generation": 2},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1,
                       "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}
        }))
        .unwrap();
        let o = observe_deployment(&d);
        assert!(o.deadline_exceeded);
        assert_eq!((o.desired, o.updated, o.available), (2, 1, 1));
    }

    fn pod(name: &str, container: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"containerStatuses": [container]},
        }))
        .unwrap()
    }

    #[test]
    fn pods_report_crash_loops_and_start_failures_but_not_a_fresh_restart() {
        use crds::reasons::degraded;
        let crash = pod(
            "a",
            serde_json::json!({"name": "m", "image": "i", "imageID": "", "ready": false,
            "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "SECRET"}}}),
        );
        let down_again = pod(
            "b",
            serde_json::json!({"name": "m", "image": "i", "imageID": "", "ready": false,
            "restartCount": 1, "state": {"terminated": {"exitCode": 2}}}),
        );
        let pull = pod(
            "c",
            serde_json::json!({"name": "m", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}),
        );
        let restarted_running = pod(
            "d",
            serde_json::json!({"name": "m", "image": "i", "imageID": "", "ready": false,
            "restartCount": 1, "state": {"running": {}}}),
        );
        let healthy = pod(
            "e",
            serde_json::json!({"name": "m", "image": "i", "imageID": "", "ready": true,
            "restartCount": 4, "state": {"running": {}}}),
        );
        let mut deleting = crash.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        let o = observe_pods([&crash, &down_again, &pull, &restarted_running, &healthy, &deleting]);
        assert_eq!(o.pods, 5);
        let got: Vec<(&str, &str)> = o.failing.iter().map(|f| (f.name.as_str(), f.reason)).collect();
        assert_eq!(
            got,
            [
                ("a/m", degraded::MANAGER_CRASH_LOOPING),
                ("b/m", degraded::MANAGER_CRASH_LOOPING),
                ("c/m", degraded::MANAGER_CANNOT_START)
            ]
        );
        assert_eq!(o.failing[0].detail, "CrashLoopBackOff, 3 restarts, last exit code 1 (Error)");
        assert!(o.failing.iter().all(|f| !f.detail.contains("SECRET")), "termination messages are never copied");
    }

    #[test]
    fn stripped_pods_keep_only_what_status_reads() {
        let mut p = pod(
            "a",
            serde_json::json!({"name": "m", "image": "registry/x", "imageID": "sha", "ready": true,
            "restartCount": 2, "state": {"running": {}}}),
        );
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("node-2".into()),
            service_account_name: Some("sa".into()),
            containers: vec![Default::default()],
            ..Default::default()
        });
        p.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        let before = observe_pods([&p]);
        strip_pod(&mut p);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-2"), "the leader's manager is found by its Node");
        assert!(spec.containers.is_empty() && spec.service_account_name.is_none() && p.metadata.annotations.is_none());
        let c = &p.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
        assert_eq!((c.image.as_str(), c.restart_count, c.ready), ("", 2, true));
        assert_eq!(observe_pods([&p]), before);
    }

    #[test]
    fn conflict_views_are_worked_out_once_per_version_of_each_cr() {
        use kube::runtime::watcher;
        let registry = ccm_builtin::registry();
        let cr = |name: &str, version: &str, controllers: serde_json::Value| {
            let spec = serde_json::from_value(serde_json::json!({"provider": "fake", "controllers": controllers}));
            let mut cr = CloudControllerManager::new(name, spec.unwrap());
            cr.metadata.namespace = Some("kube-system".into());
            cr.metadata.uid = Some(format!("uid-{name}"));
            cr.metadata.resource_version = Some(version.into());
            DeserializeGuard(Ok(cr))
        };
        let (store, mut writer) = kube::runtime::reflector::store();
        let cache = PeerCache::default();
        let routes = |peers: &[Peer], name: &str| peers.iter().find(|p| p.name == name).map(|p| p.routes);
        writer.apply_watcher_event(&watcher::Event::Apply(cr("a", "1", serde_json::json!(["route"]))));
        writer.apply_watcher_event(&watcher::Event::Apply(cr("b", "1", serde_json::json!(["route"]))));
        let peers = cache.peers(&store, &registry);
        assert_eq!((routes(&peers, "a"), routes(&peers, "b")), (Some(true), Some(true)));
        // The same version is not looked at again (a real object never changes without one).
        writer.apply_watcher_event(&watcher::Event::Apply(cr("a", "1", serde_json::json!(["service"]))));
        assert_eq!(routes(&cache.peers(&store, &registry), "a"), Some(true));
        // A new version is.
        writer.apply_watcher_event(&watcher::Event::Apply(cr("a", "2", serde_json::json!(["service"]))));
        assert_eq!(routes(&cache.peers(&store, &registry), "a"), Some(false));
        // A CR gone from the cache is forgotten.
        writer.apply_watcher_event(&watcher::Event::Delete(cr("b", "1", serde_json::json!(["route"]))));
        let peers = cache.peers(&store, &registry);
        assert_eq!((peers.len(), routes(&peers, "b")), (1, None));
        assert_eq!(cache.views.lock().unwrap().len(), 1);
    }
}
