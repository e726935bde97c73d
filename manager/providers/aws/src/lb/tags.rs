//! How a load balancer's objects are marked for their owner (pure): the tags upstream writes,
//! whether tags name this cluster and Service, and the descriptions that mark upstream's rules
//! on the Nodes' security groups.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

use crate::cluster::ClusterIdentity;
use crate::ledger::Owner;

/// Tag naming the Service (`<namespace>/<name>`), as upstream.
pub const TAG_SERVICE: &str = "kubernetes.io/service-name";

/// The description prefix of the client rules on the Nodes' groups (upstream's).
pub const NLB_CLIENT_RULE: &str = "kubernetes.io/rule/nlb/client";
/// The description prefix of the health-check rules (upstream's).
pub const NLB_HEALTH_RULE: &str = "kubernetes.io/rule/nlb/health";
/// The description of the path-MTU (ICMP 3/4) rules, shared by every NLB (upstream's).
pub const NLB_MTU_RULE: &str = "kubernetes.io/rule/nlb/mtu";

/// `<namespace>/<name>`.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The tags of a load balancer, its listeners and target groups, as upstream: the additional
/// tags, then the Service and the cluster's ownership tags over them.
pub fn lb_tags(
    cluster: &ClusterIdentity,
    service: &Service,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut tags = extra.clone();
    tags.insert(TAG_SERVICE.to_string(), service_key(service));
    tags.extend(cluster.owned_tags());
    tags
}

/// The tags of a security group made for a load balancer, as upstream: the additional tags and
/// the cluster's ownership tags (no Service tag).
pub fn group_tags(cluster: &ClusterIdentity, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut tags = extra.clone();
    tags.extend(cluster.owned_tags());
    tags
}

/// Whether `tags` mark an ELBv2 object of this cluster and Service.
pub fn owned_by(tags: &BTreeMap<String, String>, cluster: &ClusterIdentity, service: &Service) -> bool {
    cluster.tagged(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        && tags.get(TAG_SERVICE).is_some_and(|v| *v == service_key(service))
}

/// The ledger's owner for the Service's objects.
pub(super) fn owner(cluster: &ClusterIdentity, service: &Service) -> Owner {
    Owner { cluster: cluster.id.clone(), service: service_key(service) }
}

/// The description of a load balancer's client rules on the Nodes' groups.
pub fn rule_description(lb_name: &str) -> String {
    format!("{NLB_CLIENT_RULE}={lb_name}")
}

/// The description of a load balancer's health-check rules on the Nodes' groups.
pub fn health_rule_description(lb_name: &str) -> String {
    format!("{NLB_HEALTH_RULE}={lb_name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::fixtures::svc;

    #[test]
    fn load_balancer_tags_put_the_service_and_cluster_over_additional_tags() {
        let s = svc(&[], &[(80, "TCP", 30080)], "Cluster", 0);
        let c = ClusterIdentity { id: "prod".into(), legacy: true };
        let extra =
            BTreeMap::from([("team".to_string(), "web".to_string()), (TAG_SERVICE.to_string(), "x".to_string())]);
        let t = lb_tags(&c, &s, &extra);
        assert_eq!(t[TAG_SERVICE], "shop/web");
        assert_eq!(t["kubernetes.io/cluster/prod"], "owned");
        assert_eq!(t["KubernetesCluster"], "prod");
        assert_eq!(t["team"], "web");
        assert!(owned_by(&t, &c, &s));
        assert!(!owned_by(&t, &ClusterIdentity { id: "other".into(), legacy: false }, &s));
        let g = group_tags(&c, &extra);
        assert!(g.contains_key("kubernetes.io/cluster/prod") && g["team"] == "web");
    }
}
