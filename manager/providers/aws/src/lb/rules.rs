//! Security-group rules (pure), as upstream writes them: on the Nodes' groups for an NLB's
//! clients and health checks (marked by their descriptions, with the path-MTU ICMP rules), or
//! for a Classic ELB's group (all traffic from it); and the exact ingress of a load balancer's
//! own group (the Classic `k8s-elb-*` group, an NLB's managed group). Rules are compared
//! ungrouped, one source each, and without their descriptions, as upstream compares them.

use std::collections::{BTreeMap, BTreeSet};

use super::tags::{NLB_CLIENT_RULE, NLB_MTU_RULE, health_rule_description, rule_description};

/// Where a rule lets traffic in from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// An IPv4 CIDR.
    V4(String),
    /// An IPv6 CIDR.
    V6(String),
    /// The members of a security group.
    Group(String),
    /// A prefix list.
    PrefixList(String),
}

impl Source {
    /// The source for a CIDR, by its family.
    pub fn cidr(cidr: &str) -> Self {
        if cidr.contains(':') { Self::V6(cidr.to_string()) } else { Self::V4(cidr.to_string()) }
    }
}

/// One ingress rule with one source.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Perm {
    /// `tcp`, `udp`, `icmp` or `-1` (all).
    pub protocol: String,
    /// The first port (the ICMP type for `icmp`); `None` for all traffic.
    pub from: Option<i32>,
    /// The last port (the ICMP code for `icmp`).
    pub to: Option<i32>,
    /// Where from.
    pub source: Source,
    /// The description ("" when none).
    pub description: String,
}

impl Perm {
    /// A rule for one port from `cidr`.
    pub fn port(protocol: &str, port: i32, cidr: &str, description: &str) -> Self {
        Self {
            protocol: protocol.into(),
            from: Some(port),
            to: Some(port),
            source: Source::cidr(cidr),
            description: description.into(),
        }
    }

    /// ICMP type 3 code 4 (fragmentation needed, for path-MTU discovery) from `cidr`.
    pub fn mtu(cidr: &str, description: &str) -> Self {
        Self {
            protocol: "icmp".into(),
            from: Some(3),
            to: Some(4),
            source: Source::cidr(cidr),
            description: description.into(),
        }
    }

    /// All traffic from the members of `group` (a Classic ELB's rule on the Nodes' groups).
    pub fn all_from_group(group: &str) -> Self {
        Self {
            protocol: "-1".into(),
            from: None,
            to: None,
            source: Source::Group(group.into()),
            description: String::new(),
        }
    }

    /// Whether both admit the same traffic (descriptions aside).
    pub fn same_rule(&self, other: &Perm) -> bool {
        self.protocol == other.protocol && self.from == other.from && self.to == other.to && self.source == other.source
    }
}

/// Whether `set` has a rule admitting what `p` admits.
fn covered(p: &Perm, set: &[Perm]) -> bool {
    set.iter().any(|q| q.same_rule(p))
}

/// One call on a group: revoke or authorize these rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `RevokeSecurityGroupIngress`.
    Revoke(Vec<Perm>),
    /// `AuthorizeSecurityGroupIngress`.
    Grant(Vec<Perm>),
}

/// The calls that make a group's ingress exactly `want` (upstream's `setSecurityGroupIngress`:
/// grants first, then revocations; descriptions are not compared).
pub fn exact_ingress(want: &[Perm], have: &[Perm]) -> Vec<Op> {
    let grant: Vec<Perm> = dedup(want.iter().filter(|p| !covered(p, have)).cloned());
    let revoke: Vec<Perm> = dedup(have.iter().filter(|p| !covered(p, want)).cloned());
    let mut ops = Vec::new();
    if !grant.is_empty() {
        ops.push(Op::Grant(grant));
    }
    if !revoke.is_empty() {
        ops.push(Op::Revoke(revoke));
    }
    ops
}

fn dedup(it: impl Iterator<Item = Perm>) -> Vec<Perm> {
    let mut out: Vec<Perm> = Vec::new();
    for p in it {
        if !out.iter().any(|q| q.same_rule(&p)) {
            out.push(p);
        }
    }
    out
}

/// The ingress of a load balancer's own group, as upstream: each port (`protocol`, port) from
/// each client range, without descriptions, and ICMP 3/4 from each range.
pub fn own_group_rules(ports: &[(String, i32)], source_ranges: &[String]) -> Vec<Perm> {
    let mut out = Vec::new();
    for (protocol, port) in ports {
        for cidr in source_ranges {
            out.push(Perm::port(protocol, *port, cidr, ""));
        }
    }
    for cidr in source_ranges {
        out.push(Perm::mtu(cidr, ""));
    }
    out
}

/// What an NLB needs on the Nodes' groups that serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlbTraffic {
    /// The client CIDRs.
    pub client_cidrs: Vec<String>,
    /// `tcp`, or `udp` when any port is UDP.
    pub client_protocol: String,
    /// The nodePorts.
    pub client_ports: BTreeSet<i32>,
    /// The health-check ports.
    pub health_ports: BTreeSet<i32>,
    /// The CIDRs of the NLB's subnets (where its health checks come from).
    pub subnet_cidrs: Vec<String>,
}

/// Bring one set of an NLB's rules on a group to `want`: grant what is missing (any rule
/// admitting the same traffic counts), revoke what is not wanted among the rules with this
/// set's `description`; `perms` follows the changes.
fn sync_set(perms: &mut Vec<Perm>, want: Vec<Perm>, description: &str, ops: &mut Vec<Op>) {
    let revoke: Vec<Perm> = dedup(perms.iter().filter(|p| p.description == description && !covered(p, &want)).cloned());
    let grant: Vec<Perm> = dedup(want.iter().filter(|p| !covered(p, perms)).cloned());
    if !revoke.is_empty() {
        perms.retain(|p| !revoke.contains(p));
        ops.push(Op::Revoke(revoke));
    }
    if !grant.is_empty() {
        perms.extend(grant.iter().cloned());
        ops.push(Op::Grant(grant));
    }
}

/// The calls an NLB's rules need on one Node group (upstream's
/// `updateInstanceSecurityGroupsForNLB`), given the group's rules. `traffic` is `None` when the
/// group does not serve the NLB (or the NLB is going): its rules for `lb_name` are revoked.
/// Health rules from the NLB's subnets are skipped when the clients are everyone over TCP on
/// the same ports (the client rules cover them), and earlier ones then revoked (upstream leaves
/// them). When anything changed, the path-MTU rules are brought to one per client CIDR of any
/// NLB on the group.
pub fn nlb_group_ops(have: &[Perm], lb_name: &str, traffic: Option<&NlbTraffic>) -> Vec<Op> {
    let client = rule_description(lb_name);
    let health = health_rule_description(lb_name);
    let (client, health) = (client.as_str(), health.as_str());
    let mut perms = have.to_vec();
    let mut ops = Vec::new();
    match traffic {
        Some(t) => {
            let covers_health =
                t.client_cidrs == ["0.0.0.0/0"] && t.client_protocol == "tcp" && t.health_ports == t.client_ports;
            // Not needed: none (upstream leaves earlier ones in place).
            let want = if covers_health {
                Vec::new()
            } else {
                t.health_ports
                    .iter()
                    .flat_map(|p| t.subnet_cidrs.iter().map(move |c| Perm::port("tcp", *p, c, health)))
                    .collect()
            };
            sync_set(&mut perms, want, health, &mut ops);
            let want = t
                .client_ports
                .iter()
                .flat_map(|p| t.client_cidrs.iter().map(move |c| Perm::port(&t.client_protocol, *p, c, client)))
                .collect();
            sync_set(&mut perms, want, client, &mut ops);
        }
        None => {
            sync_set(&mut perms, Vec::new(), health, &mut ops);
            sync_set(&mut perms, Vec::new(), client, &mut ops);
        }
    }
    let want: Vec<Perm> =
        dedup(perms.iter().filter(|p| p.description.contains(NLB_CLIENT_RULE)).filter_map(|p| match &p.source {
            Source::V4(c) => Some(Perm::mtu(c, NLB_MTU_RULE)),
            _ => None,
        }));
    if !ops.is_empty() {
        sync_set(&mut perms, want, NLB_MTU_RULE, &mut ops);
    } else {
        // Nothing else changed: only an MTU rule no client rule justifies goes (a deletion that
        // stopped half-way leaves one; upstream keeps it).
        let stale: Vec<Perm> =
            dedup(perms.iter().filter(|p| p.description == NLB_MTU_RULE && !covered(p, &want)).cloned());
        if !stale.is_empty() {
            ops.push(Op::Revoke(stale));
        }
    }
    ops
}

/// The Node group of an instance that receives load-balancer rules (upstream's
/// `findSecurityGroupForInstance`): its one cluster-tagged group, else its one group; an error
/// when it has several of either; `None` without a group. `groups` are (ID, name).
pub fn group_for_instance(
    instance: &str,
    groups: &[(String, String)],
    tagged: &BTreeSet<String>,
) -> Result<Option<String>, String> {
    type Group<'a> = &'a (String, String);
    let (with_tag, without): (Vec<Group<'_>>, Vec<Group<'_>>) =
        groups.iter().filter(|(id, _)| !id.is_empty()).partition(|(id, _)| tagged.contains(id));
    match (with_tag.as_slice(), without.as_slice()) {
        ([one], _) => Ok(Some(one.0.clone())),
        ([], [one]) => Ok(Some(one.0.clone())),
        ([], []) => Ok(None),
        ([], _) => Err(format!(
            "Multiple untagged security groups found for instance {instance}; ensure the k8s security group is tagged"
        )),
        (many, _) => Err(format!(
            "Multiple tagged security groups found for instance {instance}; ensure only the k8s security group is tagged; the tagged groups were {}",
            many.iter().map(|(id, name)| format!("{id}({name}) ")).collect::<String>()
        )),
    }
}

/// The calls a Classic ELB's rule needs on the Nodes' groups (upstream's
/// `updateInstanceSecurityGroupsForLoadBalancer`): all traffic from `lb_group` on each group in
/// `want`; revoked from each group of `referencing` (group → cluster-tagged) not wanted that
/// is cluster-tagged, or any when the load balancer's group is being deleted. `ElbSecurityGroup`
/// is never changed.
pub fn classic_node_ops(
    lb_group: &str,
    referencing: &BTreeMap<String, bool>,
    want: &BTreeSet<String>,
    deleting: bool,
    elb_security_group: &str,
) -> Vec<(String, Op)> {
    let rule = Perm::all_from_group(lb_group);
    let mut out = Vec::new();
    for (group, tagged) in referencing {
        if !want.contains(group) && (*tagged || deleting) && group != elb_security_group {
            out.push((group.clone(), Op::Revoke(vec![rule.clone()])));
        }
    }
    for group in want.iter().filter(|g| !referencing.contains_key(*g) && *g != elb_security_group) {
        out.push((group.clone(), Op::Grant(vec![rule.clone()])));
    }
    out
}

/// The first of a Classic ELB's groups, the source of its rules on the Nodes' groups
/// (upstream's `sortELBSecurityGroupList`: the `security-groups` annotation's in order, then
/// the others, then `extra-security-groups`).
pub fn classic_primary_group(groups: &[String], annotated: &[String], extra: &[String]) -> Option<String> {
    let rank = |g: &String| {
        if let Some(i) = annotated.iter().position(|a| a == g) {
            (0, i)
        } else if let Some(j) = extra.iter().position(|e| e == g) {
            (2, j)
        } else {
            (1, 0)
        }
    };
    groups.iter().enumerate().min_by_key(|(i, g)| (rank(g), *i)).map(|(_, g)| g.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(cidrs: &[&str], health: &[i32]) -> NlbTraffic {
        NlbTraffic {
            client_cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
            client_protocol: "tcp".into(),
            client_ports: [30080].into(),
            health_ports: health.iter().copied().collect(),
            subnet_cidrs: vec!["10.0.1.0/24".into(), "10.0.2.0/24".into()],
        }
    }

    fn grants(ops: &[Op]) -> Vec<Perm> {
        ops.iter().flat_map(|o| if let Op::Grant(p) = o { p.clone() } else { Vec::new() }).collect()
    }

    #[test]
    fn clients_from_everyone_on_the_traffic_port_need_no_health_rules_but_get_the_mtu_rule() {
        let ops = nlb_group_ops(&[], "lb1", Some(&traffic(&["0.0.0.0/0"], &[30080])));
        let g = grants(&ops);
        assert_eq!(
            g,
            vec![
                Perm::port("tcp", 30080, "0.0.0.0/0", "kubernetes.io/rule/nlb/client=lb1"),
                Perm::mtu("0.0.0.0/0", "kubernetes.io/rule/nlb/mtu"),
            ]
        );
    }

    #[test]
    fn health_rules_come_from_the_load_balancers_subnets() {
        let ops = nlb_group_ops(&[], "lb1", Some(&traffic(&["203.0.113.0/24"], &[32000])));
        let g = grants(&ops);
        assert!(g.contains(&Perm::port("tcp", 32000, "10.0.1.0/24", "kubernetes.io/rule/nlb/health=lb1")));
        assert!(g.contains(&Perm::port("tcp", 32000, "10.0.2.0/24", "kubernetes.io/rule/nlb/health=lb1")));
        assert!(g.contains(&Perm::port("tcp", 30080, "203.0.113.0/24", "kubernetes.io/rule/nlb/client=lb1")));
        assert!(g.contains(&Perm::mtu("203.0.113.0/24", "kubernetes.io/rule/nlb/mtu")));
    }

    #[test]
    fn what_upstream_made_is_left_alone_and_an_identical_rule_of_anyone_counts() {
        let t = traffic(&["0.0.0.0/0"], &[30080]);
        let have = vec![
            Perm::port("tcp", 30080, "0.0.0.0/0", "kubernetes.io/rule/nlb/client=lb1"),
            Perm::mtu("0.0.0.0/0", "kubernetes.io/rule/nlb/mtu"),
            Perm::port("tcp", 22, "10.0.0.0/8", "ssh"),
        ];
        assert!(nlb_group_ops(&have, "lb1", Some(&t)).is_empty());
        let someone_elses = vec![Perm::port("tcp", 30080, "0.0.0.0/0", "")];
        assert!(nlb_group_ops(&someone_elses, "lb1", Some(&t)).is_empty(), "no MTU rule either: nothing changed");
    }

    #[test]
    fn an_mtu_rule_no_client_rule_justifies_is_revoked_even_when_nothing_else_changes() {
        let have = vec![Perm::mtu("203.0.113.0/24", "kubernetes.io/rule/nlb/mtu")];
        assert_eq!(nlb_group_ops(&have, "lb1", None), vec![Op::Revoke(have.clone())]);
    }

    #[test]
    fn health_rules_no_longer_needed_are_revoked() {
        let have = vec![
            Perm::port("tcp", 32000, "10.0.1.0/24", "kubernetes.io/rule/nlb/health=lb1"),
            Perm::port("tcp", 30080, "0.0.0.0/0", "kubernetes.io/rule/nlb/client=lb1"),
            Perm::mtu("0.0.0.0/0", "kubernetes.io/rule/nlb/mtu"),
        ];
        let ops = nlb_group_ops(&have, "lb1", Some(&traffic(&["0.0.0.0/0"], &[30080])));
        assert_eq!(ops, vec![Op::Revoke(vec![have[0].clone()])]);
    }

    #[test]
    fn a_group_no_longer_serving_loses_this_load_balancers_rules_only() {
        let have = vec![
            Perm::port("tcp", 30080, "0.0.0.0/0", "kubernetes.io/rule/nlb/client=lb1"),
            Perm::port("tcp", 31000, "0.0.0.0/0", "kubernetes.io/rule/nlb/client=lb2"),
            Perm::mtu("0.0.0.0/0", "kubernetes.io/rule/nlb/mtu"),
        ];
        let ops = nlb_group_ops(&have, "lb1", None);
        assert_eq!(ops, vec![Op::Revoke(vec![have[0].clone()])], "lb2 still needs the MTU rule");
        let only = vec![have[0].clone(), have[2].clone()];
        let ops = nlb_group_ops(&only, "lb1", None);
        assert_eq!(ops, vec![Op::Revoke(vec![only[0].clone()]), Op::Revoke(vec![only[1].clone()])]);
    }

    #[test]
    fn exact_ingress_grants_then_revokes_ignoring_descriptions() {
        let want = own_group_rules(&[("tcp".into(), 80)], &["0.0.0.0/0".into()]);
        assert_eq!(want, vec![Perm::port("tcp", 80, "0.0.0.0/0", ""), Perm::mtu("0.0.0.0/0", "")]);
        let have = vec![Perm::port("tcp", 80, "0.0.0.0/0", "described"), Perm::port("tcp", 81, "0.0.0.0/0", "")];
        assert_eq!(
            exact_ingress(&want, &have),
            vec![Op::Grant(vec![Perm::mtu("0.0.0.0/0", "")]), Op::Revoke(vec![have[1].clone()])]
        );
        assert!(exact_ingress(&want, &want).is_empty());
    }

    #[test]
    fn an_instance_gives_its_one_tagged_group_else_its_one_group_else_an_error() {
        let g = |ids: &[&str]| ids.iter().map(|s| (s.to_string(), format!("{s}-name"))).collect::<Vec<_>>();
        let tagged: BTreeSet<String> = ["sg-t".to_string(), "sg-t2".to_string()].into();
        assert_eq!(group_for_instance("i-1", &g(&["sg-a", "sg-t"]), &tagged), Ok(Some("sg-t".into())));
        assert_eq!(group_for_instance("i-1", &g(&["sg-a"]), &tagged), Ok(Some("sg-a".into())));
        assert_eq!(group_for_instance("i-1", &g(&[]), &tagged), Ok(None));
        assert!(
            group_for_instance("i-1", &g(&["sg-a", "sg-b"]), &tagged).unwrap_err().starts_with("Multiple untagged")
        );
        assert!(group_for_instance("i-1", &g(&["sg-t", "sg-t2"]), &tagged).unwrap_err().contains("sg-t(sg-t-name)"));
    }

    #[test]
    fn classic_rules_open_wanted_groups_and_close_tagged_stale_ones_never_touching_elb_security_group() {
        let referencing: BTreeMap<String, bool> =
            [("sg-keep".to_string(), true), ("sg-stale".to_string(), true), ("sg-user".to_string(), false)].into();
        let want: BTreeSet<String> = ["sg-keep".to_string(), "sg-new".to_string(), "sg-global".to_string()].into();
        let ops = classic_node_ops("sg-lb", &referencing, &want, false, "sg-global");
        let rule = Perm::all_from_group("sg-lb");
        assert_eq!(
            ops,
            vec![
                ("sg-stale".to_string(), Op::Revoke(vec![rule.clone()])),
                ("sg-new".to_string(), Op::Grant(vec![rule.clone()]))
            ]
        );
        let ops = classic_node_ops("sg-lb", &referencing, &BTreeSet::new(), true, "");
        assert_eq!(ops.len(), 3, "deleting the group: every reference goes");
    }

    #[test]
    fn the_primary_classic_group_is_the_first_annotated_then_the_own_then_the_extra() {
        let groups = vec!["sg-extra".to_string(), "sg-own".to_string()];
        assert_eq!(classic_primary_group(&groups, &[], &["sg-extra".into()]).as_deref(), Some("sg-own"));
        let groups = vec!["sg-b".to_string(), "sg-a".to_string()];
        assert_eq!(classic_primary_group(&groups, &["sg-a".into(), "sg-b".into()], &[]).as_deref(), Some("sg-a"));
    }
}
