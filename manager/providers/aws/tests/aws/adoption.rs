//! Load balancers made by hand exactly as upstream makes them, adopted with no mutating call.

use crate::kit::*;
use crate::proxy::*;

/// Tags as ELBv2 takes them.
fn v2_tags(tags: &BTreeMap<String, String>) -> Vec<ccm_provider_aws::sdk::elbv2::types::Tag> {
    tags.iter().map(|(k, v)| ccm_provider_aws::sdk::elbv2::types::Tag::builder().key(k).value(v).build()).collect()
}

/// An NLB made exactly as upstream's `ensureLoadBalancerv2` makes it for `svc` (one port), with
/// its rules on the Nodes' group: returns its DNS name.
#[allow(clippy::too_many_arguments)]
async fn upstream_nlb(
    c: &Clients,
    w: &World,
    svc: &Service,
    instances: &[String],
    groups: Vec<String>,
    health: (&str, &str, Option<&str>, i32, i32, i32),
    tg_attributes: &[(&str, &str)],
    node_rules: Vec<ec2::types::IpPermission>,
) -> String {
    use ccm_provider_aws::sdk::elbv2::types as v2;
    let name = ccm_framework::provider::default_load_balancer_name(svc);
    let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    let tags: BTreeMap<String, String> = [
        ("kubernetes.io/service-name".to_string(), format!("default/{}", svc.metadata.name.as_deref().unwrap())),
        (format!("kubernetes.io/cluster/{CLUSTER}"), "owned".to_string()),
    ]
    .into();
    let lb = c
        .elb
        .create_load_balancer()
        .name(&name)
        .r#type(v2::LoadBalancerTypeEnum::Network)
        .set_subnet_mappings(Some(
            w.subnets.iter().map(|s| v2::SubnetMapping::builder().subnet_id(s).build()).collect(),
        ))
        .set_security_groups(Some(groups))
        .set_tags(Some(v2_tags(&tags)))
        .send()
        .await
        .unwrap();
    let lb = &lb.load_balancers()[0];
    let (hc_protocol, hc_port, hc_path, interval, healthy, unhealthy) = health;
    let tg_name = ccm_provider_aws::lb::target_group_name(&ccm_provider_aws::lb::TargetGroupKey {
        cluster_id: CLUSTER,
        namespace: "default",
        name: svc.metadata.name.as_deref().unwrap(),
        port: port.port,
        node_port: port.node_port.unwrap(),
        protocol: "TCP",
        health_protocol: hc_protocol,
        health_interval: interval,
    });
    let tg = c
        .elb
        .create_target_group()
        .vpc_id(&w.vpc)
        .name(tg_name)
        .port(port.node_port.unwrap())
        .protocol(v2::ProtocolEnum::Tcp)
        .target_type(v2::TargetTypeEnum::Instance)
        .health_check_interval_seconds(interval)
        .health_check_port(hc_port)
        .health_check_protocol(v2::ProtocolEnum::from(hc_protocol))
        .healthy_threshold_count(healthy)
        .unhealthy_threshold_count(unhealthy)
        .set_health_check_path(hc_path.map(str::to_string))
        .set_tags(Some(v2_tags(&tags)))
        .send()
        .await
        .unwrap();
    let tg_arn = tg.target_groups()[0].target_group_arn().unwrap().to_string();
    c.elb
        .register_targets()
        .target_group_arn(&tg_arn)
        .set_targets(Some(
            instances
                .iter()
                .map(|i| v2::TargetDescription::builder().id(i).port(port.node_port.unwrap()).build())
                .collect(),
        ))
        .send()
        .await
        .unwrap();
    c.elb
        .create_listener()
        .load_balancer_arn(lb.load_balancer_arn().unwrap())
        .port(port.port)
        .protocol(v2::ProtocolEnum::Tcp)
        .default_actions(v2::Action::builder().r#type(v2::ActionTypeEnum::Forward).target_group_arn(&tg_arn).build())
        .set_tags(Some(v2_tags(&tags)))
        .send()
        .await
        .unwrap();
    // reconcileLBAttributes: moto does not list access_logs.s3.enabled, so upstream sets it.
    c.elb
        .modify_load_balancer_attributes()
        .load_balancer_arn(lb.load_balancer_arn().unwrap())
        .attributes(v2::LoadBalancerAttribute::builder().key("access_logs.s3.enabled").value("false").build())
        .send()
        .await
        .unwrap();
    if !tg_attributes.is_empty() {
        c.elb
            .modify_target_group_attributes()
            .target_group_arn(&tg_arn)
            .set_attributes(Some(
                tg_attributes
                    .iter()
                    .map(|(k, v)| v2::TargetGroupAttribute::builder().key(*k).value(*v).build())
                    .collect(),
            ))
            .send()
            .await
            .unwrap();
    }
    if !node_rules.is_empty() {
        c.ec2
            .authorize_security_group_ingress()
            .group_id(&w.sg)
            .set_ip_permissions(Some(node_rules))
            .send()
            .await
            .unwrap();
    }
    lb.dns_name().unwrap().to_string()
}

/// One rule from `cidr` on `from`..`to` with `description`.
fn perm(protocol: &str, from: i32, to: i32, cidr: &str, description: Option<&str>) -> ec2::types::IpPermission {
    ec2::types::IpPermission::builder()
        .ip_protocol(protocol)
        .from_port(from)
        .to_port(to)
        .ip_ranges(
            ec2::types::IpRange::builder().cidr_ip(cidr).set_description(description.map(str::to_string)).build(),
        )
        .build()
}

/// The Service with its load balancer's hostname in its status, as upstream left it.
fn with_hostname(mut s: Service, hostname: &str) -> Service {
    s.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
        load_balancer: Some(ccm_provider_aws::lb::status(hostname)),
        ..Default::default()
    });
    s
}

#[tokio::test]
async fn adopting_load_balancers_upstream_made_for_unchanged_services_makes_no_mutating_call() {
    use annotations as a;
    let Some(moto) = Moto::start("takeover_quiet").await else { return };
    assert!(moto.corrected, "the takeover test needs moto's corrections (python3 with moto)");
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 2).await;
    let ids: Vec<String> = inst.iter().map(|i| i.0.clone()).collect();
    let nodes: Vec<Node> = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    let mut services: Vec<(Service, String)> = Vec::new();

    // 1. An NLB, traffic policy Cluster, clients from everywhere, target-group attributes: a TCP
    //    check of the traffic port; the client and MTU rules on the Nodes' group.
    let web = annotated(
        with_uid(lb_service("web", &[(80, 30080)]), "a0000001-0000-0000-0000-000000000000"),
        &[(a::TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=true")],
    );
    let lb_name = ccm_framework::provider::default_load_balancer_name(&web);
    let dns = upstream_nlb(
        &c,
        &w,
        &web,
        &ids,
        Vec::new(),
        ("TCP", "traffic-port", None, 30, 3, 3),
        &[("proxy_protocol_v2.enabled", "true")],
        vec![
            perm("tcp", 30080, 30080, "0.0.0.0/0", Some(&format!("kubernetes.io/rule/nlb/client={lb_name}"))),
            perm("icmp", 3, 4, "0.0.0.0/0", Some("kubernetes.io/rule/nlb/mtu")),
        ],
    )
    .await;
    services.push((web, dns));

    // 2. An NLB, traffic policy Local, one client range: HTTP /healthz on the health-check
    //    nodePort, health rules from the subnets, client and MTU rules from the range.
    let mut local = with_uid(lb_service("local", &[(81, 30081)]), "a0000002-0000-0000-0000-000000000000");
    let spec = local.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32000);
    spec.load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);
    let lb_name = ccm_framework::provider::default_load_balancer_name(&local);
    let health = format!("kubernetes.io/rule/nlb/health={lb_name}");
    let dns = upstream_nlb(
        &c,
        &w,
        &local,
        &ids,
        Vec::new(),
        ("HTTP", "32000", Some("/healthz"), 10, 2, 2),
        &[],
        vec![
            perm("tcp", 32000, 32000, "10.0.1.0/24", Some(&health)),
            perm("tcp", 32000, 32000, "10.0.2.0/24", Some(&health)),
            perm("tcp", 30081, 30081, "203.0.113.0/24", Some(&format!("kubernetes.io/rule/nlb/client={lb_name}"))),
            perm("icmp", 3, 4, "203.0.113.0/24", Some("kubernetes.io/rule/nlb/mtu")),
        ],
    )
    .await;
    services.push((local, dns));

    // 3. An NLB made in NLBSecurityGroupMode = Managed: its own group, named, described and
    //    tagged as upstream, with the listener port and ICMP 3/4 from everywhere.
    let managed = with_uid(lb_service("managed", &[(82, 30082)]), "a0000003-0000-0000-0000-000000000000");
    let group = c
        .ec2
        .create_security_group()
        .group_name(ccm_provider_aws::lb::managed_group_name(
            CLUSTER,
            "default",
            "managed",
            "a0000003-0000-0000-0000-000000000000",
        ))
        .description("[k8s] Managed SecurityGroup for LoadBalancer")
        .vpc_id(&w.vpc)
        .tag_specifications(tags_spec(ec2::types::ResourceType::SecurityGroup, &[(cluster_tag.as_str(), "owned")]))
        .send()
        .await
        .unwrap()
        .group_id
        .unwrap();
    c.ec2
        .authorize_security_group_ingress()
        .group_id(&group)
        .ip_permissions(perm("tcp", 82, 82, "0.0.0.0/0", None))
        .ip_permissions(perm("icmp", 3, 4, "0.0.0.0/0", None))
        .send()
        .await
        .unwrap();
    let lb_name = ccm_framework::provider::default_load_balancer_name(&managed);
    let dns = upstream_nlb(
        &c,
        &w,
        &managed,
        &ids,
        vec![group.clone()],
        ("TCP", "traffic-port", None, 30, 3, 3),
        &[],
        vec![perm("tcp", 30082, 30082, "0.0.0.0/0", Some(&format!("kubernetes.io/rule/nlb/client={lb_name}")))],
    )
    .await;
    services.push((managed, dns));

    // 4. Classic ELBs (no type annotation): plain, and with proxy protocol, connection draining,
    //    an idle timeout, cross-zone and additional tags. Each with its k8s-elb group (the port
    //    and ICMP 3/4 from everywhere), the Nodes' group open to it, its attributes set and the
    //    health check configured as upstream does right after creation.
    for (svc_name, port, node_port, uid, extra) in [
        ("classic", 8080, 30083, "a0000004-0000-0000-0000-000000000000", false),
        ("classic-pp", 8081, 30084, "a0000005-0000-0000-0000-000000000000", true),
    ] {
        use ccm_provider_aws::sdk::elb::types as elb;
        let mut svc = with_uid(lb_service(svc_name, &[(port, node_port)]), uid);
        svc.metadata.annotations = extra.then(|| {
            [
                (a::PROXY_PROTOCOL, "*"),
                (a::CONNECTION_DRAINING_ENABLED, "true"),
                (a::CONNECTION_DRAINING_TIMEOUT, "30"),
                (a::CONNECTION_IDLE_TIMEOUT, "120"),
                (a::CROSS_ZONE, "true"),
                (a::EXTRA_TAGS, "team=web"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        });
        let name = ccm_framework::provider::default_load_balancer_name(&svc);
        let mut group_tags = vec![(cluster_tag.as_str(), "owned")];
        if extra {
            group_tags.push(("team", "web"));
        }
        let group = c
            .ec2
            .create_security_group()
            .group_name(format!("k8s-elb-{name}"))
            .description(format!("Security group for Kubernetes ELB {name} (default/{svc_name})"))
            .vpc_id(&w.vpc)
            .tag_specifications(tags_spec(ec2::types::ResourceType::SecurityGroup, &group_tags))
            .send()
            .await
            .unwrap()
            .group_id
            .unwrap();
        c.ec2
            .authorize_security_group_ingress()
            .group_id(&group)
            .ip_permissions(perm("tcp", port, port, "0.0.0.0/0", None))
            .ip_permissions(perm("icmp", 3, 4, "0.0.0.0/0", None))
            .send()
            .await
            .unwrap();
        let mut tags = vec![
            elb::Tag::builder().key("kubernetes.io/service-name").value(format!("default/{svc_name}")).build().unwrap(),
            elb::Tag::builder().key(&cluster_tag).value("owned").build().unwrap(),
        ];
        if extra {
            tags.push(elb::Tag::builder().key("team").value("web").build().unwrap());
        }
        let made = c
            .classic
            .create_load_balancer()
            .load_balancer_name(&name)
            .listeners(
                elb::Listener::builder()
                    .protocol("tcp")
                    .load_balancer_port(port)
                    .instance_protocol("tcp")
                    .instance_port(node_port)
                    .build()
                    .unwrap(),
            )
            .set_subnets(Some(w.subnets.clone()))
            .security_groups(&group)
            .set_tags(Some(tags))
            .send()
            .await
            .unwrap();
        if extra {
            c.classic
                .create_load_balancer_policy()
                .load_balancer_name(&name)
                .policy_name("k8s-proxyprotocol-enabled")
                .policy_type_name("ProxyProtocolPolicyType")
                .policy_attributes(
                    elb::PolicyAttribute::builder().attribute_name("ProxyProtocol").attribute_value("true").build(),
                )
                .send()
                .await
                .unwrap();
            c.classic
                .set_load_balancer_policies_for_backend_server()
                .load_balancer_name(&name)
                .instance_port(node_port)
                .policy_names("k8s-proxyprotocol-enabled")
                .send()
                .await
                .unwrap();
        }
        let attributes = elb::LoadBalancerAttributes::builder()
            .access_log(elb::AccessLog::builder().enabled(false).build())
            .connection_draining(
                elb::ConnectionDraining::builder().enabled(extra).set_timeout(extra.then_some(30)).build(),
            )
            .connection_settings(
                elb::ConnectionSettings::builder().idle_timeout(if extra { 120 } else { 60 }).build().unwrap(),
            )
            .cross_zone_load_balancing(elb::CrossZoneLoadBalancing::builder().enabled(extra).build())
            .build();
        c.classic
            .modify_load_balancer_attributes()
            .load_balancer_name(&name)
            .load_balancer_attributes(attributes)
            .send()
            .await
            .unwrap();
        let hc = elb::HealthCheck::builder()
            .target(format!("TCP:{node_port}"))
            .interval(10)
            .timeout(5)
            .healthy_threshold(2)
            .unhealthy_threshold(6)
            .build()
            .unwrap();
        c.classic.configure_health_check().load_balancer_name(&name).health_check(hc).send().await.unwrap();
        let all = ec2::types::IpPermission::builder()
            .ip_protocol("-1")
            .user_id_group_pairs(ec2::types::UserIdGroupPair::builder().group_id(&group).build())
            .build();
        c.ec2.authorize_security_group_ingress().group_id(&w.sg).ip_permissions(all).send().await.unwrap();
        c.classic
            .register_instances_with_load_balancer()
            .load_balancer_name(&name)
            .set_instances(Some(ids.iter().map(|i| elb::Instance::builder().instance_id(i).build()).collect()))
            .send()
            .await
            .unwrap();
        services.push((svc, made.dns_name().unwrap().to_string()));
    }

    // Ours takes over (NLBSecurityGroupMode = Managed, as upstream ran): every Service synced
    // and every Node pass, through a proxy counting the calls.
    let proxy = Proxy::start(moto.port).await;
    let ours = proxied_with(&proxy.url, 3, managed_config());
    let from = proxy.faults.lock().unwrap().actions.len();
    let mut changed = Vec::new();
    for (svc, hostname) in &services {
        let svc = with_hostname(svc.clone(), hostname);
        let st = ours.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
        let got = st.ingress.unwrap()[0].hostname.clone().unwrap();
        if got != *hostname {
            changed.push((svc.metadata.name.clone().unwrap(), hostname.clone(), got));
        }
        ours.update_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    }
    let calls = actions_since(&proxy, from);
    let writes = mutating(&calls);
    // Straight to stderr (libtest captures `println!` and `eprintln!`): the CI log shows it.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "adoption of {} load balancers made as upstream makes them: {} calls, mutating {writes:?}, hostnames changed {changed:?}",
        services.len(),
        calls.values().sum::<usize>()
    );
    assert!(writes.is_empty(), "adopting upstream's load balancers changed {writes:?}");
    assert!(changed.is_empty(), "{changed:?}");
    // A change after the takeover converges in place.
    let web = with_hostname(services[0].0.clone(), &services[0].1);
    let web = annotated(web, &[(a::CROSS_ZONE, "true")]);
    ours.ensure_load_balancer(CLUSTER, &web, &refs).await.unwrap();
    let writes = mutating(&actions_since(&proxy, from));
    assert_eq!(writes, BTreeMap::from([("ModifyLoadBalancerAttributes".to_string(), 1)]));
}
