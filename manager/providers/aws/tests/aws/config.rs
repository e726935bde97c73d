//! The cloud-config acting on moto: RoleARN, VPC, SubnetID, RouteTableID, subnets, the cluster ID, upstream's service IDs, SigningName.

use crate::kit::*;
use crate::proxy::*;

/// `[Global] RoleARN`, `VPC`, `SubnetID` and `RouteTableID` acting on moto: the role is
/// assumed through STS and its credentials sign every EC2 and ELBv2 call; the load balancer's
/// subnets come from the given VPC, or are the given subnet when that VPC has none; routes go
/// into the given table only.
#[tokio::test]
async fn role_arn_vpc_subnet_id_and_route_table_id_act_on_moto() {
    use ccm_framework::provider::{Route, Routes};
    let Some(moto) = Moto::start("global_keys_on_moto").await else { return };
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let svc = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000ee");

    // RoleARN: STS AssumeRole (through a [ServiceOverride]) signed with the manager's own key,
    // carrying upstream's source headers (signed), then every EC2 and ELBv2 call signed with
    // the role's.
    let proxy = Proxy::start(moto.port).await;
    let source = "arn:aws:eks:us-east-1:123456789012:cluster/prod";
    let ini = format!(
        "[Global]\nZone = {ZONE}\nKubernetesClusterID = {CLUSTER}\nRoleARN = arn:aws:iam::123456789012:role/ccm\n\
         SourceARN = {source}\n\
         [ServiceOverride \"1\"]\nService = sts\nRegion = us-east-1\nURL = {}\nSigningRegion = us-east-1\n",
        proxy.url
    );
    let cfg = ccm_provider_aws::config::parse(ini.as_bytes()).unwrap();
    let role = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&proxy.url)));
    let meta = role.instance_metadata(&nodes[0]).await.unwrap().expect("the instance is found with the role");
    assert_eq!(meta.provider_id, pid(&inst[0].0));
    role.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    role.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    let signed = proxy.faults.lock().unwrap().signed_by.clone();
    let (sts, calls): (Vec<_>, Vec<_>) = signed.iter().partition(|(a, _)| a == "AssumeRole");
    assert_eq!(sts.len(), 1, "the role is assumed once: {signed:?}");
    assert_eq!(sts[0].1, "testing", "AssumeRole is signed with the manager's own credentials");
    let heads = proxy.faults.lock().unwrap().heads.clone();
    let head = heads.iter().find(|(a, _)| a == "AssumeRole").map(|(_, h)| h.to_ascii_lowercase()).unwrap();
    assert!(head.contains("x-amz-source-account: 123456789012"), "{head}");
    assert!(head.contains(&format!("x-amz-source-arn: {source}")), "{head}");
    let signed_headers = head.split("signedheaders=").nth(1).and_then(|r| r.split(',').next()).unwrap_or_default();
    assert!(
        signed_headers.contains("x-amz-source-account") && signed_headers.contains("x-amz-source-arn"),
        "{signed_headers}"
    );
    let keys: BTreeSet<&str> = calls.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(keys.len(), 1, "{signed:?}");
    assert!(!keys.contains("testing") && !keys.contains(""), "EC2 and ELBv2 calls use the role's key: {keys:?}");
    assert!(
        calls.iter().any(|(a, _)| a == "DescribeInstances") && calls.iter().any(|(a, _)| a == "CreateLoadBalancer")
    );
    assert_eq!(lb_state(&c).await, LbState::default());

    // VPC: a Service without Nodes gets its load balancer in the given VPC; without the key the
    // VPC is the Nodes' and such a Service waits.
    let err = direct.ensure_load_balancer(CLUSTER, &svc, &[]).await.unwrap_err();
    assert!(err.to_string().contains("VPC"), "{err}");
    let in_vpc = AwsProvider::new(AwsConfig { vpc: w.vpc.clone(), ..config() }, CLUSTER, options_for(&moto.url));
    in_vpc.ensure_load_balancer(CLUSTER, &svc, &[]).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, w.subnets.iter().cloned().collect());
    in_vpc.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    // The subnets are discovered in the given VPC, not in the Nodes' one. (Ingress rules off: a
    // VPC other than the Nodes' is a test setup, and rules are kept in the VPC's groups.)
    let elsewhere =
        |vpc: String, subnet_id: String| AwsConfig { vpc, subnet_id, disable_security_group_ingress: true, ..config() };
    let v2 = c.ec2.create_vpc().cidr_block("10.1.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
    let s2 = c.ec2.create_subnet().vpc_id(&v2).cidr_block("10.1.1.0/24").availability_zone("us-east-1b").send().await;
    let s2 = s2.unwrap().subnet.unwrap().subnet_id.unwrap();
    // (Internal: these VPCs have no internet gateway, so no public subnet.)
    let internal = annotated(svc.clone(), &[(annotations::INTERNAL, "true")]);
    let in_v2 = AwsProvider::new(elsewhere(v2.clone(), String::new()), CLUSTER, options_for(&moto.url));
    in_v2.ensure_load_balancer(CLUSTER, &internal, &refs).await.unwrap();
    let lbs = c.elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers()[0].vpc_id(), Some(v2.as_str()));
    assert_eq!(lb_shape(&c).await.1, [s2.clone()].into());
    in_v2.ensure_load_balancer_deleted(CLUSTER, &internal).await.unwrap();

    // SubnetID: the subnet used when the VPC offers none.
    let v3 = c.ec2.create_vpc().cidr_block("10.2.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
    let by_subnet = AwsProvider::new(elsewhere(v3, s2.clone()), CLUSTER, options_for(&moto.url));
    by_subnet.ensure_load_balancer(CLUSTER, &internal, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, [s2.clone()].into());
    by_subnet.ensure_load_balancer_deleted(CLUSTER, &internal).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());

    // RouteTableID: routes go into that table only, not into the cluster-tagged one.
    let rtb2 = c.ec2.create_route_table().vpc_id(&w.vpc).send().await.unwrap();
    let rtb2 = rtb2.route_table.unwrap().route_table_id.unwrap();
    let by_table =
        AwsProvider::new(AwsConfig { route_table_id: rtb2.clone(), ..config() }, CLUSTER, options_for(&moto.url));
    let route =
        Route { target_node: inst[0].1.clone(), destination_cidr: "10.244.7.0/24".into(), ..Default::default() };
    by_table.create_route(CLUSTER, "uid", &route).await.unwrap();
    let routes_in = |table: String| {
        let c = c.clone();
        async move {
            let t = c.ec2.describe_route_tables().route_table_ids(table).send().await.unwrap();
            t.route_tables()[0]
                .routes()
                .iter()
                .filter_map(|r| Some((r.destination_cidr_block()?.to_string(), r.instance_id()?.to_string())))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(routes_in(rtb2.clone()).await, vec![("10.244.7.0/24".to_string(), inst[0].0.clone())]);
    assert!(routes_in(w.rtb.clone()).await.is_empty(), "the tagged table is left alone");
    let listed = by_table.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].target_node.as_str(), listed[0].destination_cidr.as_str()),
        (inst[0].1.as_str(), "10.244.7.0/24")
    );
    by_table.delete_route(CLUSTER, &listed[0]).await.unwrap();
    assert!(routes_in(rtb2).await.is_empty());
}

#[tokio::test]
async fn subnets_are_chosen_as_upstream_by_route_table_cluster_tag_and_role_and_target_groups_named_as_upstream() {
    let Some(moto) = Moto::start("subnets_as_upstream").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let subnet = |cidr: &str, zone: &str, tags: &[(&str, &str)]| {
        let (c, vpc, cidr, zone) = (c.clone(), w.vpc.clone(), cidr.to_string(), zone.to_string());
        let tags: Vec<(String, String)> = tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        async move {
            let t: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            c.ec2
                .create_subnet()
                .vpc_id(&vpc)
                .cidr_block(cidr)
                .availability_zone(zone)
                .set_tag_specifications((!t.is_empty()).then(|| vec![tags_spec(ec2::types::ResourceType::Subnet, &t)]))
                .send()
                .await
                .unwrap()
                .subnet
                .unwrap()
                .subnet_id
                .unwrap()
        }
    };
    let mine = format!("kubernetes.io/cluster/{CLUSTER}");
    // Zone c: only a subnet of another cluster. Zone d: an untagged public subnet. Zone e: a
    // cluster-tagged subnet that is private (its own route table has no internet route).
    let _other = subnet(
        "10.0.3.0/24",
        "us-east-1c",
        &[("kubernetes.io/cluster/other", "owned"), ("kubernetes.io/role/elb", "1")],
    )
    .await;
    let untagged = subnet("10.0.4.0/24", "us-east-1d", &[]).await;
    let private =
        subnet("10.0.5.0/24", "us-east-1e", &[(mine.as_str(), "shared"), ("kubernetes.io/role/internal-elb", "1")])
            .await;
    let rt =
        c.ec2.create_route_table().vpc_id(&w.vpc).send().await.unwrap().route_table.unwrap().route_table_id.unwrap();
    c.ec2.associate_route_table().route_table_id(&rt).subnet_id(&private).send().await.unwrap();
    // Zone a: a second cluster-tagged public subnet without the role tag loses to the seeded one.
    let _second = subnet("10.0.6.0/24", "us-east-1a", &[(mine.as_str(), "shared")]).await;

    let svc = with_uid(lb_service("web", &[(80, 30080)]), "f1000000-0000-0000-0000-000000000000");
    p.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let want: BTreeSet<String> = [w.subnets[0].clone(), w.subnets[1].clone(), untagged.clone()].into();
    assert_eq!(
        lb_shape(&c).await.1,
        want,
        "public subnets, untagged kept, another cluster's and private ones left out"
    );
    // The target group carries upstream's name.
    let tgs = c.elb.describe_target_groups().send().await.unwrap();
    let name = ccm_provider_aws::lb::target_group_name(&ccm_provider_aws::lb::TargetGroupKey {
        cluster_id: CLUSTER,
        namespace: "default",
        name: "web",
        port: 80,
        node_port: 30080,
        protocol: "TCP",
        health_protocol: "TCP",
        health_interval: 30,
    });
    assert_eq!(tgs.target_groups()[0].target_group_name(), Some(name.as_str()));
    p.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();

    // Internal: private subnets qualify too.
    let internal = annotated(svc.clone(), &[(annotations::INTERNAL, "true")]);
    p.ensure_load_balancer(CLUSTER, &internal, &refs).await.unwrap();
    assert!(lb_shape(&c).await.1.contains(&private));
    p.ensure_load_balancer_deleted(CLUSTER, &internal).await.unwrap();
}

/// A fake instance metadata service: IMDSv2's token, then this instance's ID.
async fn fake_imds(instance: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let instance = instance.clone();
            tokio::spawn(async move {
                while let Some((head, _)) = wire::read_request(&mut conn).await {
                    let body = if head.starts_with("PUT /latest/api/token") {
                        "token".to_string()
                    } else if head.starts_with("GET /latest/meta-data/instance-id") {
                        instance.clone()
                    } else {
                        String::new()
                    };
                    let status = if body.is_empty() { "404 Not Found" } else { "200 OK" };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nx-aws-ec2-metadata-token-ttl-seconds: 21600\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test]
async fn without_a_configured_cluster_id_the_managers_instance_tags_give_it_or_initialization_names_the_key_to_set() {
    let Some(moto) = Moto::start("cluster_id").await else { return };
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 2).await;
    // Both without `launch`'s cluster tag; the first tagged for another ID.
    c.ec2
        .delete_tags()
        .resources(&inst[0].0)
        .resources(&inst[1].0)
        .tags(ec2::types::Tag::builder().key(format!("kubernetes.io/cluster/{CLUSTER}")).build())
        .send()
        .await
        .unwrap();
    c.ec2
        .create_tags()
        .resources(&inst[0].0)
        .tags(tag("kubernetes.io/cluster/from-tags", "owned"))
        .send()
        .await
        .unwrap();
    let no_id = || AwsConfig { zone: ZONE.into(), ..Default::default() };
    let with_imds = |url: String| AwsOptions { imds_endpoint: Some(url), ..options_for(&moto.url) };

    // The manager's instance carries the cluster tag: that is the ID, never --cluster-name.
    let tagged = AwsProvider::new(no_id(), "kubernetes", with_imds(fake_imds(inst[0].0.clone()).await));
    assert_eq!(tagged.cluster().await.unwrap().id, "from-tags");
    // Untagged, or no metadata service: initialization fails naming the setting to add, and
    // no load balancer is ever made.
    let untagged = AwsProvider::new(no_id(), "kubernetes", with_imds(fake_imds(inst[1].0.clone()).await));
    let e = untagged.cluster().await.unwrap_err().to_string();
    assert!(e.contains("KubernetesClusterID"), "{e}");
    let nowhere = format!("http://127.0.0.1:{}", moto::free_port().await);
    let unreachable = AwsProvider::new(no_id(), "kubernetes", with_imds(nowhere));
    let e = unreachable.cluster().await.unwrap_err();
    assert!(matches!(e, CloudError::InvalidConfig(ref m) if m.contains("KubernetesClusterID")), "{e}");
    let nodes = [node(&inst[1].1, Some(&pid(&inst[1].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let svc = with_uid(lb_service("web", &[(80, 30080)]), "f2000000-0000-0000-0000-000000000000");
    assert!(unreachable.ensure_load_balancer("kubernetes", &svc, &refs).await.is_err());
    assert_eq!(lb_state(&c).await, LbState::default());
    assert!(
        matches!(unreachable.health().await, Health::Unhealthy { ref reason, .. } if reason == "InvalidCloudConfig")
    );
}

#[tokio::test]
async fn an_upstream_cloud_conf_with_upstreams_service_ids_and_signing_names_works_unchanged() {
    let Some(moto) = Moto::start("upstream_cloud_conf").await else { return };
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let proxy = Proxy::start(moto.port).await;
    // As shared/upstream-aws's recipe writes it, plus a key upstream ignores.
    let ini = format!(
        "[Global]\nZone = {ZONE}\nRegion = eu-west-1\nVPC = {vpc}\nSubnetID = {subnet}\nKubernetesClusterID = {CLUSTER}\nDisableStrictZoneCheck = true\n\
         [ServiceOverride \"ec2\"]\nService = EC2\nRegion = us-east-1\nURL = {u}\nSigningRegion = us-east-1\nSigningName = ec2\n\
         [ServiceOverride \"elb\"]\nService = Elastic Load Balancing\nRegion = us-east-1\nURL = {u}\nSigningRegion = us-east-1\nSigningName = elasticloadbalancing\n\
         [ServiceOverride \"elbv2\"]\nService = Elastic Load Balancing v2\nRegion = us-east-1\nURL = {u}\nSigningRegion = us-east-1\nSigningName = elasticloadbalancing\n\
         [ServiceOverride \"kms\"]\nService = KMS\nRegion = us-east-1\nURL = {u}\nSigningRegion = us-east-1\nSigningName = kms\n",
        vpc = w.vpc,
        subnet = w.subnets[0],
        u = proxy.url
    );
    let cfg = ccm_provider_aws::config::parse(ini.as_bytes()).unwrap();
    assert_eq!(cfg.warnings.len(), 1, "{:?}", cfg.warnings);
    let options = AwsOptions { endpoint_url: None, ..options_for(&moto.url) };
    let p = AwsProvider::new(cfg, CLUSTER, options);
    assert_eq!(p.clients().await.unwrap().region, "us-east-1", "the Zone wins over Region, as upstream");
    let svc = with_uid(lb_service("web", &[(80, 30080)]), "f3000000-0000-0000-0000-000000000000");
    let mut classic = with_uid(lb_service("classic", &[(80, 30081)]), "f4000000-0000-0000-0000-000000000000");
    classic.metadata.annotations = None;
    p.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    p.ensure_load_balancer(CLUSTER, &classic, &refs).await.unwrap();
    p.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    p.ensure_load_balancer_deleted(CLUSTER, &classic).await.unwrap();
    let heads = proxy.faults.lock().unwrap().heads.clone();
    let scope = |action: &str| {
        heads
            .iter()
            .find(|(a, _)| a == action)
            .and_then(|(_, h)| h.split("Credential=").nth(1))
            .and_then(|c| c.split('/').nth(3))
            .map(str::to_string)
    };
    assert_eq!(scope("DescribeInstances").as_deref(), Some("ec2"));
    assert_eq!(scope("CreateTargetGroup").as_deref(), Some("elasticloadbalancing"));
    assert_eq!(scope("ConfigureHealthCheck").as_deref(), Some("elasticloadbalancing"));
    assert_eq!(lb_state(&c).await, LbState::default());
}

#[tokio::test]
async fn the_signing_name_of_a_service_override_signs_the_requests() {
    // An endpoint that keeps each request's head and answers 400 (moto routes requests by the
    // signing name, so it cannot take another one).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                while let Some((head, _)) = wire::read_request(&mut conn).await {
                    kept.lock().unwrap().push(head);
                    let body = "<Response><Errors><Error><Code>InvalidParameter</Code><Message>no</Message></Error></Errors></Response>";
                    let resp = format!("HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    if conn.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let ini = format!(
        "[Global]\nZone = {ZONE}\nKubernetesClusterID = {CLUSTER}\n\
         [ServiceOverride \"1\"]\nService = EC2\nRegion = us-east-1\nURL = {url}\nSigningRegion = eu-west-3\nSigningName = signer-of-ec2\n"
    );
    let cfg = ccm_provider_aws::config::parse(ini.as_bytes()).unwrap();
    let options = AwsOptions { endpoint_url: None, max_attempts: 1, ..options_for(&url) };
    let p = AwsProvider::new(cfg, CLUSTER, options);
    let n = node("ip-10-0-0-1.ec2.internal", Some("aws:///us-east-1a/i-0123456789abcdef0"), Some("True"), vec![]);
    assert!(p.instance_metadata(&n).await.is_err());
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads.iter().any(|h| h.contains("/eu-west-3/signer-of-ec2/aws4_request")),
        "signed for the override's region and name: {heads:?}"
    );
}
