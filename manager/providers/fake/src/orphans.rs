//! The fake's side of the orphan report (S34, S35) and of the capability report: which of its
//! load balancers carry this cluster's ownership (the cluster name they were ensured with), and
//! what its load balancers honour. Pure; the provider applies the deletions.

use ccm_framework::capabilities::{Capabilities, Feature, LoadBalancerCapabilities, Support};
use ccm_framework::provider::OwnedObject;

/// The kind the fake's load balancers are listed as.
pub const KIND: &str = "load-balancer";

/// One load balancer of the fake cloud as the orphan scan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed<'a> {
    /// Its cloud-side name.
    pub name: &'a str,
    /// The Service it serves, as `namespace/name`.
    pub service: &'a str,
    /// The cluster name it was ensured with.
    pub cluster_name: &'a str,
}

/// The load balancers ensured for `cluster_name`, as owned objects: each names its Service and
/// its own name (derived from the Service's UID), so a load balancer of an earlier Service of the
/// same name is told apart.
pub fn owned<'a>(load_balancers: impl IntoIterator<Item = Listed<'a>>, cluster_name: &str) -> Vec<OwnedObject> {
    load_balancers
        .into_iter()
        .filter(|lb| lb.cluster_name == cluster_name)
        .map(|lb| OwnedObject {
            load_balancer: Some(lb.name.to_string()),
            ..OwnedObject::new(KIND, lb.name, Some(lb.service.to_string()))
        })
        .collect()
}

/// What the fake honours: it allocates a requested `loadBalancerIP` (not in the `bench` profile)
/// and records the hosts; every other field is accepted and has no effect.
pub fn capabilities(name: &str, instances: bool, routes: bool, load_balancer: bool) -> Capabilities {
    let ignored = "accepted; the fake cloud has no data path";
    let lb = LoadBalancerCapabilities::from_fields([
        (Feature::TcpPorts, Support::Ignored, ignored),
        (Feature::UdpPorts, Support::Ignored, ignored),
        (Feature::SctpPorts, Support::Ignored, ignored),
        (Feature::MixedProtocols, Support::Ignored, ignored),
        (Feature::LoadBalancerIp, Support::Honoured, "the address is handed out as asked (not with `profile: bench`)"),
        (Feature::SourceRanges, Support::Ignored, ignored),
        (Feature::SessionAffinity, Support::Ignored, ignored),
        (Feature::ExternalTrafficPolicyLocal, Support::Ignored, ignored),
        (Feature::DualStack, Support::Ignored, "one IPv4 address"),
        (Feature::NoNodePorts, Support::Ignored, ignored),
        (Feature::IpModeProxy, Support::Ignored, "ipMode is left unset (VIP)"),
    ])
    .with_orphans(true);
    Capabilities { provider: name.to_string(), instances, routes, load_balancer: load_balancer.then_some(lb) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb<'a>(name: &'a str, service: &'a str, cluster_name: &'a str) -> Listed<'a> {
        Listed { name, service, cluster_name }
    }

    #[test]
    fn s34_only_load_balancers_of_this_cluster_are_owned_and_each_names_its_service_and_name() {
        let lbs = [lb("a1", "ns/web", "prod"), lb("a2", "ns/api", "staging")];
        let owned = owned(lbs, "prod");
        assert_eq!(owned.len(), 1);
        assert_eq!(owned[0].kind, KIND);
        assert_eq!(owned[0].id, "a1");
        assert_eq!(owned[0].service.as_deref(), Some("ns/web"));
        assert_eq!(owned[0].load_balancer.as_deref(), Some("a1"));
    }

    #[test]
    fn the_fake_reports_every_field_and_its_orphan_listing() {
        let c = capabilities("fake", true, true, true);
        let lb = c.load_balancer.unwrap();
        assert!(lb.fields.iter().all(|f| f.support != Support::Unknown));
        assert_eq!(lb.support(Feature::LoadBalancerIp), Support::Honoured);
        assert!(lb.orphans);
        assert!(capabilities("fake", true, true, false).load_balancer.is_none());
    }
}
