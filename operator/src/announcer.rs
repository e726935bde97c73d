//! Build (pure): the per-node announcer of `spec.announcer` (docs/l2-announcement.md): its
//! ServiceAccount, its bindings to the chart's two announcer ClusterRoles, and a DaemonSet
//! running `cloud-controller-manager announce` on the host network, with `NET_RAW` only when it
//! answers ARP/NDP and a BIRD sidecar when it speaks BGP (no capability; `NET_RAW` as root with
//! `bfd`; a graceful `preStop` and `-R` with `gracefulRestart`).
//!
//! Its pods carry `app.kubernetes.io/name=ccm-announcer`, so they never count as manager pods in
//! the resource's status, and the chart's admission policy grants `NET_RAW` to them alone.

use std::collections::BTreeMap;

use ccm_provider_baremetal::deploy::{ANNOUNCER_SUBCOMMAND, BIRD_CONFIG_PATH, BIRD_SOCKET_PATH, NODE_IP_ENV};
use crds::CloudControllerManager;
use crds::v1alpha1::Announcer;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, Lifecycle,
    LifecycleHandler, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, ServiceAccount, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::desired::{self, BuildSettings, Desired};
use crate::names;
use crate::validate::Validated;

/// The announcer container's name.
pub const ANNOUNCER_CONTAINER: &str = "announcer";
/// The BIRD sidecar's name.
pub const BIRD_CONTAINER: &str = "bird";
/// The volume BIRD and the announcer share: the config file and the control socket.
pub const BIRD_VOLUME: &str = "bird";
/// Where that volume is mounted in both containers (the announcer's BIRD defaults live there).
pub const BIRD_DIR: &str = "/run/bird";
/// The uid of an announcer without `l2`: the image's non-root user.
pub const NON_ROOT_UID: i64 = 65532;
/// The name of the announcer container's metrics port (`spec.announcer.metricsPort`).
pub const METRICS_PORT_NAME: &str = "metrics";
/// Seconds a stopping announcer has to delete its Lease (it does so at SIGTERM, in milliseconds).
pub const TERMINATION_GRACE_SECONDS: i64 = 10;

/// The announcer objects of `cr`: empty without `spec.announcer`. `labels` and `owner` are the
/// resource's child labels and ownerReference (every object is pruned and adopted like the
/// manager's).
pub fn build(
    cr: &CloudControllerManager,
    validated: &Validated,
    settings: &BuildSettings,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> Vec<Desired> {
    let Some(announcer) = &cr.spec.announcer else { return Vec::new() };
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    let uid = cr.uid().unwrap_or_default();
    let object = names::announcer_name(&name);
    let (meta, subject) = desired::agent_identity(&ns, &object, labels, owner);
    let template = pod_template(cr, announcer, validated, settings, &uid, &object);
    vec![
        Desired::ServiceAccount(ServiceAccount { metadata: meta.clone(), ..Default::default() }),
        // Its own Lease and the other announcers' in this namespace.
        Desired::RoleBinding(RoleBinding {
            metadata: meta.clone(),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: settings.announcer_namespace_role.clone(),
            },
            subjects: Some(vec![subject.clone()]),
        }),
        // Services, EndpointSlices and the L2Announcing event, cluster-wide.
        desired::owned_cluster_role_binding(
            names::announcer_cluster_role_binding_name(&ns, &name),
            labels,
            (&ns, &name),
            &settings.announcer_cluster_role,
            subject,
        ),
        // One node at a time: its addresses move to the others (a graceful stop hands them
        // over at once) and come back once it has settled.
        desired::node_daemon_set(meta, names::announcer_selector_labels(&uid), template, IntOrString::Int(1)),
    ]
}

/// The BIRD sidecar's command, fixed: wait for the announcer's first config (BIRD exits without
/// one), then run BIRD in the foreground on it and on its control socket; with `recovery`
/// (`spec.announcer.gracefulRestart`) in graceful-restart recovery (`-R`). The chart's admission
/// policy admits these two commands alone in a `bird` container, with no `args` and no
/// environment.
pub fn bird_command(recovery: bool) -> Vec<String> {
    let flags = if recovery { "-f -R" } else { "-f" };
    let script = format!(
        "until [ -s {BIRD_CONFIG_PATH} ]; do sleep 1; done; exec bird {flags} -c {BIRD_CONFIG_PATH} -s {BIRD_SOCKET_PATH}"
    );
    vec!["sh".into(), "-c".into(), script]
}

/// The BIRD sidecar's `preStop` command with `spec.announcer.gracefulRestart`: BIRD closes its
/// sessions without a NOTIFICATION and exits, so routers that negotiated graceful restart keep
/// the Node's routes while the Pod is replaced (a SIGTERM would send a Cease and withdraw them).
/// The chart's admission policy admits this hook alone, in the `bird` container alone.
pub fn bird_pre_stop() -> Vec<String> {
    ["birdc", "-s", BIRD_SOCKET_PATH, "graceful", "restart"].map(String::from).to_vec()
}

/// The container-level hardening both containers share; `add` is the one capability each needs.
fn hardened(add: Option<&str>, uid: i64) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        privileged: Some(false),
        run_as_user: Some(uid),
        run_as_group: (uid != 0).then_some(NON_ROOT_UID),
        run_as_non_root: Some(uid != 0),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: add.map(|a| vec![a.to_string()]) }),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { api_version: Some("v1".into()), field_path: path.into() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resources(cpu: &str, memory: &str, limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), Quantity(limit.into()))])),
        ..Default::default()
    }
}

fn pod_template(
    cr: &CloudControllerManager,
    announcer: &Announcer,
    validated: &Validated,
    settings: &BuildSettings,
    uid: &str,
    service_account: &str,
) -> PodTemplateSpec {
    // A packet socket needs NET_RAW, which Kubernetes hands a non-root process only through file
    // capabilities the image does not carry: uid 0 with that one capability, in the announcer
    // container alone. Without l2, the image's non-root user. BIRD always runs as that user.
    let run_as = if announcer.l2 { 0 } else { NON_ROOT_UID };
    let mut annotations = BTreeMap::new();
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let mut args = vec![ANNOUNCER_SUBCOMMAND.to_string()];
    if let Some(cc) = &validated.cloud_config {
        // The announcer reads its section at start: any edit of the Secret restarts it, one
        // node at a time.
        annotations.insert(names::ANNOTATION_CLOUD_CONFIG_HASH.to_string(), cc.hash.clone());
        let (volume, mount) = crate::desired::cloud_config_volume(cc, true);
        volumes.push(volume);
        mounts.push(mount);
        args.push(format!("--cloud-config={}", names::cloud_config_path(&cc.key)));
    }
    if let Some(class) = &cr.spec.load_balancer_class {
        args.push(format!("--load-balancer-class={class}"));
    }
    // The metrics endpoint, on the Node's address only (host network: the Pod's address is the
    // Node's; the chart's admission policy admits no other --bind-address).
    let mut ports = Vec::new();
    let mut env = vec![
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env(NODE_IP_ENV, "status.hostIP"),
    ];
    if let Some(port) = announcer.metrics_port {
        args.push(format!("--secure-port={port}"));
        args.push("--bind-address=$(POD_IP)".into());
        env.push(field_env("POD_IP", "status.podIP"));
        ports.push(ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }
    let bird_mount = VolumeMount { name: BIRD_VOLUME.into(), mount_path: BIRD_DIR.into(), ..Default::default() };
    let mut containers = vec![Container {
        name: ANNOUNCER_CONTAINER.into(),
        image: Some(cr.spec.deployment.image.clone().unwrap_or_else(|| settings.manager_image.clone())),
        image_pull_policy: cr.spec.deployment.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(vec![names::MANAGER_COMMAND.into()]),
        args: Some(args),
        env: Some(env.into_iter().chain(crate::desired::http2_env(settings)).collect()),
        ports: (!ports.is_empty()).then_some(ports),
        resources: Some(resources("10m", "32Mi", "128Mi")),
        security_context: Some(hardened(announcer.l2.then_some("NET_RAW"), run_as)),
        volume_mounts: Some(mounts.into_iter().chain(announcer.bgp.then(|| bird_mount.clone())).collect()),
        ..Default::default()
    }];
    if announcer.bgp {
        volumes.push(Volume {
            name: BIRD_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        });
        // No capability by default: a non-root process gets none of those a container adds (no
        // ambient capabilities in Kubernetes), so BIRD listens on an unprivileged port and the
        // Node opens the sessions; no kernel protocol is rendered, so no NET_ADMIN. With `bfd`,
        // BIRD needs NET_RAW to mark its BFD packets (SO_PRIORITY 7): uid 0 with that one
        // capability, as the L2 announcer container. The config it reads and the socket it
        // makes are shared through the volume's group (the pod's fsGroup), not the user.
        let (add, uid) = if announcer.bfd { (Some("NET_RAW"), 0) } else { (None, NON_ROOT_UID) };
        let lifecycle = announcer.graceful_restart.then(|| Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction { command: Some(bird_pre_stop()) }),
                ..Default::default()
            }),
            ..Default::default()
        });
        containers.push(Container {
            name: BIRD_CONTAINER.into(),
            image: settings.policy.bird_image.clone(),
            command: Some(bird_command(announcer.graceful_restart)),
            lifecycle,
            resources: Some(resources("10m", "16Mi", "64Mi")),
            // Always the non-root group: the socket BIRD makes is the announcer's through it.
            security_context: Some(SecurityContext { run_as_group: Some(NON_ROOT_UID), ..hardened(add, uid) }),
            volume_mounts: Some(vec![bird_mount]),
            ..Default::default()
        });
    }
    let mut labels = names::announcer_selector_labels(uid);
    labels.insert(names::LABEL_MANAGED_BY.to_string(), names::MANAGED_BY.to_string());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(service_account.into()),
            automount_service_account_token: Some(true),
            enable_service_links: Some(false),
            // Answers and BGP sessions must come from the node's own interfaces and address.
            host_network: Some(true),
            dns_policy: Some("ClusterFirstWithHostNet".into()),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            node_selector: announcer.node_selector.clone(),
            // Every selected node announces, tainted or not (a drained node's announcer stops
            // with its eviction and hands its addresses over).
            tolerations: Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]),
            security_context: Some(PodSecurityContext {
                fs_group: Some(NON_ROOT_UID),
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
                ..Default::default()
            }),
            containers,
            volumes: (!volumes.is_empty()).then_some(volumes),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{self, Kind};
    use crate::validate::{self, CloudConfigRef, Policy, Validation};
    use crds::CloudControllerManagerSpec;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use serde_json::json;
    use testkit::Meta;

    /// The resource these tests announce for: `lb/metal`, uid `uid-7`.
    fn cr(spec: serde_json::Value) -> CloudControllerManager {
        testkit::cr("lb", "metal", spec).with_uid("uid-7")
    }

    fn validated(cr: &CloudControllerManager) -> Validated {
        Validated {
            config: validate::manager_config(cr, Some("cloud.conf")).unwrap(),
            cloud_config: Some(CloudConfigRef {
                secret: "cfg".into(),
                key: "cloud.conf".into(),
                extra_keys: Vec::new(),
                hash: "h1".into(),
                restart_hash: "r1".into(),
            }),
            provider_has_routes: false,
        }
    }

    fn settings() -> BuildSettings {
        BuildSettings {
            policy: Policy {
                allow_announcers: true,
                bird_image: Some("example.test/bird:2".into()),
                ..Policy::default()
            },
            ..BuildSettings::default()
        }
    }

    fn daemon_set<'a>(objs: &'a [Desired], name: &str) -> &'a DaemonSet {
        objs.iter()
            .find_map(|o| match o {
                Desired::DaemonSet(d) if d.metadata.name.as_deref() == Some(name) => Some(d),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no DaemonSet {name}"))
    }

    fn baremetal(announcer: serde_json::Value) -> CloudControllerManager {
        cr(json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}},
                  "loadBalancerClass": "ccm.rs/metal", "announcer": announcer}))
    }

    #[test]
    fn without_spec_announcer_nothing_is_built() {
        let c = cr(json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let objs = build::build(&c, &validated(&c), &settings());
        assert!(objs.iter().all(|o| !o.name().ends_with("-announcer")), "no announcer object");
    }

    #[test]
    fn an_l2_announcer_is_a_host_network_daemonset_with_net_raw_alone_and_its_own_bindings() {
        let c = baremetal(json!({"nodeSelector": {"edge": "true"}}));
        let s = settings();
        let objs = build::build(&c, &validated(&c), &s);
        let ours: Vec<(Kind, &str)> =
            objs.iter().filter(|o| o.name().contains("announcer")).map(|o| (o.kind(), o.name())).collect();
        assert_eq!(
            ours,
            [
                (Kind::ServiceAccount, "ccm-metal-announcer"),
                (Kind::RoleBinding, "ccm-metal-announcer"),
                (Kind::ClusterRoleBinding, "ccm-operator:lb:metal:announcer"),
                (Kind::DaemonSet, "ccm-metal-announcer"),
            ]
        );
        for o in objs.iter().filter(|o| o.name().contains("announcer")) {
            assert_eq!(o.meta().labels.as_ref().unwrap()[names::LABEL_OWNER_UID], "uid-7", "pruned like the manager's");
            assert!(o.applied_hash().is_some(), "stamped");
        }
        let roles: Vec<(String, String)> = objs
            .iter()
            .filter_map(|o| match o {
                Desired::RoleBinding(b) if o.name().ends_with("-announcer") => {
                    Some((b.role_ref.name.clone(), b.subjects.as_ref().unwrap()[0].name.clone()))
                }
                Desired::ClusterRoleBinding(b) if o.name().ends_with(":announcer") => {
                    Some((b.role_ref.name.clone(), b.subjects.as_ref().unwrap()[0].name.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            roles,
            [
                (s.announcer_namespace_role.clone(), "ccm-metal-announcer".to_string()),
                (s.announcer_cluster_role.clone(), "ccm-metal-announcer".to_string())
            ]
        );

        let ds = daemon_set(&objs, "ccm-metal-announcer");
        let spec = ds.spec.as_ref().unwrap();
        let pod = spec.template.spec.as_ref().unwrap();
        let pod_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(pod_labels[names::LABEL_NAME], names::ANNOUNCER_APP_NAME);
        assert!(!names::is_manager_pod(pod_labels), "never counted as a manager pod");
        let selector = spec.selector.match_labels.as_ref().unwrap();
        assert_ne!(selector, &names::selector_labels("uid-7"), "disjoint from the manager's selector");
        assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(pod.service_account_name.as_deref(), Some("ccm-metal-announcer"));
        assert_eq!(pod.node_selector.as_ref().unwrap()["edge"], "true");
        assert_eq!(pod.containers.len(), 1, "no BIRD without bgp");
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some(s.manager_image.as_str()), "the manager's image");
        assert_eq!(
            c.args.as_deref().unwrap(),
            [
                "announce",
                "--cloud-config=/etc/kubernetes/cloud-config/cloud.conf",
                "--load-balancer-class=ccm.rs/metal"
            ]
        );
        let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert_eq!(env, ["NODE_NAME", "POD_NAMESPACE", "NODE_IP"]);
        let sc = c.security_context.as_ref().unwrap();
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.add.as_deref(), Some(&["NET_RAW".to_string()][..]));
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!((sc.run_as_user, sc.allow_privilege_escalation, sc.privileged), (Some(0), Some(false), Some(false)));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        // Every edit of the cloud-config restarts the announcers (they read it at start).
        let annotations = spec.template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(annotations[names::ANNOTATION_CLOUD_CONFIG_HASH], "h1");
    }

    #[test]
    fn announcer_roles_bind_only_the_announcers_account_and_only_where_announcers_are_allowed() {
        let c = baremetal(json!({}));
        let s = settings();
        let objs = build::build(&c, &validated(&c), &s);
        for o in &objs {
            assert_eq!(build::binding_overreach(o, "lb", "metal", None, &s), None, "{} {}", o.kind(), o.name());
        }
        let bindings: Vec<&Desired> = objs
            .iter()
            .filter(|o| {
                o.name().contains("announcer") && matches!(o.kind(), Kind::RoleBinding | Kind::ClusterRoleBinding)
            })
            .collect();
        assert_eq!(bindings.len(), 2);
        let off = BuildSettings { policy: Policy::default(), ..settings() };
        for b in &bindings {
            let why = build::binding_overreach(b, "lb", "metal", None, &off).expect("refused when not allowed");
            assert!(why.contains("not a manager role"), "{why}");
            // The announcer's roles to the manager's account (which has Nodes and Services) or the
            // manager's roles to the announcer's are both overreach.
            let mut swapped = (*b).clone();
            match &mut swapped {
                Desired::RoleBinding(r) => r.subjects.as_mut().unwrap()[0].name = names::workload_name("metal"),
                Desired::ClusterRoleBinding(r) => r.subjects.as_mut().unwrap()[0].name = names::workload_name("metal"),
                _ => unreachable!(),
            }
            let why = build::binding_overreach(&swapped, "lb", "metal", None, &s).expect("refused");
            assert!(why.contains("subjects other than ServiceAccount lb/ccm-metal-announcer"), "{why}");
        }
        let manager_crb =
            objs.iter().find(|o| o.kind() == Kind::ClusterRoleBinding && !o.name().contains("announcer")).unwrap();
        let Desired::ClusterRoleBinding(mut m) = manager_crb.clone() else { unreachable!() };
        m.subjects.as_mut().unwrap()[0].name = names::announcer_name("metal");
        assert!(build::binding_overreach(&Desired::ClusterRoleBinding(m), "lb", "metal", None, &s).is_some());
    }

    #[test]
    fn a_metrics_port_serves_on_the_nodes_address_only_and_without_it_no_endpoint() {
        let c = baremetal(json!({"metricsPort": 7473}));
        let objs = build::build(&c, &validated(&c), &settings());
        let pod = daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap();
        let announcer = &pod.containers[0];
        let args = announcer.args.clone().unwrap();
        assert!(args.contains(&"--secure-port=7473".to_string()), "{args:?}");
        assert!(args.contains(&"--bind-address=$(POD_IP)".to_string()), "{args:?}");
        let pod_ip = announcer.env.iter().flatten().find(|e| e.name == "POD_IP").expect("POD_IP");
        let from = pod_ip.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
        assert_eq!(from.field_path, "status.podIP", "the address the chart's admission policy admits");
        let ports = announcer.ports.clone().unwrap();
        assert_eq!((ports[0].name.as_deref(), ports[0].container_port), (Some(METRICS_PORT_NAME), 7473));
        let c = baremetal(json!({}));
        let objs = build::build(&c, &validated(&c), &settings());
        let pod = daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap();
        let announcer = &pod.containers[0];
        assert!(announcer.args.iter().flatten().all(|a| !a.starts_with("--secure-port") && !a.starts_with("--bind")));
        assert!(announcer.ports.is_none() && announcer.env.iter().flatten().all(|e| e.name != "POD_IP"));
    }

    #[test]
    fn a_bgp_only_announcer_runs_non_root_with_a_bird_sidecar_holding_no_capability() {
        let c = baremetal(json!({"l2": false, "bgp": true}));
        let objs = build::build(&c, &validated(&c), &settings());
        let pod = daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap();
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [ANNOUNCER_CONTAINER, BIRD_CONTAINER]);
        let (announcer, bird) = (&pod.containers[0], &pod.containers[1]);
        let sc = announcer.security_context.as_ref().unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_non_root), (Some(NON_ROOT_UID), Some(true)));
        assert_eq!(sc.capabilities.as_ref().unwrap().add, None, "no NET_RAW without l2");
        assert_eq!(bird.image.as_deref(), Some("example.test/bird:2"));
        let bird_sc = bird.security_context.as_ref().unwrap();
        let caps = bird_sc.capabilities.as_ref().unwrap();
        assert_eq!((caps.add.as_deref(), caps.drop.as_deref()), (None, Some(&["ALL".to_string()][..])));
        assert_eq!(
            bird_sc.run_as_user,
            Some(NON_ROOT_UID),
            "BIRD never runs as root; it shares the 0640 config and the socket through fsGroup"
        );
        let script = bird.command.as_ref().unwrap().join(" ");
        assert!(script.contains(BIRD_CONFIG_PATH) && script.contains(BIRD_SOCKET_PATH), "{script}");
        for c in [announcer, bird] {
            assert!(c.volume_mounts.iter().flatten().any(|m| m.name == BIRD_VOLUME && m.mount_path == BIRD_DIR));
        }
        assert!(pod.volumes.iter().flatten().any(|v| v.name == BIRD_VOLUME && v.empty_dir.is_some()));
    }

    #[test]
    fn spec_announcer_is_refused_for_another_provider_embedded_mode_or_without_a_cloud_config() {
        let spec = |v: serde_json::Value| -> CloudControllerManagerSpec { serde_json::from_value(v).unwrap() };
        let cc = json!({"secretRef": {"name": "cfg"}});
        assert_eq!(validate::announcer_refused(&spec(json!({"provider": "baremetal", "cloudConfig": cc}))), None);
        let ok = json!({"provider": "baremetal", "cloudConfig": cc, "announcer": {}});
        assert_eq!(validate::announcer_refused(&spec(ok)), None);
        let aws = validate::announcer_refused(&spec(json!({"provider": "aws", "cloudConfig": cc, "announcer": {}})));
        assert!(aws.is_some_and(|m| m.contains("only the baremetal provider")), "{aws:?}");
        let embedded = json!({"provider": "baremetal", "cloudConfig": cc, "mode": "Embedded", "announcer": {}});
        assert!(validate::announcer_refused(&spec(embedded)).is_some_and(|m| m.contains("Deployment or DaemonSet")));
        let bare = validate::announcer_refused(&spec(json!({"provider": "baremetal", "announcer": {}})));
        assert!(bare.is_some_and(|m| m.contains("spec.cloudConfig")));
    }

    #[test]
    fn the_policy_refuses_announcers_unless_allowed_and_bgp_without_a_bird_image() {
        let c = baremetal(json!({"bgp": true}));
        let check = |policy: &Policy| validate::check_policy(&c, Validation::Valid(validated(&c)), policy, "img");
        let messages = |v: Validation| match v {
            Validation::Invalid { failures, .. } => {
                failures.into_iter().map(|f| format!("{}: {}", f.reason, f.message)).collect::<Vec<_>>()
            }
            other => panic!("expected a refusal: {other:?}"),
        };
        let off = messages(check(&Policy::default()));
        assert!(
            off[0].starts_with("NotAllowedByPolicy: spec.announcer:") && off[0].contains("announcer.enabled"),
            "{off:?}"
        );
        let no_bird = messages(check(&Policy { allow_announcers: true, ..Policy::default() }));
        assert!(no_bird[0].contains("spec.announcer.bgp") && no_bird[0].contains("announcer.birdImage"), "{no_bird:?}");
        assert!(check(&settings().policy).is_valid());
    }
    #[test]
    fn bird_runs_its_fixed_command_as_non_root_even_beside_a_root_l2_announcer() {
        let c = baremetal(json!({"l2": true, "bgp": true}));
        let objs = build::build(&c, &validated(&c), &settings());
        let pod = daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap();
        let (announcer, bird) = (&pod.containers[0], &pod.containers[1]);
        assert_eq!(announcer.security_context.as_ref().unwrap().run_as_user, Some(0), "NET_RAW needs uid 0");
        let sc = bird.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_group, sc.run_as_non_root),
            (Some(NON_ROOT_UID), Some(NON_ROOT_UID), Some(true))
        );
        assert_eq!(bird.command.as_ref(), Some(&bird_command(false)));
        assert_eq!(bird.lifecycle, None, "no hook without gracefulRestart");
        assert_eq!((bird.args.as_ref(), bird.env.as_ref(), bird.env_from.as_ref()), (None, None, None));
        // The volume they share belongs to the pod's fsGroup, which both hold.
        assert_eq!(pod.security_context.as_ref().unwrap().fs_group, Some(NON_ROOT_UID));
    }

    #[test]
    fn bfd_gives_bird_net_raw_as_root_and_graceful_restart_a_pre_stop_hook_and_recovery() {
        let c = baremetal(json!({"l2": false, "bgp": true, "bfd": true, "gracefulRestart": true}));
        let objs = build::build(&c, &validated(&c), &settings());
        let pod = daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap();
        let (announcer, bird) = (&pod.containers[0], &pod.containers[1]);
        let sc = bird.security_context.as_ref().unwrap();
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(
            (caps.add.as_deref(), caps.drop.as_deref()),
            (Some(&["NET_RAW".to_string()][..]), Some(&["ALL".to_string()][..]))
        );
        // NET_RAW reaches a process only as root (no ambient capabilities); the group stays the
        // one the non-root announcer shares the socket and the config through.
        assert_eq!((sc.run_as_user, sc.run_as_group, sc.run_as_non_root), (Some(0), Some(NON_ROOT_UID), Some(false)));
        assert_eq!(
            (sc.allow_privilege_escalation, sc.privileged, sc.read_only_root_filesystem),
            (Some(false), Some(false), Some(true))
        );
        let announcer_sc = announcer.security_context.as_ref().unwrap();
        assert_eq!(
            (announcer_sc.run_as_user, announcer_sc.capabilities.as_ref().unwrap().add.as_ref()),
            (Some(NON_ROOT_UID), None)
        );
        assert_eq!(bird.command.as_ref(), Some(&bird_command(true)));
        assert!(bird.command.as_ref().unwrap()[2].contains("exec bird -f -R -c"), "{:?}", bird.command);
        let hook = bird.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.exec.as_ref());
        assert_eq!(hook.and_then(|e| e.command.as_ref()), Some(&bird_pre_stop()));
        assert_eq!(announcer.lifecycle, None, "the hook is BIRD's alone");

        // Each alone: only its own part.
        let c = baremetal(json!({"bgp": true, "bfd": true}));
        let objs = build::build(&c, &validated(&c), &settings());
        let bird =
            daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap().containers[1].clone();
        assert_eq!((bird.lifecycle, bird.command), (None, Some(bird_command(false))));
        let c = baremetal(json!({"bgp": true, "gracefulRestart": true}));
        let objs = build::build(&c, &validated(&c), &settings());
        let bird =
            daemon_set(&objs, "ccm-metal-announcer").spec.clone().unwrap().template.spec.unwrap().containers[1].clone();
        let sc = bird.security_context.unwrap();
        assert_eq!((sc.run_as_user, sc.capabilities.unwrap().add), (Some(NON_ROOT_UID), None));
        assert!(bird.lifecycle.is_some());
    }

    #[test]
    fn the_chart_admits_exactly_the_bird_commands_and_hook_the_operator_renders() {
        let helpers = include_str!("../../charts/ccm-operator/templates/_helpers.tpl");
        let quoted = |parts: Vec<String>| {
            let parts: Vec<String> = parts.iter().map(|part| format!("'{part}'")).collect();
            format!("[{}]", parts.join(", "))
        };
        for rendered in [quoted(bird_command(false)), quoted(bird_command(true)), quoted(bird_pre_stop())] {
            assert!(helpers.contains(&rendered), "the chart's helpers lack {rendered}");
        }
        let policy = include_str!("../../charts/ccm-operator/templates/validatingadmissionpolicy.yaml");
        assert!(policy.contains(&format!("['{}']", names::MANAGER_COMMAND)), "the manager command");
    }

    #[test]
    fn every_container_the_operator_builds_is_hardened_and_only_the_l2_announcer_runs_as_root() {
        for mode in ["Deployment", "DaemonSet"] {
            let mut spec = json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}},
                "mode": mode, "announcer": {"l2": true, "bgp": true}});
            spec["loadBalancerClass"] = json!("ccm.rs/metal");
            let c = cr(spec);
            for o in build::build(&c, &validated(&c), &settings()) {
                let pod = match &o {
                    Desired::Deployment(d) => d.spec.clone().unwrap().template.spec.unwrap(),
                    Desired::DaemonSet(d) => d.spec.clone().unwrap().template.spec.unwrap(),
                    _ => continue,
                };
                assert_eq!(pod.node_name, None);
                let pod_sc = pod.security_context.clone().unwrap_or_default();
                for c in &pod.containers {
                    let sc = c.security_context.clone().unwrap();
                    let what = format!("{mode} {} {}", o.name(), c.name);
                    assert!(sc.capabilities.clone().unwrap().drop.unwrap().contains(&"ALL".to_string()), "{what}");
                    let seccomp = sc.seccomp_profile.clone().or(pod_sc.seccomp_profile.clone()).unwrap();
                    assert_eq!(seccomp.type_, "RuntimeDefault", "{what}");
                    assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}");
                    let root = c.name == ANNOUNCER_CONTAINER && o.name().ends_with("-announcer");
                    let non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root) == Some(true);
                    assert_eq!(non_root, !root, "{what}");
                }
            }
        }
    }
}
