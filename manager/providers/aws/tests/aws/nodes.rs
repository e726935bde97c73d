//! Nodes: initialization from EC2, lifecycle, eventual consistency, zone IDs.

use crate::kit::*;

testkit::backend_tests! {
    async fn node_named_by_private_dns_name_is_initialized_from_ec2(backend) {
        let Some(moto) = Moto::start("node_named_by_private_dns_name_is_initialized_from_ec2").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let instances = launch(&c, &w, 3).await;
        let zones = c.ec2.describe_availability_zones().zone_names(ZONE).send().await.unwrap();
        let zone_id = zones.availability_zones()[0].zone_id().unwrap().to_string();
        let env = Env::start(backend, p.clone(), options()).await;
        // All three exist before the controller starts, so its first pass sees them together
        // (created one by one while it runs, they could fall in separate batching windows).
        for (_, dns) in &instances {
            env.create_node(node(dns, None, None, uninitialized())).await;
        }
        env.run(Box::new(NodeController::new()));
        for (id, dns) in &instances {
            let n = eventually(|| async { env.nodes().get(dns).await.ok().filter(|n| !has_taint(n, TAINT_UNINITIALIZED)) })
                .await;
            assert_eq!(n.spec.as_ref().unwrap().provider_id.as_deref(), Some(pid(id).as_str()));
            let labels = n.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("m5.large"));
            assert_eq!(labels.get("topology.kubernetes.io/zone").map(String::as_str), Some(ZONE));
            assert_eq!(labels.get("topology.kubernetes.io/region").map(String::as_str), Some("us-east-1"));
            assert_eq!(labels.get(ccm_provider_aws::LABEL_ZONE_ID), Some(&zone_id), "upstream's zone-ID label");
            // moto 5.2.5 has no DescribeInstanceTopology (it answers 500): the Node is initialized
            // all the same, without the network-node-layer labels.
            assert!(
                !labels.keys().any(|k| k.starts_with(ccm_provider_aws::topology::LABEL_LAYER_PREFIX)),
                "{labels:?}"
            );
            let addrs: Vec<(String, String)> =
                n.status.unwrap().addresses.unwrap().into_iter().map(|a| (a.type_, a.address)).collect();
            assert_eq!(addrs.first().map(|a| a.0.as_str()), Some("InternalIP"));
            assert!(addrs.contains(&("InternalDNS".into(), dns.clone())), "{addrs:?}");
            assert!(addrs.contains(&("Hostname".into(), dns.clone())), "{addrs:?}");
        }
        // Three Nodes in one window: batched, not one call per Node.
        let calls = p.cache().counters.describe_calls.get();
        assert!(calls <= 2, "{calls} DescribeInstances calls for 3 Nodes");
    }
}

testkit::backend_tests! {
    async fn node_with_provider_id_is_initialized_and_unknown_instance_stays_tainted(backend) {
        let Some(moto) = Moto::start("node_with_provider_id_is_initialized").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let instances = launch(&c, &w, 1).await;
        let env = Env::start(backend, p.clone(), options()).await;
        env.run(Box::new(NodeController::new()));
        let (id, dns) = &instances[0];
        env.create_node(node("custom-name", Some(&pid(id)), None, uninitialized())).await;
        env.create_node(node("ghost", Some(&pid("i-0000000000000dead")), None, uninitialized())).await;
        let n = eventually(|| async {
            env.nodes().get("custom-name").await.ok().filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
        })
        .await;
        let addrs = n.status.unwrap().addresses.unwrap();
        assert!(addrs.iter().any(|a| a.type_ == "InternalDNS" && &a.address == dns));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ghost = env.nodes().get("ghost").await.unwrap();
        assert!(has_taint(&ghost, TAINT_UNINITIALIZED), "a Node without an instance is never initialized");
    }
}

testkit::backend_tests! {
    async fn terminated_instance_deletes_its_node_and_stopped_instance_gets_the_shutdown_taint(backend) {
        let Some(moto) = Moto::start("terminated_instance_deletes_its_node").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let instances = launch(&c, &w, 3).await;
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &instances {
            env.create_node(node(dns, Some(&pid(id)), Some("False"), vec![])).await;
        }
        c.ec2.terminate_instances().instance_ids(&instances[0].0).send().await.unwrap();
        c.ec2.stop_instances().instance_ids(&instances[1].0).send().await.unwrap();
        env.run(Box::new(LifecycleController::new()));
        let gone = &instances[0].1;
        eventually(|| async { env.nodes().get_opt(gone).await.unwrap().is_none().then_some(()) }).await;
        let stopped = &instances[1].1;
        eventually(|| async { env.nodes().get(stopped).await.ok().filter(|n| has_taint(n, TAINT_SHUTDOWN)) }).await;
        let running = env.nodes().get(&instances[2].1).await.unwrap();
        assert!(!has_taint(&running, TAINT_SHUTDOWN));
    }
}

#[tokio::test]
async fn instance_not_visible_yet_is_not_reported_gone_until_a_second_lookup_confirms() {
    let Some(moto) = Moto::start("instance_not_visible_yet").await else { return };
    let p = provider(&moto.url);
    let n = node("late", Some(&pid("i-00000000000000001")), Some("False"), vec![]);
    // First miss: unknown, never "gone".
    assert!(matches!(p.instance_exists(&n).await, Err(CloudError::RetryAfter { .. })));
    // It appears (launched just now): found, and the earlier miss is forgotten.
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let (id, _) = launch(&c, &w, 1).await.remove(0);
    let seen = node("late", Some(&pid(&id)), Some("False"), vec![]);
    assert_eq!(p.instance_exists(&seen).await, Ok(true));
    // Really absent: gone only after two misses at least absence_confirm_after apart.
    assert!(p.instance_exists(&n).await.is_err());
    assert!(p.instance_exists(&n).await.is_err(), "a second miss right away is not a confirmation");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(p.instance_exists(&n).await, Ok(false));
}

#[tokio::test]
async fn zone_id_as_zone_puts_the_zone_id_in_the_zone_label() {
    let Some(moto) = Moto::start("zone_id_as_zone").await else { return };
    let p =
        Arc::new(AwsProvider::new(AwsConfig { zone_id_as_zone: true, ..config() }, CLUSTER, options_for(&moto.url)));
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let (id, dns) = launch(&c, &w, 1).await.remove(0);
    let zones = c.ec2.describe_availability_zones().zone_names(ZONE).send().await.unwrap();
    let zone_id = zones.availability_zones()[0].zone_id().unwrap().to_string();
    let md = p.instance_metadata(&node(&dns, Some(&pid(&id)), None, vec![])).await.unwrap().unwrap();
    assert_eq!(md.zone, zone_id);
    assert_eq!(md.additional_labels.get(ccm_provider_aws::LABEL_ZONE_ID), Some(&zone_id));
    assert_eq!(md.provider_id, pid(&id), "the providerID keeps the zone name");
}

#[tokio::test]
async fn a_node_named_by_dns_name_is_initialized_only_from_an_instance_tagged_for_the_cluster_as_upstream() {
    let Some(moto) = Moto::start("dns_name_needs_the_cluster_tag").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let instances = launch(&c, &w, 3).await;
    let key = format!("kubernetes.io/cluster/{CLUSTER}");
    // One untagged, one with only the legacy tag (which counts, as upstream's hasClusterTag).
    c.ec2
        .delete_tags()
        .resources(&instances[1].0)
        .resources(&instances[2].0)
        .tags(ec2::types::Tag::builder().key(&key).build())
        .send()
        .await
        .unwrap();
    c.ec2.create_tags().resources(&instances[2].0).tags(tag("KubernetesCluster", CLUSTER)).send().await.unwrap();
    let by_name: Vec<Node> = instances.iter().map(|(_, dns)| node(dns, None, None, vec![])).collect();
    let refs: Vec<&Node> = by_name.iter().collect();
    let found = p.instances_metadata(&refs).await;
    assert_eq!(found[0].as_ref().unwrap().as_ref().map(|m| m.provider_id.clone()), Some(pid(&instances[0].0)));
    assert!(matches!(found[1], Ok(None)), "an untagged instance is not the Node's (DNS names repeat across VPCs)");
    assert_eq!(found[2].as_ref().unwrap().as_ref().map(|m| m.provider_id.clone()), Some(pid(&instances[2].0)));
    // By providerID no tag is needed; and the untagged instance still exists for the lifecycle.
    let by_id = node(&instances[1].1, Some(&pid(&instances[1].0)), None, vec![]);
    assert!(p.instance_metadata(&by_id).await.unwrap().is_some());
    assert_eq!(p.instance_exists(&by_name[1]).await, Ok(true), "never reported gone");
}
