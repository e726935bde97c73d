//! What a manager left: everything in moto's Elastic Load Balancing (both kinds) and EC2
//! security groups, and the Services and Nodes in the API server, read into flat fields and
//! normalised, so the states two managers left in two clouds seeded alike compare field by
//! field.
//!
//! A field belongs to an owner: a Service (`<namespace>/<name>`, from the
//! `kubernetes.io/service-name` tag of its objects, the load-balancer name in a rule's
//! description, the group a rule admits), a Node (`node <name>`), or the `world` (rules no one
//! load balancer owns, such as the path-MTU rules). Generated names, IDs and ARNs become stable
//! placeholders: `{lb ns/name}` for a Service's load-balancer name, `{sg name}` for a group,
//! `{tg name}` for a target group's ARN, `{subnet name}` and `{n0}` for the world's subnets and
//! instances, and so on.

use crate::kit::*;
use crate::world::{CLUSTER_NAME, Seeded};
use ccm_provider_aws::sdk::{elb as classic, elbv2};
use k8s_openapi::api::core::v1::Event as CoreEvent;

/// Fields by (owner, field).
pub(crate) type Fields = BTreeMap<(String, String), String>;

/// The owner of rules and objects no Service owns.
pub(crate) const WORLD: &str = "world";

/// Replaces generated names with placeholders, longest first.
#[derive(Default)]
struct Names {
    pairs: Vec<(String, String)>,
}

impl Names {
    fn add(&mut self, from: impl Into<String>, to: impl Into<String>) {
        let from = from.into();
        if !from.is_empty() {
            self.pairs.push((from, to.into()));
        }
    }

    fn finish(&mut self) {
        self.pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    fn apply(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (from, to) in &self.pairs {
            if out.contains(from.as_str()) {
                out = out.replace(from.as_str(), to);
            }
        }
        // An NLB's DNS name ends in 16 hex characters of its ARN: `{lb x}-{hex}.elb.<region>...`.
        static HEX: std::sync::OnceLock<regex_lite::Regex> = std::sync::OnceLock::new();
        let hex = HEX.get_or_init(|| regex_lite::Regex::new(r"-[0-9a-f]{16}\.elb\.").unwrap());
        hex.replace_all(&out, "-{hex}.elb.").to_string()
    }
}

struct Out<'a> {
    fields: Fields,
    names: &'a Names,
}

impl Out<'_> {
    fn put(&mut self, owner: &str, field: impl AsRef<str>, value: impl AsRef<str>) {
        let (owner, field, value) =
            (self.names.apply(owner), self.names.apply(field.as_ref()), self.names.apply(value.as_ref()));
        self.fields.insert((owner, field), value);
    }
}

fn join<I: IntoIterator<Item = String>>(items: I) -> String {
    let mut v: Vec<String> = items.into_iter().collect();
    v.sort();
    v.join(",")
}

/// The Services, Nodes and Events of the API server.
struct Cluster {
    services: Vec<Service>,
    nodes: Vec<Node>,
    events: Vec<CoreEvent>,
}

async fn cluster(client: &kube::Client) -> Cluster {
    let lp = Default::default();
    let services = Api::<Service>::all(client.clone()).list(&lp).await.unwrap().items;
    let services =
        services.into_iter().filter(|s| s.metadata.name.as_deref() != Some("kubernetes")).collect::<Vec<_>>();
    let nodes = Api::<Node>::all(client.clone()).list(&lp).await.unwrap().items;
    let events = Api::<CoreEvent>::all(client.clone()).list(&lp).await.unwrap().items;
    Cluster { services, nodes, events }
}

fn owner_of(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Every ELBv2 load balancer (all pages).
async fn v2_load_balancers(c: &Clients) -> Vec<elbv2::types::LoadBalancer> {
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let r = c.elb.describe_load_balancers().set_marker(marker).send().await.unwrap();
        out.extend(r.load_balancers().iter().cloned());
        match r.next_marker() {
            Some(m) if !m.is_empty() => marker = Some(m.to_string()),
            _ => return out,
        }
    }
}

async fn v2_target_groups(c: &Clients) -> Vec<elbv2::types::TargetGroup> {
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let r = c.elb.describe_target_groups().set_marker(marker).send().await.unwrap();
        out.extend(r.target_groups().iter().cloned());
        match r.next_marker() {
            Some(m) if !m.is_empty() => marker = Some(m.to_string()),
            _ => return out,
        }
    }
}

async fn v2_tags(c: &Clients, arns: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for chunk in arns.chunks(20) {
        let Ok(r) = c.elb.describe_tags().set_resource_arns(Some(chunk.to_vec())).send().await else { continue };
        for d in r.tag_descriptions() {
            out.insert(
                d.resource_arn().unwrap_or_default().to_string(),
                d.tags()
                    .iter()
                    .map(|t| (t.key().unwrap_or_default().into(), t.value().unwrap_or_default().into()))
                    .collect(),
            );
        }
    }
    out
}

async fn classic_load_balancers(c: &Clients) -> Vec<classic::types::LoadBalancerDescription> {
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let r = c.classic.describe_load_balancers().set_marker(marker).send().await.unwrap();
        out.extend(r.load_balancer_descriptions().iter().cloned());
        match r.next_marker() {
            Some(m) if !m.is_empty() => marker = Some(m.to_string()),
            _ => return out,
        }
    }
}

/// Reads one side: `c` talks to its moto directly (not through a counting proxy), `client` to
/// its API server. `w` names the seeded objects.
pub(crate) async fn read(c: &Clients, client: &kube::Client, w: &Seeded, known: &[Service]) -> Fields {
    let k = cluster(client).await;
    let lbs = v2_load_balancers(c).await;
    let tgs = v2_target_groups(c).await;
    let classics = classic_load_balancers(c).await;
    let groups = c.ec2.describe_security_groups().send().await.unwrap().security_groups().to_vec();

    // Names first: seeded IDs, each Service's load-balancer and managed-group names, Nodes named
    // by private DNS name, then the ARNs and IDs of what the managers made.
    let mut names = Names::default();
    for (id, name) in w.names() {
        names.add(id, name);
    }
    for i in w.instances.values() {
        names.add(i.private_dns.clone(), format!("{{{} dns}}", i.name));
    }
    let mut owners: BTreeMap<String, String> = BTreeMap::new(); // load-balancer name -> owner
    // Services deleted since (`known`) still name what they left.
    let present: BTreeSet<Option<&String>> = k.services.iter().map(|s| s.metadata.uid.as_ref()).collect();
    let gone = known.iter().filter(|s| !present.contains(&s.metadata.uid.as_ref()));
    for s in k.services.iter().chain(gone) {
        let owner = owner_of(s);
        let lb = ccm_framework::provider::default_load_balancer_name(s);
        names.add(lb.clone(), format!("{{lb {owner}}}"));
        owners.insert(lb, owner.clone());
        let (ns, name) = owner.split_once('/').unwrap();
        let uid = s.metadata.uid.as_deref().unwrap_or_default();
        names.add(
            ccm_provider_aws::lb::managed_group_name(CLUSTER_NAME, ns, name, uid),
            format!("{{managed-sg {owner}}}"),
        );
    }
    for lb in &lbs {
        let name = lb.load_balancer_name().unwrap_or_default();
        names.add(lb.load_balancer_arn().unwrap_or_default(), format!("{{arn {name}}}"));
    }
    for tg in &tgs {
        names.add(
            tg.target_group_arn().unwrap_or_default(),
            format!("{{tg {}}}", tg.target_group_name().unwrap_or_default()),
        );
    }
    names.finish();
    // Groups the managers made, named by their names with the load-balancer names replaced.
    let seeded: BTreeSet<&str> = w.groups.values().map(String::as_str).collect();
    let mut made_groups = Vec::new();
    for g in &groups {
        let id = g.group_id().unwrap_or_default();
        if !seeded.contains(id) {
            made_groups.push((id.to_string(), format!("{{sg {}}}", names.apply(g.group_name().unwrap_or_default()))));
        }
    }
    for (id, name) in made_groups {
        names.add(id, name);
    }
    names.finish();
    let mut out = Out { fields: Fields::new(), names: &names };
    // Created groups belong to the Service whose load balancer uses them.
    let mut group_owner: BTreeMap<String, String> = BTreeMap::new();

    // --- Services and their events
    for s in &k.services {
        let owner = owner_of(s);
        let ingress = s.status.as_ref().and_then(|st| st.load_balancer.as_ref()).and_then(|lb| lb.ingress.clone());
        let hosts = ingress.unwrap_or_default().into_iter().map(|i| {
            format!(
                "{}{}",
                i.hostname.clone().unwrap_or_default(),
                i.ip.clone().map(|ip| format!(" ip {ip}")).unwrap_or_default()
            )
        });
        out.put(&owner, "status.ingress", join(hosts));
        out.put(&owner, "finalizers", join(s.metadata.finalizers.clone().unwrap_or_default()));
        let mine: Vec<&CoreEvent> = k
            .events
            .iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("Service"))
            .filter(|e| e.involved_object.uid.is_some() && e.involved_object.uid == s.metadata.uid)
            .collect();
        let time = |e: &CoreEvent| {
            e.event_time
                .as_ref()
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.first_timestamp.as_ref().map(|t| t.0))
        };
        let last = |reasons: &[&str]| {
            mine.iter()
                .filter(|e| reasons.contains(&e.reason.as_deref().unwrap_or_default()))
                .max_by_key(|e| time(e))
                .copied()
        };
        let failed = last(&["SyncLoadBalancerFailed"]);
        let ok = last(&["EnsuredLoadBalancer"]);
        if let Some(f) = failed
            && ok.is_none_or(|ok| time(f) >= time(ok))
        {
            out.put(&owner, "sync.failure", refusal(f.message.as_deref().unwrap_or_default()));
        }
    }

    // --- Network Load Balancers
    let lb_arns: Vec<String> = lbs.iter().filter_map(|l| l.load_balancer_arn().map(String::from)).collect();
    let tg_arns: Vec<String> = tgs.iter().filter_map(|t| t.target_group_arn().map(String::from)).collect();
    let mut listener_arns = Vec::new();
    let mut listeners = Vec::new();
    for arn in &lb_arns {
        let r = c.elb.describe_listeners().load_balancer_arn(arn).send().await.unwrap();
        for l in r.listeners() {
            listener_arns.push(l.listener_arn().unwrap_or_default().to_string());
            listeners.push((arn.clone(), l.clone()));
        }
    }
    let all_arns: Vec<String> = lb_arns.iter().chain(&tg_arns).chain(&listener_arns).cloned().collect();
    let tags = v2_tags(c, &all_arns).await;
    let tag_owner = |arn: &str| -> String {
        tags.get(arn).and_then(|t| t.get(TAG_SERVICE_NAME)).cloned().unwrap_or_else(|| format!("untagged {arn}"))
    };
    let mut lb_owner: BTreeMap<String, String> = BTreeMap::new();
    for lb in &lbs {
        let arn = lb.load_balancer_arn().unwrap_or_default();
        let owner = tag_owner(arn);
        lb_owner.insert(arn.to_string(), owner.clone());
        let p = format!("nlb {}", lb.load_balancer_name().unwrap_or_default());
        out.put(&owner, format!("{p}.type"), lb.r#type().map(|t| t.as_str()).unwrap_or_default());
        out.put(&owner, format!("{p}.scheme"), lb.scheme().map(|t| t.as_str()).unwrap_or_default());
        out.put(&owner, format!("{p}.ip_address_type"), lb.ip_address_type().map(|t| t.as_str()).unwrap_or_default());
        out.put(&owner, format!("{p}.vpc"), lb.vpc_id().unwrap_or_default());
        out.put(&owner, format!("{p}.dns"), lb.dns_name().unwrap_or_default());
        let zones = lb.availability_zones().iter().map(|z| {
            let addresses = z
                .load_balancer_addresses()
                .iter()
                .map(|a| {
                    format!("{}{}", a.allocation_id().unwrap_or_default(), a.private_ipv4_address().unwrap_or_default())
                })
                .collect::<Vec<_>>()
                .join("+");
            format!(
                "{}{}",
                z.subnet_id().unwrap_or_default(),
                if addresses.is_empty() { String::new() } else { format!("={addresses}") }
            )
        });
        out.put(&owner, format!("{p}.subnets"), join(zones.map(|s| names.apply(&s))));
        out.put(&owner, format!("{p}.security_groups"), lb.security_groups().join(","));
        for g in lb.security_groups().iter().filter(|g| !seeded.contains(g.as_str())) {
            group_owner.insert(g.clone(), owner.clone());
        }
        for (key, value) in tags.get(arn).cloned().unwrap_or_default() {
            out.put(&owner, format!("{p}.tag[{key}]"), value);
        }
        let attrs = c.elb.describe_load_balancer_attributes().load_balancer_arn(arn).send().await.unwrap();
        for a in attrs.attributes() {
            out.put(&owner, format!("{p}.attribute[{}]", a.key().unwrap_or_default()), a.value().unwrap_or_default());
        }
    }
    for (lb_arn, l) in &listeners {
        let owner = lb_owner.get(lb_arn).cloned().unwrap_or_default();
        let p = format!("listener {}", l.port().unwrap_or_default());
        out.put(&owner, format!("{p}.protocol"), l.protocol().map(|p| p.as_str()).unwrap_or_default());
        out.put(&owner, format!("{p}.ssl_policy"), l.ssl_policy().unwrap_or_default());
        out.put(
            &owner,
            format!("{p}.certificates"),
            join(l.certificates().iter().map(|c| c.certificate_arn().unwrap_or_default().to_string())),
        );
        let actions = l.default_actions().iter().map(|a| {
            format!(
                "{}:{}",
                a.r#type().map(|t| t.as_str()).unwrap_or_default(),
                a.target_group_arn().unwrap_or_default()
            )
        });
        out.put(&owner, format!("{p}.default_actions"), actions.collect::<Vec<_>>().join(","));
        for (key, value) in tags.get(l.listener_arn().unwrap_or_default()).cloned().unwrap_or_default() {
            out.put(&owner, format!("{p}.tag[{key}]"), value);
        }
    }
    // Health-check ports several load balancers check (kube-proxy's, in `Shared` mode): one
    // rule per source serves them all, named after whichever load balancer made it first.
    let mut health_port_owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for tg in &tgs {
        let arn = tg.target_group_arn().unwrap_or_default();
        if let Some(port) = tg.health_check_port().filter(|p| p.parse::<u16>().is_ok()) {
            health_port_owners.entry(port.to_string()).or_default().insert(tag_owner(arn));
        }
    }
    let shared_health: BTreeSet<String> =
        health_port_owners.into_iter().filter(|(_, o)| o.len() > 1).map(|(p, _)| p).collect();
    for tg in &tgs {
        let arn = tg.target_group_arn().unwrap_or_default();
        let owner = tag_owner(arn);
        let p = format!("tg {}", tg.target_group_name().unwrap_or_default());
        out.put(&owner, format!("{p}.protocol"), tg.protocol().map(|p| p.as_str()).unwrap_or_default());
        out.put(&owner, format!("{p}.port"), tg.port().unwrap_or_default().to_string());
        out.put(&owner, format!("{p}.target_type"), tg.target_type().map(|t| t.as_str()).unwrap_or_default());
        out.put(&owner, format!("{p}.vpc"), tg.vpc_id().unwrap_or_default());
        out.put(&owner, format!("{p}.load_balancers"), join(tg.load_balancer_arns().iter().cloned()));
        let health = format!(
            "{} port {} path {} every {}s timeout {}s healthy {} unhealthy {} enabled {}",
            tg.health_check_protocol().map(|p| p.as_str()).unwrap_or_default(),
            tg.health_check_port().unwrap_or_default(),
            tg.health_check_path().unwrap_or("-"),
            tg.health_check_interval_seconds().unwrap_or_default(),
            tg.health_check_timeout_seconds().unwrap_or_default(),
            tg.healthy_threshold_count().unwrap_or_default(),
            tg.unhealthy_threshold_count().unwrap_or_default(),
            tg.health_check_enabled().map(|e| e.to_string()).unwrap_or_default(),
        );
        out.put(&owner, format!("{p}.health_check"), health);
        for (key, value) in tags.get(arn).cloned().unwrap_or_default() {
            out.put(&owner, format!("{p}.tag[{key}]"), value);
        }
        if let Ok(a) = c.elb.describe_target_group_attributes().target_group_arn(arn).send().await {
            for a in a.attributes() {
                out.put(
                    &owner,
                    format!("{p}.attribute[{}]", a.key().unwrap_or_default()),
                    a.value().unwrap_or_default(),
                );
            }
        }
        if let Ok(h) = c.elb.describe_target_health().target_group_arn(arn).send().await {
            let targets = h
                .target_health_descriptions()
                .iter()
                .filter_map(|d| d.target())
                .map(|t| names.apply(&format!("{}:{}", t.id().unwrap_or_default(), t.port().unwrap_or_default())));
            out.put(&owner, format!("{p}.targets"), join(targets));
        }
    }

    // --- Classic ELBs
    let classic_names: Vec<String> = classics.iter().filter_map(|l| l.load_balancer_name().map(String::from)).collect();
    let mut classic_tags: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for chunk in classic_names.chunks(20) {
        let r = c.classic.describe_tags().set_load_balancer_names(Some(chunk.to_vec())).send().await.unwrap();
        for d in r.tag_descriptions() {
            classic_tags.insert(
                d.load_balancer_name().unwrap_or_default().to_string(),
                d.tags().iter().map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string())).collect(),
            );
        }
    }
    for lb in &classics {
        let name = lb.load_balancer_name().unwrap_or_default();
        let tags = classic_tags.get(name).cloned().unwrap_or_default();
        let owner = tags.get(TAG_SERVICE_NAME).cloned().unwrap_or_else(|| format!("untagged {name}"));
        let p = format!("elb {name}");
        out.put(&owner, format!("{p}.scheme"), lb.scheme().unwrap_or_default());
        out.put(&owner, format!("{p}.vpc"), lb.vpc_id().unwrap_or_default());
        out.put(&owner, format!("{p}.dns"), lb.dns_name().unwrap_or_default());
        out.put(&owner, format!("{p}.subnets"), join(lb.subnets().iter().map(|s| names.apply(s))));
        out.put(&owner, format!("{p}.availability_zones"), join(lb.availability_zones().iter().cloned()));
        out.put(&owner, format!("{p}.security_groups"), lb.security_groups().join(","));
        for g in lb.security_groups().iter().filter(|g| !seeded.contains(g.as_str())) {
            group_owner.insert(g.clone(), owner.clone());
        }
        // A set, as AWS keeps it: moto lists an instance once per registration.
        let instances: BTreeSet<String> =
            lb.instances().iter().map(|i| names.apply(i.instance_id().unwrap_or_default())).collect();
        out.put(&owner, format!("{p}.instances"), join(instances));
        for d in lb.listener_descriptions() {
            let Some(l) = d.listener() else { continue };
            let lp = format!("{p}.listener {}", l.load_balancer_port());
            out.put(
                &owner,
                &lp,
                format!(
                    "{} -> {}:{} cert {}",
                    l.protocol(),
                    l.instance_protocol().unwrap_or_default(),
                    l.instance_port(),
                    l.ssl_certificate_id().unwrap_or("-")
                ),
            );
            out.put(&owner, format!("{lp}.policies"), d.policy_names().join(","));
        }
        for b in lb.backend_server_descriptions() {
            out.put(
                &owner,
                format!("{p}.backend {}.policies", b.instance_port().unwrap_or_default()),
                b.policy_names().join(","),
            );
        }
        let health = lb.health_check().map(|h| {
            format!(
                "{} every {}s timeout {}s healthy {} unhealthy {}",
                h.target(),
                h.interval(),
                h.timeout(),
                h.healthy_threshold(),
                h.unhealthy_threshold()
            )
        });
        out.put(&owner, format!("{p}.health_check"), health.unwrap_or_default());
        for (key, value) in &tags {
            out.put(&owner, format!("{p}.tag[{key}]"), value);
        }
        let a = c.classic.describe_load_balancer_attributes().load_balancer_name(name).send().await.unwrap();
        if let Some(a) = a.load_balancer_attributes() {
            if let Some(x) = a.cross_zone_load_balancing() {
                out.put(&owner, format!("{p}.attribute[cross_zone]"), x.enabled().to_string());
            }
            if let Some(x) = a.access_log() {
                let v = format!(
                    "{} bucket {} prefix {} every {}",
                    x.enabled(),
                    x.s3_bucket_name().unwrap_or("-"),
                    x.s3_bucket_prefix().unwrap_or("-"),
                    x.emit_interval().map(|i| i.to_string()).unwrap_or("-".into())
                );
                out.put(&owner, format!("{p}.attribute[access_log]"), v);
            }
            if let Some(x) = a.connection_draining() {
                let v = format!("{} timeout {}", x.enabled(), x.timeout().map(|t| t.to_string()).unwrap_or("-".into()));
                out.put(&owner, format!("{p}.attribute[connection_draining]"), v);
            }
            if let Some(x) = a.connection_settings() {
                out.put(&owner, format!("{p}.attribute[idle_timeout]"), x.idle_timeout().to_string());
            }
            for x in a.additional_attributes() {
                out.put(
                    &owner,
                    format!("{p}.attribute[{}]", x.key().unwrap_or_default()),
                    x.value().unwrap_or_default(),
                );
            }
        }
        if let Ok(r) = c.classic.describe_load_balancer_policies().load_balancer_name(name).send().await {
            for pol in r.policy_descriptions() {
                let attrs = pol.policy_attribute_descriptions().iter().map(|a| {
                    format!("{}={}", a.attribute_name().unwrap_or_default(), a.attribute_value().unwrap_or_default())
                });
                out.put(
                    &owner,
                    format!("{p}.policy {}", pol.policy_name().unwrap_or_default()),
                    format!("{} {}", pol.policy_type_name().unwrap_or_default(), join(attrs)),
                );
            }
        }
    }

    // --- Security groups: the ones the managers made, and every rule on the seeded ones.
    for g in &groups {
        let id = g.group_id().unwrap_or_default();
        let gname = names.apply(id);
        let made = !seeded.contains(id);
        if g.group_name() == Some("default") {
            continue;
        }
        let group_owner_of = |g: &str| group_owner.get(g).cloned();
        let owner = if made {
            group_owner_of(id).unwrap_or_else(|| format!("unused {}", g.group_name().unwrap_or_default()))
        } else {
            WORLD.to_string()
        };
        let p = format!("sg {gname}");
        if made {
            out.put(&owner, format!("{p}.name"), g.group_name().unwrap_or_default());
            out.put(&owner, format!("{p}.description"), g.description().unwrap_or_default());
            out.put(&owner, format!("{p}.vpc"), g.vpc_id().unwrap_or_default());
            for t in g.tags() {
                out.put(&owner, format!("{p}.tag[{}]", t.key().unwrap_or_default()), t.value().unwrap_or_default());
            }
        }
        for perm in g.ip_permissions() {
            let proto = perm.ip_protocol().unwrap_or_default();
            let ports = match (perm.from_port(), perm.to_port()) {
                (Some(f), Some(t)) if f == t => format!("{f}"),
                (Some(f), Some(t)) => format!("{f}-{t}"),
                _ => "all".to_string(),
            };
            let mut rules: Vec<(String, String)> = Vec::new();
            for r in perm.ip_ranges() {
                rules.push((r.cidr_ip().unwrap_or_default().into(), r.description().unwrap_or_default().into()));
            }
            for r in perm.ipv6_ranges() {
                rules.push((r.cidr_ipv6().unwrap_or_default().into(), r.description().unwrap_or_default().into()));
            }
            for r in perm.user_id_group_pairs() {
                rules.push((r.group_id().unwrap_or_default().into(), r.description().unwrap_or_default().into()));
            }
            for (source, description) in rules {
                if !made && description.starts_with(NLB_HEALTH_RULE) && shared_health.contains(&ports) {
                    out.put(
                        WORLD,
                        format!("{p}.ingress[{proto} {ports} from {}]", names.apply(&source)),
                        format!("{NLB_HEALTH_RULE}=<one of them>"),
                    );
                    continue;
                }
                // On a seeded group a rule belongs to the load balancer its description names, or
                // to the Service whose group it admits; else to the world.
                let rule_owner = if made {
                    owner.clone()
                } else {
                    let named = owners.iter().find(|(lb, _)| description.contains(lb.as_str())).map(|(_, o)| o.clone());
                    named.or_else(|| group_owner_of(&source)).unwrap_or_else(|| WORLD.to_string())
                };
                out.put(
                    &rule_owner,
                    format!("{p}.ingress[{proto} {ports} from {}]", names.apply(&source)),
                    description,
                );
            }
        }
    }

    // --- Nodes
    for n in &k.nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let owner = format!("node {}", names.apply(&name));
        let spec = n.spec.clone().unwrap_or_default();
        out.put(&owner, "providerID", spec.provider_id.unwrap_or_default());
        for (key, value) in n.metadata.labels.clone().unwrap_or_default() {
            out.put(&owner, format!("label[{key}]"), value);
        }
        let taints = spec
            .taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect));
        out.put(&owner, "taints", join(taints));
        let addresses = n.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default();
        out.put(
            &owner,
            "addresses",
            addresses.iter().map(|a| format!("{}={}", a.type_, a.address)).collect::<Vec<_>>().join(","),
        );
    }
    out.fields
}

/// The ownership tag naming the Service.
const TAG_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The description of an NLB's health rule, before `=<load balancer name>`.
const NLB_HEALTH_RULE: &str = "kubernetes.io/rule/nlb/health";

/// A sync failure's message without the service controller's prefixes, which differ in
/// wording only (upstream wraps the provider's error in `Error syncing load balancer: failed
/// to ensure load balancer: `).
/// Ours also puts the refusal's reason first (`InvalidAnnotation: `, the Service condition's
/// reason), which the condition shows too.
pub(crate) fn refusal(message: &str) -> String {
    let m = message.trim();
    let m = m.strip_prefix("Error syncing load balancer: ").unwrap_or(m);
    let m = m.strip_prefix("failed to ensure load balancer: ").unwrap_or(m);
    for reason in [refusal_reasons::INVALID_ANNOTATION, refusal_reasons::UNSUPPORTED_SERVICE] {
        if let Some(rest) = m.strip_prefix(reason).and_then(|r| r.strip_prefix(": ")) {
            return rest.to_string();
        }
    }
    m.to_string()
}
