//! Faults: a manager killed at every request, throttling, security-group modes under kills.

use crate::kit::*;
use crate::proxy::*;

#[tokio::test]
async fn manager_killed_mid_ensure_or_mid_delete_leaves_nothing_orphaned() {
    let Some(Seeded { moto, direct, c, nodes, proxy }) = seeded("manager_killed_mid_ensure", 2).await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();

    // How many requests an uninterrupted ensure makes.
    let probe = with_uid(lb_service("probe", &[(80, 30080), (443, 30443)]), "00000000-0000-0000-0000-000000000000");
    let before = proxy.faults.lock().unwrap().requests;
    proxied(&proxy.url, 1).ensure_load_balancer(CLUSTER, &probe, &refs).await.unwrap();
    let per_ensure = proxy.faults.lock().unwrap().requests - before;
    direct.ensure_load_balancer_deleted(CLUSTER, &probe).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
    assert!(per_ensure >= 8, "{per_ensure}");

    for kill_at in 1..=per_ensure {
        let svc = with_uid(
            lb_service("web", &[(80, 30080), (443, 30443)]),
            &format!("00000000-0000-0000-0000-{kill_at:012}"),
        );
        // Killed right after request `kill_at` of an ensure took effect.
        let start = proxy.faults.lock().unwrap().requests;
        proxy.set(|f| f.hold_at = Some(start + kill_at));
        let victim = proxied(&proxy.url, 1);
        let (s2, n2) = (svc.clone(), nodes.clone());
        let task = tokio::spawn(async move {
            let refs: Vec<&Node> = n2.iter().collect();
            victim.ensure_load_balancer(CLUSTER, &s2, &refs).await
        });
        let held = proxy.held_count.load(Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), async {
            while proxy.held_count.load(Ordering::SeqCst) == held {
                proxy.held.notified().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("request {kill_at} was never made"));
        task.abort();
        proxy.set(|f| f.hold_at = None);
        // A new manager resumes: one of everything, then a delete that leaves nothing.
        let restarted = provider(&moto.url);
        restarted.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
        let st = lb_state(&c).await;
        assert_eq!(st.lbs.len(), 1, "killed at request {kill_at}: {st:?}");
        assert_eq!(st.tgs.len(), 2, "killed at request {kill_at}: {st:?}");
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080), (443, 30443)]), "killed at request {kill_at}");

        // Killed mid-delete at the same point (bounded by the delete's own length).
        let start = proxy.faults.lock().unwrap().requests;
        proxy.set(|f| f.hold_at = Some(start + kill_at.min(4)));
        let victim = proxied(&proxy.url, 1);
        let s2 = svc.clone();
        let task = tokio::spawn(async move { victim.ensure_load_balancer_deleted(CLUSTER, &s2).await });
        let held = proxy.held_count.load(Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while proxy.held_count.load(Ordering::SeqCst) == held {
                proxy.held.notified().await;
            }
        })
        .await;
        task.abort();
        proxy.set(|f| f.hold_at = None);
        provider(&moto.url).ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
        assert_eq!(lb_state(&c).await, LbState::default(), "killed at request {kill_at}");
    }
}

/// (group, port, CIDR) of every rule the provider wrote.
async fn rules_by_group(c: &Clients) -> BTreeSet<(String, i32, String)> {
    let sgs = c.ec2.describe_security_groups().send().await.unwrap();
    let mut out = BTreeSet::new();
    for g in sgs.security_groups() {
        for p in g.ip_permissions() {
            for r in p.ip_ranges() {
                if r.description().unwrap_or_default().starts_with("kubernetes.io/rule/nlb/") {
                    out.insert((
                        g.group_id().unwrap().to_string(),
                        p.from_port().unwrap(),
                        r.cidr_ip().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// (port, source group) of every rule the provider wrote on `group` that admits a group.
async fn group_sourced_rules(c: &Clients, group: &str) -> BTreeSet<(i32, String)> {
    let sgs = c.ec2.describe_security_groups().group_ids(group).send().await.unwrap();
    let mut out = BTreeSet::new();
    for p in sgs.security_groups()[0].ip_permissions() {
        for pair in p.user_id_group_pairs() {
            if pair.description().unwrap_or_default().starts_with("kubernetes.io/rule/nlb/") {
                out.insert((p.from_port().unwrap(), pair.group_id().unwrap().to_string()));
            }
        }
    }
    out
}

#[tokio::test]
async fn elb_security_group_is_the_classic_elbs_group_left_unchanged_and_never_receives_nlb_rules() {
    let Some(moto) = Moto::start("global_security_group_keys").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let svc = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000dd");
    let shared = c
        .ec2
        .create_security_group()
        .group_name("elb")
        .description("elb")
        .vpc_id(&w.vpc)
        .send()
        .await
        .unwrap()
        .group_id
        .unwrap();
    let ssh = ec2::types::IpPermission::builder()
        .ip_protocol("tcp")
        .from_port(22)
        .to_port(22)
        .ip_ranges(ec2::types::IpRange::builder().cidr_ip("10.0.0.0/8").build())
        .build();
    c.ec2.authorize_security_group_ingress().group_id(&shared).ip_permissions(ssh).send().await.unwrap();
    let shared_rules = group_detail(&c, &shared).await.3;
    let cfg = AwsConfig { elb_security_group: shared.clone(), ..config() };
    let elb_sg = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&moto.url)));

    // An NLB: its rules go on the Nodes' group, never on ElbSecurityGroup.
    elb_sg.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    assert_eq!(
        rules_by_group(&c).await,
        [(w.sg.clone(), 3, "0.0.0.0/0".to_string()), (w.sg.clone(), 30080, "0.0.0.0/0".to_string())].into()
    );
    assert_eq!(group_detail(&c, &shared).await.3, shared_rules);
    elb_sg.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert!(rules_by_group(&c).await.is_empty());

    // A Classic ELB: ElbSecurityGroup is its group, left as it is; no k8s-elb group is made; the
    // Nodes' group admits it; deletion closes that again and keeps the group.
    let mut classic = with_uid(lb_service("classic", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000de");
    classic.metadata.annotations = None;
    elb_sg.ensure_load_balancer(CLUSTER, &classic, &refs).await.unwrap();
    let name = ccm_framework::provider::default_load_balancer_name(&classic);
    assert_eq!(classic_state(&c, &name).await.unwrap().groups, vec![shared.clone()]);
    assert_eq!(group_detail(&c, &shared).await.3, shared_rules);
    assert!(
        c.ec2
            .describe_security_groups()
            .filters(ec2::types::Filter::builder().name("group-name").values(format!("k8s-elb-{name}")).build())
            .send()
            .await
            .unwrap()
            .security_groups()
            .is_empty()
    );
    assert_eq!(group_detail(&c, &w.sg).await.3, BTreeSet::from([("-1".to_string(), -1, -1, shared.clone())]));
    elb_sg.ensure_load_balancer_deleted(CLUSTER, &classic).await.unwrap();
    assert!(classic_state(&c, &name).await.is_none());
    assert!(group_detail(&c, &w.sg).await.3.is_empty());
    assert_eq!(group_detail(&c, &shared).await.3, shared_rules, "ElbSecurityGroup is never deleted or changed");

    // [Global] DisableSecurityGroupIngress: the load balancer, no rule anywhere.
    let cfg = AwsConfig { disable_security_group_ingress: true, ..config() };
    let off = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&moto.url)));
    off.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    assert_eq!(lb_state(&c).await.lbs.len(), 1);
    assert!(rules_by_group(&c).await.is_empty());
    off.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
}

#[tokio::test]
async fn managed_nlb_groups_are_upstreams_mode_switches_replace_nothing_and_a_kill_at_every_request_orphans_nothing() {
    let Some(moto) = Moto::start("managed_security_groups").await else { return };
    let direct = Arc::new(AwsProvider::new(managed_config(), CLUSTER, options_for(&moto.url)));
    let plain = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes: Vec<Node> = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    let uid = "00000000-0000-0000-0000-0000000000cc";
    let mut svc = with_uid(lb_service("web", &[(80, 30080)]), uid);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);

    // Managed: a group named, described and tagged as upstream's, attached to the NLB, letting
    // the source range in on the listener port with ICMP 3/4.
    direct.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let managed = managed_sgs(&c).await;
    assert_eq!(managed.len(), 1);
    let (arn, _, sgs) = lb_shape(&c).await;
    assert_eq!(sgs, managed);
    let m = managed.iter().next().unwrap().clone();
    let (name, desc, tags, ingress) = group_detail(&c, &m).await;
    assert_eq!(name, ccm_provider_aws::lb::managed_group_name(CLUSTER, "default", "web", uid));
    assert_eq!(desc, "[k8s] Managed SecurityGroup for LoadBalancer");
    assert_eq!(tags, BTreeMap::from([(format!("kubernetes.io/cluster/{CLUSTER}"), "owned".to_string())]));
    assert_eq!(
        ingress,
        BTreeSet::from([
            ("icmp".to_string(), 3, 4, "203.0.113.0/24".to_string()),
            ("tcp".to_string(), 80, 80, "203.0.113.0/24".to_string()),
        ])
    );
    // The Nodes' rules stay CIDR-based, as upstream's: clients, health checks from the load
    // balancer's subnets, the MTU rule; none sourced from the group.
    let rules = rules_by_group(&c).await;
    for want in [(30080, "203.0.113.0/24"), (30080, "10.0.1.0/24"), (30080, "10.0.2.0/24"), (3, "203.0.113.0/24")] {
        assert!(rules.contains(&(w.sg.clone(), want.0, want.1.to_string())), "{want:?} in {rules:?}");
    }
    assert!(group_sourced_rules(&c, &w.sg).await.is_empty());

    // The mode switched off: the NLB keeps its group (nothing is replaced) and the group's
    // ingress is still kept to the Service's ranges; deletion removes the group.
    let mut narrower = svc.clone();
    narrower.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    plain.ensure_load_balancer(CLUSTER, &narrower, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await, (arn.clone(), w.subnets.iter().cloned().collect(), managed.clone()));
    assert!(group_detail(&c, &m).await.3.iter().all(|r| r.3 == "198.51.100.0/24"));
    plain.ensure_load_balancer_deleted(CLUSTER, &narrower).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
    assert!(managed_sgs(&c).await.is_empty());

    // The mode switched on for an NLB made without a group: kept without one (upstream's
    // behaviour); the replace annotation remakes it with one.
    plain.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let (arn_plain, _, sgs) = lb_shape(&c).await;
    assert!(sgs.is_empty());
    direct.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.0, arn_plain, "not replaced");
    assert!(managed_sgs(&c).await.is_empty());
    let replace = annotated(svc.clone(), &[(ccm_provider_aws::lb::REPLACE, "true")]);
    direct.ensure_load_balancer(CLUSTER, &replace, &refs).await.unwrap();
    let (arn_new, _, sgs) = lb_shape(&c).await;
    assert_ne!(arn_new, arn_plain);
    assert_eq!(sgs, managed_sgs(&c).await);
    assert_eq!(sgs.len(), 1);
    direct.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
    assert!(managed_sgs(&c).await.is_empty());
    assert!(group_sourced_rules(&c, &w.sg).await.is_empty());

    // A kill after every request of an ensure and of a delete: a restarted manager ends with one
    // of each, then nothing.
    let proxy = Proxy::start(moto.port).await;
    let before = proxy.faults.lock().unwrap().requests;
    proxied_with(&proxy.url, 1, managed_config()).ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let per_ensure = proxy.faults.lock().unwrap().requests - before;
    let before = proxy.faults.lock().unwrap().requests;
    proxied_with(&proxy.url, 1, managed_config()).ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    let per_delete = proxy.faults.lock().unwrap().requests - before;
    let mut counts = Vec::new();
    for kill_at in 1..=per_ensure {
        let s = with_uid(svc.clone(), &format!("00000000-0000-0000-0001-{kill_at:012}"));
        for deleting in [false, true] {
            let start = proxy.faults.lock().unwrap().requests;
            let at = if deleting { kill_at.min(per_delete) } else { kill_at };
            proxy.set(|f| f.hold_at = Some(start + at));
            let victim = proxied_with(&proxy.url, 1, managed_config());
            let (s2, n2) = (s.clone(), nodes.clone());
            let task = tokio::spawn(async move {
                let refs: Vec<&Node> = n2.iter().collect();
                if deleting {
                    victim.ensure_load_balancer_deleted(CLUSTER, &s2).await
                } else {
                    victim.ensure_load_balancer(CLUSTER, &s2, &refs).await.map(|_| ())
                }
            });
            let held = proxy.held_count.load(Ordering::SeqCst);
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while proxy.held_count.load(Ordering::SeqCst) == held {
                    proxy.held.notified().await;
                }
            })
            .await;
            task.abort();
            proxy.set(|f| f.hold_at = None);
            if !deleting {
                direct.ensure_load_balancer(CLUSTER, &s, &refs).await.unwrap();
                let st = lb_state(&c).await;
                let sgs = managed_sgs(&c).await;
                assert_eq!((st.lbs.len(), st.tgs.len(), sgs.len()), (1, 1, 1), "killed at ensure request {kill_at}");
                assert_eq!(lb_shape(&c).await.2, sgs, "killed at ensure request {kill_at}");
            } else {
                direct.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
                let st = lb_state(&c).await;
                let sgs = managed_sgs(&c).await.len();
                counts.push((kill_at, st.lbs.len(), st.tgs.len(), sgs));
                assert_eq!((st.lbs.len(), st.tgs.len(), sgs), (0, 0, 0), "killed at request {kill_at}");
                assert_eq!(st, LbState::default(), "killed at request {kill_at}");
            }
        }
    }
    println!(
        "managed security groups, kill at each of {per_ensure} ensure requests (a delete: {per_delete}): (request, load balancers, target groups, security groups) left after restart and delete: {counts:?}"
    );
}

testkit::backend_tests! {
    async fn throttling_bursts_end_converged_with_nothing_duplicated_and_show_in_health(backend) {
        let Some(moto) = Moto::start("throttling_bursts").await else { return };
        let direct = provider(&moto.url);
        let c = direct.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 2).await;
        let proxy = Proxy::start(moto.port).await;
        let p = proxied(&proxy.url, 2);

        // More throttling answers than the SDK retries: the caller sees Throttled with a delay.
        proxy.set(|f| {
            f.throttle.insert("DescribeInstances".into(), 3);
        });
        let n = node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![]);
        match p.instance_metadata(&n).await {
            Err(CloudError::Throttled { retry_after: Some(d), .. }) => assert!(d >= Duration::from_secs(1)),
            other => panic!("expected Throttled, got {other:?}"),
        }
        assert!(matches!(p.health().await, Health::Unhealthy { ref reason, .. } if reason == "Throttled"));

        // Bursts on every step of an ensure, through the service controller: it converges.
        proxy.set(|f| {
            for a in [
                "DescribeLoadBalancers",
                "CreateLoadBalancer",
                "CreateTargetGroup",
                "RegisterTargets",
                "CreateListener",
                "DescribeTags",
            ] {
                f.throttle.insert(a.into(), 3);
            }
            f.throttle.insert("DescribeInstances".into(), 2);
            f.throttle.insert("AuthorizeSecurityGroupIngress".into(), 2);
        });
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &inst {
            env.create_node(node(dns, Some(&pid(id)), Some("True"), vec![])).await;
        }
        env.run(Box::new(ServiceController::new()));
        env.services().create(&PostParams::default(), &lb_service("web", &[(80, 30080), (443, 30443)])).await.unwrap();
        eventually(|| async {
            env.services().get("web").await.ok().filter(|s| {
                s.status.as_ref().and_then(|st| st.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref()).is_some_and(|i| !i.is_empty())
            })
        })
        .await;
        let st = lb_state(&c).await;
        assert_eq!(st.lbs.len(), 1, "{st:?}");
        assert_eq!(st.tgs.len(), 2, "{st:?}");
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080), (443, 30443)]));
        let all: BTreeSet<String> = inst.iter().map(|i| i.0.clone()).collect();
        assert_eq!(targets(&st), vec![all.clone(), all]);
        assert_eq!(st.rules.len(), 3, "two client rules and the MTU rule: {:?}", st.rules);
        let f = proxy.faults.lock().unwrap();
        assert!(f.throttled >= 10, "the proxy throttled {} requests", f.throttled);
    }
}
