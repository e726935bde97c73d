//! Label selectors in the cloud-config (the Kubernetes shape), used by the config's validation
//! and by the allocator's pool choice; a module of its own so neither imports the other.

use std::collections::BTreeMap;

use ccm_framework::safe_yaml::unique_string_map;
use serde::Deserialize;

/// A label selector (the Kubernetes shape).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelectorConfig {
    /// Labels that must be present with these values.
    #[serde(default, deserialize_with = "unique_string_map")]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    #[serde(default)]
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelectorConfig {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// One set-based selector requirement.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the key relates to the values.
    pub operator: SelectorOperator,
    /// Values for `In` / `NotIn`; must be empty otherwise.
    #[serde(default)]
    pub values: Vec<String>,
}

/// Selector operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SelectorOperator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}
