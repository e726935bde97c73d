//! Shadow mode's pure decision for one Service: what this controller would write to it and
//! ask of the cloud, given what the cloud says of its load balancer. No I/O here.

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

use super::NAME;
use super::logic::{self, SyncPlan};
use crate::shadow::{Difference, DifferenceKind, FieldDifference, ObjectKey};

/// Whether comparing `svc` needs the cloud's view of its load balancer (it wants one, or
/// its load balancer must go); the other Services agree without a cloud call.
pub fn needs_lookup(svc: &Service, class: logic::ClassFilter<'_>, finalizer: &str) -> bool {
    matches!(logic::plan_sync(Some(svc), None, class, finalizer), SyncPlan::Ensure | SyncPlan::Cleanup)
}

fn ingress_text(status: &LoadBalancerStatus) -> String {
    let ingress = status.ingress.as_deref().unwrap_or_default();
    ingress.iter().filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone())).collect::<Vec<_>>().join(",")
}

/// The differences for `svc` given the cloud's load balancer for it (`None`: the cloud has
/// none). `lb_name` is the provider's name for it. What the cloud would answer to an ensure it
/// was never asked cannot be known, so a load balancer to create shows no status to write;
/// and the cloud's backend hosts cannot be read, so `would-update-load-balancer` is never
/// decided here.
pub fn differences(
    svc: &Service,
    lb: Option<&LoadBalancerStatus>,
    lb_name: &str,
    class: logic::ClassFilter<'_>,
    finalizer: &str,
) -> Vec<Difference> {
    let object = ObjectKey::service(
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    let finalizer_path = format!("metadata.finalizers[{finalizer}]");
    let current = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
    let mut out = Vec::new();
    match logic::plan_sync(Some(svc), None, class, finalizer) {
        SyncPlan::Ensure => {
            let mut patch = Vec::new();
            if !logic::has_finalizer(svc, finalizer) {
                patch.push(FieldDifference::new(finalizer_path, finalizer));
            }
            match lb {
                None => out.push(Difference::new(
                    NAME,
                    object.clone(),
                    DifferenceKind::WouldCreateLoadBalancer,
                    vec![FieldDifference::new("loadBalancer", lb_name)],
                )),
                Some(status) if logic::ingress_changed(current, status) => {
                    patch.push(FieldDifference::new("status.loadBalancer.ingress", ingress_text(status)));
                }
                Some(_) => {}
            }
            if !patch.is_empty() {
                out.insert(0, Difference::new(NAME, object, DifferenceKind::WouldPatch, patch));
            }
        }
        SyncPlan::Cleanup => {
            if lb.is_some() {
                out.push(Difference::new(
                    NAME,
                    object.clone(),
                    DifferenceKind::WouldDeleteLoadBalancer,
                    vec![FieldDifference::new("loadBalancer", lb_name)],
                ));
            }
            let mut patch = Vec::new();
            if !logic::is_being_deleted(svc) && logic::ingress_changed(current, &LoadBalancerStatus::default()) {
                patch.push(FieldDifference::new("status.loadBalancer.ingress", ""));
            }
            if logic::has_finalizer(svc, finalizer) {
                patch.push(FieldDifference::new(finalizer_path, ""));
            }
            if !patch.is_empty() {
                out.insert(0, Difference::new(NAME, object, DifferenceKind::WouldPatch, patch));
            }
        }
        SyncPlan::DeleteGone | SyncPlan::Forget => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, ServiceSpec, ServiceStatus};
    use kube::api::ObjectMeta;

    const FIN: &str = logic::LOAD_BALANCER_CLEANUP_FINALIZER;

    fn status(ip: &str) -> LoadBalancerStatus {
        LoadBalancerStatus { ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.into()), ..Default::default() }]) }
    }

    fn service(finalizer: bool, ingress: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some("web".into()),
                finalizers: finalizer.then(|| vec![FIN.to_string()]),
                ..Default::default()
            },
            spec: Some(ServiceSpec { type_: Some("LoadBalancer".into()), ..Default::default() }),
            status: Some(ServiceStatus { load_balancer: ingress.map(status), ..Default::default() }),
        }
    }

    #[test]
    fn a_service_served_as_we_would_serve_it_shows_no_difference() {
        let svc = service(true, Some("192.0.2.1"));
        assert_eq!(differences(&svc, Some(&status("192.0.2.1")), "lb", logic::UNCLASSED, FIN), Vec::new());
    }

    #[test]
    fn a_load_balancer_the_cloud_does_not_know_would_be_created() {
        let svc = service(true, Some("192.0.2.1"));
        let d = differences(&svc, None, "a1234", logic::UNCLASSED, FIN);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].kind, DifferenceKind::WouldCreateLoadBalancer);
        assert_eq!(d[0].fields, vec![FieldDifference::new("loadBalancer", "a1234")]);
    }

    #[test]
    fn a_missing_finalizer_and_another_ingress_would_be_patched() {
        let svc = service(false, Some("192.0.2.1"));
        let d = differences(&svc, Some(&status("192.0.2.9")), "lb", logic::UNCLASSED, FIN);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, DifferenceKind::WouldPatch);
        let paths: Vec<(&str, &str)> = d[0].fields.iter().map(|f| (f.path.as_str(), f.ours.as_str())).collect();
        assert_eq!(
            paths,
            vec![
                ("metadata.finalizers[service.kubernetes.io/load-balancer-cleanup]", FIN),
                ("status.loadBalancer.ingress", "192.0.2.9"),
            ]
        );
    }

    #[test]
    fn a_service_no_longer_a_load_balancer_would_lose_its_load_balancer_status_and_finalizer() {
        let mut svc = service(true, Some("192.0.2.1"));
        svc.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        let d = differences(&svc, Some(&status("192.0.2.1")), "lb", logic::UNCLASSED, FIN);
        let kinds: Vec<DifferenceKind> = d.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, vec![DifferenceKind::WouldPatch, DifferenceKind::WouldDeleteLoadBalancer]);
        assert!(!needs_lookup(&service(false, None).clone_with_type("ClusterIP"), logic::UNCLASSED, FIN));
    }

    trait WithType {
        fn clone_with_type(&self, t: &str) -> Service;
    }

    impl WithType for Service {
        fn clone_with_type(&self, t: &str) -> Service {
            let mut s = self.clone();
            s.spec.as_mut().unwrap().type_ = Some(t.into());
            s
        }
    }
}
