//! Build (pure): an upstream profile's per-node manager (`spec.upstream.nodeManager`, Azure's
//! cloud-node-manager, docs/profiles/azure.md): its ServiceAccount, its binding to the chart's
//! node-manager ClusterRole, and a DaemonSet on every Linux Node, as the profile's project
//! deploys it (host network, every taint tolerated, `system-node-critical`), hardened like the
//! manager's pods. While it runs, the CCM's `--controllers` leaves cloud-node out
//! ([`crate::profiles::upstream_args`]).
//!
//! Its pods carry `app.kubernetes.io/name=ccm-node-manager`, so they never count as manager pods
//! in the resource's status, and the chart's admission policy admits only a profile's
//! node-manager command in them.

use std::collections::BTreeMap;

use crds::CloudControllerManager;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, ServiceAccount, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::desired::{self, BuildSettings, Desired};
use crate::names;
use crate::profiles::NodeManagerProfile;
use crate::validate::Validated;

/// The node-manager container's name.
pub const CONTAINER: &str = "cloud-node-manager";
/// Its uid: not root (it reads instance metadata over HTTP and writes nothing locally).
pub const NON_ROOT_UID: i64 = 65532;
/// Its priority class, as its project deploys it: a Node's own agent.
pub const PRIORITY_CLASS: &str = "system-node-critical";

/// The node-manager objects of `cr`: empty unless it runs one
/// ([`crate::profiles::node_manager_of`]). `labels` and `owner` are the resource's child labels
/// and ownerReference (every object is pruned and adopted like the manager's).
pub fn build(
    cr: &CloudControllerManager,
    validated: &Validated,
    settings: &BuildSettings,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> Vec<Desired> {
    let Some((profile, image, _)) = crate::profiles::node_manager_of(cr) else { return Vec::new() };
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    let uid = cr.uid().unwrap_or_default();
    let object = names::node_manager_name(&name);
    let (meta, subject) = desired::agent_identity(&ns, &object, labels, owner);
    // It waits for its Node's route before removing the taint only when the CCM programs routes.
    let wait_routes = validated.config.configure_cloud_routes
        && validated.config.controllers.is_enabled(crds::controllers::Controller::NodeRoute);
    let template = pod_template(cr, profile, image, wait_routes, &uid, &object);
    vec![
        Desired::ServiceAccount(ServiceAccount { metadata: meta.clone(), ..Default::default() }),
        // Nodes and their status, cluster-wide.
        desired::owned_cluster_role_binding(
            names::node_manager_cluster_role_binding_name(&ns, &name),
            labels,
            (&ns, &name),
            &settings.node_manager_cluster_role,
            subject,
        ),
        // A Node initialized stays so while its pod restarts: a tenth of them at once.
        desired::node_daemon_set(
            meta,
            names::node_manager_selector_labels(&uid),
            template,
            IntOrString::String("10%".into()),
        ),
    ]
}

fn pod_template(
    cr: &CloudControllerManager,
    profile: &NodeManagerProfile,
    image: String,
    wait_routes: bool,
    uid: &str,
    service_account: &str,
) -> PodTemplateSpec {
    let mut labels = names::node_manager_selector_labels(uid);
    labels.insert(names::LABEL_MANAGED_BY.to_string(), names::MANAGED_BY.to_string());
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image),
        image_pull_policy: cr.spec.deployment.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(profile.command.iter().map(|c| c.to_string()).collect()),
        args: Some(vec!["--node-name=$(NODE_NAME)".into(), format!("--wait-routes={wait_routes}")]),
        env: Some(vec![EnvVar {
            name: "NODE_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".into()),
                    field_path: "spec.nodeName".into(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        // Its project's requests and memory limit.
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".into())),
                ("memory".to_string(), Quantity("50Mi".into())),
            ])),
            limits: Some(BTreeMap::from([("memory".to_string(), Quantity("512Mi".into()))])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            privileged: Some(false),
            run_as_user: Some(NON_ROOT_UID),
            run_as_group: Some(NON_ROOT_UID),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
        spec: Some(PodSpec {
            service_account_name: Some(service_account.into()),
            automount_service_account_token: Some(true),
            enable_service_links: Some(false),
            // Its project runs it on the host network: the instance metadata it reads must
            // describe the Node's own VM, and it must run before the pod network does.
            host_network: Some(true),
            dns_policy: Some("ClusterFirstWithHostNet".into()),
            priority_class_name: Some(PRIORITY_CLASS.into()),
            node_selector: Some(BTreeMap::from([("kubernetes.io/os".to_string(), "linux".to_string())])),
            // Every Node is initialized, tainted or not (the uninitialized taint first of all).
            tolerations: Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
                ..Default::default()
            }),
            containers: vec![container],
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{self, Kind};
    use crate::validate;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use serde_json::json;
    use testkit::Meta;

    /// An Azure resource `kube-system/azure` (uid `uid-9`) with `extra` merged into its spec.
    fn azure(extra: serde_json::Value) -> CloudControllerManager {
        let mut spec = json!({"provider": "azure", "upstream": {"profile": "azure"},
            "cloudConfig": {"secretRef": {"name": "cfg", "key": "azure.json"}}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        testkit::cr("kube-system", "azure", spec).with_uid("uid-9")
    }

    fn validated(cr: &CloudControllerManager) -> Validated {
        Validated {
            config: validate::manager_config(cr, Some("azure.json")).unwrap(),
            cloud_config: None,
            provider_has_routes: false,
        }
    }

    fn built(cr: &CloudControllerManager) -> Vec<Desired> {
        build::build(cr, &validated(cr), &BuildSettings::default())
    }

    fn daemon_set<'a>(objs: &'a [Desired], name: &str) -> Option<&'a DaemonSet> {
        objs.iter().find_map(|o| match o {
            Desired::DaemonSet(d) if d.metadata.name.as_deref() == Some(name) => Some(d),
            _ => None,
        })
    }

    fn manager_args(objs: &[Desired]) -> Vec<String> {
        let ds = objs.iter().find_map(|o| match o {
            Desired::Deployment(d) => Some(d),
            _ => None,
        });
        let pod = ds.and_then(|d| d.spec.as_ref()).and_then(|s| s.template.spec.as_ref()).expect("the CCM's pod");
        pod.containers[0].args.clone().unwrap_or_default()
    }

    #[test]
    fn azure_runs_cloud_node_manager_on_every_linux_node_and_its_ccm_leaves_cloud_node_out() {
        let c = azure(json!({}));
        let objs = built(&c);
        let ds = daemon_set(&objs, "ccm-azure-node-manager").expect("the node-manager DaemonSet");
        let template = &ds.spec.as_ref().unwrap().template;
        let pod = template.spec.as_ref().unwrap();
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("mcr.microsoft.com/oss/kubernetes/azure-cloud-node-manager:v1.36.5")
        );
        assert_eq!(container.command.as_deref(), Some(&["cloud-node-manager".to_string()][..]));
        assert_eq!(
            container.args.as_deref(),
            Some(&["--node-name=$(NODE_NAME)".to_string(), "--wait-routes=true".to_string()][..]),
            "routes are configured by default, as upstream's"
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("ccm-azure-node-manager"));
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(pod.priority_class_name.as_deref(), Some(PRIORITY_CLASS));
        assert_eq!(
            build::restricted_violations(pod),
            vec!["hostNetwork=true".to_string()],
            "restricted but the host network"
        );
        let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        assert_eq!(labels[names::LABEL_NAME], names::NODE_MANAGER_APP_NAME);
        assert!(!names::is_manager_pod(&labels), "never counted as a manager pod");
        assert_eq!(ds.spec.as_ref().unwrap().selector.match_labels, Some(names::node_manager_selector_labels("uid-9")));

        let binding = objs
            .iter()
            .find_map(|o| match o {
                Desired::ClusterRoleBinding(b) if o.name() == "ccm-operator:kube-system:azure:node-manager" => Some(b),
                _ => None,
            })
            .expect("the node manager's ClusterRoleBinding");
        assert_eq!(binding.role_ref.name, BuildSettings::default().node_manager_cluster_role);
        let subjects = binding.subjects.clone().unwrap_or_default();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
            ("ccm-azure-node-manager", Some("kube-system"))
        );
        for o in objs.iter().filter(|o| o.name().contains("node-manager")) {
            assert_eq!(
                build::binding_overreach(o, "kube-system", "azure", None, &BuildSettings::default()),
                None,
                "{}",
                o.name()
            );
        }
        assert!(objs.iter().any(|o| o.kind() == Kind::ServiceAccount && o.name() == "ccm-azure-node-manager"));
        // The node managers' role is for their account alone.
        let mut to_manager = binding.clone();
        to_manager.subjects.get_or_insert_default()[0].name = "ccm-azure".into();
        let why = build::binding_overreach(
            &Desired::ClusterRoleBinding(to_manager),
            "kube-system",
            "azure",
            None,
            &BuildSettings::default(),
        );
        assert!(
            why.is_some_and(|w| w.contains("subjects other than ServiceAccount kube-system/ccm-azure-node-manager"))
        );

        let args = manager_args(&objs);
        assert!(args.contains(&"--controllers=*,-cloud-node-controller".to_string()), "{args:?}");
    }

    #[test]
    fn the_node_manager_waits_for_routes_only_when_the_ccm_programs_them() {
        for (extra, wait) in [
            (json!({}), true),
            (json!({"configureCloudRoutes": false}), false),
            (json!({"controllers": ["*", "-route"]}), false),
        ] {
            let c = azure(extra.clone());
            let objs = built(&c);
            let ds = daemon_set(&objs, "ccm-azure-node-manager").expect("the node-manager DaemonSet");
            let args = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|p| p.containers[0].args.clone());
            assert!(
                args.flatten().unwrap_or_default().contains(&format!("--wait-routes={wait}")),
                "{extra}: --wait-routes={wait}"
            );
        }
    }

    #[test]
    fn turned_off_or_without_cloud_node_no_node_manager_runs_and_the_ccm_keeps_its_controllers() {
        for extra in [
            json!({"upstream": {"profile": "azure", "nodeManager": {"enabled": false}}}),
            json!({"controllers": ["*", "-cloud-node"]}),
            json!({"controllers": ["service", "route"]}),
        ] {
            let c = azure(extra.clone());
            let objs = built(&c);
            assert!(
                objs.iter().all(|o| !o.name().contains("node-manager")),
                "{extra}: {:?}",
                objs.iter().map(|o| o.name()).collect::<Vec<_>>()
            );
            let args = manager_args(&objs);
            let controllers = args.iter().find(|a| a.starts_with("--controllers=")).cloned().unwrap_or_default();
            assert_eq!(controllers, format!("--controllers={}", validated(&c).config.controllers), "{extra}");
        }
    }

    #[test]
    fn a_named_image_replaces_the_profiles_and_a_changed_one_rolls_the_daemonset() {
        let image = "registry.example/azure-cloud-node-manager:v1.36.4";
        let named = azure(json!({"upstream": {"profile": "azure", "nodeManager": {"image": image}}}));
        let objs = built(&named);
        let ds = daemon_set(&objs, "ccm-azure-node-manager").unwrap();
        let container = &ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some(image));
        let hash_of =
            |d: &DaemonSet| d.metadata.annotations.clone().unwrap_or_default()[names::ANNOTATION_TEMPLATE_HASH].clone();
        let default = built(&azure(json!({})));
        assert_ne!(hash_of(ds), hash_of(daemon_set(&default, "ccm-azure-node-manager").unwrap()));
    }

    #[test]
    fn other_profiles_and_the_rust_manager_run_no_node_manager() {
        for spec in [json!({"provider": "aws", "upstream": {"profile": "aws"}}), json!({"provider": "fake"})] {
            let c = testkit::cr("kube-system", "x", spec.clone()).with_uid("u");
            let objs = build::build(
                &c,
                &Validated {
                    config: validate::manager_config(&c, None).unwrap(),
                    cloud_config: None,
                    provider_has_routes: false,
                },
                &BuildSettings::default(),
            );
            assert!(objs.iter().all(|o| !o.name().contains("node-manager")), "{spec}");
        }
    }
}
