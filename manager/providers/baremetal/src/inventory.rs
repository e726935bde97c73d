//! The instance inventory: the configured machines, indexed for cheap Node lookups.
//!
//! A Node is found by `spec.providerID` first, then by its name, compared case-insensitively
//! with each instance's name and DNS-like addresses (Hostname, InternalDNS, ExternalDNS). The
//! config validation guarantees those keys are unique, so a lookup is never ambiguous.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress};

use super::config::{InstanceConfig, InstanceState};
use ccm_framework::provider::InstanceMetadata;

/// How a Node was matched to an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    /// Its `spec.providerID`.
    ProviderId,
    /// Its name (against the instance's name or a DNS-like address).
    Name,
}

#[derive(Debug)]
struct Entry {
    config: InstanceConfig,
    metadata: InstanceMetadata,
}

/// The configured instances with their lookup indexes.
#[derive(Debug, Default)]
pub struct Inventory {
    entries: Vec<Entry>,
    by_provider_id: HashMap<String, usize>,
    by_name: HashMap<String, usize>,
}

impl Inventory {
    /// Index validated instances (see [`super::config::CloudConfig::validate`]).
    pub fn new(instances: &[InstanceConfig]) -> Self {
        let mut inventory = Inventory::default();
        for (i, config) in instances.iter().enumerate() {
            let provider_id = config.effective_provider_id();
            inventory.by_provider_id.insert(provider_id.clone(), i);
            inventory.by_name.insert(config.name.to_ascii_lowercase(), i);
            for address in config.addresses.iter().filter(|a| !a.type_.is_ip()) {
                inventory.by_name.entry(address.address.to_ascii_lowercase()).or_insert(i);
            }
            let metadata = InstanceMetadata {
                provider_id,
                instance_type: config.instance_type.clone().unwrap_or_default(),
                node_addresses: config
                    .addresses
                    .iter()
                    .map(|a| NodeAddress { type_: a.type_.as_str().to_string(), address: a.address.clone() })
                    .collect(),
                zone: config.zone.clone().unwrap_or_default(),
                region: config.region.clone().unwrap_or_default(),
                additional_labels: config.labels.clone(),
            };
            inventory.entries.push(Entry { config: config.clone(), metadata });
        }
        inventory
    }

    /// How many instances there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The instance behind `node` and how it was found.
    pub fn lookup(&self, node: &Node) -> Option<(usize, MatchedBy)> {
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty());
        if let Some(i) = provider_id.and_then(|p| self.by_provider_id.get(p)) {
            return Some((*i, MatchedBy::ProviderId));
        }
        let name = node.metadata.name.as_deref()?;
        self.by_name.get(&name.to_ascii_lowercase()).map(|i| (*i, MatchedBy::Name))
    }

    /// The instance at `index`.
    pub fn instance(&self, index: usize) -> Option<&InstanceConfig> {
        self.entries.get(index).map(|e| &e.config)
    }

    /// The metadata reported for the instance at `index`.
    pub fn metadata(&self, index: usize) -> Option<&InstanceMetadata> {
        self.entries.get(index).map(|e| &e.metadata)
    }

    /// Whether the instance at `index` is declared shut down.
    pub fn declared_shutdown(&self, index: usize) -> bool {
        self.entries.get(index).is_some_and(|e| e.config.state == InstanceState::Shutdown)
    }

    /// Every instance, in configuration order.
    pub fn instances(&self) -> impl Iterator<Item = &InstanceConfig> {
        self.entries.iter().map(|e| &e.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn inventory() -> Inventory {
        let doc = "instances:\n  - name: node-1\n    addresses:\n      - {type: InternalIP, address: 10.0.0.1}\n      - {type: Hostname, address: Node-1.Lan}\n    instanceType: m1\n    zone: rack-1\n    region: home\n    labels: {example.com/disk: ssd}\n  - name: node-2\n    providerID: metal://serial-42\n    addresses:\n      - {type: InternalDNS, address: n2.internal}\n    state: shutdown\n";
        Inventory::new(&config::parse(doc.as_bytes()).unwrap().instances)
    }

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(NodeSpec { provider_id: provider_id.map(Into::into), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn lookup_prefers_the_provider_id() {
        let inv = inventory();
        // The providerID names node-2 even though the Node is called node-1.
        assert_eq!(inv.lookup(&node("node-1", Some("metal://serial-42"))), Some((1, MatchedBy::ProviderId)));
        assert_eq!(inv.lookup(&node("whatever", Some("baremetal://node-1"))), Some((0, MatchedBy::ProviderId)));
    }

    #[test]
    fn lookup_falls_back_to_the_name_then_dns_addresses_case_insensitively() {
        let inv = inventory();
        assert_eq!(inv.lookup(&node("node-1", None)), Some((0, MatchedBy::Name)));
        assert_eq!(inv.lookup(&node("node-1", Some("other://x"))), Some((0, MatchedBy::Name)));
        assert_eq!(inv.lookup(&node("node-1.lan", None)), Some((0, MatchedBy::Name)));
        assert_eq!(inv.lookup(&node("N2.INTERNAL", None)), Some((1, MatchedBy::Name)));
        assert_eq!(inv.lookup(&node("10.0.0.1", None)), None, "IP addresses are not names");
        assert_eq!(inv.lookup(&node("node-3", None)), None);
    }

    #[test]
    fn metadata_carries_every_configured_field() {
        let inv = inventory();
        let m = inv.metadata(0).unwrap();
        assert_eq!(m.provider_id, "baremetal://node-1");
        assert_eq!((m.instance_type.as_str(), m.zone.as_str(), m.region.as_str()), ("m1", "rack-1", "home"));
        let addresses: Vec<(&str, &str)> =
            m.node_addresses.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
        assert_eq!(addresses, [("InternalIP", "10.0.0.1"), ("Hostname", "Node-1.Lan")]);
        assert_eq!(m.additional_labels.get("example.com/disk").map(String::as_str), Some("ssd"));
        assert_eq!(inv.metadata(1).unwrap().provider_id, "metal://serial-42");
        assert!(!inv.declared_shutdown(0));
        assert!(inv.declared_shutdown(1));
    }
}
