//! The orphan scan's provider side on moto (S34, S35): `list_owned` lists what the provider made
//! for the cluster's Services and nothing else; `delete_owned` deletes it, and refuses an object
//! whose ownership changed since it was listed.

use ccm_framework::provider::OwnedObject;
use ccm_provider_aws::lb::{
    KIND_CLASSIC_LOAD_BALANCER, KIND_LOAD_BALANCER, KIND_SECURITY_GROUP, KIND_TARGET_GROUP, classic_group_name,
};
use ccm_provider_aws::sdk::elbv2;

use crate::kit::*;
use crate::proxy::{managed_config, managed_sgs};

fn elbv2_tag(k: &str, v: &str) -> elbv2::types::Tag {
    elbv2::types::Tag::builder().key(k).value(v).build()
}

/// An NLB made straight through the SDK, with `tags`; its ARN.
async fn nlb_by_hand(c: &Clients, w: &World, name: &str, tags: &[(&str, &str)]) -> String {
    let mut req = c
        .elb
        .create_load_balancer()
        .name(name)
        .r#type(elbv2::types::LoadBalancerTypeEnum::Network)
        .set_subnets(Some(w.subnets.clone()));
    for (k, v) in tags {
        req = req.tags(elbv2_tag(k, v));
    }
    req.send().await.unwrap().load_balancers()[0].load_balancer_arn().unwrap().to_string()
}

/// Every ELBv2 load balancer's ARN in moto.
async fn lb_arns(c: &Clients) -> BTreeSet<String> {
    let r = c.elb.describe_load_balancers().send().await.unwrap();
    r.load_balancers().iter().map(|l| l.load_balancer_arn().unwrap().to_string()).collect()
}

/// (kind, service) of each listed object.
fn shape(listed: &[OwnedObject]) -> BTreeSet<(String, Option<String>)> {
    listed.iter().map(|o| (o.kind.clone(), o.service.clone())).collect()
}

/// moto with the world, one Node and a provider in `NLBSecurityGroupMode = Managed` (so an NLB
/// has a security group of its own).
async fn start(test: &str) -> Option<(Moto, Arc<AwsProvider>, Clients, World, Vec<Node>)> {
    let moto = Moto::start(test).await?;
    let p = Arc::new(AwsProvider::new(managed_config(), CLUSTER, options_for(&moto.url)));
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = vec![node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    Some((moto, p, c, w, nodes))
}

#[tokio::test]
async fn s34_list_owned_names_the_service_of_each_object_made_for_it_and_leaves_out_untagged_and_other_clusters() {
    let Some((moto, p, c, w, nodes)) = start("s34_list_owned").await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();
    let nlb = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000a1");
    p.ensure_load_balancer(CLUSTER, &nlb, &refs).await.unwrap();
    let (ours, _, groups) = lb_shape(&c).await;
    assert_eq!(groups.len(), 1, "the NLB has its managed group");
    // A Classic ELB with its `k8s-elb-*` group.
    assert!(moto.corrected, "the Classic ELB needs moto's health-check correction (python3 with moto)");
    let mut classic = with_uid(lb_service("shop", &[(80, 30081)]), "00000000-0000-0000-0000-0000000000b2");
    classic.metadata.annotations = None;
    p.ensure_load_balancer(CLUSTER, &classic, &refs).await.unwrap();

    // Made by hand: untagged, another cluster's, this cluster's but only shared, and owned
    // without a Service tag. None is listed.
    let untagged = nlb_by_hand(&c, &w, "untagged", &[]).await;
    let other = nlb_by_hand(
        &c,
        &w,
        "other-cluster",
        &[("kubernetes.io/cluster/other", "owned"), ("kubernetes.io/service-name", "default/web")],
    )
    .await;
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    let shared =
        nlb_by_hand(&c, &w, "shared", &[(&cluster_tag, "shared"), ("kubernetes.io/service-name", "default/web")]).await;
    let serviceless = nlb_by_hand(&c, &w, "serviceless", &[(&cluster_tag, "owned")]).await;

    let listed = p.list_owned(CLUSTER).await.unwrap();
    let ids: BTreeSet<&str> = listed.iter().map(|o| o.id.as_str()).collect();
    for stranger in [&untagged, &other, &shared, &serviceless, &w.sg] {
        assert!(!ids.contains(stranger.as_str()), "{stranger} is not listed: {listed:#?}");
    }
    let lb = listed.iter().find(|o| o.kind == KIND_LOAD_BALANCER).expect("the NLB is listed");
    assert_eq!((lb.id.as_str(), lb.service.as_deref()), (ours.as_str(), Some("default/web")));
    let sg = listed.iter().find(|o| o.id == *groups.iter().next().unwrap()).expect("the managed group is listed");
    assert_eq!((sg.kind.as_str(), sg.service.as_deref()), (KIND_SECURITY_GROUP, Some("default/web")));
    let web = Some("default/web".to_string());
    let shop = Some("default/shop".to_string());
    let want = BTreeSet::from([
        (KIND_LOAD_BALANCER.to_string(), web.clone()),
        (KIND_TARGET_GROUP.to_string(), web.clone()),
        (KIND_SECURITY_GROUP.to_string(), web.clone()),
        (KIND_CLASSIC_LOAD_BALANCER.to_string(), shop.clone()),
        (KIND_SECURITY_GROUP.to_string(), shop.clone()),
    ]);
    // The Classic ELB and its group name their load balancer: one of an earlier Service is told apart.
    let name = ccm_framework::provider::default_load_balancer_name(&classic);
    let elb = listed.iter().find(|o| o.kind == KIND_CLASSIC_LOAD_BALANCER).unwrap();
    assert_eq!((elb.id.as_str(), elb.load_balancer.as_deref()), (name.as_str(), Some(name.as_str())));
    let own = listed.iter().find(|o| o.kind == KIND_SECURITY_GROUP && o.service == shop).unwrap();
    assert_eq!(own.load_balancer.as_deref(), Some(name.as_str()));
    assert_eq!(group_detail(&c, &own.id).await.0, classic_group_name(&name));
    assert_eq!(shape(&listed), want);
    assert_eq!(listed.len(), want.len(), "one of each: {listed:#?}");
}

#[tokio::test]
async fn s35_delete_owned_removes_every_listed_object_and_list_owned_is_then_empty() {
    let Some((_moto, p, c, w, nodes)) = start("s35_delete_owned").await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();
    let nlb = with_uid(lb_service("web", &[(80, 30080), (443, 30443)]), "00000000-0000-0000-0000-0000000000c3");
    p.ensure_load_balancer(CLUSTER, &nlb, &refs).await.unwrap();
    let (_, _, groups) = lb_shape(&c).await;
    let untagged = nlb_by_hand(&c, &w, "untagged", &[]).await;

    let mut listed = p.list_owned(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 4, "a load balancer, two target groups, a group: {listed:#?}");
    // Handed over groups first: the provider orders the deletions itself.
    listed.reverse();
    let results = p.delete_owned(CLUSTER, &listed).await;
    assert_eq!(results.len(), listed.len());
    for (o, r) in listed.iter().zip(&results) {
        assert!(r.is_ok(), "{} {}: {r:?}", o.kind, o.id);
    }
    assert_eq!(p.list_owned(CLUSTER).await.unwrap(), Vec::new());
    assert_eq!(lb_arns(&c).await, BTreeSet::from([untagged]), "only the untagged load balancer is left");
    assert!(c.elb.describe_target_groups().send().await.unwrap().target_groups().is_empty());
    assert!(managed_sgs(&c).await.is_disjoint(&groups));
    // Deleting again: everything is already gone, which is a success.
    assert!(p.delete_owned(CLUSTER, &listed).await.iter().all(Result::is_ok));
}

#[tokio::test]
async fn s35_delete_owned_refuses_an_object_tagged_for_another_cluster_since_the_scan_and_keeps_it() {
    let Some((_moto, p, c, _w, nodes)) = start("s35_delete_owned_refuses").await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();
    let nlb = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000d4");
    p.ensure_load_balancer(CLUSTER, &nlb, &refs).await.unwrap();
    let listed = p.list_owned(CLUSTER).await.unwrap();
    let lb = listed.iter().find(|o| o.kind == KIND_LOAD_BALANCER).unwrap().clone();

    // Between the scan and the deletion the load balancer passes to another cluster.
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    c.elb.remove_tags().resource_arns(&lb.id).tag_keys(&cluster_tag).send().await.unwrap();
    c.elb
        .add_tags()
        .resource_arns(&lb.id)
        .tags(elbv2_tag("kubernetes.io/cluster/other", "owned"))
        .send()
        .await
        .unwrap();

    let results = p.delete_owned(CLUSTER, std::slice::from_ref(&lb)).await;
    assert!(matches!(results.as_slice(), [Err(CloudError::NotOwned(_))]), "{results:?}");
    assert!(lb_arns(&c).await.contains(&lb.id), "the load balancer is kept");
    assert!(!p.list_owned(CLUSTER).await.unwrap().iter().any(|o| o.id == lb.id), "and no longer listed");

    // A Service tag changed to another Service is refused too.
    let tg = listed.iter().find(|o| o.kind == KIND_TARGET_GROUP).unwrap().clone();
    c.elb
        .add_tags()
        .resource_arns(&tg.id)
        .tags(elbv2_tag("kubernetes.io/service-name", "default/api"))
        .send()
        .await
        .unwrap();
    let results = p.delete_owned(CLUSTER, std::slice::from_ref(&tg)).await;
    assert!(
        matches!(results.as_slice(), [Err(CloudError::NotOwned(why))] if why.contains("names Service")),
        "{results:?}"
    );
    let left = c.elb.describe_target_groups().target_group_arns(&tg.id).send().await.unwrap();
    assert_eq!(left.target_groups().len(), 1, "the target group is kept");
}
