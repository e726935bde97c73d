//! Pools as resources (`loadBalancer.poolResources: true`): `LoadBalancerIPPool`s hand out
//! addresses after the cloud-config's pools, report their usage and validity in their status,
//! and honour `autoAssign` and `namespaceSelector`, on both API server backends.

use std::sync::Arc;

use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::run_controller;
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::CloudProvider;
use ccm_provider_baremetal::BaremetalProvider;
use crds::pool::{FamilyUsage, LoadBalancerIPPool};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::{Meta, TestCluster, eventually, ingress, lb_service};

const CONFIG: &str = "\
loadBalancer:
  poolResources: true
  pools:
    - name: default
      cidrs: [192.168.50.0/31]
";

fn provider(config: &str) -> Arc<BaremetalProvider> {
    Arc::new(BaremetalProvider::from_cloud_config(Some(config.as_bytes())).expect("valid cloud-config"))
}

fn pool(name: &str, spec: Value) -> LoadBalancerIPPool {
    serde_json::from_value(json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "LoadBalancerIPPool", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("pool deserializes")
}

async fn wait_ip(api: &Api<Service>, name: &str) -> String {
    eventually(&format!("{name} gets an address"), || async {
        ingress(&api.get(name).await.ok()?).first().map(|(ip, _)| ip.clone())
    })
    .await
}

/// Waits until the pool's status says `valid` with `reason` and, when given, this IPv4 usage.
async fn wait_pool(
    api: &Api<LoadBalancerIPPool>,
    name: &str,
    valid: &str,
    reason: &str,
    v4: Option<(i64, i64)>,
) -> LoadBalancerIPPool {
    eventually(&format!("pool {name} reports {valid} {reason} {v4:?}"), || async {
        let p = api.get(name).await.ok()?;
        let status = p.status.as_ref()?;
        let c = status.conditions.iter().find(|c| c.type_ == "Valid")?;
        let usage_ok = v4.is_none_or(|(assigned, available)| status.ipv4 == Some(FamilyUsage { assigned, available }));
        (c.status == valid && c.reason == reason && usage_ok).then_some(p)
    })
    .await
}

testkit::backend_tests! {
    async fn pool_resources_follow_the_cloud_config_pools_and_report_usage_and_validity(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        cluster.install_crd(&crds::pool_crd()).await.unwrap();
        let pools: Api<LoadBalancerIPPool> = Api::all(cluster.client());
        let pp = PostParams::default();

        // The API server refuses malformed entries (the CRD's CEL rules).
        let bad = pools.create(&pp, &pool("bad", json!({"cidrs": ["lab-net"]}))).await;
        assert!(format!("{bad:?}").contains("must be a CIDR"), "{bad:?}");
        // And malformed communities of an advertisement (issue 47 item 2).
        for (bgp, needle) in [
            (json!({"communities": ["65000:70000"]}), "two numbers from 0 to 65535"),
            (json!({"largeCommunities": ["65000:1"]}), "three numbers from 0 to 4294967295"),
        ] {
            let spec = json!({"cidrs": ["192.0.2.0/28"], "advertisement": {"bgp": bgp}});
            let bad = pools.create(&pp, &pool("bad", spec)).await;
            assert!(format!("{bad:?}").contains(needle), "{bad:?}");
        }

        // A pool with an advertisement policy is accepted and used like any other.
        let advertisement = json!({"nodeSelector": {"matchLabels": {"edge": "true"}}, "l2PreferredNodes": ["w1"], "l2Interfaces": ["eth1"],
            "bgp": {"communities": ["65000:1"], "largeCommunities": ["65000:1:2"], "localPref": 200}});
        pools.create(&pp, &pool("lab", json!({"cidrs": ["198.51.100.0/30"], "advertisement": advertisement}))).await.unwrap();
        pools.create(&pp, &pool("over", json!({"ranges": ["192.168.50.1-192.168.50.9"]}))).await.unwrap();
        pools.create(&pp, &pool("hosts", json!({"cidrs": ["198.51.100.65/26"]}))).await.unwrap();
        pools.create(&pp, &pool("pinned", json!({"cidrs": ["203.0.113.0/30"], "autoAssign": false}))).await.unwrap();

        let services: Api<Service> = Api::namespaced(cluster.client(), "default");
        let running = run_controller(
            cluster.client(),
            provider(CONFIG) as Arc<dyn CloudProvider>,
            ControllerOptions { concurrent_service_syncs: 1, ..Default::default() },
            Box::new(ServiceController::new()),
        )
        .await;

        // The cloud-config's two addresses go first, then the resource's.
        for name in ["a", "b", "c"] {
            services.create(&pp, &lb_service("default", name)).await.unwrap();
            wait_ip(&services, name).await;
        }
        let got: Vec<String> = [wait_ip(&services, "a").await, wait_ip(&services, "b").await, wait_ip(&services, "c").await].into();
        assert_eq!(got, ["192.168.50.0", "192.168.50.1", "198.51.100.0"]);

        let lab = wait_pool(&pools, "lab", "True", "AsExpected", Some((1, 3))).await;
        assert_eq!(lab.status.as_ref().unwrap().ipv6, None, "no IPv6 block, no IPv6 usage");
        let over = wait_pool(&pools, "over", "False", "Overlap", None).await;
        let message = &over.status.unwrap().conditions[0].message;
        assert!(message.contains("the cloud-config's pool default"), "{message}");
        let hosts = wait_pool(&pools, "hosts", "False", "InvalidEntry", None).await;
        assert!(hosts.status.unwrap().conditions[0].message.contains("spec.cidrs[0] has host bits set"));

        // autoAssign: false hands out only requested addresses.
        services.create(&pp, &lb_service("default", "want").with_annotations(&[("ccm.rs/load-balancer-ips", "203.0.113.2")])).await.unwrap();
        assert_eq!(wait_ip(&services, "want").await, "203.0.113.2");
        wait_pool(&pools, "pinned", "True", "AsExpected", Some((1, 3))).await;

        // Releasing an address shows in the usage; a new pool is used without a restart.
        services.delete("c", &DeleteParams::default()).await.unwrap();
        wait_pool(&pools, "lab", "True", "AsExpected", Some((0, 4))).await;
        pools.delete("lab", &DeleteParams::default()).await.unwrap();
        pools.create(&pp, &pool("late", json!({"ranges": ["198.51.100.200-198.51.100.201"]}))).await.unwrap();
        services.create(&pp, &lb_service("default", "d")).await.unwrap();
        assert_eq!(wait_ip(&services, "d").await, "198.51.100.200");
        wait_pool(&pools, "late", "True", "AsExpected", Some((1, 1))).await;
        running.stop().await.unwrap();
    }

    async fn a_pool_with_a_namespace_selector_serves_only_matching_namespaces(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        cluster.install_crd(&crds::pool_crd()).await.unwrap();
        let pools: Api<LoadBalancerIPPool> = Api::all(cluster.client());
        let pp = PostParams::default();
        let team = cluster.fresh_namespace("team").await.unwrap();
        let namespaces: Api<Namespace> = Api::all(cluster.client());
        let label = json!({"metadata": {"labels": {"team": "a"}}});
        namespaces.patch(&team, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
        let selector = json!({"cidrs": ["198.51.100.0/30"], "namespaceSelector": {"matchLabels": {"team": "a"}}});
        pools.create(&pp, &pool("team-a", selector)).await.unwrap();
        let config = "loadBalancer:\n  poolResources: true\n";
        let running = run_controller(
            cluster.client(),
            provider(config) as Arc<dyn CloudProvider>,
            ControllerOptions { concurrent_service_syncs: 1, ..Default::default() },
            Box::new(ServiceController::new()),
        )
        .await;
        let theirs: Api<Service> = Api::namespaced(cluster.client(), &team);
        theirs.create(&pp, &lb_service(&team, "web")).await.unwrap();
        assert_eq!(wait_ip(&theirs, "web").await, "198.51.100.0");
        let others: Api<Service> = Api::namespaced(cluster.client(), "default");
        others.create(&pp, &lb_service("default", "web")).await.unwrap();
        // The other namespace's Service is refused, and says why.
        let message = eventually("the other namespace's Service is refused with NoPoolMatches", || async {
            let svc = others.get("web").await.ok()?;
            let c = svc.status?.conditions?.into_iter().find(|c| c.type_ == "LoadBalancerProvisioned")?;
            (c.status == "False" && c.reason == "NoPoolMatches").then_some(c.message)
        })
        .await;
        assert!(message.contains("no load-balancer pool admits default/web"), "{message}");
        assert!(ingress(&others.get("web").await.unwrap()).is_empty());
        running.stop().await.unwrap();
    }
}
