//! Installation policy (pure): what a resource author may ask for beyond the manager's own
//! configuration (images and their tags, `extraArgs`, replicas, priority classes, resources,
//! the Nodes a DaemonSet reaches, announcers and where, reserved Lease names), as whoever
//! installs the operator allows it. A resource asking for more is refused with
//! `NotAllowedByPolicy` (`ReservedName` for a Lease name), naming each field.

use std::collections::BTreeMap;

use ccm_provider_baremetal::deploy;
use crds::{CloudControllerManager, Mode};
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::ResourceExt;

use super::manager_config::migration_lease_name;
use super::quantity::Amount;
use super::verdict::{Failure, Validation};
use crds::reasons::config_valid as reason;

/// What a resource author may ask for beyond the manager's own configuration, set by whoever
/// installs the operator (flags, chart values). A resource asking for more is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Images `spec.deployment.image` may name (`--allowed-images`), on repository boundaries:
    /// `registry/repo:` any tag, `registry/repo@` any digest, `registry/` any repository there,
    /// `registry/repo` any tag or digest of that repository (never `registry/repo-evil`), and any
    /// other entry (with a tag or digest) that image exactly ([`image_entry_allows`]). Empty: only
    /// the operator's `--manager-image`.
    pub allowed_images: Vec<String>,
    /// `spec.deployment.image` must be pinned by digest (`--require-image-digest`).
    pub require_image_digest: bool,
    /// `spec.deployment.image` may be tagged `latest`, or carry no tag and no digest
    /// (`--allow-latest-image`).
    pub allow_latest_image: bool,
    /// The most replicas `spec.deployment.replicas` may ask for (`--max-replicas`).
    pub max_replicas: i32,
    /// Priority classes `spec.deployment.priorityClassName` may name
    /// (`--allowed-priority-classes`); an empty name (none) is always allowed.
    pub allowed_priority_classes: Vec<String>,
    /// The most a manager container may request or be limited to, per resource
    /// (`--max-container-resources`); a resource not listed may not be asked for, and with a
    /// memory maximum `resources` must set a memory limit. Empty: no maximum.
    pub max_container_resources: Vec<ResourceMaximum>,
    /// DaemonSet mode may run on every Node: an empty `nodeSelector` and a toleration of every
    /// taint (`operator: Exists` without a key) pass (`--allow-any-node`).
    pub allow_any_node: bool,
    /// Whether `spec.announcer` may be set (`--allow-announcers`, the chart's
    /// `announcer.enabled`): announcers run on the host network of every selected node, with
    /// `NET_RAW` for L2.
    pub allow_announcers: bool,
    /// Namespaces where `spec.announcer` may be set (`--announcer-namespaces`); empty: every
    /// namespace the operator runs managers in.
    pub announcer_namespaces: Vec<String>,
    /// The BIRD image of `spec.announcer.bgp` (`--bird-image`); none refuses `bgp`.
    pub bird_image: Option<String>,
    /// Lease names no resource (nor its migration Lease) may take, besides the built-in ones
    /// (`--reserved-lease-names`; an entry ending in `*` is a prefix): third-party components'
    /// leader Leases in the managed namespaces.
    pub reserved_lease_names: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allowed_images: Vec::new(),
            require_image_digest: false,
            allow_latest_image: false,
            max_replicas: DEFAULT_MAX_REPLICAS,
            allowed_priority_classes: vec![DEFAULT_PRIORITY_CLASS.to_string()],
            max_container_resources: default_max_container_resources(),
            allow_any_node: false,
            allow_announcers: false,
            announcer_namespaces: Vec::new(),
            bird_image: None,
            reserved_lease_names: Vec::new(),
        }
    }
}

/// The default of `--max-replicas`: leader election runs one manager at a time, so more than a
/// few standbys buy nothing.
pub const DEFAULT_MAX_REPLICAS: i32 = 5;
/// The default of `--allowed-priority-classes`: the CRD's default `priorityClassName`.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-cluster-critical";
/// The default of `--max-container-resources`: four times the default memory limit, two cores.
pub const DEFAULT_MAX_CONTAINER_RESOURCES: &str = "cpu=2,memory=2Gi";
/// The highest `--v` `spec.extraArgs` may set. From 5 on the manager logs at trace level, where
/// the AWS SDK (aws-sigv4) logs every canonical request it signs, the `x-amz-security-token`
/// header's value (temporary credentials) included.
pub const MAX_VERBOSITY: u8 = 4;

/// The most a container may ask for of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceMaximum {
    /// The resource's name (`cpu`, `memory`, ...).
    pub name: String,
    /// The maximum as given, for messages.
    pub shown: String,
    /// The maximum, comparable.
    pub amount: Amount,
}

/// Why `--max-container-resources` is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// An entry is not `name=quantity`.
    #[error("--max-container-resources: entry {index} is not name=quantity (e.g. memory=2Gi)")]
    NotAPair {
        /// The entry's position.
        index: usize,
    },
    /// An entry's quantity does not parse.
    #[error("--max-container-resources: {name}: {source}")]
    Quantity {
        /// The resource.
        name: String,
        /// Why.
        source: super::quantity::QuantityError,
    },
}

/// Parse `--max-container-resources` entries (`name=quantity`); empty entries are skipped.
pub fn parse_max_container_resources<S: AsRef<str>>(entries: &[S]) -> Result<Vec<ResourceMaximum>, PolicyError> {
    let mut out = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let entry = entry.as_ref().trim();
        if entry.is_empty() {
            continue;
        }
        let Some((name, value)) = entry.split_once('=').filter(|(n, v)| !n.trim().is_empty() && !v.trim().is_empty())
        else {
            return Err(PolicyError::NotAPair { index });
        };
        let (name, value) = (name.trim(), value.trim());
        let amount = Amount::parse(value).map_err(|source| PolicyError::Quantity { name: name.to_string(), source })?;
        out.retain(|m: &ResourceMaximum| m.name != name);
        out.push(ResourceMaximum { name: name.to_string(), shown: value.to_string(), amount });
    }
    Ok(out)
}

/// [`DEFAULT_MAX_CONTAINER_RESOURCES`], parsed.
pub fn default_max_container_resources() -> Vec<ResourceMaximum> {
    let entries: Vec<&str> = DEFAULT_MAX_CONTAINER_RESOURCES.split(',').collect();
    // A constant that parses (a test checks it); an error would only drop the maximum.
    parse_max_container_resources(&entries).unwrap_or_default()
}

/// Why `spec.announcer` cannot be built for this spec, if it cannot (pure).
pub fn announcer_refused(spec: &crds::CloudControllerManagerSpec) -> Option<&'static str> {
    spec.announcer.as_ref()?;
    if spec.provider != deploy::NAME {
        return Some("spec.announcer: only the baremetal provider announces its addresses; remove spec.announcer");
    }
    if spec.mode == Mode::Embedded {
        return Some(
            "spec.announcer needs mode Deployment or DaemonSet: the announcers are pods on every node, which Embedded mode does not create",
        );
    }
    if spec.cloud_config.is_none() {
        return Some("spec.announcer needs spec.cloudConfig: the announcers read loadBalancer.announcement from it");
    }
    None
}

/// Manager flags `spec.extraArgs` may set: tuning and logging only. Every other flag is refused,
/// among them whatever changes the manager's identity, credentials, kubeconfig or authorization
/// (`--kubeconfig`, `--master`, `--authentication-*`, `--authorization-*`, `--client-ca-file`,
/// `--requestheader-*`, `--use-service-account-credentials`), its serving (`--tls-*`,
/// `--cert-dir`, `--secure-port`, `--bind-address`, `--permit-*`, `--webhook*`, `--profiling`),
/// its cloud (`--cloud-provider`, `--cloud-config`) or its Lease (`--leader-elect*`,
/// `--leader-migration-config`), and flags the spec already sets (`--controllers`,
/// `--cluster-*`, `--configure-cloud-routes`, `--concurrent-*-syncs`). The operator binds the
/// endpoint to the Pod's own address (`--bind-address`); `0.0.0.0` would widen it to every
/// address of the host on the host network. `--v` is capped at [`MAX_VERBOSITY`].
pub const ALLOWED_EXTRA_ARGS: [&str; 16] = [
    "v",
    "vmodule",
    "logging-format",
    "kube-api-qps",
    "kube-api-burst",
    "kube-api-content-type",
    "min-resync-period",
    "controller-start-interval",
    "route-reconciliation-period",
    "node-monitor-period",
    "node-sync-period",
    "node-status-update-frequency",
    "concurrent-node-status-updates",
    "node-batch-size",
    "node-batch-window",
    "allow-untagged-cloud",
];

/// Why `spec.extraArgs[i]` is refused, or `None` (pure). Only `--flag=value`, `--flag` and
/// `-v=N` forms of [`ALLOWED_EXTRA_ARGS`] pass: a bare value could be taken as another flag's.
/// `--v` needs a value of at most [`MAX_VERBOSITY`].
pub fn extra_arg_refused(arg: &str) -> Option<String> {
    let name = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-').filter(|r| r.starts_with('v')));
    let Some(name) = name else {
        return Some("is not a flag; give values in the --flag=value form".into());
    };
    let (name, value) = name.split_once('=').map_or((name, None), |(n, v)| (n, Some(v)));
    if name == "v" {
        return match value.map(str::parse::<u8>) {
            Some(Ok(level)) if level <= MAX_VERBOSITY => None,
            // The value stays out of the message, like every other.
            _ => Some(format!(
                "--v must be a number from 0 to {MAX_VERBOSITY}: from 5 on the manager logs at trace level, where the AWS SDK logs the signed requests' x-amz-security-token (credentials)"
            )),
        };
    }
    if ALLOWED_EXTRA_ARGS.contains(&name) {
        return None;
    }
    // The flag name only: a value may be anything the author typed.
    let shown: String = name.chars().take(64).collect();
    Some(format!(
        "--{shown} is not allowed; spec.extraArgs may set only tuning and logging flags ({})",
        ALLOWED_EXTRA_ARGS.iter().map(|f| format!("--{f}")).collect::<Vec<_>>().join(", ")
    ))
}

/// Whether allow-list `entry` admits `image`, on repository boundaries (pure): an entry ending in
/// `:`, `@` or `/` is a prefix (any tag, any digest, any repository under that path); an entry
/// with a tag or digest is that image exactly; any other entry is a repository and admits it with
/// any tag or digest, never a sibling repository that only starts with the same characters.
pub fn image_entry_allows(entry: &str, image: &str) -> bool {
    if entry.is_empty() {
        return false;
    }
    if image == entry {
        return true;
    }
    if entry.ends_with([':', '@', '/']) {
        return image.starts_with(entry);
    }
    if has_tag_or_digest(entry) {
        return false;
    }
    image.strip_prefix(entry).is_some_and(|rest| rest.starts_with([':', '@']))
}

/// Whether an image reference names a tag or a digest: a `@`, or a `:` after the last `/` (a `:`
/// before it is a registry's port).
fn has_tag_or_digest(reference: &str) -> bool {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    reference.contains('@') || last.contains(':')
}

/// Whether `image` is allowed by `allowed` ([`image_entry_allows`]), or, with an empty list,
/// equal to `default_image` (pure).
pub fn image_allowed(image: &str, allowed: &[String], default_image: &str) -> bool {
    if allowed.is_empty() {
        return image == default_image;
    }
    allowed.iter().any(|entry| image_entry_allows(entry, image))
}

/// Why `image`'s tag or digest is refused by `policy`, or `None` (pure): no digest where one is
/// required, or `latest` (or no tag and no digest, which pulls `latest`) unless allowed.
pub fn image_reference_refused(image: &str, policy: &Policy) -> Option<&'static str> {
    let digest = image.contains('@');
    if policy.require_image_digest && !digest {
        return Some(
            "must be pinned by digest (repository@sha256:...); the operator's --require-image-digest, the chart's admissionPolicy.requireDigest",
        );
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    let tag = last.split_once(':').map(|(_, t)| t);
    if !policy.allow_latest_image && !digest && tag.is_none_or(|t| t == "latest") {
        return Some(
            "is tagged latest or has no tag: name a version or a digest; the operator's --allow-latest-image, the chart's admissionPolicy.allowLatestTag",
        );
    }
    None
}

/// Why `resources` ask for more than `maximums` allow, one message per field (pure).
pub fn resources_refused(resources: &ResourceRequirements, maximums: &[ResourceMaximum]) -> Vec<String> {
    if maximums.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let listed = || maximums.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ");
    let empty = BTreeMap::new();
    for (kind, values) in [("requests", &resources.requests), ("limits", &resources.limits)] {
        for (name, quantity) in values.as_ref().unwrap_or(&empty) {
            let field = format!("spec.deployment.resources.{kind}.{name}");
            let Some(max) = maximums.iter().find(|m| &m.name == name) else {
                out.push(format!(
                    "{field} is not allowed: a manager container may ask only for {} (the operator's --max-container-resources, the chart's manager.maxContainerResources)",
                    listed()
                ));
                continue;
            };
            match Amount::parse(&quantity.0) {
                Err(e) => out.push(format!("{field} {e}")),
                Ok(amount) if amount > max.amount => out.push(format!(
                    "{field} is above the maximum of {} (the operator's --max-container-resources, the chart's manager.maxContainerResources)",
                    max.shown
                )),
                Ok(_) => {}
            }
        }
    }
    let memory_limit = resources.limits.as_ref().is_some_and(|l| l.contains_key("memory"));
    if let Some(max) = maximums.iter().find(|m| m.name == "memory")
        && !memory_limit
    {
        out.push(format!(
            "spec.deployment.resources.limits.memory is unset, which leaves the manager's memory unbounded: set it, at most {} (the operator's --max-container-resources, the chart's manager.maxContainerResources)",
            max.shown
        ));
    }
    out
}

/// Why a DaemonSet-mode spec reaches every Node, one message per field, unless `policy` allows
/// it (pure): an empty `nodeSelector`, or a toleration of every taint (`Exists` without a key).
pub fn every_node_refused(cr: &CloudControllerManager, policy: &Policy) -> Vec<String> {
    if cr.spec.mode != Mode::DaemonSet || policy.allow_any_node {
        return Vec::new();
    }
    let d = &cr.spec.deployment;
    let mut out = Vec::new();
    if d.node_selector.as_ref().is_some_and(BTreeMap::is_empty) {
        out.push(
            "spec.deployment.nodeSelector is empty, which runs a manager on every Node in DaemonSet mode: leave it out (the control-plane Nodes) or select Nodes; the operator's --allow-any-node, the chart's manager.allowAnyNode"
                .to_string(),
        );
    }
    for (i, t) in d.tolerations.iter().flatten().enumerate() {
        if t.key.as_deref().unwrap_or_default().is_empty() && t.operator.as_deref() == Some("Exists") {
            out.push(format!(
                "spec.deployment.tolerations[{i}] tolerates every taint (operator Exists without a key), which runs a manager on every tainted Node in DaemonSet mode: name the taint's key; the operator's --allow-any-node, the chart's manager.allowAnyNode"
            ));
        }
    }
    out
}

/// Whether `name` is one of `reserved` (an entry ending in `*` is a prefix) (pure).
fn reserved_by(name: &str, reserved: &[String]) -> bool {
    reserved.iter().filter(|r| !r.is_empty()).any(|r| match r.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == r,
    })
}

/// The `ReservedName` failure when the resource's name (its Lease's) or its migration Lease's is
/// one the installation reserved (`--reserved-lease-names`) (pure).
pub fn reserved_by_installation(cr: &CloudControllerManager, policy: &Policy) -> Option<Failure> {
    let list = || policy.reserved_lease_names.join(", ");
    let name = cr.name_any();
    if reserved_by(&name, &policy.reserved_lease_names) {
        return Some(Failure {
            reason: reason::RESERVED_NAME,
            message: format!(
                "metadata.name {name:?} is reserved by this installation ({}; the operator's --reserved-lease-names, the chart's manager.reservedLeaseNames): the manager's leader-election Lease is named after the resource; recreate the resource under another name",
                list()
            ),
        });
    }
    let lease = migration_lease_name(&cr.spec)?;
    reserved_by(&lease, &policy.reserved_lease_names).then(|| Failure {
        reason: reason::RESERVED_NAME,
        message: format!(
            "spec.leaderElection.migration.leaderName {lease:?} is reserved by this installation ({}; the operator's --reserved-lease-names, the chart's manager.reservedLeaseNames); choose another name",
            list()
        ),
    })
}

/// Refuse a valid verdict whose spec asks for more than `policy` allows: a Lease name the
/// installation reserved (`ReservedName`, alone), else an image outside the allow-list or with
/// a refused tag, a flag outside [`ALLOWED_EXTRA_ARGS`] or a `--v` above [`MAX_VERBOSITY`], more
/// replicas than the maximum, a priority class not on the list, resources above the maximum,
/// every Node in DaemonSet mode, an announcer where none may run. Each failure names the field;
/// the reason is `NotAllowedByPolicy`.
pub fn check_policy(
    cr: &CloudControllerManager,
    verdict: Validation,
    policy: &Policy,
    default_image: &str,
) -> Validation {
    if !verdict.is_valid() {
        return verdict;
    }
    if let Some(failure) = reserved_by_installation(cr, policy) {
        return Validation::refused(vec![failure]);
    }
    let d = &cr.spec.deployment;
    let mut failures = Vec::new();
    let mut refuse = |message: String| failures.push(Failure { reason: reason::NOT_ALLOWED_BY_POLICY, message });
    let runs_a_pod = cr.spec.mode != Mode::Embedded;
    if runs_a_pod {
        // An upstream profile's own image passes the same allow-list as one the resource names.
        let profile_image = cr
            .spec
            .upstream
            .as_ref()
            .map(|u| crate::profiles::profile(u.profile))
            .filter(|p| !p.image.is_empty())
            .map(|p| (p.image, format!("spec.upstream.profile {}'s image {}", p.profile.as_str(), p.image)));
        let image = match (d.image.as_deref(), profile_image) {
            (Some(image), _) => Some((image, "spec.deployment.image".to_string())),
            (None, Some((image, field))) => Some((image, field)),
            (None, None) => None,
        };
        // An upstream profile's node manager (spec.upstream.nodeManager) likewise.
        let node_manager = crate::profiles::node_manager_of(cr).map(|(_, image, field)| (image, field));
        let node_manager = node_manager.as_ref().map(|(image, field)| (image.as_str(), field.clone()));
        for (image, field) in image.into_iter().chain(node_manager) {
            if !image_allowed(image, &policy.allowed_images, default_image) {
                let list = if policy.allowed_images.is_empty() {
                    default_image.to_string()
                } else {
                    policy.allowed_images.join(", ")
                };
                refuse(format!(
                    "{field} is not an allowed image (allowed: {list}); the operator's --allowed-images, the chart's admissionPolicy.allowedImages"
                ));
            } else if let Some(why) = image_reference_refused(image, policy) {
                refuse(format!("{field} {why}"));
            }
        }
        if cr.spec.mode == Mode::Deployment && d.replicas > policy.max_replicas {
            refuse(format!(
                "spec.deployment.replicas is {}, above the maximum of {} (the operator's --max-replicas, the chart's manager.maxReplicas)",
                d.replicas, policy.max_replicas
            ));
        }
        if !d.priority_class_name.is_empty() && !policy.allowed_priority_classes.contains(&d.priority_class_name) {
            refuse(format!(
                "spec.deployment.priorityClassName {:?} is not allowed (allowed: {}); the operator's --allowed-priority-classes, the chart's manager.allowedPriorityClasses",
                d.priority_class_name,
                if policy.allowed_priority_classes.is_empty() {
                    "none".to_string()
                } else {
                    policy.allowed_priority_classes.join(", ")
                }
            ));
        }
        if let Some(resources) = &d.resources {
            resources_refused(resources, &policy.max_container_resources).into_iter().for_each(&mut refuse);
        }
        every_node_refused(cr, policy).into_iter().for_each(&mut refuse);
    }
    if let Some(announcer) = &cr.spec.announcer {
        let namespace = cr.namespace().unwrap_or_default();
        if !policy.allow_announcers {
            refuse(
                "spec.announcer: this installation does not run announcers (the operator's --allow-announcers, the chart's announcer.enabled)"
                    .into(),
            );
        } else if !policy.announcer_namespaces.is_empty() && !policy.announcer_namespaces.contains(&namespace) {
            refuse(format!(
                "spec.announcer: this installation runs announcers only in namespaces {} (the operator's --announcer-namespaces, the chart's announcer.namespaces), not in {namespace}",
                policy.announcer_namespaces.join(", ")
            ));
        } else if announcer.bgp && policy.bird_image.is_none() {
            refuse(
                "spec.announcer.bgp: no BIRD image is configured (the operator's --bird-image, the chart's announcer.birdImage)"
                    .into(),
            );
        }
    }
    for (i, arg) in cr.spec.extra_args.iter().enumerate() {
        if let Some(why) = extra_arg_refused(arg) {
            refuse(format!("spec.extraArgs[{i}]: {why}"));
        }
    }
    if failures.is_empty() { verdict } else { Validation::refused(failures) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::pipeline::validate;
    use crate::validate::secret::SecretState;
    use crate::validate::testing::{cr, reason_of, registry};
    use serde_json::json;

    #[test]
    fn a_spec_asking_for_more_than_the_policy_allows_is_refused_naming_each_field() {
        let policy = Policy::default();
        let image = "registry.example/ccm:v1";
        let check = |spec: serde_json::Value, policy: &Policy| {
            let c = cr("a", 1, spec);
            check_policy(&c, validate(&c, &SecretState::NotReferenced, &registry(), &[]), policy, image)
        };
        assert!(check(json!({"provider": "plain"}), &policy).is_valid(), "the defaults pass");
        let ok = json!({"provider": "plain", "extraArgs": ["--v=4", "-v=2", "--node-monitor-period=7s"],
            "deployment": {"image": image, "replicas": 5, "priorityClassName": "system-cluster-critical"}});
        assert!(check(ok, &policy).is_valid());
        let v = check(
            json!({"provider": "plain",
                "extraArgs": ["--v=2", "--kubeconfig=/tmp/k", "--authorization-always-allow-paths=/metrics", "/x", "--tls-min-version=VersionTLS10",
                              "--use-service-account-credentials", "--cloud-config=/etc/passwd", "--leader-elect-resource-name=kube-scheduler", "--", "--master=x",
                              "--bind-address=0.0.0.0", "--v=5"],
                "deployment": {"image": "evil.example/ccm:v1", "replicas": 6, "priorityClassName": "system-node-critical"}}),
            &policy,
        );
        assert_eq!(reason_of(&v), reason::NOT_ALLOWED_BY_POLICY);
        let Validation::Invalid { failures, .. } = &v else { panic!() };
        let messages: Vec<&str> = failures.iter().map(|f| f.message.as_str()).collect();
        let fields: Vec<&str> = messages.iter().map(|m| m.split([' ', ':']).next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "spec.deployment.image",
                "spec.deployment.replicas",
                "spec.deployment.priorityClassName",
                "spec.extraArgs[1]",
                "spec.extraArgs[2]",
                "spec.extraArgs[3]",
                "spec.extraArgs[4]",
                "spec.extraArgs[5]",
                "spec.extraArgs[6]",
                "spec.extraArgs[7]",
                "spec.extraArgs[8]",
                "spec.extraArgs[9]",
                "spec.extraArgs[10]",
                "spec.extraArgs[11]"
            ],
            "{messages:#?}"
        );
        assert!(
            !messages.iter().any(|m| m.contains("/tmp/k") || m.contains("/etc/passwd")),
            "values stay out: {messages:#?}"
        );
        // Entries are exact references or prefixes; DaemonSet mode ignores replicas.
        let listed = Policy {
            allowed_images: vec!["registry.example/ccm@".into(), "mirror.example/".into()],
            ..Policy::default()
        };
        let with_image = |i: &str| json!({"provider": "plain", "deployment": {"image": i}});
        assert!(check(with_image("registry.example/ccm@sha256:abc"), &listed).is_valid());
        assert!(check(with_image("mirror.example/any:1"), &listed).is_valid());
        assert!(!check(with_image("registry.example/ccm:v1"), &listed).is_valid(), "tags not listed");
        assert!(!check(with_image("registry.example/ccm-evil@sha256:abc"), &listed).is_valid());
        assert!(
            check(json!({"provider": "plain", "mode": "DaemonSet", "deployment": {"replicas": 50}}), &policy)
                .is_valid()
        );
        let none = Policy { allowed_priority_classes: Vec::new(), ..Policy::default() };
        assert!(check(json!({"provider": "plain", "deployment": {"priorityClassName": ""}}), &none).is_valid());
    }

    #[test]
    fn an_upstream_profiles_own_image_passes_the_allow_list_like_a_named_one() {
        let c = cr("a", 1, json!({"provider": "aws", "upstream": {"profile": "aws"}}));
        let check = |policy: &Policy| {
            check_policy(
                &c,
                validate(&c, &SecretState::NotReferenced, &registry(), &[]),
                policy,
                "registry.example/ccm:v1",
            )
        };
        let v = check(&Policy::default());
        assert_eq!(reason_of(&v), reason::NOT_ALLOWED_BY_POLICY);
        assert!(
            v.summary().unwrap().1.starts_with(
                "spec.upstream.profile aws's image registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.1 is not an allowed image"
            ),
            "{v:?}"
        );
        let listed = Policy {
            allowed_images: vec!["registry.k8s.io/provider-aws/cloud-controller-manager".into()],
            ..Policy::default()
        };
        assert!(check(&listed).is_valid(), "{:?}", check(&listed));
    }

    #[test]
    fn a_node_managers_image_passes_the_allow_list_and_tag_rules_like_the_managers() {
        let mut c = cr("azure", 1, json!({"provider": "azure", "upstream": {"profile": "azure"}}));
        c.metadata.namespace = Some("kube-system".into());
        let check = |c: &CloudControllerManager, policy: &Policy| {
            check_policy(
                c,
                validate(c, &SecretState::NotReferenced, &registry(), &[]),
                policy,
                "registry.example/ccm:v1",
            )
        };
        let ccm_only = Policy {
            allowed_images: vec!["mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager".into()],
            ..Policy::default()
        };
        let v = check(&c, &ccm_only);
        assert_eq!(reason_of(&v), reason::NOT_ALLOWED_BY_POLICY);
        assert!(
            v.summary().unwrap().1.starts_with("spec.upstream.profile azure's node-manager image mcr.microsoft.com/oss/kubernetes/azure-cloud-node-manager:v1.36.5 is not an allowed image"),
            "{v:?}"
        );
        let both = Policy {
            allowed_images: vec![
                "mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager".into(),
                "mcr.microsoft.com/oss/kubernetes/azure-cloud-node-manager".into(),
            ],
            ..Policy::default()
        };
        assert!(check(&c, &both).is_valid(), "{:?}", check(&c, &both));
        // A named one is checked, tag rules included; turned off, none is.
        c.spec.upstream = Some(serde_json::from_value(json!({"profile": "azure", "nodeManager": {"image": "mcr.microsoft.com/oss/kubernetes/azure-cloud-node-manager:latest"}})).unwrap());
        let v = check(&c, &both);
        assert!(v.summary().is_some_and(|(_, m)| m.starts_with("spec.upstream.nodeManager.image ")), "{v:?}");
        c.spec.upstream =
            Some(serde_json::from_value(json!({"profile": "azure", "nodeManager": {"enabled": false}})).unwrap());
        assert!(check(&c, &ccm_only).is_valid(), "{:?}", check(&c, &ccm_only));
    }

    #[test]
    fn allow_list_entries_match_on_repository_boundaries() {
        let allows = image_entry_allows;
        // A repository: any tag or digest of it, never a sibling or a sub-repository.
        assert!(allows("registry.example/ccm", "registry.example/ccm:v1"));
        assert!(allows("registry.example/ccm", "registry.example/ccm@sha256:abc"));
        assert!(allows("registry.example/ccm", "registry.example/ccm"));
        assert!(!allows("registry.example/ccm", "registry.example/ccm-evil:v1"));
        assert!(!allows("registry.example/ccm", "registry.example/ccmx"));
        assert!(!allows("registry.example/ccm", "registry.example/ccm/evil:v1"));
        // A registry port is no tag.
        assert!(allows("registry.example:5000/ccm", "registry.example:5000/ccm:v1"));
        assert!(!allows("registry.example:5000/ccm", "registry.example:5000/ccm-evil:v1"));
        // Prefixes end at a boundary the entry names.
        assert!(allows("registry.example/ccm:", "registry.example/ccm:v2"));
        assert!(!allows("registry.example/ccm:", "registry.example/ccm@sha256:abc"));
        assert!(allows("registry.example/ccm@", "registry.example/ccm@sha256:abc"));
        assert!(allows("mirror.example/", "mirror.example/anything:1"));
        // A tag or digest: that image only.
        assert!(allows("registry.example/ccm:v1", "registry.example/ccm:v1"));
        assert!(!allows("registry.example/ccm:v1", "registry.example/ccm:v1-evil"));
        assert!(!allows("registry.example/ccm@sha256:ab", "registry.example/ccm@sha256:abc"));
        assert!(!allows("", "anything"));
    }

    #[test]
    fn digests_can_be_required_and_latest_is_refused_unless_allowed() {
        let policy = Policy::default();
        assert_eq!(image_reference_refused("r.example/ccm:v1", &policy), None);
        assert_eq!(image_reference_refused("r.example/ccm@sha256:abc", &policy), None);
        assert_eq!(image_reference_refused("r.example:5000/ccm:v1", &policy), None);
        for latest in ["r.example/ccm:latest", "r.example/ccm", "r.example:5000/ccm"] {
            let why = image_reference_refused(latest, &policy).unwrap_or_else(|| panic!("{latest} passed"));
            assert!(why.contains("latest") && why.contains("admissionPolicy.allowLatestTag"), "{why}");
        }
        let lenient = Policy { allow_latest_image: true, ..Policy::default() };
        assert_eq!(image_reference_refused("r.example/ccm", &lenient), None);
        let pinned = Policy { require_image_digest: true, ..Policy::default() };
        let why = image_reference_refused("r.example/ccm:v1", &pinned).expect("a tag alone is refused");
        assert!(why.contains("digest") && why.contains("admissionPolicy.requireDigest"), "{why}");
        assert_eq!(image_reference_refused("r.example/ccm:v1@sha256:abc", &pinned), None);
    }

    #[test]
    fn verbosity_is_capped_below_the_level_where_the_aws_sdk_logs_credentials() {
        for ok in ["--v=0", "--v=4", "-v=4"] {
            assert_eq!(extra_arg_refused(ok), None, "{ok}");
        }
        for refused in ["--v=5", "-v=9", "--v=255", "--v=x", "--v", "-v"] {
            let why = extra_arg_refused(refused).unwrap_or_else(|| panic!("{refused} passed"));
            assert!(why.contains("x-amz-security-token"), "{refused}: {why}");
        }
        // The manager logs at trace level from 5 on: the level aws-sigv4 logs canonical requests at.
        use ccm_framework::program::flags::Flags;
        let parsed = Flags::try_parse_args(["cloud-controller-manager", "--cloud-provider=fake", "--v=5"]).unwrap();
        assert_eq!(parsed.verbosity, MAX_VERBOSITY + 1);
    }

    #[test]
    fn resources_above_the_maximum_or_of_unlisted_kinds_are_refused_naming_the_field() {
        let check = |spec: serde_json::Value, policy: &Policy| {
            let c = cr("a", 1, spec);
            check_policy(&c, validate(&c, &SecretState::NotReferenced, &registry(), &[]), policy, "img:v1")
        };
        let messages = |v: Validation| match v {
            Validation::Invalid { failures, .. } => failures.into_iter().map(|f| f.message).collect::<Vec<_>>(),
            other => panic!("expected a refusal: {other:?}"),
        };
        let policy = Policy::default();
        let within = json!({"provider": "plain", "deployment": {"resources": {
            "requests": {"cpu": "2", "memory": "64Mi"}, "limits": {"memory": "2Gi"}}}});
        assert!(check(within, &policy).is_valid());
        let greedy = json!({"provider": "plain", "deployment": {"resources": {
            "requests": {"cpu": "2001m", "memory": "3Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "2049Mi", "ephemeral-storage": "1Ti"}}}});
        let m = messages(check(greedy, &policy));
        let fields: Vec<&str> = m.iter().map(|m| m.split(' ').next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "spec.deployment.resources.requests.cpu",
                "spec.deployment.resources.requests.memory",
                "spec.deployment.resources.requests.nvidia.com/gpu",
                "spec.deployment.resources.limits.ephemeral-storage",
                "spec.deployment.resources.limits.memory",
            ],
            "{m:#?}"
        );
        assert!(m[0].contains("above the maximum of 2") && m[0].contains("manager.maxContainerResources"), "{}", m[0]);
        assert!(m[2].contains("only for cpu, memory"), "{}", m[2]);
        // No memory limit: unbounded.
        let unbounded = json!({"provider": "plain", "deployment": {"resources": {"requests": {"memory": "64Mi"}}}});
        let m = messages(check(unbounded.clone(), &policy));
        assert!(m[0].starts_with("spec.deployment.resources.limits.memory is unset"), "{m:?}");
        // No maximum configured: anything goes; the default resources need none.
        let open = Policy { max_container_resources: Vec::new(), ..Policy::default() };
        assert!(check(unbounded, &open).is_valid());
        assert!(check(json!({"provider": "plain"}), &policy).is_valid());
        assert_eq!(parse_max_container_resources(&["cpu=2", "memory=2Gi"]).unwrap(), default_max_container_resources());
        assert_eq!(default_max_container_resources().len(), 2, "the default parses");
        assert_eq!(parse_max_container_resources(&["memory"]), Err(PolicyError::NotAPair { index: 0 }));
        assert!(matches!(parse_max_container_resources(&["memory=lots"]), Err(PolicyError::Quantity { .. })));
    }

    #[test]
    fn a_daemonset_on_every_node_is_refused_unless_the_installation_allows_it() {
        let check = |spec: serde_json::Value, policy: &Policy| {
            let c = cr("a", 1, spec);
            check_policy(&c, validate(&c, &SecretState::NotReferenced, &registry(), &[]), policy, "img:v1")
        };
        let policy = Policy::default();
        let every = json!({"provider": "plain", "mode": "DaemonSet", "deployment": {"nodeSelector": {},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}, {"operator": "Exists"}, {"key": "", "operator": "Exists", "effect": "NoSchedule"}]}});
        let Validation::Invalid { failures, .. } = check(every.clone(), &policy) else { panic!("refused") };
        let fields: Vec<&str> = failures.iter().map(|f| f.message.split(' ').next().unwrap()).collect();
        assert_eq!(
            fields,
            ["spec.deployment.nodeSelector", "spec.deployment.tolerations[1]", "spec.deployment.tolerations[2]"]
        );
        assert!(
            failures.iter().all(|f| f.reason == reason::NOT_ALLOWED_BY_POLICY && f.message.contains("allowAnyNode"))
        );
        assert!(check(every.clone(), &Policy { allow_any_node: true, ..Policy::default() }).is_valid());
        // Deployment mode runs a few replicas wherever the scheduler puts them: not this rule's.
        let mut deployment = every;
        deployment["mode"] = json!("Deployment");
        assert!(check(deployment, &policy).is_valid());
        // A selector with keys, and the default (control-plane Nodes), pass.
        let selected =
            json!({"provider": "plain", "mode": "DaemonSet", "deployment": {"nodeSelector": {"edge": "true"}}});
        assert!(check(selected, &policy).is_valid());
        assert!(check(json!({"provider": "plain", "mode": "DaemonSet"}), &policy).is_valid());
    }

    #[test]
    fn lease_names_the_installation_reserves_are_refused_with_reserved_name() {
        let policy =
            Policy { reserved_lease_names: vec!["vendor-ccm".into(), "metallb-*".into()], ..Policy::default() };
        let check = |name: &str, spec: serde_json::Value| {
            let c = cr(name, 1, spec);
            check_policy(&c, validate(&c, &SecretState::NotReferenced, &registry(), &[]), &policy, "img:v1")
        };
        for name in ["vendor-ccm", "metallb-controller"] {
            let v = check(name, json!({"provider": "plain"}));
            assert_eq!(reason_of(&v), reason::RESERVED_NAME, "{name}");
            let (_, message) = v.summary().unwrap();
            assert!(
                message.starts_with(&format!("metadata.name {name:?} is reserved by this installation")),
                "{message}"
            );
            assert!(message.contains("manager.reservedLeaseNames"), "{message}");
        }
        assert!(check("vendor-ccm-2", json!({"provider": "plain"})).is_valid());
        let migrating =
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": "metallb-x"}}});
        let v = check("aws", migrating);
        assert_eq!(reason_of(&v), reason::RESERVED_NAME);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration.leaderName"), "{v:?}");
    }

    #[test]
    fn an_announcer_is_refused_in_a_namespace_the_installation_did_not_allow_for_announcers() {
        let spec = json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}, "announcer": {}});
        let c = cr("metal", 1, spec);
        let valid = || {
            Validation::Valid(crate::validate::Validated {
                config: crate::validate::manager_config(&c, Some("cloud.conf")).unwrap(),
                cloud_config: None,
                provider_has_routes: false,
            })
        };
        let elsewhere = Policy { allow_announcers: true, announcer_namespaces: vec!["lb".into()], ..Policy::default() };
        let v = check_policy(&c, valid(), &elsewhere, "img:v1");
        assert_eq!(reason_of(&v), reason::NOT_ALLOWED_BY_POLICY);
        let (_, message) = v.summary().unwrap();
        assert!(message.starts_with("spec.announcer:") && message.contains("announcer.namespaces"), "{message}");
        assert!(message.contains("kube-system") && message.contains("lb"), "{message}");
        let here = Policy { announcer_namespaces: vec!["lb".into(), "kube-system".into()], ..elsewhere.clone() };
        assert!(check_policy(&c, valid(), &here, "img:v1").is_valid());
        let anywhere = Policy { announcer_namespaces: Vec::new(), ..elsewhere };
        assert!(check_policy(&c, valid(), &anywhere, "img:v1").is_valid());
    }

    /// A value of the type the manager's flag takes, by its clap value name.
    fn sample(value_name: &str) -> &'static str {
        match value_name {
            "duration" => "7s",
            "float32" => "5",
            "int" | "int32" | "Level" => "3",
            "ip" => "10.0.0.1",
            "pattern=N,..." => "x=2",
            "string" => "text",
            other => panic!("no sample value for a flag of type {other}; add one"),
        }
    }

    #[test]
    fn every_flag_extra_args_may_set_is_a_flag_of_the_manager_taking_the_value_form_extra_args_passes() {
        use ccm_framework::program::flags::Flags;
        use clap::CommandFactory;
        let command = Flags::command();
        let parses = |arg: &str| Flags::try_parse_args(["cloud-controller-manager", "--cloud-provider=fake", arg]);
        for flag in ALLOWED_EXTRA_ARGS {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("--{flag} is allowed in spec.extraArgs but is no flag of the manager"));
            assert!(arg.get_action().takes_values(), "--{flag} takes no value, but extraArgs passes --{flag}=value");
            // A flag whose value may be left out (a bool) is given as `--flag` or `--flag=true`.
            let bare = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
            let value = if bare {
                "true"
            } else {
                let name = arg.get_value_names().and_then(|n| n.first()).map(|n| n.to_string()).unwrap_or_default();
                sample(&name)
            };
            let given = format!("--{flag}={value}");
            assert_eq!(extra_arg_refused(&given), None, "{given}");
            assert!(parses(&given).is_ok(), "the manager refuses {given}: {:?}", parses(&given).err());
            if bare {
                assert_eq!(extra_arg_refused(&format!("--{flag}")), None);
                assert!(parses(&format!("--{flag}")).is_ok(), "the manager refuses --{flag}");
            }
        }
        // The short form extraArgs takes for the verbosity.
        assert_eq!(extra_arg_refused("-v=4"), None);
        assert_eq!(parses("-v=4").map(|f| f.verbosity).ok(), Some(4));
    }

    #[test]
    fn the_extra_args_allow_list_in_the_crd_reference_is_the_code_s() {
        let doc = include_str!("../../../docs/crd-reference.md");
        let row = doc.lines().find(|l| l.starts_with("| `extraArgs` |")).expect("the extraArgs row");
        let start = row.find("Only tuning and logging flags").expect("the allow-list in the row");
        let end = row[start..].find("Any other entry").map(|e| start + e).expect("the end of the allow-list");
        let documented: Vec<&str> = row[start..end]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|code| code.strip_prefix("--"))
            // The forms, not flags: `--flag=value`, `--flag`.
            .filter(|name| !name.starts_with("flag"))
            .collect();
        assert_eq!(documented, ALLOWED_EXTRA_ARGS, "docs/crd-reference.md, spec.extraArgs");
    }
}
