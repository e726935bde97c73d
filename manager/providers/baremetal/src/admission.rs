//! The provider's admission webhook (KEP-2699 hosting, see `ccm_framework::webhook`): a
//! LoadBalancer Service that asks for an address no pool can give (`spec.loadBalancerIP`,
//! `ccm.rs/load-balancer-ips`, MetalLB's or Cilium's requested-address annotations) is refused
//! when it is created or edited, instead of being accepted and then left without an address
//! with a `RequestedAddressUnavailable` condition.
//!
//! It decides from the pools alone: an address in no pool, in a pool that does not admit the
//! Service (namespaces, selectors, the `ccm.rs/address-pool` annotation), in a disabled pool, or
//! one `avoidBuggyIPs` skips. Whether another Service holds the address is left to the service
//! controller (that changes from one moment to the next). An edit that keeps the addresses the
//! Service already asked for is never refused, so a Service whose pool was edited away can
//! still be changed. With `loadBalancer.poolResources`, a replica that has not read the pool
//! resources (a standby) allows the request with a warning.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_framework::webhook::{Admission, AdmissionContext, AdmissionRequest, AdmissionWebhook};
use k8s_openapi::api::core::v1::Service;

use crate::BaremetalProvider;
use crate::ipam::{self, AllocError, LbRequest, Pool, Slot};

/// The webhook's name in `--webhooks`.
pub const WEBHOOK_NAME: &str = "baremetal-requested-addresses";
/// The path it is served at.
pub const WEBHOOK_PATH: &str = "/validate-baremetal-requested-addresses";

/// The addresses `request` asks for by name.
fn requested(request: &LbRequest) -> Vec<IpAddr> {
    request.slots.iter().filter_map(|s| if let Slot::Exact(ip) = s { Some(*ip) } else { None }).collect()
}

/// Why no pool can give `service` an address it asks for, or `None` when every newly asked
/// address can be given (pure). `old` is the Service before an edit: addresses it already
/// asked for are not checked again, nor a malformed request it already had.
pub fn refusal(
    service: &Service,
    old: Option<&Service>,
    pools: &[Pool],
    namespace_labels: BTreeMap<String, String>,
) -> Option<String> {
    let old_request = old.map(ipam::request_for);
    let mut request = match ipam::request_for(service) {
        Ok(r) => r,
        Err(AllocError::Invalid(m) | AllocError::Unsatisfiable(_, m)) => {
            let same =
                matches!(&old_request, Some(Err(AllocError::Invalid(o) | AllocError::Unsatisfiable(_, o))) if *o == m);
            return (!same).then_some(m);
        }
        Err(AllocError::NotReady) => return None,
    };
    request.namespace_labels = namespace_labels;
    let before: Vec<IpAddr> = match &old_request {
        Some(Ok(r)) => requested(r),
        _ => Vec::new(),
    };
    let key = &request.key;
    for ip in requested(&request).into_iter().filter(|ip| !before.contains(ip)) {
        let Some(pool) = pools.iter().find(|p| p.blocks.iter().any(|b| b.contains(ip))) else {
            return Some(format!("{key} asks for {ip}, which is in no load-balancer pool"));
        };
        if !pool.admits(&request) {
            return Some(format!(
                "{key} asks for {ip}, but pool {} does not admit it (namespaces, serviceSelector, namespaceSelector or the address-pool annotation)",
                pool.name
            ));
        }
        if let Some(why) = ipam::withheld(pool, key, ip) {
            return Some(why);
        }
    }
    None
}

/// The webhook, over the provider's live pools.
#[derive(Debug)]
pub struct AddressWebhook {
    provider: Arc<BaremetalProvider>,
}

impl AddressWebhook {
    /// The webhook of `provider`.
    pub fn new(provider: Arc<BaremetalProvider>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl AdmissionWebhook for AddressWebhook {
    fn name(&self) -> &str {
        WEBHOOK_NAME
    }

    fn path(&self) -> &str {
        WEBHOOK_PATH
    }

    async fn admit(&self, ctx: &AdmissionContext, request: &AdmissionRequest) -> Result<Admission, String> {
        if request.kind.kind != "Service" || !matches!(request.operation.as_str(), "CREATE" | "UPDATE") {
            return Ok(Admission::allowed());
        }
        let Some(service) = request.object_as::<Service>()? else { return Ok(Admission::allowed()) };
        if !ctx.takes_service(&service) {
            return Ok(Admission::allowed());
        }
        // Pool resources are read by the leader at start: another replica cannot judge yet.
        if self.provider.pool_resources && self.provider.client.get().is_none() {
            return Ok(Admission::Allowed {
                warnings: vec![
                    "the load-balancer pools are not known to this replica yet; requested addresses not checked".into(),
                ],
            });
        }
        let old = if request.operation == "UPDATE" { request.old_object_as::<Service>()? } else { None };
        let namespace = request.namespace.clone().unwrap_or_default();
        let labels = if self.provider.pool_resources {
            self.provider.pools.namespace_labels(&namespace)
        } else {
            BTreeMap::new()
        };
        let pools = self.provider.allocator.pools();
        Ok(match refusal(&service, old.as_ref(), &pools, labels) {
            Some(why) => Admission::denied(why),
            None => Admission::allowed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use kube::api::ObjectMeta;

    fn pool(name: &str, cidr: &str) -> Pool {
        crate::ipam::test_pool(name, &[cidr])
    }

    fn service(ns: &str, ip: Option<&str>, annotation: Option<(&str, &str)>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some(ns.into()),
                annotations: annotation.map(|(k, v)| [(k.to_string(), v.to_string())].into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_ip: ip.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_address_in_no_pool_is_refused_naming_it_and_a_pool_address_is_not() {
        let pools = [pool("default", "192.0.2.0/28")];
        let none = BTreeMap::new;
        assert_eq!(refusal(&service("a", Some("192.0.2.5"), None), None, &pools, none()), None);
        assert_eq!(refusal(&service("a", None, None), None, &pools, none()), None, "nothing requested");
        let why = refusal(&service("a", Some("198.51.100.7"), None), None, &pools, none()).unwrap();
        assert!(why.contains("a/web asks for 198.51.100.7, which is in no load-balancer pool"), "{why}");
        let ours = service("a", None, Some((ipam::LOAD_BALANCER_IPS_ANNOTATION, "198.51.100.8")));
        assert!(refusal(&ours, None, &pools, none()).unwrap().contains("198.51.100.8"));
        let metallb = service("a", None, Some(("metallb.universe.tf/loadBalancerIPs", "198.51.100.9")));
        assert!(refusal(&metallb, None, &pools, none()).unwrap().contains("198.51.100.9"));
        let malformed = service("a", None, Some((ipam::LOAD_BALANCER_IPS_ANNOTATION, "not-an-ip")));
        assert!(refusal(&malformed, None, &pools, none()).unwrap().contains("not an IP address"));
    }

    #[test]
    fn pools_that_do_not_admit_the_service_or_hand_out_nothing_refuse_it() {
        let mut only_b = pool("only-b", "192.0.2.0/28");
        only_b.namespaces = ["b".to_string()].into();
        let mut off = pool("off", "192.0.2.16/28");
        off.disabled = true;
        let mut careful = pool("careful", "198.51.100.0/24");
        careful.avoid_buggy_ips = true;
        let pools = [only_b, off, careful, pool("wide", "10.0.0.0/24")];
        let why = |svc: Service| refusal(&svc, None, &pools, BTreeMap::new());
        assert!(why(service("a", Some("192.0.2.1"), None)).unwrap().contains("pool only-b does not admit it"));
        assert_eq!(why(service("b", Some("192.0.2.1"), None)), None);
        assert!(why(service("b", Some("192.0.2.17"), None)).unwrap().contains("pool off is disabled"));
        // avoidBuggyIPs skips addresses ending in .0 and .255, as MetalLB.
        assert!(why(service("b", Some("198.51.100.255"), None)).unwrap().contains("avoidBuggyIPs"));
        assert_eq!(why(service("b", Some("198.51.100.63"), None)), None);
        let named = service("a", Some("10.0.0.1"), Some((ipam::ADDRESS_POOL_ANNOTATION, "careful")));
        assert!(why(named).unwrap().contains("pool wide does not admit it"));
    }

    #[test]
    fn an_ipv6_pools_subnet_router_anycast_address_is_refused_as_the_allocator_refuses_it() {
        let pools = [pool("v6", "fd00:10::/120")];
        let why = |ip: &str| refusal(&service("a", Some(ip), None), None, &pools, BTreeMap::new());
        let anycast = why("fd00:10::").unwrap();
        assert!(anycast.contains("subnet-router anycast address of pool v6"), "{anycast}");
        assert_eq!(why("fd00:10::1"), None);
    }

    #[test]
    fn an_edit_keeping_the_addresses_already_asked_for_is_never_refused() {
        let pools = [pool("default", "192.0.2.0/28")];
        let before = service("a", Some("198.51.100.7"), None);
        let mut relabelled = before.clone();
        relabelled.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
        assert_eq!(refusal(&relabelled, Some(&before), &pools, BTreeMap::new()), None);
        let moved = service("a", Some("198.51.100.8"), None);
        assert!(refusal(&moved, Some(&before), &pools, BTreeMap::new()).is_some(), "a new address is checked");
        let bad = service("a", None, Some((ipam::LOAD_BALANCER_IPS_ANNOTATION, "x")));
        assert_eq!(refusal(&bad, Some(&bad), &pools, BTreeMap::new()), None, "an old malformed request stays editable");
    }
}
