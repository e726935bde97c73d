//! Pure decisions of the service controller: which Services it handles, which changes make it
//! act, which Nodes are load-balancer hosts and whether a host set changed. No I/O here.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service, ServicePort};

/// The upstream cleanup finalizer (KEP-992), used when no `--load-balancer-class` is set.
pub const LOAD_BALANCER_CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// Label that takes a Node out of every load balancer's host set (S20).
pub const EXCLUDE_FROM_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// Taint the cluster autoscaler puts on a Node it is about to remove (S19).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// Most node names listed in an `UpdateLoadBalancerFailed` event (S17).
pub const MAX_NODE_NAMES_IN_EVENT: usize = 20;
/// First delay of the per-key exponential backoff (upstream's service queue).
pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Largest delay of the per-key exponential backoff.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Largest backoff after a provider's refusal (`CloudError::Refused`): it may clear without
/// any change to the Service (an address freed, a pool added), so it is retried more often.
pub const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// First delay of a retry after the API server refused a write (S32): its own back-off, apart
/// from the cloud's, so an outage of the API server never lengthens a Service's cloud back-off.
pub const API_BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Largest delay of the API back-off: once the API server answers again, every pending Service
/// is retried within this.
pub const API_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The finalizer this manager owns. Unclassed managers use upstream's; a manager restricted to
/// one `loadBalancerClass` uses its own, so that after a type change (which clears the class)
/// two managers sharing a cluster never clean up each other's load balancers.
pub fn cleanup_finalizer(class: Option<&str>) -> String {
    let Some(class) = class else { return LOAD_BALANCER_CLEANUP_FINALIZER.to_string() };
    // FNV-1a keeps two classes that sanitize alike apart.
    let hash = class.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let mut readable: String =
        class.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    // "cleanup-" + readable + "-" + 8 hex digits fits the 63-character name limit.
    readable.truncate(46);
    format!("lb-class.ccm.rs/cleanup-{readable}-{hash:08x}")
}

/// The canonical `namespace/name` key of a Service.
pub fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn is_type_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// S1, S28: which `loadBalancerClass`es this manager takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassFilter<'a> {
    /// `--load-balancer-class`; `None`: Services without a class (upstream).
    pub class: Option<&'a str>,
    /// `--handle-unclassed-services`: a manager with a class also takes Services without one.
    pub also_unclassed: bool,
}

/// Upstream's filter: Services without a `loadBalancerClass`.
pub const UNCLASSED: ClassFilter<'static> = ClassFilter::of(None);

impl<'a> ClassFilter<'a> {
    /// Exactly the Services of `class` (`None`: those without one).
    pub const fn of(class: Option<&'a str>) -> Self {
        Self { class, also_unclassed: false }
    }

    /// Whether a Service whose `spec.loadBalancerClass` is `service_class` is for this manager.
    pub fn takes(self, service_class: Option<&str>) -> bool {
        service_class == self.class || (service_class.is_none() && self.also_unclassed)
    }
}

/// S1: the Service wants a load balancer from this manager: `type: LoadBalancer` and a
/// `loadBalancerClass` the manager takes (both unset upstream; S28 adds unset ones to a class).
pub fn wants_load_balancer(svc: &Service, class: ClassFilter<'_>) -> bool {
    is_type_load_balancer(svc) && class.takes(svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()))
}

/// Whether the Service carries `finalizer`.
pub fn has_finalizer(svc: &Service, finalizer: &str) -> bool {
    svc.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Whether the Service is being deleted.
pub fn is_being_deleted(svc: &Service) -> bool {
    svc.metadata.deletion_timestamp.is_some()
}

/// S2: the Service has this manager's finalizer and is being deleted or no longer a
/// LoadBalancer, so its load balancer must go.
pub fn needs_cleanup(svc: &Service, finalizer: &str) -> bool {
    has_finalizer(svc, finalizer) && (is_being_deleted(svc) || !is_type_load_balancer(svc))
}

/// S2: whether a newly seen Service is worth a sync.
pub fn should_sync_added(svc: &Service, class: ClassFilter<'_>, finalizer: &str) -> bool {
    wants_load_balancer(svc, class) || needs_cleanup(svc, finalizer)
}

/// S3: whether an update is worth a sync.
pub fn should_sync_updated(old: &Service, new: &Service, class: ClassFilter<'_>, finalizer: &str) -> bool {
    update_trigger(old, new, class).is_some() || needs_cleanup(new, finalizer)
}

fn empty_if_none<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or_default()
}

fn ports_equal_for_lb(a: &[ServicePort], b: &[ServicePort]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.protocol == y.protocol
                && x.port == y.port
                && x.node_port == y.node_port
                && x.target_port == y.target_port
                && x.app_protocol == y.app_protocol
        })
}

/// S3: the first field whose change makes the load balancer need an ensure, or `None`.
/// Only Services that want a load balancer before or after count. Labels, selector,
/// finalizers, status, `allocateLoadBalancerNodePorts`, `internalTrafficPolicy` and
/// `ipFamilyPolicy` never trigger. An unset list or map equals an empty one.
pub fn update_trigger(old: &Service, new: &Service, class: ClassFilter<'_>) -> Option<&'static str> {
    let (old_wants, new_wants) = (wants_load_balancer(old, class), wants_load_balancer(new, class));
    if !old_wants && !new_wants {
        return None;
    }
    if old_wants != new_wants {
        return Some("type");
    }
    let default_spec = Default::default();
    let o = old.spec.as_ref().unwrap_or(&default_spec);
    let n = new.spec.as_ref().unwrap_or(&default_spec);
    if empty_if_none(&o.load_balancer_source_ranges) != empty_if_none(&n.load_balancer_source_ranges) {
        return Some("loadBalancerSourceRanges");
    }
    if !ports_equal_for_lb(empty_if_none(&o.ports), empty_if_none(&n.ports)) {
        return Some("ports");
    }
    if o.session_affinity != n.session_affinity || o.session_affinity_config != n.session_affinity_config {
        return Some("sessionAffinity");
    }
    if o.load_balancer_ip != n.load_balancer_ip {
        return Some("loadBalancerIP");
    }
    if empty_if_none(&o.external_ips) != empty_if_none(&n.external_ips) {
        return Some("externalIPs");
    }
    let no_annotations = BTreeMap::new();
    if old.metadata.annotations.as_ref().unwrap_or(&no_annotations)
        != new.metadata.annotations.as_ref().unwrap_or(&no_annotations)
    {
        return Some("annotations");
    }
    if old.metadata.uid != new.metadata.uid {
        return Some("uid");
    }
    if o.external_traffic_policy != n.external_traffic_policy {
        return Some("externalTrafficPolicy");
    }
    if o.health_check_node_port != n.health_check_node_port {
        return Some("healthCheckNodePort");
    }
    if empty_if_none(&o.ip_families).len() != empty_if_none(&n.ip_families).len() {
        return Some("ipFamilies");
    }
    None
}

/// What one sync of a Service key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPlan {
    /// S7: add the finalizer if missing, then ensure the load balancer.
    Ensure,
    /// S11: delete the load balancer if it exists, then drop the finalizer if present.
    Cleanup,
    /// S14: the Service is gone without a finalizer; delete the load balancer it had.
    DeleteGone,
    /// Nothing to do; forget the key.
    Forget,
}

/// Decide a sync from the cached Service (`None` when gone) and the Service as last synced.
/// A Service being deleted never gets an ensure, so the finalizer is never added to it
/// (a deliberate fix, reference §6 item 9).
pub fn plan_sync(
    current: Option<&Service>,
    last: Option<&Service>,
    class: ClassFilter<'_>,
    finalizer: &str,
) -> SyncPlan {
    match current {
        None if last.is_some_and(|l| wants_load_balancer(l, class)) => SyncPlan::DeleteGone,
        None => SyncPlan::Forget,
        Some(svc) if wants_load_balancer(svc, class) && !is_being_deleted(svc) => SyncPlan::Ensure,
        Some(svc) if has_finalizer(svc, finalizer) || wants_load_balancer(svc, class) => SyncPlan::Cleanup,
        // Neither ours nor wanting a load balancer: only a previously synced one needs a look.
        Some(_) if last.is_some_and(|l| wants_load_balancer(l, class)) => SyncPlan::Cleanup,
        Some(_) => SyncPlan::Forget,
    }
}

/// S6: the cached Service was deleted and recreated under the same name since the last sync,
/// so the old load balancer must be deleted first.
pub fn recreated_since(current: &Service, last: &Service, class: ClassFilter<'_>) -> bool {
    current.metadata.uid != last.metadata.uid && wants_load_balancer(last, class)
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// S20: the exclusion label takes the Node out of load balancers: present and either a true
/// boolean or not a boolean at all.
pub fn is_excluded_from_load_balancers(node: &Node) -> bool {
    match node.metadata.labels.as_ref().and_then(|l| l.get(EXCLUDE_FROM_LB_LABEL)) {
        None => false,
        Some(v) => parse_go_bool(v).unwrap_or(true),
    }
}

fn has_to_be_deleted_taint(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
}

/// S19: a Node is a load-balancer host iff it is not being deleted, not excluded by label and
/// not tainted for removal by the cluster autoscaler. Readiness does not matter (KEP-3458).
pub fn is_load_balancer_host(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && !is_excluded_from_load_balancers(node)
        && !has_to_be_deleted_taint(node)
}

/// S15: whether a Node update can change some host set. Upstream reacts to the exclusion
/// label and the providerID; the autoscaler's removal taint and a deletion timestamp
/// also count here (a deliberate fix, reference §6 item 4).
pub fn node_update_changes_hosts(old: &Node, new: &Node) -> bool {
    is_excluded_from_load_balancers(old) != is_excluded_from_load_balancers(new)
        || old.spec.as_ref().and_then(|s| s.provider_id.as_ref())
            != new.spec.as_ref().and_then(|s| s.provider_id.as_ref())
        || is_load_balancer_host(old) != is_load_balancer_host(new)
}

/// A load balancer's host set: Node name to providerID ("" when unset).
pub type HostSet = BTreeMap<String, String>;

/// S16: the host set of `nodes` after the S19 predicates.
pub fn host_set<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> HostSet {
    nodes
        .into_iter()
        .filter(|n| is_load_balancer_host(n))
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                n.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default(),
            )
        })
        .collect()
}

/// S10: whether writing `new` changes the Service's ingress (conditions are not compared; an
/// unset list equals an empty one; an unset ipMode of an IP entry equals `VIP`, which the API
/// server stores in its place).
pub fn ingress_changed(current: Option<&LoadBalancerStatus>, new: &LoadBalancerStatus) -> bool {
    fn normalized(status: Option<&LoadBalancerStatus>) -> Vec<LoadBalancerIngress> {
        let mut ingress = status.and_then(|s| s.ingress.clone()).unwrap_or_default();
        for i in &mut ingress {
            if i.ip.is_some() && i.ip_mode.is_none() {
                i.ip_mode = Some("VIP".into());
            }
        }
        ingress
    }
    normalized(current) != normalized(Some(new))
}

/// Whether the Service's status reports a load-balancer ingress.
pub fn reports_ingress(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// S30 (ours): after a refusal, whether the Service's ingress is stale and goes: it reports one
/// and the provider says no load balancer exists (`exists`, `None` when asking failed, keeps
/// it). A provider refusing a change while the old load balancer serves keeps its ingress; one
/// that let go of the load balancer (a port it must not serve) takes it out, since kube-proxy
/// forwards whatever a Service reports.
pub fn ingress_is_stale(svc: &Service, exists: Option<bool>) -> bool {
    exists == Some(false) && reports_ingress(svc)
}

/// S17 and S30: whether a failed host update needs no retry: the load balancer no longer exists
/// and the Service reports none; one that still reports an ingress goes through the full
/// ensure, which takes the stale ingress out.
pub fn failed_update_needs_no_retry(svc: &Service, exists: Option<bool>) -> bool {
    exists == Some(false) && !reports_ingress(svc)
}

/// Per-key exponential backoff: 5 s after the first failure, doubling, at most 300 s.
pub fn backoff_delay(failures: u32) -> Duration {
    let factor = 1u64.checked_shl(failures.saturating_sub(1)).unwrap_or(u64::MAX);
    BACKOFF_BASE.checked_mul(u32::try_from(factor).unwrap_or(u32::MAX)).map_or(BACKOFF_MAX, |d| d.min(BACKOFF_MAX))
}

/// S32: the API back-off, 200 ms after the first failure, doubling, at most 5 s.
pub fn api_backoff_delay(failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX);
    API_BACKOFF_BASE.checked_mul(factor).map_or(API_BACKOFF_MAX, |d| d.min(API_BACKOFF_MAX))
}

/// S32: whether a failed API request is one to retry on the API back-off: the server failed
/// (5xx), throttled (429) or did not answer (a transport error or timeout). Other refusals (a
/// 4xx: invalid, forbidden, conflict) do not pass by retrying soon and back off like the cloud.
pub fn is_transient_api_error(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        _ => true,
    }
}

/// S17: the `UpdateLoadBalancerFailed` message, naming at most 20 hosts plus the total.
pub fn update_failed_message(hosts: &HostSet, error: &str) -> String {
    let shown: Vec<&str> = hosts.keys().take(MAX_NODE_NAMES_IN_EVENT).map(String::as_str).collect();
    let more = hosts.len().saturating_sub(shown.len());
    let list =
        if more > 0 { format!("[{}, and {more} more]", shown.join(", ")) } else { format!("[{}]", shown.join(", ")) };
    format!("Error updating load balancer with new hosts {list} ({} in total): {error}", hosts.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, ServiceSpec, SessionAffinityConfig, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kube::api::ObjectMeta;

    const F: &str = LOAD_BALANCER_CLEANUP_FINALIZER;

    fn lb() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    protocol: Some("TCP".into()),
                    port: 80,
                    node_port: Some(30080),
                    target_port: Some(IntOrString::Int(8080)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::now())
    }

    #[test]
    fn s1_class_decides_which_manager_wants_the_service() {
        let mut svc = lb();
        assert!(wants_load_balancer(&svc, UNCLASSED));
        assert!(!wants_load_balancer(&svc, ClassFilter::of(Some("internal"))));
        svc.spec.as_mut().unwrap().load_balancer_class = Some("internal".into());
        assert!(!wants_load_balancer(&svc, UNCLASSED), "S1: a classed Service is not for the unclassed manager");
        assert!(wants_load_balancer(&svc, ClassFilter::of(Some("internal"))));
        assert!(!wants_load_balancer(&svc, ClassFilter::of(Some("external"))));
        svc.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(!wants_load_balancer(&svc, ClassFilter::of(Some("internal"))));
    }

    #[test]
    fn s28_a_classed_manager_told_to_also_takes_services_without_a_class_but_no_other_class() {
        let both = ClassFilter { class: Some("internal"), also_unclassed: true };
        let mut svc = lb();
        assert!(wants_load_balancer(&svc, both), "S28: an unclassed Service");
        svc.spec.as_mut().unwrap().load_balancer_class = Some("internal".into());
        assert!(wants_load_balancer(&svc, both), "S28: its own class");
        svc.spec.as_mut().unwrap().load_balancer_class = Some("external".into());
        assert!(!wants_load_balancer(&svc, both), "S28: never another class");
        assert!(!wants_load_balancer(&lb(), ClassFilter::of(Some("internal"))), "S1 without the opt-in");
    }

    #[test]
    fn classed_managers_own_distinct_valid_finalizers() {
        assert_eq!(cleanup_finalizer(None), F);
        let a = cleanup_finalizer(Some("example.com/internal"));
        let b = cleanup_finalizer(Some("example.com-internal"));
        assert_ne!(a, b);
        assert_ne!(a, F);
        for f in [a, b, cleanup_finalizer(Some(&"x/".repeat(200)))] {
            let (prefix, name) = f.split_once('/').unwrap();
            assert_eq!(prefix, "lb-class.ccm.rs");
            assert!(name.len() <= 63, "{name}");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)), "{name}");
            assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn s2_added_service_is_synced_when_it_wants_a_load_balancer_or_needs_cleanup() {
        assert!(should_sync_added(&lb(), UNCLASSED, F));
        let mut cip = lb();
        cip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(!should_sync_added(&cip, UNCLASSED, F));
        cip.metadata.finalizers = Some(vec![F.into()]);
        assert!(should_sync_added(&cip, UNCLASSED, F), "S13: type changed while the manager was down");
        let mut deleting = lb();
        deleting.metadata.finalizers = Some(vec![F.into()]);
        deleting.metadata.deletion_timestamp = Some(now());
        assert!(needs_cleanup(&deleting, F));
        assert!(!needs_cleanup(&deleting, &cleanup_finalizer(Some("other"))));
    }

    type Edit = fn(&mut Service);

    fn spec(s: &mut Service) -> &mut ServiceSpec {
        s.spec.as_mut().unwrap()
    }

    fn port(s: &mut Service) -> &mut ServicePort {
        &mut spec(s).ports.as_mut().unwrap()[0]
    }

    #[test]
    fn s3_update_matrix() {
        let triggers: &[(&str, Edit)] = &[
            ("type", |s| spec(s).type_ = Some("NodePort".into())),
            ("loadBalancerSourceRanges", |s| spec(s).load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into()])),
            ("ports", |s| port(s).name = Some("web".into())),
            ("ports", |s| port(s).protocol = Some("UDP".into())),
            ("ports", |s| port(s).port = 81),
            ("ports", |s| port(s).node_port = Some(30081)),
            ("ports", |s| port(s).target_port = Some(IntOrString::String("http".into()))),
            ("ports", |s| port(s).app_protocol = Some("http".into())),
            ("ports", |s| spec(s).ports.as_mut().unwrap().push(ServicePort { port: 443, ..Default::default() })),
            ("sessionAffinity", |s| spec(s).session_affinity = Some("ClientIP".into())),
            ("sessionAffinity", |s| spec(s).session_affinity_config = Some(SessionAffinityConfig::default())),
            ("loadBalancerIP", |s| spec(s).load_balancer_ip = Some("192.0.2.1".into())),
            ("externalIPs", |s| spec(s).external_ips = Some(vec!["192.0.2.2".into()])),
            ("annotations", |s| {
                s.metadata.annotations = Some([("lb.example/size".to_string(), "big".to_string())].into())
            }),
            ("uid", |s| s.metadata.uid = Some("uid-2".into())),
            ("externalTrafficPolicy", |s| spec(s).external_traffic_policy = Some("Local".into())),
            ("healthCheckNodePort", |s| spec(s).health_check_node_port = Some(32000)),
            ("ipFamilies", |s| spec(s).ip_families = Some(vec!["IPv4".into(), "IPv6".into()])),
        ];
        for (field, edit) in triggers {
            let old = lb();
            let mut new = lb();
            edit(&mut new);
            assert_eq!(update_trigger(&old, &new, UNCLASSED), Some(*field), "S3: {field} must trigger");
            // Either side wanting a load balancer is enough.
            assert!(update_trigger(&new, &old, UNCLASSED).is_some(), "S3: reverse {field} must trigger");
        }
        let quiet: &[(&str, Edit)] = &[
            ("labels", |s| s.metadata.labels = Some([("app".to_string(), "x".to_string())].into())),
            ("selector", |s| spec(s).selector = Some([("app".to_string(), "x".to_string())].into())),
            ("finalizers", |s| s.metadata.finalizers = Some(vec![F.into()])),
            ("allocateLoadBalancerNodePorts", |s| spec(s).allocate_load_balancer_node_ports = Some(false)),
            ("internalTrafficPolicy", |s| spec(s).internal_traffic_policy = Some("Local".into())),
            ("ipFamilyPolicy", |s| spec(s).ip_family_policy = Some("PreferDualStack".into())),
            ("ipFamilies order", |s| spec(s).ip_families = Some(vec!["IPv4".into()])),
            ("status", |s| {
                s.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
                    load_balancer: Some(LoadBalancerStatus {
                        ingress: Some(vec![LoadBalancerIngress { ip: Some("192.0.2.9".into()), ..Default::default() }]),
                    }),
                    ..Default::default()
                })
            }),
            ("resourceVersion", |s| s.metadata.resource_version = Some("42".into())),
            ("empty annotations", |s| s.metadata.annotations = Some(BTreeMap::new())),
            ("empty source ranges", |s| spec(s).load_balancer_source_ranges = Some(vec![])),
        ];
        for (field, edit) in quiet {
            let mut old = lb();
            if *field == "ipFamilies order" {
                spec(&mut old).ip_families = Some(vec!["IPv6".into()]);
            }
            let mut new = lb();
            edit(&mut new);
            assert_eq!(update_trigger(&old, &new, UNCLASSED), None, "S3: {field} must not trigger");
        }
        // Services that never want a load balancer never trigger.
        let mut a = lb();
        spec(&mut a).type_ = Some("ClusterIP".into());
        let mut b = a.clone();
        spec(&mut b).load_balancer_ip = Some("192.0.2.1".into());
        assert_eq!(update_trigger(&a, &b, UNCLASSED), None);
    }

    #[test]
    fn s3_cleanup_need_triggers_even_without_spec_change() {
        let mut old = lb();
        old.metadata.finalizers = Some(vec![F.into()]);
        let mut new = old.clone();
        new.metadata.deletion_timestamp = Some(now());
        assert!(update_trigger(&old, &new, UNCLASSED).is_none());
        assert!(should_sync_updated(&old, &new, UNCLASSED, F));
    }

    #[test]
    fn s5_s6_s14_sync_plans_cover_ensure_cleanup_and_legacy_deletion() {
        let svc = lb();
        assert_eq!(plan_sync(Some(&svc), None, UNCLASSED, F), SyncPlan::Ensure);
        let mut deleting = svc.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        assert_eq!(
            plan_sync(Some(&deleting), None, UNCLASSED, F),
            SyncPlan::Cleanup,
            "§6 item 9: no ensure when deleting"
        );
        let mut cip = svc.clone();
        spec(&mut cip).type_ = Some("ClusterIP".into());
        assert_eq!(plan_sync(Some(&cip), None, UNCLASSED, F), SyncPlan::Forget);
        assert_eq!(plan_sync(Some(&cip), Some(&svc), UNCLASSED, F), SyncPlan::Cleanup);
        cip.metadata.finalizers = Some(vec![F.into()]);
        assert_eq!(plan_sync(Some(&cip), None, UNCLASSED, F), SyncPlan::Cleanup);
        assert_eq!(plan_sync(None, Some(&svc), UNCLASSED, F), SyncPlan::DeleteGone, "S14");
        assert_eq!(plan_sync(None, Some(&cip), UNCLASSED, F), SyncPlan::Forget);
        assert_eq!(plan_sync(None, None, UNCLASSED, F), SyncPlan::Forget);
        let mut recreated = svc.clone();
        recreated.metadata.uid = Some("uid-2".into());
        assert!(recreated_since(&recreated, &svc, UNCLASSED), "S6");
        assert!(!recreated_since(&svc, &svc, UNCLASSED));
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(NodeSpec { provider_id: Some(format!("fake://{name}")), ..Default::default() }),
            ..Default::default()
        }
    }

    fn labelled(value: &str) -> Node {
        let mut n = node("n");
        n.metadata.labels = Some([(EXCLUDE_FROM_LB_LABEL.to_string(), value.to_string())].into());
        n
    }

    #[test]
    fn s20_exclusion_label_value_table() {
        assert!(!is_excluded_from_load_balancers(&node("n")), "absent: included");
        for v in ["true", "True", "TRUE", "t", "T", "1"] {
            assert!(is_excluded_from_load_balancers(&labelled(v)), "{v:?}: excluded");
        }
        for v in ["false", "False", "FALSE", "f", "F", "0"] {
            assert!(!is_excluded_from_load_balancers(&labelled(v)), "{v:?}: included");
        }
        for v in ["", "yes", "no", "excluded", " true"] {
            assert!(is_excluded_from_load_balancers(&labelled(v)), "{v:?}: not a boolean, excluded");
        }
    }

    #[test]
    fn s19_host_predicates_ignore_readiness_and_initialization() {
        assert!(is_load_balancer_host(&node("n")));
        let mut no_pid = node("n");
        no_pid.spec = None;
        assert!(is_load_balancer_host(&no_pid), "a Node without providerID is a host");
        let mut deleting = node("n");
        deleting.metadata.deletion_timestamp = Some(now());
        assert!(!is_load_balancer_host(&deleting));
        let mut tainted = node("n");
        tainted.spec.as_mut().unwrap().taints =
            Some(vec![Taint { key: TO_BE_DELETED_TAINT.into(), effect: "NoSchedule".into(), ..Default::default() }]);
        assert!(!is_load_balancer_host(&tainted));
        let mut uninit = node("n");
        uninit.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert!(is_load_balancer_host(&uninit));
        assert!(!is_load_balancer_host(&labelled("true")));
    }

    #[test]
    fn s15_node_updates_that_change_hosts() {
        let base = node("n");
        assert!(!node_update_changes_hosts(&base, &base));
        let mut ready = base.clone();
        ready.metadata.labels = Some([("other".to_string(), "x".to_string())].into());
        ready.status = Some(Default::default());
        assert!(!node_update_changes_hosts(&base, &ready), "labels, status and readiness do not count");
        assert!(node_update_changes_hosts(&base, &labelled("true")));
        assert!(!node_update_changes_hosts(&base, &labelled("false")));
        let mut pid = base.clone();
        pid.spec.as_mut().unwrap().provider_id = Some("fake://other".into());
        assert!(node_update_changes_hosts(&base, &pid));
        let mut tainted = base.clone();
        tainted.spec.as_mut().unwrap().taints =
            Some(vec![Taint { key: TO_BE_DELETED_TAINT.into(), effect: "NoSchedule".into(), ..Default::default() }]);
        assert!(node_update_changes_hosts(&base, &tainted), "§6 item 4: the autoscaler taint counts");
    }

    #[test]
    fn s16_host_sets_compare_names_and_provider_ids() {
        let nodes = [node("a"), node("b"), labelled("true")];
        let set = host_set(&nodes);
        assert_eq!(set.len(), 2);
        assert_eq!(set, host_set([&nodes[1], &nodes[0]]), "order does not matter");
        let mut moved = node("b");
        moved.spec.as_mut().unwrap().provider_id = Some("fake://b2".into());
        assert_ne!(set, host_set([&nodes[0], &moved]));
    }

    #[test]
    fn s10_only_ingress_changes_count() {
        let ing = |ip: &str| LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.into()), ..Default::default() }]),
        };
        assert!(ingress_changed(None, &ing("192.0.2.1")));
        assert!(!ingress_changed(Some(&ing("192.0.2.1")), &ing("192.0.2.1")));
        assert!(ingress_changed(Some(&ing("192.0.2.1")), &ing("192.0.2.2")));
        assert!(!ingress_changed(None, &LoadBalancerStatus::default()));
        assert!(!ingress_changed(Some(&LoadBalancerStatus { ingress: Some(vec![]) }), &LoadBalancerStatus::default()));
    }

    #[test]
    fn s10_ip_mode_defaulted_by_the_api_server_is_no_change() {
        let ing = |mode: Option<&str>| LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some("192.0.2.1".into()),
                ip_mode: mode.map(Into::into),
                ..Default::default()
            }]),
        };
        assert!(!ingress_changed(Some(&ing(Some("VIP"))), &ing(None)));
        assert!(ingress_changed(Some(&ing(Some("Proxy"))), &ing(None)));
        assert!(ingress_changed(Some(&ing(Some("VIP"))), &ing(Some("Proxy"))));
    }

    #[test]
    fn s12_backoff_doubles_from_five_seconds_to_five_minutes() {
        let got: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff_delay(200), BACKOFF_MAX);
    }

    #[test]
    fn s32_the_api_backoff_doubles_from_200_ms_to_5_s_and_only_transient_errors_take_it() {
        let got: Vec<u128> = (1..=7).map(|n| api_backoff_delay(n).as_millis()).collect();
        assert_eq!(got, [200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(api_backoff_delay(100), API_BACKOFF_MAX);
        let status = |code: u16| kube::Error::Api(kube::core::Status { code, ..Default::default() }.boxed());
        for code in [500, 503, 504, 429] {
            assert!(is_transient_api_error(&status(code)), "{code}");
        }
        for code in [400, 403, 404, 409, 422] {
            assert!(!is_transient_api_error(&status(code)), "{code}");
        }
    }

    #[test]
    fn s17_failure_message_lists_at_most_twenty_hosts() {
        let hosts: HostSet = (0..25).map(|i| (format!("n{i:02}"), String::new())).collect();
        let msg = update_failed_message(&hosts, "boom");
        assert!(msg.contains("n19, and 5 more]"), "{msg}");
        assert!(!msg.contains("n20"), "{msg}");
        assert!(msg.contains("(25 in total): boom"), "{msg}");
    }

    #[test]
    fn s30_after_a_refusal_an_ingress_goes_only_when_the_provider_has_no_load_balancer() {
        let mut reporting = lb();
        reporting.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress { ip: Some("192.0.2.1".into()), ..Default::default() }]),
            }),
            ..Default::default()
        });
        assert!(reports_ingress(&reporting) && !reports_ingress(&lb()));
        assert!(ingress_is_stale(&reporting, Some(false)), "the provider let go of it");
        assert!(!ingress_is_stale(&reporting, Some(true)), "the old load balancer still serves");
        assert!(!ingress_is_stale(&reporting, None), "asking failed: keep it");
        assert!(!ingress_is_stale(&lb(), Some(false)), "nothing to clear");
        // A failed host update: S17 skips a load balancer that is gone, unless the Service
        // still reports it, which the full ensure then takes out.
        assert!(failed_update_needs_no_retry(&lb(), Some(false)));
        assert!(!failed_update_needs_no_retry(&reporting, Some(false)));
        assert!(!failed_update_needs_no_retry(&lb(), Some(true)));
        assert!(!failed_update_needs_no_retry(&lb(), None));
    }
}
