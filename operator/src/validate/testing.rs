//! Fixtures of validation's tests: providers with and without routes, resources, Secrets.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ccm_framework::provider::{CloudError, CloudProvider, Route, Routes};
use ccm_framework::registry::{FactoryInput, Registry};
use crds::CloudControllerManager;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use testkit::Meta;

use super::conflicts::Peer;
use super::secret::SecretState;
use super::verdict::Validation;
use crds::reasons::config_valid as reason;

struct NoRoutes;
impl CloudProvider for NoRoutes {
    fn name(&self) -> &str {
        "plain"
    }
}

struct WithRoutes;
#[ccm_framework::async_trait]
impl Routes for WithRoutes {
    async fn list_routes(&self, _cluster_name: &str) -> ccm_framework::provider::CloudResult<Vec<Route>> {
        Ok(Vec::new())
    }
    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        _route: &Route,
    ) -> ccm_framework::provider::CloudResult<()> {
        Ok(())
    }
    async fn delete_route(&self, _cluster_name: &str, _route: &Route) -> ccm_framework::provider::CloudResult<()> {
        Ok(())
    }
}
struct Routed(WithRoutes);
impl CloudProvider for Routed {
    fn name(&self) -> &str {
        "routed"
    }
    fn routes(&self) -> Option<&dyn Routes> {
        Some(&self.0)
    }
}

/// `plain` (no routes; a cloud-config starting with `bad` is refused, one starting with `slow`
/// takes 500 ms) and `routed` (programs routes).
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register("plain", |input: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
        match input.cloud_config {
            Some(b) if b.starts_with(b"bad") => Err(CloudError::InvalidConfig("line 1: expected key = value".into())),
            Some(b) if b.starts_with(b"slow") => {
                std::thread::sleep(std::time::Duration::from_millis(500));
                Ok(Arc::new(NoRoutes))
            }
            _ => Ok(Arc::new(NoRoutes)),
        }
    })
    .unwrap();
    r.register("routed", |_: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
        Ok(Arc::new(Routed(WithRoutes)))
    })
    .unwrap();
    r
}

/// A registry whose one provider, `counted`, counts the runs of its factory in `runs`.
pub fn counting_registry(runs: Arc<AtomicUsize>) -> Registry {
    let mut r = Registry::new();
    r.register("counted", move |_: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(NoRoutes))
    })
    .unwrap();
    r
}

/// A resource in `kube-system` created at second `created`.
pub fn cr(name: &str, created: i64, spec: serde_json::Value) -> CloudControllerManager {
    let mut cr = testkit::cr("kube-system", name, spec).with_uid(&format!("uid-{name}"));
    cr.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
    cr
}

/// Secret `cfg`, key `cloud.conf`, holding `data`.
pub fn found(data: &[u8]) -> SecretState {
    SecretState::Found { name: "cfg".into(), key: "cloud.conf".into(), data: data.to_vec(), extra: Vec::new() }
}

/// Secret `cfg`, key `cloud.conf` holding `data`, and the credentials key holding `credentials`.
pub fn found_with_credentials(data: &[u8], credentials: &[u8]) -> SecretState {
    SecretState::Found {
        name: "cfg".into(),
        key: "cloud.conf".into(),
        data: data.to_vec(),
        extra: vec![("credentials".into(), credentials.to_vec())],
    }
}

/// The `ConfigValid` reason of a verdict.
pub fn reason_of(v: &Validation) -> &'static str {
    v.summary().map(|(r, _)| r).unwrap_or(reason::VALID)
}

/// The conflict views of `crs`.
pub fn peers(crs: &[&CloudControllerManager]) -> Vec<Peer> {
    crs.iter().filter_map(|c| Peer::from_cr(c, &registry())).collect()
}
