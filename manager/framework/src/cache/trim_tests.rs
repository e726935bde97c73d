//! The caches store trimmed objects ([`trim_node`], [`trim_service`]): every decision a
//! controller makes must be the same on the trimmed object as on the whole one (issue 50). For
//! each field a decision reads, a pair of objects differing in that field alone is decided on
//! whole and trimmed: a trim that dropped the field would make the trimmed pair look alike and
//! fail here. For each field the trim drops, a pair differing there is decided alike.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service};
use serde_json::{Value, json};

use super::{trim_node, trim_service};
use crate::controllers::lifecycle::logic as lifecycle;
use crate::controllers::node::logic as node;
use crate::controllers::route::logic as route;
use crate::controllers::service::logic::{self as service, ClassFilter};

/// A Node as a kubelet reports it: labels, annotations, taints, podCIDRs, addresses,
/// conditions, capacity, nodeInfo, images and volumes.
fn kubelet_node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-7", "uid": "u-7", "resourceVersion": "41",
            "labels": {"kubernetes.io/hostname": "node-7", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "node.kubernetes.io/instance-type": "m5.large", "topology.kubernetes.io/zone": "zone-a"},
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.7",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"], "providerID": "fake://node-7",
            "taints": [{"key": "example.com/dedicated", "value": "db", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "Hostname", "address": "node-7"}],
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "1900m", "memory": "7Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                           {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"}],
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                "osImage": "Debian", "containerRuntimeVersion": "containerd://1.7", "kubeletVersion": "v1.36.2",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320_000},
                       {"names": ["docker.io/library/nginx:1.27"], "sizeBytes": 72_000_000}],
            "volumesInUse": ["kubernetes.io/csi/ebs^vol-1"],
            "volumesAttached": [{"name": "kubernetes.io/csi/ebs^vol-1", "devicePath": "/dev/xvdb"}],
            "config": {"active": {"configMap": {"name": "kubelet", "namespace": "kube-system", "kubeletConfigKey": "k"}}}}})
}

/// A LoadBalancer Service with every field the service controller reads set, and those the trim
/// drops too.
fn lb_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-web",
            "annotations": {"example.com/lb": "internal"}, "labels": {"app": "web"},
            "finalizers": ["service.kubernetes.io/load-balancer-cleanup"]},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
            "internalTrafficPolicy": "Cluster", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
            "loadBalancerSourceRanges": ["192.0.2.0/24"], "loadBalancerIP": "198.51.100.9", "externalIPs": ["203.0.113.9"],
            "sessionAffinity": "ClientIP", "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}})
}

fn edited(base: &Value, edit: impl FnOnce(&mut Value)) -> Value {
    let mut v = base.clone();
    edit(&mut v);
    v
}

fn as_service(v: &Value) -> Service {
    serde_json::from_value(v.clone()).expect("a Service")
}

fn as_node(v: &Value) -> Node {
    serde_json::from_value(v.clone()).expect("a Node")
}

fn trimmed_service(v: &Value) -> Service {
    let mut s = as_service(v);
    trim_service(&mut s);
    s
}

fn trimmed_node(v: &Value) -> Node {
    let mut n = as_node(v);
    trim_node(&mut n);
    n
}

/// Everything the service controller decides from an old and a new Service.
fn service_decisions(old: &Service, new: &Service) -> (Option<&'static str>, bool, bool, bool) {
    let class = ClassFilter { class: None, also_unclassed: false };
    let finalizer = service::cleanup_finalizer(None);
    (
        service::update_trigger(old, new, class),
        service::should_sync_updated(old, new, class, &finalizer),
        service::wants_load_balancer(new, class),
        service::reports_ingress(new),
    )
}

/// Everything the Node-reading controllers decide from an old and a new Node.
fn node_decisions(old: &Node, new: &Node) -> String {
    let cidrs: Vec<IpNet> = vec!["10.244.0.0/16".parse().expect("a CIDR")];
    let cloud = [NodeAddress { type_: "InternalIP".into(), address: "10.0.0.7".into() }];
    let decisions = (
        service::node_update_changes_hosts(old, new),
        service::host_set([new]),
        service::is_load_balancer_host(new),
        lifecycle::classify(new),
        lifecycle::is_ready(new),
        route::plan(&[], &[new], &cidrs),
        node::is_uninitialized(new),
        node::desired_addresses(new, &cloud),
        node::reconcile_labels(new),
    );
    format!("{decisions:?}")
}

#[test]
fn every_field_the_service_controller_reads_survives_the_trim_and_what_it_drops_changes_no_decision() {
    let base = lb_service();
    let read: Vec<(&str, Value)> = vec![
        ("type", edited(&base, |s| s["spec"]["type"] = json!("NodePort"))),
        ("loadBalancerClass", edited(&base, |s| s["spec"]["loadBalancerClass"] = json!("example.com/other"))),
        ("loadBalancerSourceRanges", edited(&base, |s| s["spec"]["loadBalancerSourceRanges"] = json!(["10.0.0.0/8"]))),
        ("ports", edited(&base, |s| s["spec"]["ports"][0]["port"] = json!(443))),
        ("nodePort", edited(&base, |s| s["spec"]["ports"][0]["nodePort"] = json!(30443))),
        ("sessionAffinity", edited(&base, |s| s["spec"]["sessionAffinity"] = json!("None"))),
        ("loadBalancerIP", edited(&base, |s| s["spec"]["loadBalancerIP"] = json!("198.51.100.10"))),
        ("externalIPs", edited(&base, |s| s["spec"]["externalIPs"] = json!([]))),
        ("annotations", edited(&base, |s| s["metadata"]["annotations"]["example.com/lb"] = json!("public"))),
        ("uid", edited(&base, |s| s["metadata"]["uid"] = json!("u-web-2"))),
        ("externalTrafficPolicy", edited(&base, |s| s["spec"]["externalTrafficPolicy"] = json!("Cluster"))),
        ("healthCheckNodePort", edited(&base, |s| s["spec"]["healthCheckNodePort"] = json!(31001))),
        ("ipFamilies", edited(&base, |s| s["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]))),
        ("deletionTimestamp", edited(&base, |s| s["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z"))),
        ("status", edited(&base, |s| s["status"] = json!({}))),
    ];
    for (field, changed) in &read {
        let whole = service_decisions(&as_service(&base), &as_service(changed));
        let trimmed = service_decisions(&trimmed_service(&base), &trimmed_service(changed));
        assert_eq!(trimmed, whole, "a change of {field} is decided alike on trimmed Services");
        assert_ne!(
            whole,
            service_decisions(&as_service(&base), &as_service(&base)),
            "the fixture makes a change of {field} matter (else this case proves nothing)"
        );
    }
    let dropped: Vec<(&str, Value)> = vec![
        ("selector", edited(&base, |s| s["spec"]["selector"] = json!({"app": "web-2"}))),
        ("clusterIP", edited(&base, |s| s["spec"]["clusterIP"] = json!("10.96.0.10"))),
        ("clusterIPs", edited(&base, |s| s["spec"]["clusterIPs"] = json!(["10.96.0.10"]))),
        ("internalTrafficPolicy", edited(&base, |s| s["spec"]["internalTrafficPolicy"] = json!("Local"))),
    ];
    for (field, changed) in &dropped {
        let whole = service_decisions(&as_service(&base), &as_service(changed));
        assert_eq!(whole, service_decisions(&as_service(&base), &as_service(&base)), "{field} is read by no decision");
    }
}

#[test]
fn every_field_the_node_controllers_read_survives_the_trim_and_what_it_drops_changes_no_decision() {
    let base = kubelet_node();
    let read: Vec<(&str, Value)> = vec![
        ("providerID", edited(&base, |n| n["spec"]["providerID"] = json!("fake://node-7-b"))),
        (
            "exclusion label",
            edited(&base, |n| {
                n["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"] = json!("")
            }),
        ),
        (
            "beta labels",
            edited(&base, |n| n["metadata"]["labels"]["beta.kubernetes.io/instance-type"] = json!("m5.xlarge")),
        ),
        (
            "taints",
            edited(
                &base,
                |n| n["spec"]["taints"] = json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]),
            ),
        ),
        (
            "autoscaler taint",
            edited(&base, |n| {
                n["spec"]["taints"] = json!([{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
            }),
        ),
        ("conditions", edited(&base, |n| n["status"]["conditions"][0]["status"] = json!("Unknown"))),
        (
            "podCIDRs",
            edited(&base, |n| {
                n["spec"]["podCIDR"] = json!("10.244.8.0/24");
                n["spec"]["podCIDRs"] = json!(["10.244.8.0/24"]);
            }),
        ),
        ("addresses", edited(&base, |n| n["status"]["addresses"][1]["address"] = json!("node-7.lan"))),
        (
            "provided node IP",
            edited(&base, |n| {
                n["metadata"]["annotations"]["alpha.kubernetes.io/provided-node-ip"] = json!("10.0.0.99")
            }),
        ),
        ("deletionTimestamp", edited(&base, |n| n["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z"))),
    ];
    let unchanged = node_decisions(&as_node(&base), &as_node(&base));
    for (field, changed) in &read {
        let whole = node_decisions(&as_node(&base), &as_node(changed));
        let trimmed = node_decisions(&trimmed_node(&base), &trimmed_node(changed));
        assert_eq!(trimmed, whole, "a change of {field} is decided alike on trimmed Nodes");
        assert_ne!(whole, unchanged, "the fixture makes a change of {field} matter (else this case proves nothing)");
    }
    let dropped: Vec<(&str, Value)> = vec![
        ("images", edited(&base, |n| n["status"]["images"] = json!([]))),
        ("volumesInUse", edited(&base, |n| n["status"]["volumesInUse"] = json!([]))),
        ("volumesAttached", edited(&base, |n| n["status"]["volumesAttached"] = json!([]))),
        ("config", edited(&base, |n| n["status"]["config"] = json!({}))),
    ];
    for (field, changed) in &dropped {
        assert_eq!(node_decisions(&as_node(&base), &as_node(changed)), unchanged, "{field} is read by no decision");
    }
    // And the trim really drops them: a kubelet Node shrinks.
    let whole = serde_json::to_vec(&as_node(&base)).expect("JSON").len();
    let trimmed = serde_json::to_vec(&trimmed_node(&base)).expect("JSON").len();
    assert!(trimmed < whole, "{trimmed} bytes trimmed, {whole} whole");
}
