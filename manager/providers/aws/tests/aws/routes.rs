//! Routes in VPC route tables.

use crate::kit::*;

testkit::backend_tests! {
    async fn routes_for_pod_cidrs_are_created_and_removed_and_blackholes_cleaned_up(backend) {
        let Some(moto) = Moto::start("routes").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 2).await;
        let opts = ControllerOptions {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            route_reconciliation_period: Duration::from_millis(500),
            ..options()
        };
        let env = Env::start(backend, p.clone(), opts).await;
        for (i, (id, dns)) in inst.iter().enumerate() {
            let mut n = node(dns, Some(&pid(id)), Some("True"), vec![]);
            n.spec.as_mut().unwrap().pod_cidr = Some(format!("10.244.{i}.0/24"));
            n.spec.as_mut().unwrap().pod_cidrs = Some(vec![format!("10.244.{i}.0/24")]);
            env.create_node(n).await;
        }
        // Another cluster's route table, with a route inside this cluster's CIDR: never touched.
        let foreign = c
            .ec2
            .create_route_table()
            .vpc_id(&w.vpc)
            .tag_specifications(tags_spec(ec2::types::ResourceType::RouteTable, &[("kubernetes.io/cluster/other", "owned")]))
            .send()
            .await
            .unwrap();
        let foreign = foreign.route_table.unwrap().route_table_id.unwrap();
        c.ec2
            .create_route()
            .route_table_id(&foreign)
            .destination_cidr_block("10.244.9.0/24")
            .instance_id(&inst[1].0)
            .send()
            .await
            .unwrap();
        env.run(Box::new(RouteController::new()));
        let routes = || async {
            let t = c.ec2.describe_route_tables().route_table_ids(&w.rtb).send().await.unwrap();
            t.route_tables()[0]
                .routes()
                .iter()
                .filter(|r| r.instance_id().is_some())
                .map(|r| (r.destination_cidr_block().unwrap().to_string(), r.instance_id().unwrap().to_string()))
                .collect::<BTreeSet<_>>()
        };
        let want: BTreeSet<(String, String)> =
            inst.iter().enumerate().map(|(i, (id, _))| (format!("10.244.{i}.0/24"), id.clone())).collect();
        eventually(|| async { Some(routes().await).filter(|r| *r == want) }).await;
        let d = c.ec2.describe_instances().instance_ids(&inst[0].0).send().await.unwrap();
        let i0 = &d.reservations()[0].instances()[0];
        assert_eq!(i0.source_dest_check(), Some(false), "source/destination check is off on route targets");

        // The Node goes: its route is removed.
        env.nodes().delete(&inst[1].1, &DeleteParams::default()).await.unwrap();
        let one: BTreeSet<(String, String)> = [("10.244.0.0/24".to_string(), inst[0].0.clone())].into();
        eventually(|| async { Some(routes().await).filter(|r| *r == one) }).await;
        let t = c.ec2.describe_route_tables().route_table_ids(&foreign).send().await.unwrap();
        assert!(
            t.route_tables()[0].routes().iter().any(|r| r.destination_cidr_block() == Some("10.244.9.0/24")),
            "another cluster's table keeps its routes"
        );

        // A route to an instance that is then terminated is reported as a blackhole. It lives in a
        // table the running controller does not manage (named by RouteTableID), so nothing
        // removes it before it is listed.
        let other = c.ec2.create_route_table().vpc_id(&w.vpc).send().await.unwrap();
        let other = other.route_table.unwrap().route_table_id.unwrap();
        c.ec2
            .create_route()
            .route_table_id(&other)
            .destination_cidr_block("10.245.0.0/24")
            .instance_id(&inst[0].0)
            .send()
            .await
            .unwrap();
        c.ec2.terminate_instances().instance_ids(&inst[0].0).send().await.unwrap();
        let by_id = AwsProvider::new(
            AwsConfig { route_table_id: other.clone(), ..config() },
            CLUSTER,
            options_for(&moto.url),
        );
        let listed = ccm_framework::provider::Routes::list_routes(&by_id, CLUSTER).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].blackhole && listed[0].destination_cidr == "10.245.0.0/24", "{listed:?}");
        assert!(listed[0].target_node.is_empty(), "a blackhole has no target Node: {listed:?}");

        // In the managed table, the terminated instance's route goes (the route controller removes
        // blackholes, as upstream does) and is not recreated while no instance backs the Node.
        eventually(|| async { Some(routes().await).filter(|r| r.is_empty()) }).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(routes().await.is_empty(), "a route to a terminated instance is never recreated");
        eventually(|| async { Some(routes().await).filter(|r| r.is_empty()) }).await;
    }
}
