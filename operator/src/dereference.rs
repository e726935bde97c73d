//! Dereference: read what a CloudControllerManager points at (its Secret, its Lease, its
//! workload, the other CRs) into plain values for the pure steps.
//!
//! Everything comes from watch caches except the Secret's data: the operator watches only
//! Secret metadata, and reads (then remembers) a referenced key only when the Secret's
//! `resourceVersion` moved, so an idle operator makes no requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ccm_framework::registry::Registry;
use crds::CloudControllerManager;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PartialObjectMeta;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};

use crate::status::{DaemonSetObservation, DeploymentObservation, LeaseObservation};
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
    /// Read `key` of Secret `namespace/name`. `metadata` is the watch cache of Secret metadata:
    /// when it shows the remembered `resourceVersion`, no request is made.
    pub async fn read(
        &self,
        client: &Client,
        metadata: &Store<PartialObjectMeta<Secret>>,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> SecretState {
        let cache_key = (namespace.to_string(), name.to_string(), key.to_string());
        let current_rv =
            metadata.get(&ObjectRef::new(name).within(namespace)).and_then(|m| m.metadata.resource_version.clone());
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
        Some(data) => SecretState::Found { name: name.to_string(), key: key.to_string(), data },
        None => SecretState::KeyNotFound { name: name.to_string(), key: key.to_string() },
    }
}

/// The conflict view of every CR in the caches.
pub fn peers(stores: &[Store<DeserializeGuard<CloudControllerManager>>], registry: &Registry) -> Vec<Peer> {
    stores
        .iter()
        .flat_map(|s| s.state())
        .filter_map(|o| o.0.as_ref().ok().and_then(|cr| Peer::from_cr(cr, registry)))
        .collect()
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
}
