//! Upstream CCM profiles (pure data): what each cloud's own cloud-controller-manager image
//! needs to run from a `CloudControllerManager` with `spec.upstream` (docs/profiles/).
//!
//! Every profile's manager is a `k8s.io/cloud-provider` app, so it takes upstream's flags; the
//! operator renders them from the same validated [`ManagerConfig`] as for the Rust manager
//! ([`upstream_args`]), and a profile adds its image, command, `--cloud-provider` name and how
//! the cloud config reaches it.

use ccm_framework::config::ManagerConfig;
use crds::controllers::{Controller, ControllerSelection};
use crds::v1alpha1::{UpstreamManager, UpstreamProfile};

/// How a profile's manager gets the cloud config named by `spec.cloudConfig.secretRef`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudConfigUse {
    /// A file, mounted as for the Rust manager and named by `--cloud-config`; `format` is what
    /// the manager parses (documentation only: the operator never reads it).
    File {
        /// The file's format, as the upstream project documents it.
        format: &'static str,
    },
    /// An environment variable filled from the Secret's key (`secretKeyRef`); no file.
    Env {
        /// The variable the manager reads its credentials from.
        var: &'static str,
    },
}

/// A profile's per-node manager: a DaemonSet that initializes each Node from the cloud's
/// instance metadata in place of the CCM's cloud-node controller (Azure's cloud-node-manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeManagerProfile {
    /// The published image run when `spec.upstream.nodeManager.image` is unset.
    pub image: &'static str,
    /// The container command (the chart's admission policy admits exactly these).
    pub command: &'static [&'static str],
}

/// One upstream CCM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// `spec.upstream.profile`.
    pub profile: UpstreamProfile,
    /// The name its manager registers (`--cloud-provider`); `spec.provider` must equal it.
    /// Empty for `generic`: any name.
    pub cloud_provider: &'static str,
    /// The published image run when `spec.deployment.image` is unset (the project's release for
    /// Kubernetes 1.36, else its newest); empty for `generic`, which needs one.
    pub image: &'static str,
    /// The container command; empty: the image's entrypoint.
    pub command: &'static [&'static str],
    /// Flags of its own after the rendered upstream ones, before `spec.extraArgs`.
    pub args: &'static [&'static str],
    /// How the cloud config reaches it.
    pub cloud_config: CloudConfigUse,
    /// The only `--concurrent-service-syncs` its manager accepts, rendered whatever
    /// `spec.concurrency.serviceSyncs` says.
    pub service_syncs: Option<i32>,
    /// Upstream flags its own copy of the manager app lacks: not rendered.
    pub omit: &'static [&'static str],
    /// Leases its cloud code locks besides leader election, granted by name in the resource's
    /// namespace, which must then be [`Self::namespace`].
    pub leases: &'static [&'static str],
    /// The namespace the resource must be in, when its code looks for something there.
    pub namespace: Option<&'static str>,
    /// Why it cannot run as a Pod the operator manages, if it cannot.
    pub refused: Option<&'static str>,
    /// Its per-node manager, if its project runs one beside the CCM.
    pub node_manager: Option<NodeManagerProfile>,
}

const INI: CloudConfigUse = CloudConfigUse::File { format: "INI (gcfg)" };

/// A profile with no particular needs.
const BASE: Profile = Profile {
    profile: UpstreamProfile::Generic,
    cloud_provider: "",
    image: "",
    command: &[],
    args: &[],
    cloud_config: INI,
    service_syncs: None,
    omit: &[],
    leases: &[],
    namespace: None,
    refused: None,
    node_manager: None,
};

/// Every profile, in [`UpstreamProfile::ALL`]'s order (sources: docs/profiles/).
pub const PROFILES: [Profile; 10] = [
    Profile {
        profile: UpstreamProfile::Aws,
        cloud_provider: "aws",
        image: "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.1",
        command: &["/bin/aws-cloud-controller-manager"],
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Gcp,
        cloud_provider: "gce",
        image: "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v36.3.8",
        command: &["/cloud-controller-manager"],
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Azure,
        cloud_provider: "azure",
        image: "mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager:v1.36.5",
        command: &["cloud-controller-manager"],
        cloud_config: CloudConfigUse::File { format: "JSON or YAML (azure.json)" },
        // Its controller-manager refuses to start with more than one service worker.
        service_syncs: Some(1),
        omit: &["--concurrent-node-syncs"],
        // Its load-balancer code serialises cloud changes on this Lease in kube-system.
        leases: &["aks-managed-resource-locker"],
        namespace: Some("kube-system"),
        // Its Nodes are initialized from each VM's instance metadata by this DaemonSet, as the
        // project's manifests and Helm chart deploy it.
        node_manager: Some(NodeManagerProfile {
            image: "mcr.microsoft.com/oss/kubernetes/azure-cloud-node-manager:v1.36.5",
            command: &["cloud-node-manager"],
        }),
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Openstack,
        cloud_provider: "openstack",
        image: "registry.k8s.io/provider-os/openstack-cloud-controller-manager:v1.36.0",
        // The image sets only CMD, no entrypoint.
        command: &["/bin/openstack-cloud-controller-manager"],
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Hetzner,
        cloud_provider: "hcloud",
        image: "docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.35.0",
        command: &["/bin/hcloud-cloud-controller-manager"],
        // Hetzner's clusters carry no cluster tag.
        args: &["--allow-untagged-cloud"],
        cloud_config: CloudConfigUse::Env { var: "HCLOUD_TOKEN" },
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Vsphere,
        cloud_provider: "vsphere",
        image: "registry.k8s.io/cloud-pv-vsphere/cloud-provider-vsphere:v1.36.0",
        command: &["/bin/vsphere-cloud-controller-manager"],
        cloud_config: CloudConfigUse::File { format: "YAML (vsphere.conf; INI accepted)" },
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Digitalocean,
        cloud_provider: "digitalocean",
        image: "docker.io/digitalocean/digitalocean-cloud-controller-manager:v0.1.68",
        command: &["/bin/digitalocean-cloud-controller-manager"],
        cloud_config: CloudConfigUse::Env { var: "DO_ACCESS_TOKEN" },
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Oracle,
        cloud_provider: "oci",
        image: "ghcr.io/oracle/cloud-provider-oci:v1.35.0",
        // The image holds several binaries and no entrypoint.
        command: &["/usr/local/bin/oci-cloud-controller-manager"],
        cloud_config: CloudConfigUse::File { format: "YAML (cloud-provider.yaml)" },
        ..BASE
    },
    Profile {
        profile: UpstreamProfile::Kind,
        cloud_provider: "kind",
        image: "registry.k8s.io/cloud-provider-kind/cloud-controller-manager:v0.11.1",
        refused: Some(
            "cloud-provider-kind drives kind's Node containers through the host's container runtime socket, which the operator's Pods never mount, and takes none of k8s.io/cloud-provider's flags; run it beside kind on the host (docs/profiles/kind.md)",
        ),
        ..BASE
    },
    BASE,
];

/// The profile of `p`.
pub fn profile(p: UpstreamProfile) -> &'static Profile {
    // PROFILES lists every variant in ALL's order (test below), so the index is in bounds.
    let index = UpstreamProfile::ALL.iter().position(|x| *x == p).unwrap_or(UpstreamProfile::ALL.len() - 1);
    &PROFILES[index]
}

/// The flag that stops an upstream manager reading kube-system's
/// `extension-apiserver-authentication` ConfigMap at start: bearer tokens are still checked by
/// TokenReview, so it needs no right in kube-system and accepts no front-proxy identity.
pub const SKIP_AUTHENTICATION_LOOKUP: &str = "--authentication-skip-lookup=true";

/// This project's flags that `ManagerConfig` always renders and `k8s.io/cloud-provider` lacks
/// (validation refuses a resource whose value for them would matter).
pub const NOT_UPSTREAM: [&str; 1] = ["--concurrent-route-syncs"];

/// Flags of `spec.extraArgs`'s allow-list that only this project's manager has (an upstream
/// manager exits at start on an unknown flag), refused with `spec.upstream`.
pub const NOT_UPSTREAM_EXTRA_ARGS: [&str; 2] = ["--node-batch-size", "--node-batch-window"];

/// Whether `spec.upstream` runs its profile's node manager: the profile has one, the resource
/// did not turn it off, and its controllers include cloud-node (which the node manager then
/// runs instead of the CCM).
pub fn runs_node_manager(upstream: &UpstreamManager, controllers: &ControllerSelection) -> bool {
    profile(upstream.profile).node_manager.is_some()
        && upstream.node_manager.as_ref().is_none_or(|n| n.enabled)
        && controllers.is_enabled(Controller::CloudNode)
}

/// The node manager `cr` runs and its image (`spec.upstream.nodeManager.image`, else the
/// profile's), with the field that names the image for messages; `None` when it runs none.
pub fn node_manager_of(cr: &crds::CloudControllerManager) -> Option<(&'static NodeManagerProfile, String, String)> {
    let upstream = cr.spec.upstream.as_ref()?;
    let controllers = ControllerSelection::parse(&cr.spec.controllers).ok()?;
    if !runs_node_manager(upstream, &controllers) {
        return None;
    }
    let node_manager = profile(upstream.profile).node_manager.as_ref()?;
    Some(match upstream.node_manager.as_ref().and_then(|n| n.image.clone()) {
        Some(image) => (node_manager, image, "spec.upstream.nodeManager.image".to_string()),
        None => (
            node_manager,
            node_manager.image.to_string(),
            format!("spec.upstream.profile {}'s node-manager image {}", upstream.profile.as_str(), node_manager.image),
        ),
    })
}

/// `controllers` without cloud-node, for a CCM beside its node manager: an entry naming it is
/// dropped and, when `*` enables it, `-cloud-node-controller` added (upstream's manifests run
/// Azure's CCM with `--controllers=*,-cloud-node`).
pub fn without_cloud_node(controllers: &ControllerSelection) -> ControllerSelection {
    let name = Controller::CloudNode.name();
    let mut entries: Vec<String> = controllers.entries().iter().filter(|e| *e != name).cloned().collect();
    if entries.iter().any(|e| e == "*") && !entries.iter().any(|e| e.strip_prefix('-') == Some(name)) {
        entries.push(format!("-{name}"));
    }
    // Every entry came from a valid selection, so the parse cannot fail; keep the input if it did.
    ControllerSelection::parse(&entries).unwrap_or_else(|_| controllers.clone())
}

/// The upstream manager's arguments: `config`'s upstream flags (validation keeps this project's
/// own flags out of an upstream resource's config; [`NOT_UPSTREAM`] and the profile's `omit`
/// are dropped), with `--cloud-config` only for a file profile and the profile's fixed service
/// workers, then `bind` (the Pod address), the lookup skip, the profile's own flags and
/// `spec.extraArgs` last. With its node manager (`node_manager`), without cloud-node.
pub fn upstream_args(config: &ManagerConfig, profile: &Profile, bind: &str, node_manager: bool) -> Vec<String> {
    let mut args = if node_manager {
        ManagerConfig { controllers: without_cloud_node(&config.controllers), ..config.clone() }.to_args()
    } else {
        config.to_args()
    };
    let extra = config.extra_args.len().min(args.len());
    let extra_args = args.split_off(args.len() - extra);
    let env = matches!(profile.cloud_config, CloudConfigUse::Env { .. });
    args.retain(|a| {
        let flag = a.split('=').next().unwrap_or_default();
        !(NOT_UPSTREAM.contains(&flag) || profile.omit.contains(&flag) || (env && flag == "--cloud-config"))
    });
    if let Some(n) = profile.service_syncs {
        for a in args.iter_mut().filter(|a| a.starts_with("--concurrent-service-syncs=")) {
            *a = format!("--concurrent-service-syncs={n}");
        }
    }
    args.push(bind.to_string());
    args.push(SKIP_AUTHENTICATION_LOOKUP.to_string());
    args.extend(profile.args.iter().map(|a| a.to_string()));
    args.extend(extra_args);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_is_listed_once_in_the_order_of_the_enum() {
        for (p, listed) in UpstreamProfile::ALL.iter().zip(PROFILES.iter()) {
            assert_eq!(*p, listed.profile);
            assert_eq!(profile(*p).profile, *p);
        }
    }

    #[test]
    fn a_profile_with_fixed_service_workers_renders_them_whatever_the_spec_says() {
        let mut config = ManagerConfig { concurrent_service_syncs: 32, ..ManagerConfig::default() };
        config.extra_args = vec!["--v=2".into()];
        let args = upstream_args(&config, profile(UpstreamProfile::Azure), "--bind-address=$(POD_IP)", false);
        assert!(args.contains(&"--concurrent-service-syncs=1".to_string()), "{args:?}");
        assert!(!args.iter().any(|a| a == "--concurrent-service-syncs=32"));
        assert!(!args.iter().any(|a| a.starts_with("--concurrent-node-syncs=")), "Azure's app has no such flag");
        assert!(!args.iter().any(|a| a.starts_with("--concurrent-route-syncs=")), "no upstream app has");
        assert_eq!(args.last().map(String::as_str), Some("--v=2"), "extraArgs stay last");
        let aws = upstream_args(&config, profile(UpstreamProfile::Aws), "--bind-address=$(POD_IP)", false);
        assert!(aws.contains(&"--concurrent-service-syncs=32".to_string()));
    }

    #[test]
    fn the_charts_upstream_commands_are_the_profiles() {
        let helpers = include_str!("../../charts/ccm-operator/templates/_helpers.tpl");
        let start = helpers.find("define \"ccm-operator.upstreamCommands\"").expect("the define");
        let list = helpers[start..].lines().nth(1).unwrap_or_default();
        let rendered: Vec<String> = PROFILES
            .iter()
            .filter(|p| p.refused.is_none() && !p.command.is_empty())
            .map(|p| format!("[{}]", p.command.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", ")))
            .collect();
        assert_eq!(list, format!("[{}]", rendered.join(", ")));
    }

    #[test]
    fn a_ccm_beside_its_node_manager_runs_every_controller_it_would_but_cloud_node() {
        for (entries, expected) in [
            (vec!["*"], "*,-cloud-node-controller"),
            (vec!["cloud-node", "service"], "service-lb-controller"),
            (vec!["*", "-route"], "*,-node-route-controller,-cloud-node-controller"),
            (vec!["*", "-cloud-node"], "*,-cloud-node-controller"),
        ] {
            let selection = ControllerSelection::parse(&entries).unwrap();
            let without = without_cloud_node(&selection);
            assert_eq!(without.to_string(), expected, "{entries:?}");
            assert!(!without.is_enabled(Controller::CloudNode));
            for c in [Controller::CloudNodeLifecycle, Controller::ServiceLb, Controller::NodeRoute] {
                assert_eq!(without.is_enabled(c), selection.is_enabled(c), "{entries:?} {c}");
            }
        }
    }

    #[test]
    fn the_charts_node_manager_commands_are_the_profiles() {
        let helpers = include_str!("../../charts/ccm-operator/templates/_helpers.tpl");
        let start = helpers.find("define \"ccm-operator.nodeManagerCommands\"").expect("the define");
        let list = helpers[start..].lines().nth(1).unwrap_or_default();
        let rendered: Vec<String> = PROFILES
            .iter()
            .filter_map(|p| p.node_manager)
            .map(|n| format!("[{}]", n.command.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", ")))
            .collect();
        assert_eq!(list, format!("[{}]", rendered.join(", ")));
    }

    #[test]
    fn every_runnable_profile_but_generic_names_its_provider_image_and_a_pinned_tag() {
        for p in PROFILES.iter().filter(|p| p.profile != UpstreamProfile::Generic) {
            assert!(!p.cloud_provider.is_empty(), "{:?}", p.profile);
            let last = p.image.rsplit('/').next().unwrap_or_default();
            let tag = last.split_once(':').map(|(_, t)| t).unwrap_or_default();
            assert!(!tag.is_empty() && tag != "latest", "{:?}: {}", p.profile, p.image);
        }
        let generic = profile(UpstreamProfile::Generic);
        assert!(generic.image.is_empty() && generic.command.is_empty() && generic.cloud_provider.is_empty());
    }
}
