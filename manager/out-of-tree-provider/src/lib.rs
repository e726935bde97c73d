//! A tiny cloud provider, written the way a cloud vendor would write theirs.
//!
//! The "example" cloud knows its instances from its cloud-config (a real provider would call
//! its cloud's API instead):
//!
//! ```yaml
//! region: eu-1
//! instances:
//!   worker-1: { id: i-0a1, type: small, zone: eu-1a, address: 10.0.0.11 }
//!   worker-2: { id: i-0b2, type: large, zone: eu-1b, address: 10.0.0.12, stopped: true }
//! ```
//!
//! It implements only instances, so the manager runs the two node controllers and skips the
//! service and route controllers with a log line.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_framework::provider::{CloudError, CloudProvider, CloudResult, Health, InstanceMetadata, Instances};
use ccm_framework::registry::FactoryInput;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::ResourceExt;
use serde::Deserialize;

/// The name to pass to `--cloud-provider`.
pub const NAME: &str = "example";

/// The providerID scheme: `example://<instance id>`.
pub const PROVIDER_ID_PREFIX: &str = "example://";

/// The cloud-config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The region every instance is in.
    pub region: String,
    /// Instances by Node name.
    #[serde(default)]
    pub instances: BTreeMap<String, Instance>,
}

/// One instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// The cloud's instance ID.
    pub id: String,
    /// The instance type.
    #[serde(rename = "type")]
    pub type_: String,
    /// The zone.
    pub zone: String,
    /// The private address.
    pub address: String,
    /// Whether the instance is stopped.
    #[serde(default)]
    pub stopped: bool,
}

/// The provider.
#[derive(Debug)]
pub struct ExampleCloud {
    config: Config,
}

/// The factory the registry calls with `--cloud-config`'s bytes. Cheap and side-effect free.
pub fn factory(input: FactoryInput<'_>) -> Result<Arc<dyn CloudProvider>, CloudError> {
    let bytes = input.cloud_config.ok_or_else(|| CloudError::InvalidConfig("--cloud-config is required".into()))?;
    // Report where the config is wrong, never what it says: it may hold credentials.
    let config: Config = serde_yaml::from_slice(bytes).map_err(|e| match e.location() {
        Some(at) => CloudError::InvalidConfig(format!("invalid at line {}, column {}", at.line(), at.column())),
        None => CloudError::InvalidConfig("not valid YAML".into()),
    })?;
    Ok(Arc::new(ExampleCloud { config }))
}

impl ExampleCloud {
    /// Look a Node up by providerID first, then by name.
    fn find(&self, node: &Node) -> Option<&Instance> {
        let by_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| p.strip_prefix(PROVIDER_ID_PREFIX))
            .and_then(|id| self.config.instances.values().find(|i| i.id == id));
        by_id.or_else(|| self.config.instances.get(&node.name_any()))
    }
}

#[async_trait]
impl CloudProvider for ExampleCloud {
    fn name(&self) -> &str {
        NAME
    }

    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }

    async fn health(&self) -> Health {
        Health::healthy(format!("{} instances", self.config.instances.len()))
    }
}

#[async_trait]
impl Instances for ExampleCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.find(node).is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.find(node).is_some_and(|i| i.stopped))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        Ok(self.find(node).map(|i| InstanceMetadata {
            provider_id: format!("{PROVIDER_ID_PREFIX}{}", i.id),
            instance_type: i.type_.clone(),
            node_addresses: vec![NodeAddress { type_: "InternalIP".into(), address: i.address.clone() }],
            zone: i.zone.clone(),
            region: self.config.region.clone(),
            additional_labels: BTreeMap::new(),
        }))
    }
}
