//! Plain-Rust validation of a spec.
//!
//! The CRD carries the same rules as CEL for the API server. This module is what the operator
//! calls, and what covers rules a client cannot evaluate, so both paths reject the same specs.

use std::fmt;

use ipnet::IpNet;

use crate::controllers::{self, ControllerSelection};
use crate::v1alpha1::{CloudControllerManagerSpec, controllers_message};

/// One invalid field: its JSON path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, such as `spec.concurrency.nodeSyncs`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid spec: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidSpec(pub Vec<FieldError>);

/// An invalid `--cluster-cidr` / `clusterCIDR` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The value is empty.
    #[error("no CIDR given")]
    Empty,
    /// An entry does not parse as a CIDR.
    #[error("{0:?} is not a CIDR such as 10.244.0.0/16")]
    Malformed(String),
    /// More than two entries.
    #[error("at most two CIDRs (one per IP family) are allowed, got {0}")]
    TooMany(usize),
    /// Two entries of the same IP family.
    #[error("two CIDRs must be of different IP families (one IPv4, one IPv6)")]
    SameFamily,
}

/// The leader-election timing rule the manager enforces (client-go's): the lease outlasts the
/// renew deadline, which outlasts the jittered retry period, which is positive. The CRD's own
/// rule (its CEL, mirrored by [`validate_spec`]) is looser; this is the one place of the
/// manager's, for the flags, the embedded engine and the operator's validation alike.
pub fn leader_election_timings(
    lease_duration: std::time::Duration,
    renew_deadline: std::time::Duration,
    retry_period: std::time::Duration,
) -> Result<(), String> {
    use crate::defaults::LEADER_ELECTION_JITTER as JITTER;
    if lease_duration <= renew_deadline {
        return Err("--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline".into());
    }
    if renew_deadline <= retry_period.mul_f64(JITTER) {
        return Err(format!(
            "--leader-elect-renew-deadline must be greater than {JITTER} x --leader-elect-retry-period"
        ));
    }
    if retry_period.is_zero() {
        return Err("--leader-elect-retry-period must be positive".into());
    }
    Ok(())
}

/// Parse a comma-separated CIDR list with upstream's rules: one or two entries, and two only
/// when they are of different IP families (dual-stack).
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, CidrError> {
    if value.trim().is_empty() {
        return Err(CidrError::Empty);
    }
    let parts: Vec<&str> = value.split(',').map(str::trim).collect();
    if parts.len() > 2 {
        return Err(CidrError::TooMany(parts.len()));
    }
    let nets = parts
        .iter()
        .map(|p| p.parse::<IpNet>().map_err(|_| CidrError::Malformed((*p).to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if let [a, b] = nets.as_slice()
        && matches!((a, b), (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_)))
    {
        return Err(CidrError::SameFamily);
    }
    Ok(nets)
}

/// Messages in the form a kube-apiserver gives for a CRD's schema and CEL rules.
pub mod messages {
    /// `maxLength`: `Too long: may not be more than N bytes`.
    pub fn too_long(max: usize) -> String {
        format!("Too long: may not be more than {max} bytes")
    }

    /// `maxItems`: `Too many: N: must have at most M items`.
    pub fn too_many(got: usize, max: usize) -> String {
        format!("Too many: {got}: must have at most {max} items")
    }

    /// `maxProperties`: `Too many: N: must have at most M items`.
    pub fn too_many_properties(got: usize, max: usize) -> String {
        too_many(got, max)
    }

    /// `minLength`, for the empty string (the only value a minimum of 1 rejects).
    pub fn too_short(field: &str, min: usize) -> String {
        format!("Invalid value: \"\": {field} in body should be at least {min} chars long")
    }

    /// `minimum` of an integer.
    pub fn below_minimum(field: &str, value: i64, min: i64) -> String {
        format!("Invalid value: {value}: {field} in body should be greater than or equal to {min}")
    }

    /// `maximum` of an integer.
    pub fn above_maximum(field: &str, value: i64, max: i64) -> String {
        format!("Invalid value: {value}: {field} in body should be less than or equal to {max}")
    }

    /// `enum`: the value itself is withheld; the supported values are listed.
    pub fn unsupported(supported: &[&str]) -> String {
        let list: Vec<String> = supported.iter().map(|v| format!("{v:?}")).collect();
        format!("Unsupported value: supported values: {}", list.join(", "))
    }

    /// A CEL rule's message, with the type of the value as the API server names it.
    pub fn cel(type_: &str, message: &str) -> String {
        format!("Invalid value: \"{type_}\": {message}")
    }

    /// A required field is missing.
    pub const REQUIRED: &str = "Required value";
}

/// Limits of the CRD, shared by [`validate_spec`] and the schema the CRD is generated from.
pub mod limits {
    /// `spec.provider`.
    pub const PROVIDER: usize = 63;
    /// `spec.controllers` items.
    pub const CONTROLLERS: usize = 16;
    /// `spec.clusterName`, `spec.loadBalancerClass`, Secret names and keys, priority class.
    pub const NAME: usize = 253;
    /// A namespace name (`spec.leaderElection.migration.leaseNamespace`).
    pub const NAMESPACE: usize = 63;
    /// `spec.clusterCIDR`.
    pub const CLUSTER_CIDR: usize = 128;
    /// `spec.nodePlatforms` items.
    pub const NODE_PLATFORMS: usize = 8;
    /// Each of `spec.nodePlatforms`.
    pub const PLATFORM: usize = 63;
    /// `spec.extraArgs` items.
    pub const EXTRA_ARGS: usize = 64;
    /// Each of `spec.extraArgs`.
    pub const EXTRA_ARG: usize = 4096;
    /// `spec.deployment.image` and `spec.upstream.nodeManager.image`.
    pub const IMAGE: usize = 1024;
    /// `spec.deployment.nodeSelector` entries.
    pub const NODE_SELECTOR: usize = 32;
    /// `spec.announcer.metricsPort`: no privileged port (the announcer has no
    /// `NET_BIND_SERVICE`).
    pub const METRICS_PORT: std::ops::RangeInclusive<i32> = 1024..=65535;
    /// `spec.deployment.tolerations` items.
    pub const TOLERATIONS: usize = 64;
}

/// Whether `name` can be a platform (`spec.nodePlatforms`, `--cloud-provider-platforms`): a URI
/// scheme (a letter, then letters, digits, `+`, `-`, `.`), at most 63 characters.
pub fn is_platform_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= limits::PLATFORM
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Deserialize a spec from JSON (as a `DynamicObject` carries it). An error names the JSON path
/// of the offending field and what was expected, never the value found there.
pub fn parse_spec(value: &serde_json::Value) -> Result<CloudControllerManagerSpec, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = describe_serde_error(&e.inner().to_string());
        let field = if path == "." || path.is_empty() { "spec".to_string() } else { format!("spec.{path}") };
        match message.strip_prefix("missing field ") {
            Some(name) => {
                FieldError { field: format!("{field}.{}", name.trim_matches('`')), message: messages::REQUIRED.into() }
            }
            None => FieldError { field, message },
        }
    })
}

/// A serde error message with every value it quotes withheld: `invalid type: string "x",
/// expected i32` becomes `invalid type: string, expected i32`; an unknown enum variant becomes
/// the API server's `Unsupported value` with the supported values (type data, not user data).
pub fn describe_serde_error(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let expected = rest.split_once(", expected ").map(|(_, e)| e).unwrap_or_default();
        let expected = expected.strip_prefix("one of ").unwrap_or(expected);
        let supported: Vec<&str> =
            expected.split(", ").map(|v| v.trim_matches('`')).filter(|v| !v.is_empty()).collect();
        return messages::unsupported(&supported);
    }
    for kind in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(kind)
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            // `string "x"`, `integer `5``, `floating point `1.5``: keep the words before the value.
            let found = found.split(['"', '`']).next().unwrap_or_default().trim();
            return format!("{kind}{found}, expected {}", withhold_quoted(expected));
        }
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("missing field {}", field.trim_matches('`'));
    }
    withhold_quoted(message)
}

/// Replace every `"..."` and `` `...` `` span with `<value>` (a last line of defence for
/// messages of other shapes).
fn withhold_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(256));
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        if c == '"' || c == '`' {
            for d in chars.by_ref() {
                if d == c {
                    break;
                }
            }
            out.push_str("<value>");
        } else {
            out.push(c);
        }
    }
    out
}

/// Validate a spec: every rule the CRD states (lengths, item counts, minimums, CEL rules),
/// evaluated in Rust with the messages a kube-apiserver gives. Enums are enforced when the
/// spec is deserialized ([`parse_spec`]), because the Rust types cannot hold other values.
/// Messages name fields and limits, never the user's values.
pub fn validate_spec(spec: &CloudControllerManagerSpec) -> Result<(), InvalidSpec> {
    let mut errors = Errors::default();
    let len = |s: &str| s.chars().count();

    errors.string("spec.provider", &spec.provider, limits::PROVIDER);

    if spec.controllers.len() > limits::CONTROLLERS {
        errors.push("spec.controllers", messages::too_many(spec.controllers.len(), limits::CONTROLLERS));
    } else {
        let allowed = controllers::allowed_entries();
        if !spec.controllers.iter().all(|c| allowed.iter().any(|a| a == c)) {
            errors.push("spec.controllers", messages::cel("array", &controllers_message()));
        } else if let Err(e) = ControllerSelection::parse(&spec.controllers) {
            errors.push("spec.controllers", e.to_string());
        }
    }

    errors.string("spec.clusterName", &spec.cluster_name, limits::NAME);

    if let Some(cidr) = &spec.cluster_cidr {
        if len(cidr) > limits::CLUSTER_CIDR {
            errors.push("spec.clusterCIDR", messages::too_long(limits::CLUSTER_CIDR));
        } else if let Err(e) = parse_cluster_cidrs(cidr) {
            // The CRD's CEL messages; the entry itself is not repeated.
            let message = match e {
                CidrError::TooMany(_) => "at most two CIDRs, one per IP family",
                CidrError::SameFamily => "two CIDRs must be of different IP families",
                CidrError::Empty | CidrError::Malformed(_) => "every entry must be a CIDR such as 10.244.0.0/16",
            };
            errors.push("spec.clusterCIDR", messages::cel("string", message));
        }
    }

    if let Some(class) = &spec.load_balancer_class {
        errors.string("spec.loadBalancerClass", class, limits::NAME);
    }
    if spec.handle_unclassed_services && spec.load_balancer_class.is_none() {
        errors.push("spec.handleUnclassedServices", messages::cel("object", crate::v1alpha1::HANDLE_UNCLASSED_MESSAGE));
    }
    if spec.node_platforms.len() > limits::NODE_PLATFORMS {
        errors.push("spec.nodePlatforms", messages::too_many(spec.node_platforms.len(), limits::NODE_PLATFORMS));
    } else {
        let long: Vec<usize> =
            (0..spec.node_platforms.len()).filter(|i| len(&spec.node_platforms[*i]) > limits::PLATFORM).collect();
        for i in &long {
            errors.push(&format!("spec.nodePlatforms[{i}]"), messages::too_long(limits::PLATFORM));
        }
        if long.is_empty() && !spec.node_platforms.iter().all(|p| is_platform_name(p)) {
            errors.push("spec.nodePlatforms", messages::cel("array", crate::v1alpha1::NODE_PLATFORMS_MESSAGE));
        }
    }
    if spec.orphans.sweep && spec.shadow {
        errors.push("spec.orphans.sweep", messages::cel("object", crate::v1alpha1::SWEEP_IN_SHADOW_MESSAGE));
    }

    let le = &spec.leader_election;
    let positive = !le.retry_period.is_negative() && !std::time::Duration::from(le.retry_period).is_zero();
    if !(le.lease_duration > le.renew_deadline && le.renew_deadline > le.retry_period && positive) {
        errors.push(
            "spec.leaderElection",
            messages::cel(
                "object",
                "leaseDuration must be greater than renewDeadline, which must be greater than retryPeriod, which must be positive",
            ),
        );
    }

    if let Some(m) = &le.migration {
        if let Some(name) = &m.leader_name {
            errors.string("spec.leaderElection.migration.leaderName", name, limits::NAME);
            if !name.is_empty() && len(name) <= limits::NAME && !is_dns_subdomain(name) {
                errors.push(
                    "spec.leaderElection.migration.leaderName",
                    messages::cel(
                        "string",
                        "leaderName must be a valid Lease name (lowercase letters, digits, '-' and '.')",
                    ),
                );
            }
        }
        if let Some(ns) = &m.lease_namespace {
            let field = "spec.leaderElection.migration.leaseNamespace";
            errors.string(field, ns, limits::NAMESPACE);
            if !ns.is_empty() && len(ns) <= limits::NAMESPACE && !is_dns_label(ns) {
                errors.push(
                    field,
                    messages::cel(
                        "string",
                        "leaseNamespace must be a namespace name (lowercase letters, digits and '-', at most 63 characters)",
                    ),
                );
            }
        }
        if let Some(leaders) = &m.controller_leaders {
            let field = "spec.leaderElection.migration.controllerLeaders";
            if leaders.len() > crate::v1alpha1::MAX_CONTROLLER_LEADERS {
                errors.push(field, messages::too_many(leaders.len(), crate::v1alpha1::MAX_CONTROLLER_LEADERS));
            } else {
                for (i, l) in leaders.iter().enumerate() {
                    errors.string(&format!("{field}[{i}].name"), &l.name, limits::NAME);
                    errors.string(&format!("{field}[{i}].component"), &l.component, limits::NAME);
                }
            }
            if leaders.iter().any(|x| leaders.iter().filter(|y| y.name == x.name).count() != 1) {
                errors.push(field, messages::cel("array", "controllerLeaders: each name may appear once"));
            }
        }
    }

    let min_workers = crate::defaults::MIN_WORKERS;
    for (field, value, min) in [
        ("spec.concurrency.nodeSyncs", spec.concurrency.node_syncs, min_workers),
        ("spec.concurrency.serviceSyncs", spec.concurrency.service_syncs, min_workers),
        ("spec.concurrency.routeSyncs", spec.concurrency.route_syncs, min_workers),
        ("spec.deployment.replicas", spec.deployment.replicas, 1),
    ] {
        if value < min {
            errors.push(field, messages::below_minimum(field, i64::from(value), i64::from(min)));
        }
    }

    let d = &spec.deployment;
    if let Some(image) = &d.image
        && len(image) > limits::IMAGE
    {
        errors.push("spec.deployment.image", messages::too_long(limits::IMAGE));
    }
    if let Some(image) = spec.upstream.as_ref().and_then(|u| u.node_manager.as_ref()).and_then(|n| n.image.as_ref())
        && len(image) > limits::IMAGE
    {
        errors.push("spec.upstream.nodeManager.image", messages::too_long(limits::IMAGE));
    }
    if len(&d.priority_class_name) > limits::NAME {
        errors.push("spec.deployment.priorityClassName", messages::too_long(limits::NAME));
    }
    if let Some(selector) = &d.node_selector
        && selector.len() > limits::NODE_SELECTOR
    {
        errors
            .push("spec.deployment.nodeSelector", messages::too_many_properties(selector.len(), limits::NODE_SELECTOR));
    }
    if let Some(tolerations) = &d.tolerations
        && tolerations.len() > limits::TOLERATIONS
    {
        errors.push("spec.deployment.tolerations", messages::too_many(tolerations.len(), limits::TOLERATIONS));
    }

    if let Some(announcer) = &spec.announcer {
        if !announcer.l2 && !announcer.bgp {
            errors.push("spec.announcer", messages::cel("object", crate::v1alpha1::ANNOUNCER_NOTHING_MESSAGE));
        }
        if !announcer.bgp && (announcer.bfd || announcer.graceful_restart) {
            errors.push("spec.announcer", messages::cel("object", crate::v1alpha1::ANNOUNCER_BIRD_OPTIONS_MESSAGE));
        }
        if let Some(selector) = &announcer.node_selector
            && selector.len() > limits::NODE_SELECTOR
        {
            errors.push(
                "spec.announcer.nodeSelector",
                messages::too_many_properties(selector.len(), limits::NODE_SELECTOR),
            );
        }
        if let Some(port) = announcer.metrics_port {
            let (field, range) = ("spec.announcer.metricsPort", limits::METRICS_PORT);
            if port < *range.start() {
                errors.push(field, messages::below_minimum(field, i64::from(port), i64::from(*range.start())));
            } else if port > *range.end() {
                errors.push(field, messages::above_maximum(field, i64::from(port), i64::from(*range.end())));
            }
        }
    }

    if spec.extra_args.len() > limits::EXTRA_ARGS {
        errors.push("spec.extraArgs", messages::too_many(spec.extra_args.len(), limits::EXTRA_ARGS));
    } else {
        for (i, arg) in spec.extra_args.iter().enumerate() {
            if len(arg) > limits::EXTRA_ARG {
                errors.push(&format!("spec.extraArgs[{i}]"), messages::too_long(limits::EXTRA_ARG));
            }
        }
    }

    if let Some(src) = &spec.cloud_config {
        errors.string("spec.cloudConfig.secretRef.name", &src.secret_ref.name, limits::NAME);
        errors.string("spec.cloudConfig.secretRef.key", &src.secret_ref.key, limits::NAME);
        // The CRD's pattern and rules for the keys mounted beside the cloud-config.
        for (field, key) in [
            ("spec.cloudConfig.credentialsKey", &src.credentials_key),
            ("spec.cloudConfig.caBundleKey", &src.ca_bundle_key),
        ] {
            let Some(key) = key else { continue };
            errors.string(field, key, limits::NAME);
            if !key.is_empty() && !key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')) {
                errors.push(field, "must consist of alphanumeric characters, '-', '_' or '.'".into());
            }
        }
        if src.credentials_key.as_ref() == Some(&src.secret_ref.key) {
            errors.push(
                "spec.cloudConfig.credentialsKey",
                "credentialsKey must name another key than secretRef.key".into(),
            );
        }
        if let Some(ca) = &src.ca_bundle_key
            && (ca == &src.secret_ref.key || src.credentials_key.as_ref() == Some(ca))
        {
            errors.push(
                "spec.cloudConfig.caBundleKey",
                "caBundleKey must name another key than secretRef.key and credentialsKey".into(),
            );
        }
    }
    if errors.0.is_empty() { Ok(()) } else { Err(InvalidSpec(errors.0)) }
}

/// Whether `s` is a DNS-1123 subdomain, as a Lease name must be (the CRD's `leaderName` rule).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= limits::NAME
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `s` is a DNS-1123 label, as a namespace name must be (the CRD's `leaseNamespace`
/// rule).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= limits::NAMESPACE
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: &str, message: String) {
        self.0.push(FieldError { field: field.to_string(), message });
    }

    /// minLength 1 and maxLength `max`; whitespace-only values are refused too.
    fn string(&mut self, field: &str, value: &str, max: usize) {
        if value.is_empty() {
            self.push(field, messages::too_short(field, 1));
        } else if value.chars().count() > max {
            self.push(field, messages::too_long(max));
        } else if value.trim().is_empty() {
            self.push(field, "must not be blank".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_mounted_beside_the_cloud_config_are_secret_keys_distinct_from_each_other() {
        let errors = |cloud_config: serde_json::Value| {
            let spec: CloudControllerManagerSpec =
                serde_json::from_value(serde_json::json!({"provider": "aws", "cloudConfig": cloud_config})).unwrap();
            match validate_spec(&spec) {
                Ok(()) => Vec::new(),
                Err(InvalidSpec(e)) => e.into_iter().map(|e| e.field).collect::<Vec<_>>(),
            }
        };
        let ok =
            serde_json::json!({"secretRef": {"name": "c"}, "credentialsKey": "credentials", "caBundleKey": "ca.crt"});
        assert!(errors(ok).is_empty());
        let same =
            serde_json::json!({"secretRef": {"name": "c", "key": "k"}, "credentialsKey": "k", "caBundleKey": "k"});
        assert_eq!(errors(same), ["spec.cloudConfig.credentialsKey", "spec.cloudConfig.caBundleKey"]);
        let path = serde_json::json!({"secretRef": {"name": "c"}, "caBundleKey": "../ca"});
        assert_eq!(errors(path), ["spec.cloudConfig.caBundleKey"], "no path outside the mount");
    }

    #[test]
    fn single_and_dual_stack_cidrs_parse() {
        assert_eq!(parse_cluster_cidrs("10.244.0.0/16").unwrap().len(), 1);
        assert_eq!(parse_cluster_cidrs("10.244.0.0/16, fd00:10:244::/56").unwrap().len(), 2);
        assert_eq!(parse_cluster_cidrs("fd00::/48").unwrap().len(), 1);
    }

    #[test]
    fn malformed_cidrs_are_rejected_naming_the_entry() {
        for bad in ["10.244.0.0", "10.244.0.0/33", "not-a-cidr", "10.244.0.0/16,", "300.1.1.1/8"] {
            let e = parse_cluster_cidrs(bad).unwrap_err();
            assert!(matches!(e, CidrError::Malformed(_)), "{bad}: {e:?}");
        }
        assert_eq!(parse_cluster_cidrs("").unwrap_err(), CidrError::Empty);
    }

    #[test]
    fn m7_a_lease_namespace_must_be_a_namespace_name_naming_the_field() {
        let spec = |ns: &str| {
            let mut spec: CloudControllerManagerSpec =
                serde_json::from_value(serde_json::json!({"provider": "fake"})).unwrap();
            spec.leader_election.migration = Some(crate::v1alpha1::LeaderMigration {
                enabled: true,
                lease_namespace: Some(ns.to_string()),
                ..Default::default()
            });
            spec
        };
        assert!(validate_spec(&spec("ccm-moving")).is_ok());
        for bad in ["", "Kube-System", "a.b", "-a", "a-", &"a".repeat(64)] {
            let e = validate_spec(&spec(bad)).unwrap_err();
            assert!(e.0.iter().all(|f| f.field == "spec.leaderElection.migration.leaseNamespace"), "{bad:?}: {e}");
            assert!(!e.0.is_empty());
        }
        assert!(is_dns_label("kube-system") && !is_dns_label("") && !is_dns_label(&"a".repeat(64)));
    }

    #[test]
    fn three_cidrs_are_rejected() {
        assert_eq!(parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16,fd00::/48").unwrap_err(), CidrError::TooMany(3));
    }

    #[test]
    fn two_cidrs_of_one_family_are_rejected() {
        assert_eq!(parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16").unwrap_err(), CidrError::SameFamily);
        assert_eq!(parse_cluster_cidrs("fd00::/48,fd01::/48").unwrap_err(), CidrError::SameFamily);
    }
}
