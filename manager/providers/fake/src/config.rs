//! The fake's cloud-config: YAML parsed strictly (unknown fields refused, errors that never
//! quote the document) and checked before the provider is built from it.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_framework::provider::{CloudError, CloudResult};
use ccm_framework::safe_yaml;
use ipnet::IpNet;
use serde::Deserialize;

use crate::calls::methods;

/// The fake's cloud-config (YAML). Unknown fields are rejected.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeConfig {
    /// Latency of every instance, zone, route and cluster call (Go duration, e.g. `20ms`).
    #[serde(default)]
    pub latency: Option<kube::core::Duration>,
    /// Latency of every load-balancer call.
    #[serde(default)]
    pub load_balancer_latency: Option<kube::core::Duration>,
    /// The batch size reported to the controllers (default 100).
    #[serde(default)]
    pub batch_size: Option<usize>,
    /// Every Node name is a running instance unless listed otherwise.
    #[serde(default)]
    pub auto_instances: bool,
    /// Explicit instances.
    #[serde(default)]
    pub instances: Vec<FakeInstanceConfig>,
    /// Where load-balancer addresses come from (default [`DEFAULT_LB_RANGE`](crate::addresses::DEFAULT_LB_RANGE)).
    #[serde(default, rename = "loadBalancerIPRange")]
    pub load_balancer_ip_range: Option<IpNet>,
    /// Offer no instances capability.
    #[serde(default)]
    pub disable_instances: bool,
    /// Offer no load-balancer capability.
    #[serde(default)]
    pub disable_load_balancers: bool,
    /// Offer no routes capability.
    #[serde(default)]
    pub disable_routes: bool,
    /// Offer no zones capability.
    #[serde(default)]
    pub disable_zones: bool,
    /// Offer no clusters capability.
    #[serde(default)]
    pub disable_clusters: bool,
    /// The health probe's result (default healthy).
    #[serde(default)]
    pub health: Option<FakeHealthConfig>,
    /// Injected failures.
    #[serde(default)]
    pub failures: Vec<FakeFailureConfig>,
    /// Seed for rate failures.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Which cloud the fake answers as (default [`FakeProfile::Fake`]).
    #[serde(default)]
    pub profile: FakeProfile,
    /// With `profile: bench`, also report an InternalIP derived from the Node name, as the
    /// upstream binary's `BENCH_INTERNAL_IP=1` does.
    #[serde(default, rename = "benchInternalIP")]
    pub bench_internal_ip: bool,
}

/// Which cloud the fake answers as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FakeProfile {
    /// The fake's own cloud: instances derived from the name or listed, addresses from a range.
    #[default]
    Fake,
    /// The `bench` provider of the shared upstream Go binary (`../shared/upstream`), answered
    /// alike so that the same cluster can be driven by either (see the crate README).
    Bench,
}

/// An instance in [`FakeConfig`]. Fields left out take the values the provider derives from
/// the name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeInstanceConfig {
    /// The Node name.
    pub name: String,
    /// The providerID (default `fake://<name>`).
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
    /// The instance type.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// The zone.
    #[serde(default)]
    pub zone: Option<String>,
    /// The region.
    #[serde(default)]
    pub region: Option<String>,
    /// The addresses (`{type: InternalIP, address: 10.0.0.1}`).
    #[serde(default)]
    pub addresses: Option<Vec<FakeAddressConfig>>,
    /// Extra labels.
    #[serde(default, deserialize_with = "safe_yaml::unique_string_map")]
    pub labels: BTreeMap<String, String>,
    /// Whether the instance exists (default true).
    #[serde(default = "yes")]
    pub exists: bool,
    /// Whether the instance is shut down (default false).
    #[serde(default)]
    pub shutdown: bool,
}

fn yes() -> bool {
    true
}

/// A Node address in [`FakeInstanceConfig`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeAddressConfig {
    /// `InternalIP`, `ExternalIP`, `Hostname`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// The health result in [`FakeConfig`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeHealthConfig {
    /// Whether the probe passes.
    pub healthy: bool,
    /// The reason when unhealthy (default `ProbeFailing`).
    #[serde(default)]
    pub reason: Option<String>,
    /// The message.
    #[serde(default)]
    pub message: String,
}

/// The kinds of error a [`FakeFailureConfig`] can inject, one per [`CloudError`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FakeErrorKind {
    /// [`CloudError::NotImplemented`].
    NotImplemented,
    /// [`CloudError::ImplementedElsewhere`].
    ImplementedElsewhere,
    /// [`CloudError::RetryAfter`] (uses `retryAfter`, default 1s).
    RetryAfter,
    /// [`CloudError::Throttled`] (uses `retryAfter` when given).
    Throttled,
    /// [`CloudError::Unauthorized`].
    Unauthorized,
    /// [`CloudError::Unavailable`].
    Unavailable,
    /// [`CloudError::InvalidConfig`].
    InvalidConfig,
    /// [`CloudError::Other`].
    Other,
}

/// An injected failure in [`FakeConfig`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeFailureConfig {
    /// The method (see [`methods`]), or `*` for every method without its own entry.
    pub method: String,
    /// Fail this many calls, then stop failing; absent for no limit.
    #[serde(default)]
    pub times: Option<usize>,
    /// Probability (0..=1) that a call fails (default 1).
    #[serde(default)]
    pub rate: Option<f64>,
    /// The error.
    pub error: FakeErrorKind,
    /// The error's message.
    #[serde(default)]
    pub message: Option<String>,
    /// The delay for `retryAfter` and `throttled`.
    #[serde(default)]
    pub retry_after: Option<kube::core::Duration>,
}

impl FakeFailureConfig {
    pub(crate) fn to_error(&self) -> CloudError {
        let message = self.message.clone().unwrap_or_else(|| "injected by the fake provider".to_string());
        let after = self.retry_after.map(Duration::from);
        match self.error {
            FakeErrorKind::NotImplemented => CloudError::NotImplemented,
            FakeErrorKind::ImplementedElsewhere => CloudError::ImplementedElsewhere,
            FakeErrorKind::RetryAfter => {
                CloudError::RetryAfter { after: after.unwrap_or(Duration::from_secs(1)), message }
            }
            FakeErrorKind::Throttled => CloudError::Throttled { retry_after: after, message },
            FakeErrorKind::Unauthorized => CloudError::Unauthorized(message),
            FakeErrorKind::Unavailable => CloudError::Unavailable(message),
            FakeErrorKind::InvalidConfig => CloudError::InvalidConfig(message),
            FakeErrorKind::Other => CloudError::Other(message),
        }
    }
}

impl FakeConfig {
    /// Parse YAML (at most [`safe_yaml::CLOUD_CONFIG_LIMITS`]). Errors name the field path, the
    /// position and the kind of problem, never the content.
    pub fn parse(bytes: &[u8]) -> CloudResult<Self> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        static SCHEMA: std::sync::OnceLock<safe_yaml::Schema> = std::sync::OnceLock::new();
        let schema = SCHEMA.get_or_init(|| {
            safe_yaml::Schema::new()
                .with::<FakeConfig>()
                .with::<FakeInstanceConfig>()
                .with::<FakeAddressConfig>()
                .with::<FakeHealthConfig>()
                .with::<FakeFailureConfig>()
                .with::<FakeErrorKind>()
                .with::<FakeProfile>()
                .with_messages(&[safe_yaml::DUPLICATE_KEY])
        });
        let config: Self = safe_yaml::from_slice(bytes, &safe_yaml::CLOUD_CONFIG_LIMITS, schema)
            .map_err(|e| CloudError::InvalidConfig(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Check the values serde cannot.
    pub fn validate(&self) -> CloudResult<()> {
        if self.batch_size == Some(0) {
            return Err(CloudError::InvalidConfig("batchSize must be at least 1".into()));
        }
        for (i, f) in self.failures.iter().enumerate() {
            if !methods::is_known(&f.method) {
                return Err(CloudError::InvalidConfig(format!(
                    "failures[{i}].method is not a fake provider method (known: *, {})",
                    methods::ALL.join(", ")
                )));
            }
            if f.rate.is_some_and(|r| !(0.0..=1.0).contains(&r)) {
                return Err(CloudError::InvalidConfig(format!("failures[{i}].rate must be between 0 and 1")));
            }
        }
        for (i, inst) in self.instances.iter().enumerate() {
            if inst.name.is_empty() {
                return Err(CloudError::InvalidConfig(format!("instances[{i}].name must not be empty")));
            }
        }
        if self.profile == FakeProfile::Bench {
            // Bench's instances and addresses are fixed; these would silently not apply.
            if !self.instances.is_empty() {
                return Err(CloudError::InvalidConfig("instances cannot be listed with profile: bench".into()));
            }
            if self.load_balancer_ip_range.is_some() {
                return Err(CloudError::InvalidConfig("loadBalancerIPRange cannot be set with profile: bench".into()));
            }
        } else if self.bench_internal_ip {
            return Err(CloudError::InvalidConfig("benchInternalIP needs profile: bench".into()));
        }
        for d in [self.latency, self.load_balancer_latency].into_iter().flatten() {
            if d.is_negative() {
                return Err(CloudError::InvalidConfig("latencies must not be negative".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn cloud_config_errors_point_at_the_problem_without_quoting_it() {
        for (yaml, want) in [
            (&b"autoInstances: true\nsecretToken: hunter2\n"[..], "document: has an unknown field (allowed: latency,"),
            (b"autoInstances: true\nhunter2: 1\n", "(line 2, column 1)"),
            (b"batchSize: lots-hunter2\n", "batchSize: expected a whole number"),
            (b"instances: [{name: a, labels: {hunter2: [1]}}]\n", "instances[0].labels.<key>: expected a string"),
            (b"batchSize: 0\n", "batchSize must be at least 1"),
            (b"failures: [{method: hunter2, error: other}]\n", "not a fake provider method"),
            (b"failures: [{method: health, rate: 2, error: other}]\n", "between 0 and 1"),
            (b"profile: hunter2\n", "profile"),
            (b"profile: bench\ninstances: [{name: hunter2}]\n", "instances cannot be listed with profile: bench"),
            (b"profile: bench\nloadBalancerIPRange: 10.0.0.0/8\n", "loadBalancerIPRange cannot be set"),
            (b"benchInternalIP: true\n", "benchInternalIP needs profile: bench"),
        ] {
            let err = FakeConfig::parse(yaml).unwrap_err();
            assert!(matches!(err, CloudError::InvalidConfig(_)));
            let text = err.to_string();
            assert!(text.contains(want), "{text}");
            assert!(!text.contains("hunter2"), "config content leaked: {text}");
        }
        assert_eq!(FakeConfig::parse(b"  \n").unwrap(), FakeConfig::default());
    }

    pub(crate) const TOKEN: &str = "SECRET-TOKEN-12345";

    /// Fake cloud-configs with the token in every field (as a value, a key, a tag, an anchor),
    /// each wrong in some way, plus malformed YAML.
    pub(crate) fn token_documents() -> Vec<String> {
        let t = TOKEN;
        let mut docs = vec![
            format!("{t}\n"),
            format!("{t}: 1\n"),
            format!("\"{t}\": [\n"),
            format!("instances: [{{name: a}}]\n{t}"),
            format!("instances: [{{name: a, {t}: 1}}]\n"),
            format!("instances: [{{name: \"\", providerID: {t}}}]\n"),
            format!("instances: [{{name: a, addresses: [{{type: {t}, address: {t}, {t}: x}}]}}]\n"),
            format!("instances: [{{name: a, addresses: [{{type: {t}}}]}}]\n"),
            format!("instances: [{{name: a, labels: {{{t}: [{t}]}}}}]\n"),
            format!("instances: [{{name: a, labels: {{{t}: {t}, {t}: b}}}}]\n"),
            format!("health: {{healthy: {t}, reason: {t}, message: {t}}}\n"),
            format!("health: {{reason: {t}, message: {t}}}\n"),
            format!("failures: [{{method: {t}, error: other, message: {t}}}]\n"),
            format!("failures: [{{method: health, error: {t}}}]\n"),
            format!("failures: [{{method: health, error: other, rate: {t}}}]\n"),
            format!("failures: [{{method: health, error: other, times: {t}}}]\n"),
            format!("failures: [{{method: health, error: other, retryAfter: {t}}}]\n"),
            format!("failures: [{{method: health, error: other, rate: 7, message: {t}}}]\n"),
            format!("latency: {t}\n"),
            format!("loadBalancerLatency: \"-{t}\"\n"),
            format!("batchSize: {t}\n"),
            format!("autoInstances: {t}\n"),
            format!("loadBalancerIPRange: {t}\n"),
            format!("loadBalancerIPRange: 10.0.0.0/{t}\n"),
            format!("seed: {t}\n"),
            format!("profile: {t}\n"),
            format!("profile: bench\nbenchInternalIP: {t}\n"),
            format!("instances: {t}\n"),
            format!("instances: [{{name: [{t}]}}]\n"),
            format!("instances: &{t} [{{name: a}}]\nfailures: *{t}\n"),
            format!("instances: *{t}\n"),
            format!("instances: []\n---\n{t}: 1\n"),
            format!("instances: [\"\\{t}\"]\n"),
            format!("{t}: a: b\n"),
            format!("instances:\n\t- name: {t}\n"),
        ];
        for flag in ["disableInstances", "disableLoadBalancers", "disableRoutes", "disableZones", "disableClusters"] {
            docs.push(format!("{flag}: {t}\n"));
        }
        for field in ["instanceType", "zone", "region", "exists", "shutdown"] {
            docs.push(format!("instances: [{{name: a, {field}: {{{t}: {t}}}}}]\n"));
        }
        docs
    }

    #[test]
    fn no_cloud_config_error_quotes_the_document() {
        for doc in token_documents() {
            let err = FakeConfig::parse(doc.as_bytes()).expect_err(&format!("accepted:\n{doc}"));
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(!text.contains("SECRET"), "{doc}\n=> {text}");
            }
        }
    }

    #[test]
    fn hostile_cloud_configs_are_refused_with_the_limit_they_break() {
        for (name, doc, problem) in safe_yaml::hostile::all() {
            let want = problem.to_string();
            let err = FakeConfig::parse(&doc).unwrap_err();
            assert!(matches!(err, CloudError::InvalidConfig(ref m) if m.contains(&want)), "{name}: {err}");
        }
    }
}
