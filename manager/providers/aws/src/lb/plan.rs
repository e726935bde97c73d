//! What differs between an existing NLB and what its Service asks for (pure): the settings AWS
//! cannot change in place (kept, and refused unless the Service asks for a replacement), and
//! which target groups, health checks, targets and listeners change. The I/O files describe
//! what exists in the plain shapes here and apply the answers.

use std::collections::BTreeSet;

use super::desired::{Desired, DesiredPort, HealthSpec};
use super::spec::REPLACE;
use crate::annotations as ann;

/// Event reason (Warning, on the Service) when a load balancer is replaced on request.
pub const REASON_LOAD_BALANCER_REPLACED: &str = "LoadBalancerReplaced";
/// The event's action.
pub(super) const ACTION_REPLACE: &str = "ReplaceLoadBalancer";

/// The note of the [`REASON_LOAD_BALANCER_REPLACED`] event: why, and what the user sees.
pub fn replacement_note(fields: &[FixedField]) -> String {
    format!(
        "the load balancer was deleted and is being made again because {} changed and {REPLACE} is \"true\": \
         the Service gets a new hostname and open connections were dropped",
        describe(fields)
    )
}

/// A network load balancer as the sync compares it.
#[derive(Debug, Clone, Default)]
pub(super) struct LbInfo {
    /// Its ARN.
    pub(super) arn: String,
    /// Its DNS name (the Service's hostname).
    pub(super) dns: String,
    /// Whether its scheme is `internal`.
    pub(super) internal: bool,
    /// When it was made (seconds since the epoch), to keep the oldest of duplicates.
    pub(super) created: Option<f64>,
    /// `ipv4` or `dualstack`.
    pub(super) ip_address_type: String,
    /// Its subnets.
    pub(super) subnets: BTreeSet<String>,
    /// The Elastic IP allocations of its addresses; `None` when ELBv2 reports no addresses.
    pub(super) allocations: Option<BTreeSet<String>>,
    /// The private IPv4 addresses of its addresses; `None` when ELBv2 reports none.
    pub(super) private_ipv4: Option<BTreeSet<String>>,
    /// Its security groups, in order.
    pub(super) security_groups: Vec<String>,
    /// Its VPC.
    pub(super) vpc: String,
}

/// A target group as the sync compares it.
#[derive(Debug, Clone, Default)]
pub(super) struct TgInfo {
    /// Its ARN.
    pub(super) arn: String,
    /// Its name.
    pub(super) name: String,
    /// Its protocol (`TCP`, `UDP`, `TLS`).
    pub(super) protocol: String,
    /// Its port (the nodePort).
    pub(super) port: i32,
    /// The health check's port, as ELBv2 writes it.
    pub(super) health_port: String,
    /// The health check's path.
    pub(super) health_path: String,
    /// The health check's protocol.
    pub(super) health_protocol: String,
    /// (interval, timeout, healthy, unhealthy).
    pub(super) health_timing: (i32, i32, i32, i32),
    /// The load balancers it is attached to.
    pub(super) lb_arns: Vec<String>,
}

/// A listener as the sync compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ListenerInfo {
    /// Its ARN.
    pub(super) arn: String,
    /// Its port.
    pub(super) port: i32,
    /// Its protocol (`TCP`, `UDP`, `TLS`).
    pub(super) protocol: String,
    /// The target group of its first default action.
    pub(super) target_group: String,
    /// Its first certificate's ARN.
    pub(super) certificate: String,
    /// Its TLS security policy.
    pub(super) policy: String,
    /// How many default actions it has.
    pub(super) actions: usize,
}

/// A setting of an existing load balancer that AWS cannot change in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FixedField {
    /// The scheme (`internal`).
    Scheme,
    /// An NLB's subnets (`subnets`).
    Subnets,
    /// An NLB's Elastic IPs (`eip-allocations`).
    ElasticIps,
    /// An NLB's private addresses (`private-ipv4-addresses`).
    PrivateIpv4,
    /// A security group on an NLB made without (`NLBSecurityGroupMode = Managed` since).
    SecurityGroups,
}

impl FixedField {
    /// The annotation that asks for it.
    pub fn annotation(self) -> &'static str {
        match self {
            Self::Scheme => ann::INTERNAL,
            Self::Subnets => ann::SUBNETS,
            Self::ElasticIps => ann::EIP_ALLOCATIONS,
            Self::PrivateIpv4 => ann::PRIVATE_IPV4,
            Self::SecurityGroups => "[Global] NLBSecurityGroupMode",
        }
    }

    /// What it is.
    pub fn what(self) -> &'static str {
        match self {
            Self::Scheme => "the scheme",
            Self::Subnets => "the subnets",
            Self::ElasticIps => "the Elastic IPs",
            Self::PrivateIpv4 => "the private IPv4 addresses",
            Self::SecurityGroups => "the security groups",
        }
    }
}

fn describe(fields: &[FixedField]) -> String {
    fields.iter().map(|f| format!("{} ({})", f.what(), f.annotation())).collect::<Vec<_>>().join(", ")
}

/// The refusal message for changes AWS cannot make in place: the load balancer is kept.
pub fn fixed_field_message(fields: &[FixedField]) -> String {
    format!(
        "{} of an existing load balancer cannot change in place; it is kept as it is. \
         Set the annotation {REPLACE}: \"true\" to replace it (a new hostname), or restore the annotation",
        describe(fields)
    )
}

/// What the Service asks that the existing NLB cannot do in place: the scheme; the subnets the
/// annotation names (`subnets`: the resolved IDs, when the annotation is set); and the fixed
/// addresses, compared only where ELBv2 reports the load balancer's addresses.
pub(super) fn fixed_changes(lb: &LbInfo, desired: &Desired, subnets: Option<&BTreeSet<String>>) -> Vec<FixedField> {
    let a = desired.annotations();
    let mut out = Vec::new();
    if lb.internal != desired.internal {
        out.push(FixedField::Scheme);
    }
    if subnets.is_some_and(|want| *want != lb.subnets) {
        out.push(FixedField::Subnets);
    }
    let want_eips: BTreeSet<String> = a.eip_allocations.iter().cloned().collect();
    if lb.allocations.as_ref().is_some_and(|have| *have != want_eips) {
        out.push(FixedField::ElasticIps);
    }
    // AWS reports addresses it picked itself too: only a list the annotation asks for counts.
    let want_ips: BTreeSet<String> = a.private_ipv4.iter().map(|ip| ip.to_string()).collect();
    if !want_ips.is_empty() && lb.private_ipv4.as_ref().is_some_and(|have| *have != want_ips) {
        out.push(FixedField::PrivateIpv4);
    }
    out
}

/// The existing target group that serves `port`, upstream's way. When the load balancer has a
/// listener on the port with the protocol it should have (`listener_kept`): the target group
/// on its nodePort, unless its protocol, health-check protocol or interval differ, which
/// upstream fixes with a new target group. Otherwise upstream makes the listener with the
/// target group of the port's own name (`CreateTargetGroup` answers an existing one of that
/// name), so only that one serves.
pub(super) fn target_group_for<'a>(
    existing: &'a [TgInfo],
    port: &DesiredPort,
    h: &HealthSpec,
    listener_kept: bool,
) -> Option<&'a TgInfo> {
    existing.iter().find(|t| {
        t.port == port.node_port
            && t.protocol == port.protocol
            && t.health_protocol.eq_ignore_ascii_case(h.protocol.as_str())
            && t.health_timing.0 == h.interval
            && (listener_kept || t.name == port.target_group)
    })
}

/// Whether a target group's health check differs from `h` in what can change in place: the
/// port, the thresholds, the path (HTTP and HTTPS), and the timeout when one is asked.
pub(super) fn health_check_differs(tg: &TgInfo, h: &HealthSpec) -> bool {
    let (_, timeout, healthy, unhealthy) = tg.health_timing;
    tg.health_port != h.port_string()
        || h.api_path().is_some_and(|p| p != tg.health_path)
        || healthy != h.healthy_threshold
        || unhealthy != h.unhealthy_threshold
        || h.timeout.is_some_and(|t| t != timeout)
}

/// A target of a target group: (instance ID, port).
pub type Target = (String, i32);

/// The targets to register and to deregister.
pub fn target_changes(want: &BTreeSet<Target>, have: &BTreeSet<Target>) -> (Vec<Target>, Vec<Target>) {
    (want.difference(have).cloned().collect(), have.difference(want).cloned().collect())
}

/// One change to a load balancer's listeners.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ListenerChange<'a> {
    /// Set an existing listener's protocol, TLS settings and target group.
    Modify {
        /// The listener.
        arn: &'a str,
        /// What it should be.
        port: &'a DesiredPort,
        /// The target group it should forward to.
        target_group: &'a str,
    },
    /// Delete a listener on a port no longer wanted, or a second one on a port.
    Delete {
        /// The listener.
        arn: &'a str,
    },
    /// Create a listener.
    Create {
        /// What it should be.
        port: &'a DesiredPort,
        /// The target group it forwards to.
        target_group: &'a str,
    },
}

/// The listener changes, in the order to make them: each existing listener kept (changed where
/// it differs, in place) or deleted, then the missing ones created. `wanted` pairs each port
/// with its target group's ARN. A TLS listener's policy is compared only when one is asked.
pub(super) fn listener_changes<'a>(
    existing: &'a [ListenerInfo],
    wanted: &'a [(DesiredPort, String)],
) -> Vec<ListenerChange<'a>> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for l in existing {
        match wanted.iter().find(|(p, _)| p.port == l.port) {
            Some((p, tg)) if !seen.contains(&l.port) => {
                seen.insert(l.port);
                let tls_differs = match &p.tls {
                    None => false,
                    Some(t) => {
                        t.certificate_arn != l.certificate || t.policy.as_deref().is_some_and(|want| want != l.policy)
                    }
                };
                if p.listener_protocol() != l.protocol || *tg != l.target_group || l.actions != 1 || tls_differs {
                    out.push(ListenerChange::Modify { arn: &l.arn, port: p, target_group: tg });
                }
            }
            _ => out.push(ListenerChange::Delete { arn: &l.arn }),
        }
    }
    for (p, tg) in wanted.iter().filter(|(p, _)| !seen.contains(&p.port)) {
        out.push(ListenerChange::Create { port: p, target_group: tg });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterIdentity;
    use crate::config::ClusterProbe;
    use crate::lb::desired::{ListenerTls, desired};
    use crate::lb::fixtures::svc;

    fn d(pairs: &[(&str, &str)]) -> Desired {
        let c = ClusterIdentity { id: "c".into(), legacy: false };
        desired(&svc(pairs, &[(80, "TCP", 30080)], "Cluster", 0), &c, &ClusterProbe::default()).unwrap()
    }

    #[test]
    fn nothing_is_fixed_when_nothing_changed_and_unknown_addresses_never_count() {
        let lb = LbInfo { subnets: ["subnet-a".to_string()].into(), ..Default::default() };
        assert!(fixed_changes(&lb, &d(&[]), None).is_empty());
        let eip = d(&[(ann::EIP_ALLOCATIONS, "eipalloc-01234567")]);
        assert!(fixed_changes(&lb, &eip, None).is_empty(), "no addresses reported: not compared");
    }

    #[test]
    fn scheme_subnets_and_addresses_that_changed_are_named() {
        let lb = LbInfo {
            internal: false,
            subnets: ["subnet-a".to_string()].into(),
            allocations: Some(["eipalloc-01234567".to_string()].into()),
            private_ipv4: Some(["10.0.1.5".to_string()].into()),
            ..Default::default()
        };
        let internal = d(&[(ann::INTERNAL, "true")]);
        let plain = LbInfo { allocations: None, ..lb.clone() };
        assert_eq!(fixed_changes(&plain, &internal, None), vec![FixedField::Scheme]);
        let other: BTreeSet<String> = ["subnet-b".to_string()].into();
        assert_eq!(
            fixed_changes(&lb, &d(&[(ann::EIP_ALLOCATIONS, "eipalloc-01234567")]), Some(&other)),
            vec![FixedField::Subnets]
        );
        assert_eq!(
            fixed_changes(&lb, &d(&[(ann::EIP_ALLOCATIONS, "eipalloc-89abcdef")]), None),
            vec![FixedField::ElasticIps]
        );
        assert_eq!(fixed_changes(&lb, &d(&[]), None), vec![FixedField::ElasticIps], "Elastic IPs removed");
        let m = fixed_field_message(&[FixedField::Scheme, FixedField::ElasticIps]);
        assert!(
            m.contains(ann::INTERNAL) && m.contains(ann::EIP_ALLOCATIONS) && m.contains(REPLACE) && m.contains("kept"),
            "{m}"
        );
        assert!(replacement_note(&[FixedField::Scheme]).contains("new hostname"));
    }

    fn listener(arn: &str, port: i32, protocol: &str, target_group: &str) -> ListenerInfo {
        ListenerInfo {
            arn: arn.into(),
            port,
            protocol: protocol.into(),
            target_group: target_group.into(),
            certificate: String::new(),
            policy: String::new(),
            actions: 1,
        }
    }

    fn tcp(port: i32) -> DesiredPort {
        DesiredPort {
            port,
            protocol: "TCP".into(),
            node_port: 30000 + port,
            tls: None,
            target_group: format!("tg{port}"),
        }
    }

    #[test]
    fn listeners_are_kept_changed_or_deleted_in_order_then_missing_ones_created() {
        let wanted =
            vec![(tcp(80), "tg-80".to_string()), (tcp(443), "tg-443".to_string()), (tcp(8080), "tg-8080".to_string())];
        let existing = vec![
            listener("l-80", 80, "TCP", "tg-80"),
            listener("l-22", 22, "TCP", "tg-22"),
            listener("l-443", 443, "TCP", "tg-old"),
            listener("l-80b", 80, "TCP", "tg-80"),
        ];
        assert_eq!(
            listener_changes(&existing, &wanted),
            vec![
                ListenerChange::Delete { arn: "l-22" },
                ListenerChange::Modify { arn: "l-443", port: &wanted[1].0, target_group: "tg-443" },
                ListenerChange::Delete { arn: "l-80b" },
                ListenerChange::Create { port: &wanted[2].0, target_group: "tg-8080" },
            ]
        );
    }

    #[test]
    fn a_tls_listener_changes_with_its_certificate_and_a_policy_only_when_one_is_asked() {
        let tls = |policy: Option<&str>| DesiredPort {
            tls: Some(ListenerTls { certificate_arn: "cert-2".into(), policy: policy.map(str::to_string) }),
            ..tcp(443)
        };
        let mut have = listener("l", 443, "TLS", "tg");
        have.certificate = "cert-2".into();
        have.policy = "ELBSecurityPolicy-2016-08".into();
        let same = vec![(tls(None), "tg".to_string())];
        assert!(listener_changes(std::slice::from_ref(&have), &same).is_empty());
        let policy = vec![(tls(Some("ELBSecurityPolicy-TLS13-1-2-2021-06")), "tg".to_string())];
        assert_eq!(listener_changes(std::slice::from_ref(&have), &policy).len(), 1);
        have.certificate = "cert-1".into();
        assert_eq!(listener_changes(std::slice::from_ref(&have), &same).len(), 1);
    }

    #[test]
    fn a_target_group_is_reused_unless_its_protocol_or_health_protocol_or_interval_changed() {
        let des = d(&[]);
        let h = &des.health;
        let tg = TgInfo {
            arn: "tg".into(),
            name: "k8s-other-name".into(),
            protocol: "TCP".into(),
            port: 30080,
            health_port: "traffic-port".into(),
            health_path: String::new(),
            health_protocol: "TCP".into(),
            health_timing: (30, 10, 3, 3),
            lb_arns: Vec::new(),
        };
        let port = &des.ports[0];
        assert!(target_group_for(std::slice::from_ref(&tg), port, h, true).is_some());
        assert!(
            target_group_for(std::slice::from_ref(&tg), port, h, false).is_none(),
            "a new listener takes the target group of its own name, as upstream"
        );
        let named = TgInfo { name: port.target_group.clone(), ..tg.clone() };
        assert!(target_group_for(std::slice::from_ref(&named), port, h, false).is_some());
        assert!(!health_check_differs(&tg, h), "upstream's target group, AWS's timeout: unchanged");
        assert!(health_check_differs(&TgInfo { health_timing: (30, 10, 2, 3), ..tg.clone() }, h));
        assert!(health_check_differs(&TgInfo { health_port: "8080".into(), ..tg.clone() }, h));
        let timed = HealthSpec { timeout: Some(6), ..h.clone() };
        assert!(health_check_differs(&tg, &timed), "an annotated timeout is set");
        assert!(target_group_for(&[TgInfo { health_timing: (10, 10, 3, 3), ..tg.clone() }], port, h, true).is_none());
        assert!(target_group_for(&[TgInfo { health_protocol: "HTTP".into(), ..tg.clone() }], port, h, true).is_none());
        assert!(target_group_for(&[TgInfo { protocol: "UDP".into(), ..tg }], port, h, true).is_none());
    }

    #[test]
    fn targets_are_registered_and_deregistered_by_the_difference() {
        let t = |id: &str| (id.to_string(), 30080);
        let want: BTreeSet<Target> = [t("i-1"), t("i-2")].into();
        let have: BTreeSet<Target> = [t("i-2"), t("i-3")].into();
        assert_eq!(target_changes(&want, &have), (vec![t("i-1")], vec![t("i-3")]));
    }
}
