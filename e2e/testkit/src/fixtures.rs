//! The objects tests create, built one way: a LoadBalancer Service, a Node as kubelet registers
//! it, a CloudControllerManager resource, Secrets, ConfigMaps and Namespaces. Each constructor makes the
//! common shape; the `with_*` methods of [`Meta`], [`ServiceFixture`] and [`NodeFixture`]
//! change what a test needs changed.

use std::collections::BTreeMap;

use crds::{CloudControllerManager, CloudControllerManagerSpec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Secret, Service, ServicePort,
    ServiceSpec, Taint,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use serde_json::Value;

/// The taint kubelet with `--cloud-provider=external` puts on a new Node.
pub const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// The label kubelet gives a Node its host name in.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), namespace: namespace.map(Into::into), ..Default::default() }
}

fn pairs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A `type: LoadBalancer` Service `namespace/name` with one TCP port `http` 80 -> 8080,
/// selecting `app: <name>`.
pub fn lb_service(namespace: &str, name: &str) -> Service {
    Service {
        metadata: meta(Some(namespace), name),
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some(pairs(&[("app", name)])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The taint [`UNINITIALIZED`], as kubelet sets it.
pub fn uninitialized_taint() -> Taint {
    Taint { key: UNINITIALIZED.into(), value: Some("true".into()), effect: "NoSchedule".into(), time_added: None }
}

/// A Node as kubelet with `--cloud-provider=external` registers it: tainted [`UNINITIALIZED`],
/// an empty status.
pub fn kubelet_node(name: &str) -> Node {
    Node {
        metadata: meta(None, name),
        spec: Some(NodeSpec { taints: Some(vec![uninitialized_taint()]), ..Default::default() }),
        status: Some(NodeStatus::default()),
    }
}

/// A Node with a name and nothing else.
pub fn node(name: &str) -> Node {
    Node { metadata: meta(None, name), ..Default::default() }
}

/// A CloudControllerManager `namespace/name` with `spec` (its JSON; panics when it is not one).
pub fn cr(namespace: &str, name: &str, spec: Value) -> CloudControllerManager {
    let spec: CloudControllerManagerSpec =
        serde_json::from_value(spec).unwrap_or_else(|e| panic!("a CloudControllerManager spec: {e}"));
    let mut cr = CloudControllerManager::new(name, spec);
    cr.metadata.namespace = Some(namespace.into());
    cr
}

/// A Secret `namespace/name` holding `data` under `key`.
pub fn secret(namespace: &str, name: &str, key: &str, data: &[u8]) -> Secret {
    Secret {
        metadata: meta(Some(namespace), name),
        data: Some([(key.to_string(), ByteString(data.to_vec()))].into()),
        ..Default::default()
    }
}

/// The labels that make a Secret usable as a cloud-config.
pub fn cloud_config_labels() -> BTreeMap<String, String> {
    pairs(&[(crds::CLOUD_CONFIG_LABEL, crds::CLOUD_CONFIG_LABEL_VALUE)])
}

/// A [`secret`] labelled as a cloud-config, so the operator may read it.
pub fn cloud_config_secret(namespace: &str, name: &str, key: &str, data: &[u8]) -> Secret {
    let mut secret = secret(namespace, name, key, data);
    secret.metadata.labels = Some(cloud_config_labels());
    secret
}

/// A ConfigMap `name` (in the client's namespace) holding `data`.
pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap { metadata: meta(None, name), data: Some(pairs(data)), ..Default::default() }
}

/// A Namespace `name`.
pub fn namespace(name: &str) -> Namespace {
    Namespace { metadata: meta(None, name), ..Default::default() }
}

/// The load-balancer ingress of a Service as (IP, ipMode) pairs, in the order published.
pub fn ingress(service: &Service) -> Vec<(String, Option<String>)> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| Some((i.ip.clone()?, i.ip_mode.clone())))
        .collect()
}

/// The load-balancer ingress IPs of a Service, in the order published.
pub fn ingress_ips(service: &Service) -> Vec<String> {
    ingress(service).into_iter().map(|(ip, _)| ip).collect()
}

/// Metadata changes for any fixture.
pub trait Meta: Sized {
    /// With these labels added.
    fn with_labels(self, labels: &[(&str, &str)]) -> Self;
    /// With these annotations added.
    fn with_annotations(self, annotations: &[(&str, &str)]) -> Self;
    /// With this uid.
    fn with_uid(self, uid: &str) -> Self;
}

impl<K: kube::Resource> Meta for K {
    fn with_labels(mut self, labels: &[(&str, &str)]) -> Self {
        self.meta_mut().labels.get_or_insert_default().extend(pairs(labels));
        self
    }

    fn with_annotations(mut self, annotations: &[(&str, &str)]) -> Self {
        self.meta_mut().annotations.get_or_insert_default().extend(pairs(annotations));
        self
    }

    fn with_uid(mut self, uid: &str) -> Self {
        self.meta_mut().uid = Some(uid.into());
        self
    }
}

/// Changes to a [`lb_service`].
pub trait ServiceFixture {
    /// With its one port's number `port` (name, target port and protocol kept).
    fn with_port(self, port: i32) -> Self;
    /// With `spec.loadBalancerClass` `class`.
    fn with_class(self, class: &str) -> Self;
}

impl ServiceFixture for Service {
    fn with_port(mut self, port: i32) -> Self {
        let spec = self.spec.get_or_insert_default();
        for p in spec.ports.get_or_insert_default() {
            p.port = port;
        }
        self
    }

    fn with_class(mut self, class: &str) -> Self {
        self.spec.get_or_insert_default().load_balancer_class = Some(class.into());
        self
    }
}

/// Changes to a [`kubelet_node`] or [`node`].
pub trait NodeFixture {
    /// With the host name kubelet reports: the [`HOSTNAME_LABEL`] label and a `Hostname` address.
    fn with_hostname(self) -> Self;
    /// With an address of `type_` (`InternalIP`, `ExternalIP`, `Hostname`, ...) added.
    fn with_address(self, type_: &str, address: &str) -> Self;
    /// With the condition `Ready` `True`, as kubelet reports it.
    fn ready(self) -> Self;
    /// With `spec.providerID`.
    fn with_provider_id(self, provider_id: &str) -> Self;
    /// With a taint added.
    fn with_taint(self, taint: Taint) -> Self;
}

impl NodeFixture for Node {
    fn with_hostname(self) -> Self {
        let name = self.metadata.name.clone().unwrap_or_default();
        self.with_labels(&[(HOSTNAME_LABEL, &name)]).with_address("Hostname", &name)
    }

    fn with_address(mut self, type_: &str, address: &str) -> Self {
        let status = self.status.get_or_insert_default();
        status.addresses.get_or_insert_default().push(NodeAddress { type_: type_.into(), address: address.into() });
        self
    }

    fn ready(mut self) -> Self {
        let status = self.status.get_or_insert_default();
        status.conditions.get_or_insert_default().push(NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            ..Default::default()
        });
        self
    }

    fn with_provider_id(mut self, provider_id: &str) -> Self {
        self.spec.get_or_insert_default().provider_id = Some(provider_id.into());
        self
    }

    fn with_taint(mut self, taint: Taint) -> Self {
        self.spec.get_or_insert_default().taints.get_or_insert_default().push(taint);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelet_node_with_its_hostname_carries_the_label_and_the_address() {
        let node = kubelet_node("n1").with_hostname().ready();
        assert_eq!(node.metadata.labels.as_ref().unwrap()[HOSTNAME_LABEL], "n1");
        let status = node.status.unwrap();
        assert_eq!(status.addresses.unwrap(), vec![NodeAddress { type_: "Hostname".into(), address: "n1".into() }]);
        assert_eq!(status.conditions.unwrap()[0].status, "True");
        assert_eq!(node.spec.unwrap().taints.unwrap(), vec![uninitialized_taint()]);
    }

    #[test]
    fn a_load_balancer_service_keeps_its_port_shape_when_renumbered() {
        let svc = lb_service("ns", "web").with_port(8443).with_annotations(&[("a", "b")]);
        let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.port, port.name.as_deref(), port.target_port.clone()),
            (8443, Some("http"), Some(IntOrString::Int(8080)))
        );
        assert_eq!(svc.metadata.annotations.unwrap()["a"], "b");
    }

    #[test]
    fn a_resource_is_built_from_its_spec_in_its_namespace() {
        let cr = cr("kube-system", "aws", serde_json::json!({"provider": "fake"}));
        assert_eq!((cr.metadata.namespace.as_deref(), cr.metadata.name.as_deref()), (Some("kube-system"), Some("aws")));
    }
}
