//! The verdict pipeline (pure): is a CloudControllerManager usable as specified? Each check
//! below is one job's (conflicts, spec to ManagerConfig, policy, the provider's factory); the
//! first that refuses decides, except that conflicts and Secret problems are reported together.
//!
//! Inputs are already dereferenced (the Secret's state, the other CRs); the only thing this
//! calls is the provider's factory, which the registry contract makes cheap and free of side
//! effects. It runs once, and the provider it built comes with a valid verdict.

use ccm_framework::registry::{ClusterSettings, Registry, RegistryError};
use crds::CloudControllerManager;
use crds::Mode;
use crds::controllers::{ControllerSelection, route_controller_runs};
use crds::validation::{parse_cluster_cidrs, validate_spec};
use kube::ResourceExt;

use super::conflicts::{Peer, conflict_failures, reserved_lease_name, reserved_migration_lease};
use super::credentials::credentials_refused;
use super::manager_config::{Controllers, manager_config_with};
use super::policy::announcer_refused;
use super::secret::SecretState;
use super::upstream::upstream_refused;
use super::verdict::{Checked, CloudConfigRef, Failure, Validated, Validation};
use crate::hash;
use crds::reasons::config_valid as reason;

/// The Secret's name, the cloud-config's key and value, and the keys mounted beside it.
type FoundConfig<'a> = (&'a str, &'a str, &'a [u8], &'a [(String, Vec<u8>)]);

/// Validate `cr` given its Secret and the other CRs in scope.
pub fn validate(cr: &CloudControllerManager, secret: &SecretState, registry: &Registry, peers: &[Peer]) -> Validation {
    check(cr, &ControllerSelection::parse(&cr.spec.controllers), secret, registry, peers).validation
}

/// [`validate`], given `spec.controllers` as the reconcile resolved it; a valid verdict comes
/// with the provider the factory built.
pub fn check(
    cr: &CloudControllerManager,
    controllers: &Controllers,
    secret: &SecretState,
    registry: &Registry,
    peers: &[Peer],
) -> Checked {
    let spec = &cr.spec;
    let refused = |failures: Vec<Failure>| Checked::without_provider(Validation::refused(failures));

    if let Err(e) = validate_spec(spec) {
        return refused(vec![Failure { reason: reason::INVALID_SPEC, message: e.to_string() }]);
    }
    if let Some(failure) = reserved_lease_name(&cr.name_any()).or_else(|| reserved_migration_lease(cr, peers)) {
        return refused(vec![failure]);
    }
    let upstream = upstream_refused(cr);
    if !upstream.is_empty() {
        return refused(upstream);
    }
    if let Some(failure) = credentials_refused(cr) {
        return refused(vec![failure]);
    }
    if let Some(why) = announcer_refused(spec) {
        return refused(vec![Failure { reason: reason::INVALID_SPEC, message: why.into() }]);
    }
    if spec.mode == Mode::Embedded && !spec.extra_args.is_empty() {
        return refused(vec![Failure {
            reason: reason::EXTRA_ARGS_NOT_SUPPORTED,
            message: "spec.extraArgs is not supported in Embedded mode: the embedded engine takes no command line, so the arguments would be ignored; remove spec.extraArgs, or use mode Deployment or DaemonSet".into(),
        }]);
    }
    let cloud_config_key = spec.cloud_config.as_ref().map(|c| c.secret_ref.key.as_str());
    // The binary's own checks, which refuse timings the CRD accepts (renewDeadline must exceed
    // 1.2 x retryPeriod).
    let config = match manager_config_with(cr, cloud_config_key, controllers) {
        Ok(config) => config,
        Err(failure) => return refused(vec![failure]),
    };
    // An upstream image registers its own providers; its profile was checked above.
    if spec.upstream.is_none() && !registry.contains(&spec.provider) {
        return refused(vec![Failure {
            reason: reason::UNKNOWN_PROVIDER,
            message: format!(
                "unknown cloud provider {:?}; known providers: {}",
                spec.provider,
                registry.names().join(", ")
            ),
        }]);
    }

    let (mut failures, conflicts_with) = match Peer::with_controllers(cr, &config.controllers, registry) {
        Some(me) => conflict_failures(&me, peers),
        None => (Vec::new(), Vec::new()),
    };
    let invalid = |failures: Vec<Failure>, conflicts_with: Vec<String>| {
        Checked::without_provider(Validation::Invalid { failures, conflicts_with })
    };

    let cloud_config: Option<FoundConfig<'_>> = match secret {
        SecretState::NotReferenced => None,
        SecretState::NotFound { name } => {
            failures.push(Failure {
                reason: reason::SECRET_NOT_FOUND,
                message: format!(
                    "Secret {name:?} (spec.cloudConfig.secretRef) does not exist or is not labelled {}={}",
                    crds::CLOUD_CONFIG_LABEL,
                    crds::CLOUD_CONFIG_LABEL_VALUE
                ),
            });
            return invalid(failures, conflicts_with);
        }
        SecretState::KeyNotFound { name, key } => {
            failures.push(Failure {
                reason: reason::SECRET_KEY_NOT_FOUND,
                message: format!("Secret {name:?} has no key {key:?}"),
            });
            return invalid(failures, conflicts_with);
        }
        SecretState::Unreadable { name, error } => {
            if !failures.is_empty() {
                return invalid(failures, conflicts_with);
            }
            return Checked::without_provider(Validation::Unknown(Failure {
                reason: reason::SECRET_UNREADABLE,
                message: format!("reading Secret {name:?}: {error}"),
            }));
        }
        SecretState::Found { name, key, data, extra } => Some((name, key, data, extra)),
    };

    if spec.upstream.is_some() {
        // Nothing here parses an upstream CCM's cloud config: any edit of it rolls the pods.
        if !failures.is_empty() {
            return invalid(failures, conflicts_with);
        }
        let validated = Validated {
            config,
            cloud_config: cloud_config.map(|(name, key, data, extra)| {
                let salt = cr.metadata.uid.as_deref().unwrap_or_default();
                let hash = with_extra(hash::cloud_config(salt, key, data), extra);
                CloudConfigRef {
                    secret: name.to_string(),
                    key: key.to_string(),
                    extra_keys: extra.iter().map(|(k, _)| k.clone()).collect(),
                    restart_hash: hash.clone(),
                    hash,
                }
            }),
            provider_has_routes: false,
        };
        return Checked { validation: Validation::Valid(validated), provider: None };
    }
    let settings = ClusterSettings {
        cluster_name: spec.cluster_name.clone(),
        cluster_cidrs: spec.cluster_cidr.as_deref().and_then(|c| parse_cluster_cidrs(c).ok()).unwrap_or_default(),
    };
    let provider = match registry.create(&spec.provider, cloud_config.map(|(_, _, data, _)| data), &settings) {
        Ok(p) => p,
        Err(e) => {
            let message = match e {
                // Parsers report a field path and the kind of problem, never a value (the
                // provider contract), so the message is passed on as it is.
                RegistryError::Init { source, .. } => {
                    format!("provider {:?} rejected the cloud-config: {source}", spec.provider)
                }
                other => other.to_string(),
            };
            failures.push(Failure { reason: reason::CLOUD_CONFIG_REJECTED, message });
            return invalid(failures, conflicts_with);
        }
    };
    let provider_has_routes = provider.routes().is_some();
    let restart_fingerprint = provider.restart_fingerprint();
    if route_controller_runs(&config.controllers, config.configure_cloud_routes, provider_has_routes)
        && config.cluster_cidr.is_none()
    {
        failures.push(Failure {
            reason: reason::CLUSTER_CIDR_REQUIRED,
            message: format!(
                "provider {:?} programs routes and the route controller is enabled, but spec.clusterCIDR is empty; set it, or set configureCloudRoutes: false, or disable the route controller",
                spec.provider
            ),
        });
    }
    if !failures.is_empty() {
        return invalid(failures, conflicts_with);
    }
    let validated = Validated {
        config,
        cloud_config: cloud_config.map(|(name, key, data, extra)| {
            let salt = cr.metadata.uid.as_deref().unwrap_or_default();
            let hash = with_extra(hash::cloud_config(salt, key, data), extra);
            let restart_hash = match &restart_fingerprint {
                Some(fingerprint) => hash::cloud_config_restart(salt, key, fingerprint),
                None => hash::cloud_config(salt, key, data),
            };
            // Credentials and CA files are read once: a new one needs a restart.
            let restart_hash = with_extra(restart_hash, extra);
            CloudConfigRef {
                secret: name.to_string(),
                key: key.to_string(),
                extra_keys: extra.iter().map(|(k, _)| k.clone()).collect(),
                hash,
                restart_hash,
            }
        }),
        provider_has_routes,
    };
    Checked { validation: Validation::Valid(validated), provider: Some(provider) }
}

/// `hash` folded with each key mounted beside the cloud-config and its value.
fn with_extra(hash: String, extra: &[(String, Vec<u8>)]) -> String {
    extra.iter().fold(hash, |hash, (key, value)| hash::extra_key(&hash, key, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::testing::{counting_registry, cr, found, found_with_credentials, reason_of, registry};
    use serde_json::json;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_pool_edit_keeps_the_restart_hash_and_other_edits_change_it() {
        let c = cr("a", 1, json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let registry = ccm_builtin::registry();
        let refs = |doc: &str| match validate(&c, &found(doc.as_bytes()), &registry, &[]) {
            Validation::Valid(v) => v.cloud_config.unwrap(),
            other => panic!("{other:?}"),
        };
        let base = "instances: [{name: n1}]\nloadBalancer:\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let a = refs(base);
        let pools = refs(&base.replace("10.0.0.0/30", "10.0.0.0/29"));
        let inventory = refs(&base.replace("n1", "n2"));
        assert_ne!(a.hash, pools.hash);
        assert_eq!(a.restart_hash, pools.restart_hash, "a pool edit is reloaded, not rolled out");
        assert_ne!(a.restart_hash, inventory.restart_hash);
        // An invalid pool edit is refused before anything sees it.
        let bad = validate(&c, &found(base.replace("10.0.0.0/30", "10.0.0.1/30").as_bytes()), &registry, &[]);
        assert_eq!(reason_of(&bad), reason::CLOUD_CONFIG_REJECTED);
    }

    #[test]
    fn a_new_credentials_file_rolls_the_pods() {
        let cloud_config = json!({"secretRef": {"name": "cfg"}, "credentialsKey": "credentials"});
        let registry = ccm_builtin::registry();
        let aws = "[Global]\nRegion=us-east-1\nZone=us-east-1a\nKubernetesClusterID=c\n";
        for spec in [
            json!({"provider": "aws", "cloudConfig": cloud_config, "clusterCIDR": "10.244.0.0/16"}),
            json!({"provider": "aws", "upstream": {"profile": "aws"}, "cloudConfig": cloud_config}),
        ] {
            let c = cr("a", 1, spec);
            let refs = |credentials: &[u8]| match validate(
                &c,
                &found_with_credentials(aws.as_bytes(), credentials),
                &registry,
                &[],
            ) {
                Validation::Valid(v) => v.cloud_config.unwrap(),
                other => panic!("{other:?}"),
            };
            let (one, two) = (refs(b"[default]\naws_access_key_id=A"), refs(b"[default]\naws_access_key_id=B"));
            assert_eq!(one.extra_keys, ["credentials"]);
            assert_ne!(one.hash, two.hash);
            assert_ne!(one.restart_hash, two.restart_hash, "the SDK reads the file once: a new one restarts");
        }
        // A new CA bundle restarts too, beside the credentials.
        let c = cr(
            "a",
            1,
            json!({"provider": "aws", "upstream": {"profile": "aws"},
            "cloudConfig": {"secretRef": {"name": "cfg"}, "credentialsKey": "credentials", "caBundleKey": "ca.crt"}}),
        );
        let refs = |ca: &[u8]| {
            let secret = SecretState::Found {
                name: "cfg".into(),
                key: "cloud.conf".into(),
                data: aws.as_bytes().to_vec(),
                extra: vec![("credentials".into(), b"k".to_vec()), ("ca.crt".into(), ca.to_vec())],
            };
            match validate(&c, &secret, &registry, &[]) {
                Validation::Valid(v) => v.cloud_config.unwrap(),
                other => panic!("{other:?}"),
            }
        };
        let (one, two) = (refs(b"-----BEGIN CERTIFICATE-----1"), refs(b"-----BEGIN CERTIFICATE-----2"));
        assert_eq!(one.extra_keys, ["credentials", "ca.crt"]);
        assert_ne!(one.restart_hash, two.restart_hash);
    }

    #[test]
    fn valid_spec_with_secret_yields_the_config_hash() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let Validation::Valid(v) = validate(&c, &found(b"ok"), &registry(), &[]) else { panic!() };
        let refs = v.cloud_config.clone().unwrap();
        assert_eq!(refs.restart_hash, refs.hash, "a provider that reloads nothing restarts on any edit");
        assert_eq!(
            v.cloud_config.unwrap().hash,
            hash::cloud_config(c.metadata.uid.as_deref().unwrap_or_default(), "cloud.conf", b"ok")
        );
        assert!(!v.provider_has_routes);
        assert_eq!(v.config.controllers.enabled().len(), 4);
    }

    #[test]
    fn extra_args_in_embedded_mode_are_refused_naming_the_field() {
        let embedded = cr("a", 1, json!({"provider": "plain", "mode": "Embedded", "extraArgs": ["-v=4"]}));
        let v = validate(&embedded, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::EXTRA_ARGS_NOT_SUPPORTED);
        assert!(v.summary().unwrap().1.starts_with("spec.extraArgs"), "{v:?}");
        // Without extraArgs, or in a mode with a command line, the same spec is valid.
        let plain = cr("a", 1, json!({"provider": "plain", "mode": "Embedded"}));
        assert!(validate(&plain, &SecretState::NotReferenced, &registry(), &[]).is_valid());
        let deployment = cr("a", 1, json!({"provider": "plain", "mode": "Deployment", "extraArgs": ["-v=4"]}));
        let Validation::Valid(v) = validate(&deployment, &SecretState::NotReferenced, &registry(), &[]) else {
            panic!("extraArgs are a Deployment's")
        };
        assert_eq!(v.config.to_args().last().map(String::as_str), Some("-v=4"));
    }

    #[test]
    fn unknown_provider_lists_the_known_ones() {
        let c = cr("a", 1, json!({"provider": "nimbus"}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::UNKNOWN_PROVIDER);
        assert!(v.summary().unwrap().1.contains("known providers: plain, routed"), "{v:?}");
    }

    #[test]
    fn missing_secret_and_missing_key_have_their_own_reasons() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v = validate(&c, &SecretState::NotFound { name: "cfg".into() }, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::SECRET_NOT_FOUND);
        let v =
            validate(&c, &SecretState::KeyNotFound { name: "cfg".into(), key: "cloud.conf".into() }, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::SECRET_KEY_NOT_FOUND);
        assert!(v.summary().unwrap().1.contains("\"cloud.conf\""));
    }

    #[test]
    fn unreadable_secret_is_unknown_not_invalid() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v = validate(&c, &SecretState::Unreadable { name: "cfg".into(), error: "503".into() }, &registry(), &[]);
        assert!(matches!(v, Validation::Unknown(ref f) if f.reason == reason::SECRET_UNREADABLE));
    }

    #[test]
    fn parser_rejection_carries_the_parser_message() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v = validate(&c, &found(b"bad config"), &registry(), &[]);
        assert_eq!(reason_of(&v), reason::CLOUD_CONFIG_REJECTED);
        assert!(v.summary().unwrap().1.contains("line 1: expected key = value"));
    }

    #[test]
    fn routes_capable_provider_needs_a_cluster_cidr() {
        let c = cr("a", 1, json!({"provider": "routed"}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::CLUSTER_CIDR_REQUIRED);
        for spec in [
            json!({"provider": "routed", "clusterCIDR": "10.244.0.0/16"}),
            json!({"provider": "routed", "configureCloudRoutes": false}),
            json!({"provider": "routed", "controllers": ["*", "-route"]}),
            json!({"provider": "plain"}),
        ] {
            let c = cr("a", 1, spec.clone());
            assert!(validate(&c, &SecretState::NotReferenced, &registry(), &[]).is_valid(), "{spec}");
        }
    }

    #[test]
    fn lease_timings_the_manager_refuses_are_invalid_spec() {
        let c = cr(
            "a",
            1,
            json!({"provider": "plain", "leaderElection": {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "9s"}}),
        );
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::INVALID_SPEC);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection"), "{v:?}");
    }

    #[test]
    fn spec_breaking_crd_rules_is_invalid_spec() {
        let c = cr("a", 1, json!({"provider": "plain", "concurrency": {"nodeSyncs": 0}}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::INVALID_SPEC);
        assert!(v.summary().unwrap().1.contains("spec.concurrency.nodeSyncs"));
    }

    #[test]
    fn handle_unclassed_services_without_a_class_is_refused_naming_the_field() {
        let c = cr("a", 1, json!({"provider": "plain", "handleUnclassedServices": true}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert!(v.summary().unwrap().1.starts_with("invalid spec: spec.handleUnclassedServices: "), "{v:?}");
    }

    #[test]
    fn the_factory_runs_once_per_validation_and_a_valid_verdict_brings_the_provider_it_built() {
        let runs = Arc::new(AtomicUsize::new(0));
        let registry = counting_registry(runs.clone());
        let c = cr("a", 1, json!({"provider": "counted", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let controllers = ControllerSelection::parse(&c.spec.controllers);
        let checked = check(&c, &controllers, &found(b"ok"), &registry, &[]);
        assert!(checked.validation.is_valid(), "{checked:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(checked.provider.as_ref().map(|p| p.name()), Some("plain"), "the provider it built");
        // A verdict refused before the factory builds nothing.
        let missing = check(&c, &controllers, &SecretState::NotFound { name: "cfg".into() }, &registry, &[]);
        assert!(!missing.validation.is_valid() && missing.provider.is_none());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
