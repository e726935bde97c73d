//! Bounded execution: validation off the async runtime, within a time limit, so one resource's
//! cloud-config that is slow to parse (deeply nested, huge) never holds another's reconcile up.

use std::time::Duration;

use ccm_framework::registry::Registry;
use crds::CloudControllerManager;

use super::conflicts::Peer;
use super::environment::{Environment, check_environment};
use super::manager_config::Controllers;
use super::pipeline::check;
use super::secret::SecretState;
use super::verdict::{Checked, Failure, Validation};
use crds::reasons::config_valid as reason;

/// How long a provider may take to check a cloud-config before it is refused.
pub const PARSE_TIME_LIMIT: Duration = Duration::from_secs(10);

/// The verdict for a cloud-config the provider did not finish checking within `limit`: refused,
/// so a document that is slow to parse (deeply nested, huge) never holds anything up.
pub fn parse_timed_out(provider: &str, limit: Duration) -> Validation {
    Validation::refused(vec![Failure {
        reason: reason::CLOUD_CONFIG_REJECTED,
        message: format!(
            "provider {provider:?} did not finish checking the cloud-config within the limit of {limit:?}; it is refused (very large or deeply nested documents are the usual cause)"
        ),
    }])
}

/// What [`validate_bounded`] checks: one resource as the reconcile dereferenced it.
#[derive(Debug, Clone)]
pub struct Subject {
    /// The resource.
    pub cr: CloudControllerManager,
    /// Its `spec.controllers`, resolved once by the reconcile.
    pub controllers: Controllers,
    /// Its cloud-config Secret.
    pub secret: SecretState,
    /// The other resources in scope.
    pub peers: Vec<Peer>,
}

/// [`check`] and [`check_environment`] on a blocking thread, off the async runtime, given at
/// most `limit`: a cloud-config that is slow to parse never occupies a runtime thread, so no
/// other resource's reconcile waits for it. Past the limit the thread is abandoned (it cannot
/// be stopped) and `None` is returned (the caller refuses it with [`parse_timed_out`]).
pub async fn validate_bounded(
    subject: Subject,
    registry: Registry,
    env: Environment,
    limit: Duration,
) -> Option<Checked> {
    let provider = subject.cr.spec.provider.clone();
    let task = tokio::task::spawn_blocking(move || {
        let Subject { cr, controllers, secret, peers } = subject;
        let checked = check(&cr, &controllers, &secret, &registry, &peers);
        let validation = check_environment(&cr, checked.validation, &secret, &env);
        // A verdict the environment refused runs nothing.
        let provider = checked.provider.filter(|_| validation.is_valid());
        Checked { validation, provider }
    });
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(checked)) => Some(checked),
        Ok(Err(_)) => Some(Checked::without_provider(Validation::refused(vec![Failure {
            reason: reason::CLOUD_CONFIG_REJECTED,
            message: format!("provider {provider:?} failed while checking the cloud-config (it panicked)"),
        }]))),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::testing::{counting_registry, cr, found, registry};
    use crds::controllers::ControllerSelection;
    use serde_json::json;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_cloud_config_slower_than_the_limit_is_refused_and_the_runtime_stays_free() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let subject = |data: &[u8]| Subject {
            cr: c.clone(),
            controllers: ControllerSelection::parse(&c.spec.controllers),
            secret: found(data),
            peers: Vec::new(),
        };
        let limit = std::time::Duration::from_millis(100);
        let slow = validate_bounded(subject(b"slow"), registry(), Environment::default(), limit);
        // The async runtime (one thread here) keeps serving other work meanwhile.
        let other = async {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            std::time::Instant::now()
        };
        let started = std::time::Instant::now();
        let (v, other_done) = tokio::join!(slow, other);
        assert!(other_done - started < std::time::Duration::from_millis(90));
        assert!(v.is_none(), "past the limit there is no verdict");
        let (r, message) = parse_timed_out("plain", limit).summary().unwrap();
        assert_eq!(r, reason::CLOUD_CONFIG_REJECTED);
        assert!(message.contains("within the limit of 100ms"), "{message}");
        // Within the limit, the verdict is validate's own.
        let v =
            validate_bounded(subject(b"fine"), registry(), Environment::default(), std::time::Duration::from_secs(5))
                .await;
        assert!(v.unwrap().validation.is_valid());
    }

    #[tokio::test]
    async fn a_bounded_validation_runs_the_factory_once_and_keeps_the_provider_only_when_valid() {
        let runs = Arc::new(AtomicUsize::new(0));
        let registry = counting_registry(runs.clone());
        let c = cr("a", 1, json!({"provider": "counted", "mode": "Embedded"}));
        let subject = Subject {
            cr: c.clone(),
            controllers: ControllerSelection::parse(&c.spec.controllers),
            secret: SecretState::NotReferenced,
            peers: Vec::new(),
        };
        let limit = std::time::Duration::from_secs(5);
        let checked = validate_bounded(subject.clone(), registry.clone(), Environment::default(), limit).await.unwrap();
        assert!(checked.validation.is_valid() && checked.provider.is_some());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // The environment refuses it: the provider is dropped, and was built once all the same.
        let disabled = Environment { embedded_enabled: false, host_network: true };
        let checked = validate_bounded(subject, registry, disabled, limit).await.unwrap();
        assert!(!checked.validation.is_valid() && checked.provider.is_none());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
