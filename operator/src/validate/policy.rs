//! Installation policy (pure): what a resource author may ask for beyond the manager's own
//! configuration (images, `extraArgs`, replicas, priority classes, announcers), as whoever
//! installs the operator allows it. A resource asking for more is refused with
//! `NotAllowedByPolicy`, naming each field.

use ccm_provider_baremetal::deploy;
use crds::{CloudControllerManager, Mode};

use super::verdict::{Failure, Validation};
use crds::reasons::config_valid as reason;

/// What a resource author may ask for beyond the manager's own configuration, set by whoever
/// installs the operator (flags, chart values). A resource asking for more is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Images `spec.deployment.image` may name (`--allowed-images`): an entry allows the image
    /// equal to it or starting with it (`registry/repo:` any tag, `registry/repo@` any digest,
    /// `registry/` any repository there). Empty: only the operator's `--manager-image`.
    pub allowed_images: Vec<String>,
    /// The most replicas `spec.deployment.replicas` may ask for (`--max-replicas`).
    pub max_replicas: i32,
    /// Priority classes `spec.deployment.priorityClassName` may name
    /// (`--allowed-priority-classes`); an empty name (none) is always allowed.
    pub allowed_priority_classes: Vec<String>,
    /// Whether `spec.announcer` may be set (`--allow-announcers`, the chart's
    /// `announcer.enabled`): announcers run on the host network of every selected node, with
    /// `NET_RAW` for L2.
    pub allow_announcers: bool,
    /// The BIRD image of `spec.announcer.bgp` (`--bird-image`); none refuses `bgp`.
    pub bird_image: Option<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allowed_images: Vec::new(),
            max_replicas: DEFAULT_MAX_REPLICAS,
            allowed_priority_classes: vec![DEFAULT_PRIORITY_CLASS.to_string()],
            allow_announcers: false,
            bird_image: None,
        }
    }
}

/// The default of `--max-replicas`: leader election runs one manager at a time, so more than a
/// few standbys buy nothing.
pub const DEFAULT_MAX_REPLICAS: i32 = 5;
/// The default of `--allowed-priority-classes`: the CRD's default `priorityClassName`.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-cluster-critical";

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
/// `--cert-dir`, `--secure-port`, `--permit-*`, `--webhook*`, `--profiling`),
/// its cloud (`--cloud-provider`, `--cloud-config`) or its Lease (`--leader-elect*`,
/// `--leader-migration-config`), and flags the spec already sets (`--controllers`,
/// `--cluster-*`, `--configure-cloud-routes`, `--concurrent-*-syncs`). `--bind-address` is
/// allowed: the default already listens on every address of the pod (or host), so another value
/// narrows what is exposed, never widens it.
pub const ALLOWED_EXTRA_ARGS: [&str; 17] = [
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
    "bind-address",
];

/// Why `spec.extraArgs[i]` is refused, or `None` (pure). Only `--flag=value`, `--flag` and
/// `-v=N` forms of [`ALLOWED_EXTRA_ARGS`] pass: a bare value could be taken as another flag's.
pub fn extra_arg_refused(arg: &str) -> Option<String> {
    let name = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-').filter(|r| r.starts_with('v')));
    let Some(name) = name else {
        return Some("is not a flag; give values in the --flag=value form".into());
    };
    let name = name.split_once('=').map_or(name, |(n, _)| n);
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

/// Whether `image` is allowed by `allowed` (entries equal to it or prefixes of it), or, with
/// an empty list, equal to `default_image` (pure).
pub fn image_allowed(image: &str, allowed: &[String], default_image: &str) -> bool {
    if allowed.is_empty() {
        return image == default_image;
    }
    allowed.iter().any(|p| !p.is_empty() && (image == p || image.starts_with(p.as_str())))
}

/// Refuse a valid verdict whose spec asks for more than `policy` allows: an image outside the
/// allow-list, a flag outside [`ALLOWED_EXTRA_ARGS`], more replicas than the maximum, a priority
/// class not on the list. Each failure names the field; the reason is `NotAllowedByPolicy`.
pub fn check_policy(
    cr: &CloudControllerManager,
    verdict: Validation,
    policy: &Policy,
    default_image: &str,
) -> Validation {
    if !verdict.is_valid() {
        return verdict;
    }
    let d = &cr.spec.deployment;
    let mut failures = Vec::new();
    let mut refuse = |message: String| failures.push(Failure { reason: reason::NOT_ALLOWED_BY_POLICY, message });
    let runs_a_pod = cr.spec.mode != Mode::Embedded;
    if runs_a_pod {
        if let Some(image) = d.image.as_deref()
            && !image_allowed(image, &policy.allowed_images, default_image)
        {
            let list = if policy.allowed_images.is_empty() {
                default_image.to_string()
            } else {
                policy.allowed_images.join(", ")
            };
            refuse(format!(
                "spec.deployment.image is not an allowed image (allowed: {list}); the operator's --allowed-images, the chart's manager.allowedImages"
            ));
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
    }
    if let Some(announcer) = &cr.spec.announcer {
        if !policy.allow_announcers {
            refuse(
                "spec.announcer: this installation does not run announcers (the operator's --allow-announcers, the chart's announcer.enabled)"
                    .into(),
            );
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
        let ok = json!({"provider": "plain", "extraArgs": ["--v=4", "-v=2", "--node-monitor-period=7s", "--bind-address=10.0.0.1"],
            "deployment": {"image": image, "replicas": 5, "priorityClassName": "system-cluster-critical"}});
        assert!(check(ok, &policy).is_valid());
        let v = check(
            json!({"provider": "plain",
                "extraArgs": ["--v=2", "--kubeconfig=/tmp/k", "--authorization-always-allow-paths=/metrics", "/x", "--tls-min-version=VersionTLS10",
                              "--use-service-account-credentials", "--cloud-config=/etc/passwd", "--leader-elect-resource-name=kube-scheduler", "--", "--master=x"],
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
                "spec.extraArgs[9]"
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
