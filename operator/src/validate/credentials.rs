//! `spec.cloudConfig.credentialsKey` (pure): which managers read credentials from a file, and
//! through which variable; elsewhere the key is refused naming the field.

use crds::v1alpha1::UpstreamProfile;
use crds::{CloudControllerManager, CloudControllerManagerSpec, Mode};

use super::verdict::Failure;
use crds::reasons::config_valid as reason;

/// The variable the SDK of `spec`'s manager reads a credentials file's path from: the AWS SDKs'
/// shared credentials file (this project's `aws` provider and upstream's `aws` image), Google's
/// application default credentials (the `gcp` image). `None` where credentials belong in the
/// cloud-config itself (Azure, OpenStack, vSphere), in a token variable (Hetzner,
/// DigitalOcean), or where no file can be mounted (Embedded).
pub fn credentials_file_env(spec: &CloudControllerManagerSpec) -> Option<&'static str> {
    if spec.mode == Mode::Embedded {
        return None;
    }
    match spec.upstream.as_ref().map(|u| u.profile) {
        None if spec.provider == "aws" => Some("AWS_SHARED_CREDENTIALS_FILE"),
        Some(UpstreamProfile::Aws) => Some("AWS_SHARED_CREDENTIALS_FILE"),
        Some(UpstreamProfile::Gcp) => Some("GOOGLE_APPLICATION_CREDENTIALS"),
        _ => None,
    }
}

/// Why `spec.cloudConfig.credentialsKey` or `caBundleKey` cannot be used, if one cannot.
pub fn credentials_refused(cr: &CloudControllerManager) -> Option<Failure> {
    let spec = &cr.spec;
    let source = spec.cloud_config.as_ref()?;
    if source.ca_bundle_key.is_some() && spec.mode == Mode::Embedded {
        return Some(Failure {
            reason: reason::INVALID_SPEC,
            message: "spec.cloudConfig.caBundleKey: Embedded mode runs the provider inside the operator, whose trusted CAs are its own; use mode Deployment or DaemonSet".into(),
        });
    }
    source.credentials_key.as_ref()?;
    if credentials_file_env(spec).is_some() {
        return None;
    }
    let why = if spec.mode == Mode::Embedded {
        "Embedded mode runs the provider inside the operator, where no credentials file is mounted; use mode Deployment or DaemonSet, or the SDK's other sources".to_string()
    } else {
        let manager = match &spec.upstream {
            Some(u) => format!("the {} profile's manager", u.profile.as_str()),
            None => format!("provider {:?}", spec.provider),
        };
        format!(
            "{manager} reads no credentials file (only aws and the gcp profile do); put its credentials where its cloud-config says"
        )
    };
    Some(Failure { reason: reason::INVALID_SPEC, message: format!("spec.cloudConfig.credentialsKey: {why}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::testing::cr;
    use serde_json::json;

    fn with_key(spec: serde_json::Value) -> CloudControllerManager {
        let mut spec = spec;
        spec["cloudConfig"] =
            json!({"secretRef": {"name": "cfg", "key": "cloud.conf"}, "credentialsKey": "credentials"});
        cr("a", 1, spec)
    }

    #[test]
    fn aws_managers_rust_or_upstream_read_the_shared_credentials_file() {
        for spec in [json!({"provider": "aws"}), json!({"provider": "aws", "upstream": {"profile": "aws"}})] {
            let c = with_key(spec);
            assert_eq!(credentials_file_env(&c.spec), Some("AWS_SHARED_CREDENTIALS_FILE"));
            assert_eq!(credentials_refused(&c), None);
        }
        let gcp = with_key(json!({"provider": "gce", "upstream": {"profile": "gcp"}}));
        assert_eq!(credentials_file_env(&gcp.spec), Some("GOOGLE_APPLICATION_CREDENTIALS"));
    }

    #[test]
    fn a_credentials_key_where_no_file_is_read_is_refused_naming_the_field() {
        for spec in [
            json!({"provider": "baremetal"}),
            json!({"provider": "hcloud", "upstream": {"profile": "hetzner"}}),
            json!({"provider": "aws", "mode": "Embedded"}),
        ] {
            let failure = credentials_refused(&with_key(spec.clone())).unwrap_or_else(|| panic!("{spec} accepted"));
            assert_eq!(failure.reason, reason::INVALID_SPEC);
            assert!(failure.message.starts_with("spec.cloudConfig.credentialsKey: "), "{}", failure.message);
        }
        // A CA bundle is for every manager but the embedded engine.
        let mut embedded = cr("a", 1, json!({"provider": "baremetal", "mode": "Embedded"}));
        embedded.spec.cloud_config =
            Some(serde_json::from_value(json!({"secretRef": {"name": "cfg"}, "caBundleKey": "ca.crt"})).unwrap());
        let failure = credentials_refused(&embedded).expect("refused in Embedded mode");
        assert!(failure.message.starts_with("spec.cloudConfig.caBundleKey: "), "{}", failure.message);
        embedded.spec.mode = Mode::Deployment;
        assert_eq!(credentials_refused(&embedded), None);
        // Without the key nothing is refused.
        assert_eq!(credentials_refused(&cr("a", 1, json!({"provider": "baremetal"}))), None);
    }
}
