//! The names upstream gives a load balancer's objects (pure), so that objects upstream made are
//! the ones found and kept: target groups, the NLB's managed security group, and the Classic
//! ELB's `k8s-elb-*` security group.

use ring::digest::{Context, SHA1_FOR_LEGACY_USE_ONLY, SHA256};

/// `s` without the characters outside `[A-Za-z0-9]`, at most `n` of them (Go's
/// `[^[:alnum:]]` removal and `%.Ns`).
fn sanitized(s: &str, n: usize) -> String {
    s.chars().filter(char::is_ascii_alphanumeric).take(n).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What upstream's target-group name hashes, for one listener.
#[derive(Debug, Clone, Copy)]
pub struct TargetGroupKey<'a> {
    /// The cluster ID.
    pub cluster_id: &'a str,
    /// The Service's namespace.
    pub namespace: &'a str,
    /// The Service's name.
    pub name: &'a str,
    /// The Service port (the listener's).
    pub port: i32,
    /// The nodePort (the targets').
    pub node_port: i32,
    /// The target protocol: `TCP`, `UDP` or `TLS`.
    pub protocol: &'a str,
    /// The health check's protocol (`TCP`, `HTTP`, `HTTPS`).
    pub health_protocol: &'a str,
    /// The health check's interval.
    pub health_interval: i32,
}

/// Upstream's target-group name, `k8s-<namespace:8>-<name:8>-<10 hex>`: the hex is SHA-1 over
/// the cluster ID, namespace, name, port, nodePort, target protocol, target type (`instance`),
/// health-check protocol and interval, concatenated.
pub fn target_group_name(k: &TargetGroupKey<'_>) -> String {
    let mut h = Context::new(&SHA1_FOR_LEGACY_USE_ONLY);
    for part in [
        k.cluster_id,
        k.namespace,
        k.name,
        &k.port.to_string(),
        &k.node_port.to_string(),
        k.protocol,
        "instance",
        k.health_protocol,
        &k.health_interval.to_string(),
    ] {
        h.update(part.as_bytes());
    }
    let digest = hex(h.finish().as_ref());
    format!("k8s-{}-{}-{}", sanitized(k.namespace, 8), sanitized(k.name, 8), &digest[..10])
}

/// Upstream's name for an NLB's managed security group (`NLBSecurityGroupMode = Managed`),
/// `k8s-<namespace:8>-<name:8>-<10 hex>`: the hex is SHA-256 over `--cluster-name`, the
/// Service's name, namespace and UID, concatenated.
pub fn managed_group_name(cluster_name: &str, namespace: &str, name: &str, uid: &str) -> String {
    let mut h = Context::new(&SHA256);
    for part in [cluster_name, name, namespace, uid] {
        h.update(part.as_bytes());
    }
    let digest = hex(h.finish().as_ref());
    format!("k8s-{}-{}-{}", sanitized(namespace, 8), sanitized(name, 8), &digest[..10])
}

/// The managed group's description, as upstream.
pub const MANAGED_GROUP_DESCRIPTION: &str = "[k8s] Managed SecurityGroup for LoadBalancer";

/// The Classic ELB's own security group, `k8s-elb-<load balancer name>`.
pub fn classic_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

/// The Classic ELB's security group's description, as upstream.
pub fn classic_group_description(lb_name: &str, service_key: &str) -> String {
    format!("Security group for Kubernetes ELB {lb_name} ({service_key})")
}

/// The Classic ELB's proxy-protocol policy.
pub const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// The Classic ELB's SSL negotiation policy for a reference policy.
pub fn ssl_policy_name(reference: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{reference}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha1_hex(s: &str) -> String {
        hex(ring::digest::digest(&SHA1_FOR_LEGACY_USE_ONLY, s.as_bytes()).as_ref())
    }

    #[test]
    fn target_group_names_hash_upstreams_fields_in_upstreams_order() {
        let k = TargetGroupKey {
            cluster_id: "prod",
            namespace: "shop-front",
            name: "web.server-main",
            port: 80,
            node_port: 30080,
            protocol: "TCP",
            health_protocol: "TCP",
            health_interval: 30,
        };
        let want = &sha1_hex("prodshop-frontweb.server-main8030080TCPinstanceTCP30")[..10];
        assert_eq!(target_group_name(&k), format!("k8s-shopfron-webserve-{want}"));
        assert!(target_group_name(&k).len() <= 32);
        let other = TargetGroupKey { health_interval: 10, ..k };
        assert_ne!(target_group_name(&other), target_group_name(&k));
    }

    #[test]
    fn managed_group_names_hash_cluster_name_name_namespace_and_uid() {
        let digest = hex(ring::digest::digest(&SHA256, b"kuberneteswebshopuid-1").as_ref());
        assert_eq!(managed_group_name("kubernetes", "shop", "web", "uid-1"), format!("k8s-shop-web-{}", &digest[..10]));
    }

    #[test]
    fn classic_names_follow_upstream() {
        assert_eq!(classic_group_name("a1b2"), "k8s-elb-a1b2");
        assert_eq!(classic_group_description("a1b2", "ns/web"), "Security group for Kubernetes ELB a1b2 (ns/web)");
        assert_eq!(ssl_policy_name("ELBSecurityPolicy-2016-08"), "k8s-SSLNegotiationPolicy-ELBSecurityPolicy-2016-08");
    }
}
