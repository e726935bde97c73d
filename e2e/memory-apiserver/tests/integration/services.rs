//! Service cluster IP and node port allocation.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use memory_apiserver::TestApiServer;
use serde_json::json;

use crate::common::*;

fn svc(name: &str, ty: &str, node_port: Option<i32>) -> Service {
    let mut port = json!({"port": 80});
    if let Some(np) = node_port {
        port["nodePort"] = json!(np);
    }
    serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"type": ty, "ports": [port], "selector": {"app": name}}}),
    )
    .unwrap()
}

fn node_port(s: &Service) -> i32 {
    s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.unwrap()
}

#[tokio::test]
async fn services_get_unique_cluster_ips_and_node_ports() {
    let s = server().await;
    let api: Api<Service> = Api::default_namespaced(s.client());
    let mut ips = HashSet::new();
    let mut ports = HashSet::new();
    for i in 0..40 {
        let ty = if i % 2 == 0 { "NodePort" } else { "LoadBalancer" };
        let created = api.create(&PostParams::default(), &svc(&format!("s{i}"), ty, None)).await.unwrap();
        let spec = created.spec.as_ref().unwrap();
        assert!(ips.insert(spec.cluster_ip.clone().unwrap()), "duplicate cluster IP");
        assert_eq!(spec.cluster_ips.as_ref().unwrap(), &vec![spec.cluster_ip.clone().unwrap()]);
        let np = node_port(&created);
        assert!((30000..=32767).contains(&np));
        assert!(ports.insert(np), "duplicate node port {np}");
        let p = &spec.ports.as_ref().unwrap()[0];
        assert_eq!(p.protocol.as_deref(), Some("TCP"));
    }
    let plain = api.create(&PostParams::default(), &svc("plain", "ClusterIP", None)).await.unwrap();
    assert!(plain.spec.unwrap().ports.unwrap()[0].node_port.is_none());
}

#[tokio::test]
async fn requested_node_ports_are_honoured_once() {
    let s = server().await;
    let api: Api<Service> = Api::default_namespaced(s.client());
    let a = api.create(&PostParams::default(), &svc("a", "NodePort", Some(30080))).await.unwrap();
    assert_eq!(node_port(&a), 30080);
    let e = api_err(api.create(&PostParams::default(), &svc("b", "NodePort", Some(30080))).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.contains("already allocated"), "{}", e.message);
    // Deleting releases the port.
    api.delete("a", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &svc("b", "NodePort", Some(30080))).await.unwrap();
}

#[tokio::test]
async fn updates_keep_allocations_and_type_changes_allocate() {
    let s = server().await;
    let api: Api<Service> = Api::default_namespaced(s.client());
    let c = api.create(&PostParams::default(), &svc("x", "ClusterIP", None)).await.unwrap();
    let ip = c.spec.as_ref().unwrap().cluster_ip.clone();
    let np =
        api.patch("x", &PatchParams::default(), &Patch::Merge(json!({"spec": {"type": "NodePort"}}))).await.unwrap();
    assert_eq!(np.spec.as_ref().unwrap().cluster_ip, ip);
    let port = node_port(&np);
    // A full replace that omits nodePort and clusterIP keeps both.
    let mut replaced = svc("x", "NodePort", None);
    replaced.metadata.resource_version = np.metadata.resource_version.clone();
    let r = api.replace("x", &PostParams::default(), &replaced).await.unwrap();
    assert_eq!(node_port(&r), port);
    assert_eq!(r.spec.as_ref().unwrap().cluster_ip, ip);
    let e = api_err(
        api.patch("x", &PatchParams::default(), &Patch::Merge(json!({"spec": {"clusterIP": "10.96.99.99"}}))).await,
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn node_port_range_is_configurable_and_exhaustion_is_invalid() {
    let s = TestApiServer::builder().node_port_range(31000, 31001).start().await.unwrap();
    let api: Api<Service> = Api::default_namespaced(s.client());
    api.create(&PostParams::default(), &svc("a", "NodePort", None)).await.unwrap();
    api.create(&PostParams::default(), &svc("b", "NodePort", None)).await.unwrap();
    let e = api_err(api.create(&PostParams::default(), &svc("c", "NodePort", None)).await);
    assert_eq!(e.code, 422);
    assert_eq!(api_err(api.get("c").await).code, 404, "nothing stored after a failed allocation");
}
