//! Classic ELBs on moto: upstream's shape, changes in place, SSL listeners and policies.

use crate::kit::*;

testkit::backend_tests! {
    async fn a_service_without_a_type_annotation_gets_a_classic_elb_as_upstream_changed_in_place_and_deleted(backend) {
        let Some(moto) = Moto::start("classic_lifecycle").await else { return };
        assert!(moto.corrected, "the Classic ELB tests need moto's health-check correction (python3 with moto)");
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 2).await;
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &inst {
            env.create_node(node(dns, Some(&pid(id)), Some("True"), vec![])).await;
        }
        eventually(|| async { (env.ctx.nodes.state().len() == 2).then_some(()) }).await;
        env.run(Box::new(ServiceController::new()));
        let mut svc = lb_service("classic", &[(80, 30080)]);
        svc.metadata.annotations = None;
        env.services().create(&PostParams::default(), &svc).await.unwrap();
        let (s, hostname) = service_with_hostname(&env, "classic").await;
        let name = ccm_framework::provider::default_load_balancer_name(&s);

        // Upstream's shape: a TCP listener, the health check on the nodePort (10 s, 5 s, 2, 6),
        // both instances, the Service and cluster tags, upstream's attributes.
        let st = eventually(|| async { classic_state(&c, &name).await.filter(|st| st.instances.len() == 2) }).await;
        assert_eq!(st.dns, hostname);
        assert!(!st.internal);
        assert_eq!(st.listeners, BTreeSet::from([("TCP".to_string(), 80, 30080)]));
        assert_eq!(st.health, Some(("TCP:30080".to_string(), 10, 5, 2, 6)));
        assert_eq!(st.instances, inst.iter().map(|i| i.0.clone()).collect());
        assert_eq!(st.tags.get("kubernetes.io/service-name").map(String::as_str), Some("default/classic"));
        assert_eq!(st.tags.get(&format!("kubernetes.io/cluster/{CLUSTER}")).map(String::as_str), Some("owned"));
        assert_eq!(st.subnets, w.subnets.iter().cloned().collect());
        assert_eq!((st.attributes.0, st.attributes.1, st.attributes.2, st.attributes.4), (false, false, false, 60));
        // Its own group k8s-elb-<name>: described and tagged as upstream, clients on the port and
        // ICMP 3/4, and the Nodes' group open to it.
        assert_eq!(st.groups.len(), 1);
        let (gname, gdesc, gtags, gin) = group_detail(&c, &st.groups[0]).await;
        assert_eq!(gname, format!("k8s-elb-{name}"));
        assert_eq!(gdesc, format!("Security group for Kubernetes ELB {name} (default/classic)"));
        assert_eq!(gtags, BTreeMap::from([(format!("kubernetes.io/cluster/{CLUSTER}"), "owned".to_string())]));
        assert_eq!(
            gin,
            BTreeSet::from([
                ("icmp".to_string(), 3, 4, "0.0.0.0/0".to_string()),
                ("tcp".to_string(), 80, 80, "0.0.0.0/0".to_string()),
            ])
        );
        let node_rules = group_detail(&c, &w.sg).await.3;
        assert_eq!(node_rules, BTreeSet::from([("-1".to_string(), -1, -1, st.groups[0].clone())]));

        // Annotations on the live Service converge in place: proxy protocol, attributes, tags,
        // client ranges.
        let patch = json!({
            "metadata": {"annotations": {
                annotations::PROXY_PROTOCOL: "*",
                annotations::CONNECTION_IDLE_TIMEOUT: "120",
                annotations::CROSS_ZONE: "true",
                annotations::CONNECTION_DRAINING_ENABLED: "true",
                annotations::CONNECTION_DRAINING_TIMEOUT: "30",
                annotations::EXTRA_TAGS: "team=web",
                annotations::HC_INTERVAL: "30",
            }},
            "spec": {"loadBalancerSourceRanges": ["203.0.113.0/24"]}
        });
        env.services().patch("classic", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let st = eventually(|| async {
            classic_state(&c, &name).await.filter(|st| {
                st.attributes == (true, false, true, Some(30), 120)
                    && !st.proxy.is_empty()
                    && st.health.as_ref().is_some_and(|h| h.1 == 30)
            })
        })
        .await;
        assert_eq!(st.dns, hostname, "the same load balancer");
        assert_eq!(st.proxy, BTreeSet::from([30080]));
        assert_eq!(st.tags.get("team").map(String::as_str), Some("web"));
        assert_eq!(st.health.as_ref().map(|h| h.1), Some(30));
        let gin = eventually(|| async {
            let g = group_detail(&c, &st.groups[0]).await.3;
            g.iter().any(|r| r.3 == "203.0.113.0/24").then_some(g)
        })
        .await;
        assert_eq!(
            gin,
            BTreeSet::from([
                ("icmp".to_string(), 3, 4, "203.0.113.0/24".to_string()),
                ("tcp".to_string(), 80, 80, "203.0.113.0/24".to_string()),
            ])
        );

        // A second port (proxy protocol off again): the listener is added, the backend cleared.
        let patch = json!({
            "metadata": {"annotations": {annotations::PROXY_PROTOCOL: null}},
            "spec": {"ports": [
                {"name": "p80", "port": 80, "nodePort": 30080, "protocol": "TCP"},
                {"name": "p443", "port": 443, "nodePort": 30443, "protocol": "TCP"}
            ]}
        });
        env.services().patch("classic", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let st = eventually(|| async { classic_state(&c, &name).await.filter(|st| st.listeners.len() == 2 && st.proxy.is_empty()) }).await;
        assert_eq!(st.dns, hostname);
        assert!(st.listeners.contains(&("TCP".to_string(), 443, 30443)));

        // A malformed annotation: refused, naming it; nothing changes.
        let patch = json!({"metadata": {"annotations": {annotations::PROXY_PROTOCOL: "yes"}}});
        env.services().patch("classic", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let cond = condition(&env, "classic", Some(refusal_reasons::INVALID_ANNOTATION)).await.unwrap();
        assert!(cond.message.contains(annotations::PROXY_PROTOCOL), "{}", cond.message);

        // Deleted in upstream's order: nothing left, the Nodes' group closed again.
        env.services().delete("classic", &DeleteParams::default()).await.unwrap();
        eventually(|| async { env.services().get_opt("classic").await.unwrap().is_none().then_some(()) }).await;
        assert!(classic_state(&c, &name).await.is_none());
        assert!(c.ec2.describe_security_groups().group_ids(&st.groups[0]).send().await.is_err(), "k8s-elb group deleted");
        assert!(group_detail(&c, &w.sg).await.3.is_empty());
    }
}

#[tokio::test]
async fn a_classic_elb_takes_ssl_listeners_its_negotiation_policy_access_logs_and_the_internal_scheme() {
    use annotations as a;
    let Some(moto) = Moto::start("classic_tls").await else { return };
    assert!(moto.corrected, "the Classic ELB tests need moto's health-check correction (python3 with moto)");
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let cert = acm_certificate(moto.port).await;
    let mut svc = with_uid(lb_service("tls", &[(80, 30080), (443, 30443)]), "c1a55000-0000-0000-0000-000000000000");
    svc.metadata.annotations = Some(
        [
            (a::SSL_CERT, cert.as_str()),
            (a::SSL_PORTS, "443"),
            (a::SSL_POLICY, "ELBSecurityPolicy-TLS-1-2-2017-01"),
            (a::INTERNAL, "true"),
            (a::ACCESS_LOG_ENABLED, "true"),
            (a::ACCESS_LOG_BUCKET, "elb-logs"),
            (a::ACCESS_LOG_EMIT_INTERVAL, "5"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    p.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let name = ccm_framework::provider::default_load_balancer_name(&svc);
    let st = classic_state(&c, &name).await.unwrap();
    assert!(st.internal);
    assert_eq!(st.listeners, BTreeSet::from([("SSL".to_string(), 443, 30443), ("TCP".to_string(), 80, 30080)]));
    assert!(st.attributes.1, "access logs on");
    let d = c.classic.describe_load_balancers().load_balancer_names(&name).send().await.unwrap();
    let d = &d.load_balancer_descriptions()[0];
    let policy = "k8s-SSLNegotiationPolicy-ELBSecurityPolicy-TLS-1-2-2017-01";
    assert!(d.policies().unwrap().other_policies().iter().any(|p| p == policy));
    let on_443: Vec<&str> = d
        .listener_descriptions()
        .iter()
        .filter(|l| l.listener().map(|l| l.load_balancer_port()) == Some(443))
        .flat_map(|l| l.policy_names().iter().map(String::as_str))
        .collect();
    assert_eq!(on_443, vec![policy]);
    let tls =
        d.listener_descriptions().iter().find_map(|l| l.listener().filter(|l| l.load_balancer_port() == 443)).unwrap();
    assert_eq!(tls.ssl_certificate_id(), Some(cert.as_str()));
    let a = c.classic.describe_load_balancer_attributes().load_balancer_name(&name).send().await.unwrap();
    let log = a.load_balancer_attributes().unwrap().access_log().unwrap();
    assert_eq!((log.s3_bucket_name(), log.emit_interval()), (Some("elb-logs"), Some(5)));
    p.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert!(classic_state(&c, &name).await.is_none());
}
