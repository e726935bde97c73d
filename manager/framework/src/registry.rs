//! Providers registered by name, each with a factory that builds it from its cloud-config.
//!
//! Unlike upstream's process-global map, a registry is a value: a vendor's `main` builds one,
//! the operator builds one, and tests build their own. Registering a name twice is an error
//! the caller handles, not a process exit.

pub use crate::error::RegistryError;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use crate::provider::{CloudError, CloudProvider};
use crate::webhook::AdmissionWebhook;

/// The largest cloud-config handed to any factory (a Kubernetes Secret's own limit); a larger
/// one is refused before the provider sees it.
pub const MAX_CLOUD_CONFIG_BYTES: usize = crate::safe_yaml::CLOUD_CONFIG_LIMITS.max_bytes;

/// How long [`Registry::create_bounded`] waits for a factory (that is, for a cloud-config to be
/// parsed and validated).
pub const FACTORY_TIME_LIMIT: Duration = Duration::from_secs(10);

/// Read a cloud-config file, at most one byte past [`MAX_CLOUD_CONFIG_BYTES`] (enough for the
/// size check to refuse it) so that a huge file is never loaded into memory.
pub fn read_cloud_config_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_CLOUD_CONFIG_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Cluster-wide settings a provider may need at construction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// `--cluster-name`.
    pub cluster_name: String,
    /// `--cluster-cidr`, parsed; empty when not set.
    pub cluster_cidrs: Vec<IpNet>,
}

/// What a factory receives.
#[derive(Debug, Clone, Copy)]
pub struct FactoryInput<'a> {
    /// The cloud-config bytes, or `None` when no `--cloud-config` was given.
    pub cloud_config: Option<&'a [u8]>,
    /// Cluster settings.
    pub cluster: &'a ClusterSettings,
}

/// Builds a provider. Must be cheap and free of side effects (no network calls, no tasks):
/// the operator calls it to validate a cloud-config. Start work in `initialize` instead.
pub type ProviderFactory = Arc<dyn Fn(FactoryInput<'_>) -> Result<Arc<dyn CloudProvider>, CloudError> + Send + Sync>;

/// A provider and the admission webhooks it serves (they may share its state).
#[derive(Clone)]
pub struct Built {
    /// The provider.
    pub provider: Arc<dyn CloudProvider>,
    /// Its webhooks, served when `--webhooks` selects them (see [`crate::webhook`]).
    pub webhooks: Vec<Arc<dyn AdmissionWebhook>>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built").field("provider", &self.provider.name()).field("webhooks", &self.webhooks).finish()
    }
}

/// Builds a provider with its webhooks; the same rules as [`ProviderFactory`].
pub type BuildFactory = Arc<dyn Fn(FactoryInput<'_>) -> Result<Built, CloudError> + Send + Sync>;

/// Providers by name.
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<String, BuildFactory>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("providers", &self.names()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a provider under `name`.
    pub fn register<F>(&mut self, name: impl Into<String>, factory: F) -> Result<(), RegistryError>
    where
        F: Fn(FactoryInput<'_>) -> Result<Arc<dyn CloudProvider>, CloudError> + Send + Sync + 'static,
    {
        self.register_with_webhooks(name, move |input: FactoryInput<'_>| {
            factory(input).map(|provider| Built { provider, webhooks: Vec::new() })
        })
    }

    /// Register a provider whose factory also returns admission webhooks (KEP-2699): the
    /// manager serves those `--webhooks` selects; validation ([`Self::create`]) ignores them.
    pub fn register_with_webhooks<F>(&mut self, name: impl Into<String>, factory: F) -> Result<(), RegistryError>
    where
        F: Fn(FactoryInput<'_>) -> Result<Built, CloudError> + Send + Sync + 'static,
    {
        let name = name.into();
        if self.factories.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        tracing::debug!(provider = %name, "registered cloud provider");
        self.factories.insert(name, Arc::new(factory));
        Ok(())
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.factories.keys().cloned().collect()
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// Build the provider `name` from its cloud-config: also the pure validation function the
    /// operator calls (factories have no side effects). A cloud-config over
    /// [`MAX_CLOUD_CONFIG_BYTES`] is refused before the factory; the built-in factories bound
    /// depth and alias expansion too (`safe_yaml`). Blocking: on an async runtime,
    /// prefer [`Self::create_bounded`].
    pub fn create(
        &self,
        name: &str,
        cloud_config: Option<&[u8]>,
        cluster: &ClusterSettings,
    ) -> Result<Arc<dyn CloudProvider>, RegistryError> {
        self.build(name, cloud_config, cluster).map(|built| built.provider)
    }

    /// [`Self::create`] with the provider's webhooks.
    pub fn build(
        &self,
        name: &str,
        cloud_config: Option<&[u8]>,
        cluster: &ClusterSettings,
    ) -> Result<Built, RegistryError> {
        let factory = match name {
            "" => return Err(RegistryError::Empty { known: self.names() }),
            "external" => return Err(RegistryError::External { known: self.names() }),
            _ => self
                .factories
                .get(name)
                .ok_or_else(|| RegistryError::Unknown { name: name.to_string(), known: self.names() })?,
        };
        if cloud_config.is_some_and(|c| c.len() > MAX_CLOUD_CONFIG_BYTES) {
            let source = CloudError::InvalidConfig(format!(
                "the cloud-config is larger than the limit of {MAX_CLOUD_CONFIG_BYTES} bytes"
            ));
            return Err(RegistryError::Init { name: name.to_string(), source });
        }
        factory(FactoryInput { cloud_config, cluster })
            .map_err(|source| RegistryError::Init { name: name.to_string(), source })
    }

    /// [`Self::create`] on a blocking thread, off the async runtime, given at most `limit`.
    ///
    /// A factory past its limit is abandoned (a thread cannot be stopped; the built-in parsers
    /// are bounded by size and depth, so this guards other providers) and the cloud-config is
    /// refused with [`RegistryError::TimedOut`].
    pub async fn create_bounded(
        &self,
        name: &str,
        cloud_config: Option<Vec<u8>>,
        cluster: &ClusterSettings,
        limit: Duration,
    ) -> Result<Arc<dyn CloudProvider>, RegistryError> {
        self.build_bounded(name, cloud_config, cluster, limit).await.map(|built| built.provider)
    }

    /// [`Self::create_bounded`] with the provider's webhooks.
    pub async fn build_bounded(
        &self,
        name: &str,
        cloud_config: Option<Vec<u8>>,
        cluster: &ClusterSettings,
        limit: Duration,
    ) -> Result<Built, RegistryError> {
        let (registry, owned_name, cluster) = (self.clone(), name.to_string(), cluster.clone());
        let task = tokio::task::spawn_blocking(move || registry.build(&owned_name, cloud_config.as_deref(), &cluster));
        match tokio::time::timeout(limit, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RegistryError::Init {
                name: name.to_string(),
                source: CloudError::Other("the provider's factory panicked".to_string()),
            }),
            Err(_) => Err(RegistryError::TimedOut { name: name.to_string(), limit }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(String);
    impl CloudProvider for Named {
        fn name(&self) -> &str {
            &self.0
        }
    }

    fn named(input: FactoryInput<'_>) -> Result<Arc<dyn CloudProvider>, CloudError> {
        match input.cloud_config {
            Some(b"bad") => Err(CloudError::InvalidConfig("line 1: expected a map".into())),
            _ => Ok(Arc::new(Named(input.cluster.cluster_name.clone()))),
        }
    }

    #[test]
    fn p1_registered_provider_is_built_by_its_factory() {
        let mut r = Registry::new();
        r.register("mycloud", named).unwrap();
        let settings = ClusterSettings { cluster_name: "prod".into(), ..Default::default() };
        let p = r.create("mycloud", None, &settings).unwrap();
        assert_eq!(p.name(), "prod");
    }

    #[test]
    fn p2_registering_a_name_twice_is_an_error_not_an_exit() {
        let mut r = Registry::new();
        r.register("mycloud", named).unwrap();
        let err = r.register("mycloud", named).unwrap_err();
        assert!(matches!(err, RegistryError::Duplicate(ref n) if n == "mycloud"));
        assert_eq!(r.names(), ["mycloud"]);
    }

    #[test]
    fn p3_unknown_name_lists_the_known_ones() {
        let mut r = Registry::new();
        r.register("b", named).unwrap();
        r.register("a", named).unwrap();
        let err = r.create("c", None, &ClusterSettings::default()).unwrap_err();
        assert!(matches!(err, RegistryError::Unknown { .. }));
        assert!(err.to_string().contains("known providers: a, b"), "{err}");
    }

    #[test]
    fn p4_external_and_empty_names_are_refused_with_an_explanation() {
        let mut r = Registry::new();
        r.register("a", named).unwrap();
        let err = r.create("external", None, &ClusterSettings::default()).unwrap_err();
        assert!(matches!(err, RegistryError::External { .. }));
        assert!(err.to_string().contains("kube-controller-manager"));
        let err = r.create("", None, &ClusterSettings::default()).unwrap_err();
        assert!(err.to_string().contains("cannot be empty"));
    }

    #[test]
    fn a_cloud_config_over_the_size_limit_never_reaches_the_factory() {
        let mut r = Registry::new();
        r.register("picky", |_: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
            panic!("the factory must not be called")
        })
        .unwrap();
        let big = vec![b'a'; MAX_CLOUD_CONFIG_BYTES + 1];
        let err = r.create("picky", Some(&big), &ClusterSettings::default()).unwrap_err();
        assert!(err.to_string().contains(&format!("limit of {MAX_CLOUD_CONFIG_BYTES} bytes")), "{err}");
    }

    #[tokio::test]
    async fn a_slow_factory_is_abandoned_at_the_time_limit_without_blocking_the_runtime() {
        let mut r = Registry::new();
        r.register("slow", |_: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
            std::thread::sleep(Duration::from_millis(500));
            Err(CloudError::InvalidConfig("late".into()))
        })
        .unwrap();
        r.register("mycloud", named).unwrap();
        let cluster = ClusterSettings::default();
        let err = r.create_bounded("slow", None, &cluster, Duration::from_millis(50)).await.unwrap_err();
        assert!(matches!(err, RegistryError::TimedOut { .. }), "{err}");
        assert!(err.to_string().contains("within the limit"), "{err}");
        let ok = r.create_bounded("mycloud", Some(b"x".to_vec()), &cluster, Duration::from_secs(5)).await;
        assert!(ok.is_ok());
    }

    #[test]
    fn p1_a_provider_registered_with_webhooks_hands_them_over_and_validation_ignores_them() {
        struct Hook;
        #[async_trait::async_trait]
        impl AdmissionWebhook for Hook {
            fn name(&self) -> &str {
                "hook"
            }
            fn path(&self) -> &str {
                "/hook"
            }
            async fn admit(
                &self,
                _: &crate::webhook::AdmissionContext,
                _: &crate::webhook::AdmissionRequest,
            ) -> Result<crate::webhook::Admission, String> {
                Ok(crate::webhook::Admission::allowed())
            }
        }
        let mut r = Registry::new();
        r.register_with_webhooks("hooked", |input: FactoryInput<'_>| {
            Ok(Built { provider: named(input)?, webhooks: vec![Arc::new(Hook)] })
        })
        .unwrap();
        r.register("plain", named).unwrap();
        let built = r.build("hooked", None, &ClusterSettings::default()).unwrap();
        assert_eq!(built.webhooks.iter().map(|w| w.name()).collect::<Vec<_>>(), ["hook"]);
        assert!(r.build("plain", None, &ClusterSettings::default()).unwrap().webhooks.is_empty());
        assert!(r.create("hooked", None, &ClusterSettings::default()).is_ok());
        assert!(matches!(r.register("hooked", named), Err(RegistryError::Duplicate(_))));
    }

    #[test]
    fn p4_factory_errors_are_wrapped_with_the_provider_name() {
        let mut r = Registry::new();
        r.register("mycloud", named).unwrap();
        let err = r.create("mycloud", Some(b"bad"), &ClusterSettings::default()).unwrap_err();
        match err {
            RegistryError::Init { ref name, source: CloudError::InvalidConfig(_) } => assert_eq!(name, "mycloud"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().starts_with("could not init cloud provider"));
    }
}
