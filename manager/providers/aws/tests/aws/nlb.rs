//! Network Load Balancers on moto: lifecycle, annotations, settings fixed at creation, calls per sync.

use crate::kit::*;
use crate::proxy::*;

testkit::backend_tests! {
    async fn nlb_lifecycle_create_ports_nodes_traffic_policy_delete(backend) {
        let Some(moto) = Moto::start("nlb_lifecycle").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 3).await;
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &inst[..2] {
            env.create_node(node(dns, Some(&pid(id)), Some("True"), vec![])).await;
        }
        // The first ensure is to see both Nodes; one arriving later is the node pass's case below.
        eventually(|| async { (env.ctx.nodes.state().len() == 2).then_some(()) }).await;
        env.run(Box::new(ServiceController::new()));
        let mut svc = lb_service("web", &[(80, 30080)]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);
        env.services().create(&PostParams::default(), &svc).await.unwrap();
        let two: BTreeSet<String> = inst[..2].iter().map(|i| i.0.clone()).collect();

        // Created: one NLB, one target group on the nodePort checked on the traffic port (upstream's
        // default), a listener, targets, and the client rule from the source range.
        let s = eventually(|| async {
            env.services().get("web").await.ok().filter(|s| {
                s.status.as_ref().and_then(|st| st.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref()).is_some_and(|i| !i.is_empty())
            })
        })
        .await;
        let hostname = s.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0].hostname.clone().unwrap();
        assert!(!hostname.is_empty());
        let st = lb_state(&c).await;
        assert_eq!(st.lbs.len(), 1);
        assert_eq!(st.lbs[0].1, "default/web");
        assert_eq!(st.tgs.len(), 1);
        assert_eq!((st.tgs[0].1.as_str(), st.tgs[0].2, st.tgs[0].3.as_str()), ("TCP", 30080, "traffic-port"));
        assert_eq!(targets(&st), vec![two.clone()]);
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080)]));
        assert!(st.rules.iter().any(|r| r.1 == 30080 && r.2 == "203.0.113.0/24"), "{:?}", st.rules);

        // Add a port.
        let pp = PatchParams::default();
        let ports = |list: &[(i32, i32)]| json!({"spec": {"ports": list.iter().map(|(p, np)| json!({"name": format!("p{p}"), "port": p, "nodePort": np, "protocol": "TCP"})).collect::<Vec<_>>()}});
        env.services().patch("web", &pp, &Patch::Merge(ports(&[(80, 30080), (443, 30443)]))).await.unwrap();
        let st =
            eventually(|| async { Some(lb_state(&c).await).filter(|s| s.listeners.len() == 2 && s.tgs.len() == 2) }).await;
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080), (443, 30443)]));
        assert_eq!(st.lbs.len(), 1, "the load balancer is kept");

        // Remove a port: its listener, target group and rule go.
        env.services().patch("web", &pp, &Patch::Merge(ports(&[(443, 30443)]))).await.unwrap();
        // Rules are synced last in a sync: wait for them too.
        let st = eventually(|| async {
            Some(lb_state(&c).await)
                .filter(|s| s.listeners.len() == 1 && s.tgs.len() == 1 && !s.rules.iter().any(|r| r.1 == 30080))
        })
        .await;
        assert_eq!(st.listeners, BTreeSet::from([(443, 30443)]));
        assert!(!st.rules.iter().any(|r| r.1 == 30080), "{:?}", st.rules);

        // Add a Node, then remove one.
        env.create_node(node(&inst[2].1, Some(&pid(&inst[2].0)), Some("True"), vec![])).await;
        let all: BTreeSet<String> = inst.iter().map(|i| i.0.clone()).collect();
        eventually(|| async { Some(lb_state(&c).await).filter(|s| targets(s) == vec![all.clone()]) }).await;
        env.nodes().delete(&inst[0].1, &DeleteParams::default()).await.unwrap();
        let last_two: BTreeSet<String> = inst[1..].iter().map(|i| i.0.clone()).collect();
        eventually(|| async { Some(lb_state(&c).await).filter(|s| targets(s) == vec![last_two.clone()]) }).await;

        // Switch to externalTrafficPolicy: Local: the health check moves to healthCheckNodePort and
        // health rules open it from the load balancer's subnets.
        env.services()
            .patch(
                "web",
                &pp,
                &Patch::Merge(json!({"spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}})),
            )
            .await
            .unwrap();
        // Rules are synced last in a sync: wait for both.
        let st = eventually(|| async {
            Some(lb_state(&c).await).filter(|s| {
                s.tgs.first().is_some_and(|t| t.3 == "32100")
                    && s.rules.iter().any(|r| r.1 == 32100 && r.2 == "10.0.1.0/24")
                    && s.rules.iter().any(|r| r.1 == 32100 && r.2 == "10.0.2.0/24")
            })
        })
        .await;
        assert_eq!(st.lbs.len(), 1);

        // Delete: nothing left.
        env.services().delete("web", &DeleteParams::default()).await.unwrap();
        eventually(|| async { env.services().get_opt("web").await.unwrap().is_none().then_some(()) }).await;
        assert_eq!(lb_state(&c).await, LbState::default());
        let _ = w.vpc;
    }
}

testkit::backend_tests! {
    async fn a_change_aws_cannot_make_in_place_is_refused_keeping_the_load_balancer_unless_the_service_asks_for_a_replacement(backend) {
        let Some(moto) = Moto::start("fixed_settings").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 1).await;
        let env = Env::start(backend, p.clone(), options()).await;
        // The engine hands the provider its event sink when it starts leading.
        let init = InitContext {
            client: env.cluster.client(),
            shutdown: env.shutdown.clone(),
            metrics: env.ctx.metrics.clone(),
            events: env.ctx.events.clone(),
        };
        p.initialize(init).await.unwrap();
        env.create_node(node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])).await;
        env.run(Box::new(ServiceController::new()));
        env.services().create(&PostParams::default(), &lb_service("moved", &[(80, 30080)])).await.unwrap();
        let (_, hostname) = service_with_hostname(&env, "moved").await;
        let first = lb_shape(&c).await.0;

        // The scheme cannot change on an existing NLB: refused, naming the annotation, and the
        // load balancer kept (the same ARN and hostname); a port change still converges.
        let patch = json!({
            "metadata": {"annotations": {annotations::INTERNAL: "true"}},
            "spec": {"ports": [{"name": "p81", "port": 81, "nodePort": 30081, "protocol": "TCP"}]}
        });
        env.services().patch("moved", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let cond = condition(&env, "moved", Some(refusal_reasons::UNSUPPORTED_SERVICE)).await.unwrap();
        assert!(cond.message.contains(annotations::INTERNAL) && cond.message.contains(ccm_provider_aws::lb::REPLACE), "{}", cond.message);
        eventually(|| async { Some(lb_state(&c).await).filter(|s| s.listeners == BTreeSet::from([(81, 30081)])) }).await;
        assert_eq!(lb_shape(&c).await.0, first, "kept");
        let s = env.services().get("moved").await.unwrap();
        assert_eq!(s.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0].hostname.as_deref(), Some(hostname.as_str()));

        // Asked explicitly: replaced, with a Warning saying why and that the hostname changes.
        let patch = json!({"metadata": {"annotations": {ccm_provider_aws::lb::REPLACE: "true"}}});
        env.services().patch("moved", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let e = event(&env, ccm_provider_aws::lb::REASON_LOAD_BALANCER_REPLACED).await;
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("moved"));
        let note = e.note.unwrap_or_default();
        assert!(note.contains(annotations::INTERNAL) && note.contains("new hostname"), "{note}");
        // Read with DescribeLoadBalancers only: the controller is still at work.
        eventually(|| async {
            let lbs = c.elb.describe_load_balancers().send().await.ok()?;
            let l: Vec<_> = lbs.load_balancers().iter().collect();
            (l.len() == 1 && l[0].load_balancer_arn() != Some(first.as_str()) && l[0].scheme().map(|s| s.as_str()) == Some("internal")).then_some(())
        })
        .await;
        assert!(condition(&env, "moved", None).await.is_none(), "the refusal is gone");
    }
}

#[tokio::test]
async fn annotations_apply_on_moto_and_changes_converge_on_the_same_load_balancer() {
    use annotations as a;
    let Some(moto) = Moto::start("annotations_apply").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 2).await;
    let mut nodes: Vec<Node> = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    nodes[0].metadata.labels = Some([("pool".to_string(), "lb".to_string())].into());
    let refs: Vec<&Node> = nodes.iter().collect();
    let cert = acm_certificate(moto.port).await;
    let policy = "ELBSecurityPolicy-TLS13-1-2-2021-06";
    let mut base = with_uid(lb_service("web", &[(80, 30080), (443, 30443)]), "00000000-0000-0000-0000-0000000000aa");
    base.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].name = Some("https".into());

    // Every NLB annotation at once.
    let first = annotated(
        base.clone(),
        &[
            (a::HC_PROTOCOL, "HTTP"),
            (a::HC_PORT, "8080"),
            (a::HC_PATH, "/ready"),
            (a::HC_INTERVAL, "10"),
            (a::HC_TIMEOUT, "5"),
            (a::HC_HEALTHY, "3"),
            (a::HC_UNHEALTHY, "4"),
            (a::CROSS_ZONE, "true"),
            (a::TARGET_GROUP_ATTRIBUTES, "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=true"),
            (a::TARGET_NODE_LABELS, "pool=lb"),
            (a::SSL_CERT, &cert),
            (a::SSL_PORTS, "https"),
            (a::SSL_POLICY, policy),
            (a::SOURCE_RANGES, "198.51.100.0/24"),
        ],
    );
    p.ensure_load_balancer(CLUSTER, &first, &refs).await.unwrap();
    let d = nlb_detail(&c).await;
    let only_a: BTreeSet<String> = [inst[0].0.clone()].into();
    for port in [30080, 30443] {
        let (proto, health, attrs, targets) = &d.tgs[&port];
        assert_eq!(proto, "TCP");
        assert_eq!(health, &("HTTP".into(), "8080".into(), "/ready".into(), 10, 5, 3, 4), "port {port}");
        assert_eq!(attrs["preserve_client_ip.enabled"], "false");
        assert_eq!(attrs["proxy_protocol_v2.enabled"], "true");
        assert_eq!(targets, &only_a, "target-node-labels selects the labelled Node only");
    }
    assert_eq!(d.lb_attrs["load_balancing.cross_zone.enabled"], "true");
    // (moto reports its default policy on every listener, TCP ones too.)
    assert_eq!((d.listeners[&80].0.as_str(), d.listeners[&80].1.as_str()), ("TCP", ""));
    assert_eq!(d.listeners[&443], ("TLS".into(), cert.clone(), policy.to_string()));
    let st = lb_state(&c).await;
    assert!(st.rules.iter().any(|r| r.1 == 30080 && r.2 == "198.51.100.0/24"), "{:?}", st.rules);
    // Health checks come from the load balancer's subnets; the clients' range gets the MTU rule.
    for subnet in ["10.0.1.0/24", "10.0.2.0/24"] {
        assert!(st.rules.iter().any(|r| r.1 == 8080 && r.2 == subnet && r.3.contains("/health=")), "{:?}", st.rules);
    }
    assert!(st.rules.iter().any(|r| r.0 == "icmp" && r.2 == "198.51.100.0/24" && r.3 == "kubernetes.io/rule/nlb/mtu"));
    assert!(!st.rules.iter().any(|r| r.2 == "0.0.0.0/0"), "{:?}", st.rules);

    // Changed on the live Service: TCP health check on the traffic port every 30 s (a new target
    // group, as upstream makes one when the check's protocol or interval changes), every Node,
    // no TLS, access logs on. Same load balancer.
    let second = annotated(
        base.clone(),
        &[
            (a::HC_PROTOCOL, "TCP"),
            (a::HC_PORT, "traffic-port"),
            (a::HC_INTERVAL, "30"),
            (a::CROSS_ZONE, "false"),
            (a::ACCESS_LOG_ENABLED, "true"),
            (a::ACCESS_LOG_BUCKET, "nlb-logs"),
            (a::ACCESS_LOG_PREFIX, "web"),
        ],
    );
    p.ensure_load_balancer(CLUSTER, &second, &refs).await.unwrap();
    let e = nlb_detail(&c).await;
    assert_eq!(e.lb_arn, d.lb_arn, "not recreated");
    let all: BTreeSet<String> = inst.iter().map(|i| i.0.clone()).collect();
    for port in [30080, 30443] {
        let (_, health, attrs, targets) = &e.tgs[&port];
        assert_eq!((health.0.as_str(), health.1.as_str(), health.3, health.4), ("TCP", "traffic-port", 30, 10));
        assert_eq!(attrs["preserve_client_ip.enabled"], "true", "a new target group, AWS's values");
        assert_eq!(attrs["proxy_protocol_v2.enabled"], "false");
        assert_eq!(targets, &all);
    }
    assert_eq!(e.tgs.len(), 2, "the old target groups are gone");
    assert_eq!(e.lb_attrs["load_balancing.cross_zone.enabled"], "false");
    assert_eq!(e.lb_attrs["access_logs.s3.enabled"], "true");
    assert_eq!(e.lb_attrs["access_logs.s3.bucket"], "nlb-logs");
    assert_eq!(e.lb_attrs["access_logs.s3.prefix"], "web");
    assert_eq!(e.listeners[&443].0, "TCP");
    // Clients from everywhere on the traffic port: the client rules cover the health checks,
    // so there are none of those, as upstream.
    let st = lb_state(&c).await;
    assert!(st.rules.iter().any(|r| r.1 == 30443 && r.2 == "0.0.0.0/0" && r.3.contains("/client=")), "{:?}", st.rules);
    assert!(!st.rules.iter().any(|r| r.3.contains("/health=")), "{:?}", st.rules);
    assert!(!st.rules.iter().any(|r| r.2 == "198.51.100.0/24"), "the old range's rules are removed: {:?}", st.rules);

    // A bad value on the live Service changes nothing and names the annotation.
    let before = lb_state(&c).await;
    let bad = annotated(second.clone(), &[(a::HC_INTERVAL, "3")]);
    let err = p.ensure_load_balancer(CLUSTER, &bad, &refs).await.unwrap_err().to_string();
    assert!(err.contains(a::HC_INTERVAL) && err.contains("5 to 300"), "{err}");
    assert_eq!(lb_state(&c).await, before);

    // Without the annotation the target groups' attributes are left as they are, as upstream.
    let third = annotated(second.clone(), &[(a::TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=true")]);
    p.ensure_load_balancer(CLUSTER, &third, &refs).await.unwrap();
    p.ensure_load_balancer(CLUSTER, &second, &refs).await.unwrap();
    for (_, _, attrs, _) in nlb_detail(&c).await.tgs.values() {
        assert_eq!(attrs["proxy_protocol_v2.enabled"], "true");
    }

    // [Global] ClusterServiceLoadBalancerHealthProbeMode = Shared: HTTP on kube-proxy's port,
    // over the health-check annotations (upstream's NLB rule).
    p.ensure_load_balancer_deleted(CLUSTER, &second).await.unwrap();
    let mut cfg = config();
    cfg.cluster_probe.mode = ccm_provider_aws::config::ProbeMode::Shared;
    let shared = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&moto.url)));
    shared.ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::HC_PROTOCOL, "TCP")]), &refs).await.unwrap();
    for (_, health, _, _) in nlb_detail(&c).await.tgs.values() {
        assert_eq!((health.0.as_str(), health.1.as_str(), health.2.as_str()), ("HTTP", "10256", "/healthz"));
    }
    shared.ensure_load_balancer_deleted(CLUSTER, &base).await.unwrap();

    // A bad value on a new Service creates nothing.
    let err = p
        .ensure_load_balancer(CLUSTER, &annotated(first.clone(), &[(a::SSL_CERT, "web-cert")]), &refs)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(a::SSL_CERT), "{err}");
    assert_eq!(lb_state(&c).await, LbState::default());
}

#[tokio::test]
async fn nlb_settings_fixed_at_creation_are_kept_and_refused_and_dual_stack_and_subnet_names_apply() {
    use annotations as a;
    let Some(moto) = Moto::start("nlb_fixed_settings").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let base = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000bb");
    let subnets: BTreeSet<String> = w.subnets.iter().cloned().collect();
    let mut eips = Vec::new();
    for _ in 0..2 {
        eips.push(
            c.ec2.allocate_address().domain(ec2::types::DomainType::Vpc).send().await.unwrap().allocation_id.unwrap(),
        );
    }
    let refused = |e: CloudError, annotation: &str| {
        assert!(matches!(e, CloudError::Refused { .. }), "{e}");
        let m = e.to_string();
        assert!(m.contains(annotation) && m.contains(ccm_provider_aws::lb::REPLACE) && m.contains("kept"), "{m}");
    };

    // Elastic IPs, one per subnet, at creation. (moto 5.2.5 keeps only SubnetMapping.SubnetId
    // and reports no LoadBalancerAddresses: the pairing and the comparison with what AWS reports
    // are unit tests, `elastic_ips_pair_in_order_and_private_addresses_by_subnet_cidr` and
    // `scheme_subnets_and_addresses_that_changed_are_named`.)
    let two = format!("{},{}", eips[0], eips[1]);
    let with_eips = annotated(base.clone(), &[(a::EIP_ALLOCATIONS, &two)]);
    p.ensure_load_balancer(CLUSTER, &with_eips, &refs).await.unwrap();
    let (arn1, got_subnets, _) = lb_shape(&c).await;
    assert_eq!(got_subnets, subnets);
    // One Elastic IP for two subnets on a new load balancer: refused before anything changes.
    p.ensure_load_balancer_deleted(CLUSTER, &with_eips).await.unwrap();
    let err = p
        .ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::EIP_ALLOCATIONS, &eips[1])]), &refs)
        .await
        .unwrap_err();
    // Upstream's message, word for word (the differential compares it).
    assert!(err.to_string().contains("Must have same number of EIP AllocationIDs (1) and SubnetIDs (2)"), "{err}");
    assert_eq!(lb_state(&c).await, LbState::default());
    let _ = arn1;

    // The scheme and the subnets are fixed at creation: a change is refused, naming the
    // annotation, and the load balancer kept; everything else still converges.
    p.ensure_load_balancer(CLUSTER, &base, &refs).await.unwrap();
    let (arn, _, _) = lb_shape(&c).await;
    let two_ports = |s: Service| {
        let mut s = s;
        s.spec.as_mut().unwrap().ports.as_mut().unwrap().push(ServicePort {
            name: Some("p81".into()),
            port: 81,
            node_port: Some(30081),
            protocol: Some("TCP".into()),
            ..Default::default()
        });
        s
    };
    let internal = two_ports(annotated(base.clone(), &[(a::INTERNAL, "true")]));
    refused(p.ensure_load_balancer(CLUSTER, &internal, &refs).await.unwrap_err(), a::INTERNAL);
    assert_eq!(lb_shape(&c).await.0, arn);
    assert_eq!(lb_state(&c).await.listeners.len(), 2, "the other changes are made");
    let one_subnet = annotated(base.clone(), &[(a::SUBNETS, &w.subnets[0])]);
    refused(p.ensure_load_balancer(CLUSTER, &one_subnet, &refs).await.unwrap_err(), a::SUBNETS);
    assert_eq!(lb_shape(&c).await, (arn.clone(), subnets.clone(), BTreeSet::new()));
    // Asked for: replaced.
    let replace = annotated(one_subnet.clone(), &[(ccm_provider_aws::lb::REPLACE, "true")]);
    p.ensure_load_balancer(CLUSTER, &replace, &refs).await.unwrap();
    let (arn2, got, _) = lb_shape(&c).await;
    assert_ne!(arn2, arn);
    assert_eq!(got, [w.subnets[0].clone()].into());
    let st = lb_state(&c).await;
    assert_eq!((st.lbs.len(), st.tgs.len(), st.listeners.len()), (1, 1, 1), "{st:?}");
    p.ensure_load_balancer_deleted(CLUSTER, &base).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());

    // Security groups of one's own on an NLB: refused with upstream's message.
    let byo = annotated(base.clone(), &[(a::SECURITY_GROUPS, &w.sg)]);
    let e = p.ensure_load_balancer(CLUSTER, &byo, &refs).await.unwrap_err().to_string();
    assert!(e.contains("BYO security group annotation") && e.contains("not supported by NLB"), "{e}");
    assert_eq!(lb_state(&c).await, LbState::default());

    // Dual stack (ours), following spec.ipFamilies, switched in place both ways.
    let mut dual = base.clone();
    dual.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    dual.spec.as_mut().unwrap().ip_family_policy = Some("RequireDualStack".into());
    let ip_type = |c: Clients| async move {
        let lbs = c.elb.describe_load_balancers().send().await.unwrap();
        lbs.load_balancers()[0].ip_address_type().unwrap().as_str().to_string()
    };
    dual.spec.as_mut().unwrap().load_balancer_source_ranges =
        Some(vec!["203.0.113.0/24".into(), "2001:db8::/32".into()]);
    p.ensure_load_balancer(CLUSTER, &dual, &refs).await.unwrap();
    let arn_dual = lb_shape(&c).await.0;
    assert_eq!(ip_type(c.clone()).await, "dualstack");
    let g = c.ec2.describe_security_groups().group_ids(&w.sg).send().await.unwrap();
    let v6: Vec<(i32, String)> = g.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| p.ipv6_ranges().iter().map(move |r| (p.from_port().unwrap(), r.cidr_ipv6().unwrap().to_string())))
        .collect();
    assert_eq!(v6, vec![(30080, "2001:db8::/32".to_string())], "the IPv6 source range reaches the nodePort");
    // Instance targets on the nodePort stay in an IPv4 target group: ELBv2's IPv6 target groups
    // take only `ip` targets, and the dualstack NLB translates IPv6 clients to them.
    let tgs = c.elb.describe_target_groups().send().await.unwrap();
    for tg in tgs.target_groups() {
        assert_eq!(tg.target_type().map(|t| t.as_str()), Some("instance"));
        assert_eq!(tg.ip_address_type().map(|t| t.as_str()).unwrap_or("ipv4"), "ipv4");
    }
    p.ensure_load_balancer(CLUSTER, &base, &refs).await.unwrap();
    assert_eq!(ip_type(c.clone()).await, "ipv4");
    let g = c.ec2.describe_security_groups().group_ids(&w.sg).send().await.unwrap();
    assert!(g.security_groups()[0].ip_permissions().iter().all(|p| p.ipv6_ranges().is_empty()), "IPv6 rule removed");
    p.ensure_load_balancer(CLUSTER, &dual, &refs).await.unwrap();
    assert_eq!(ip_type(c.clone()).await, "dualstack");
    assert_eq!(lb_shape(&c).await.0, arn_dual, "changed in place (SetIpAddressType)");
    p.ensure_load_balancer_deleted(CLUSTER, &dual).await.unwrap();

    // Subnets by Name tag, as upstream; an unknown name is refused before anything is made.
    c.ec2.create_tags().resources(&w.subnets[1]).tags(tag("Name", "public-b")).send().await.unwrap();
    let named = annotated(base.clone(), &[(a::SUBNETS, "public-b")]);
    p.ensure_load_balancer(CLUSTER, &named, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, [w.subnets[1].clone()].into());
    p.ensure_load_balancer_deleted(CLUSTER, &named).await.unwrap();
    let err =
        p.ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::SUBNETS, "nowhere")]), &refs).await.unwrap_err();
    assert!(err.to_string().contains(a::SUBNETS), "{err}");
    assert_eq!(lb_state(&c).await, LbState::default());
}

#[tokio::test]
async fn a_sync_makes_as_many_calls_beside_thirty_load_balancers_as_beside_none_after_one_scan() {
    let Some(Seeded { moto: _moto, direct, c, nodes, proxy }) = seeded("sync_calls_flat", 2).await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();
    let p = proxied(&proxy.url, 3);
    let web = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0002-000000000000");
    p.ensure_load_balancer(CLUSTER, &web, &refs).await.unwrap();

    let steady = |label: &'static str| {
        let (p, web, refs) = (p.clone(), web.clone(), refs.clone());
        let proxy = &proxy;
        async move {
            let from = proxy.faults.lock().unwrap().actions.len();
            p.update_load_balancer(CLUSTER, &web, &refs).await.unwrap();
            let mut calls = actions_since(proxy, from);
            // The instance cache refreshes on its own clock, whatever the load balancers.
            calls.remove("DescribeInstances");
            println!("{label}: {calls:?}");
            calls
        }
    };
    let alone = steady("one load balancer").await;
    for i in 0..30 {
        let other = with_uid(
            lb_service(&format!("other-{i}"), &[(80, 31000 + i)]),
            &format!("{i:08x}-0000-0000-0003-000000000000"),
        );
        direct.ensure_load_balancer(CLUSTER, &other, &refs).await.unwrap();
    }
    assert_eq!(lb_state(&c).await.lbs.len(), 31);
    let crowded = steady("beside thirty").await;
    assert_eq!(crowded, alone, "a sync's calls do not depend on how many other load balancers exist");
    assert!(!alone.contains_key("DescribeTags") || alone["DescribeTags"] <= 1, "{alone:?}");

    // A new process scans once (pages of 400, tags 20 at a time), then syncs as cheaply.
    let fresh = proxied(&proxy.url, 3);
    let from = proxy.faults.lock().unwrap().actions.len();
    fresh.update_load_balancer(CLUSTER, &web, &refs).await.unwrap();
    let first = actions_since(&proxy, from);
    println!("new process, first sync: {first:?}");
    assert_eq!(
        first.get("DescribeTags"),
        Some(&(2 + 2 + 1)),
        "31 load balancers and 31 target groups, 20 a call, then its own"
    );
    let from = proxy.faults.lock().unwrap().actions.len();
    fresh.update_load_balancer(CLUSTER, &web, &refs).await.unwrap();
    let mut second = actions_since(&proxy, from);
    second.remove("DescribeInstances");
    assert_eq!(second, alone);
}

/// #17 at `--concurrent-service-syncs` above one: NLBs share the Nodes' group and its path-MTU
/// rule; deleted all at once, none of their client or path-MTU rules is left behind.
#[tokio::test]
async fn nlbs_deleted_at_once_leave_none_of_their_rules_on_the_shared_node_group() {
    let Some(Seeded { moto: _moto, direct, c, nodes, proxy: _proxy }) = seeded("delete_at_once", 2).await else {
        return;
    };
    let refs: Vec<&Node> = nodes.iter().collect();
    let services: Vec<Service> = (0..8)
        .map(|i| {
            with_uid(
                lb_service(&format!("gone-{i}"), &[(80, 31100 + i)]),
                &format!("{i:08x}-0000-0000-0004-000000000000"),
            )
        })
        .collect();
    for s in &services {
        direct.ensure_load_balancer(CLUSTER, s, &refs).await.unwrap();
    }
    let ours = |st: &LbState| -> Vec<(String, i32, String, String)> {
        st.rules.iter().filter(|r| r.3.starts_with("kubernetes.io/rule/nlb/")).cloned().collect()
    };
    let made = ours(&lb_state(&c).await);
    assert!(made.iter().filter(|r| (31100..31108).contains(&r.1)).count() == 8, "{made:?}");
    assert!(made.iter().any(|r| r.0 == "icmp"), "a path-MTU rule beside the client rules: {made:?}");

    let mut deletes = tokio::task::JoinSet::new();
    for s in services {
        let p = direct.clone();
        deletes.spawn(async move {
            // A target group still attached for a moment is retried, as the controller would.
            for _ in 0..5 {
                match p.ensure_load_balancer_deleted(CLUSTER, &s).await {
                    Ok(()) => return,
                    Err(e) => {
                        eprintln!("retrying the delete of {}: {e}", s.metadata.name.as_deref().unwrap_or_default())
                    }
                }
            }
            panic!("the delete did not finish");
        });
    }
    while let Some(done) = deletes.join_next().await {
        done.unwrap();
    }
    let st = lb_state(&c).await;
    assert!(st.lbs.is_empty(), "{:?}", st.lbs);
    assert_eq!(ours(&st), Vec::new(), "no rule of a deleted load balancer is left");
}
