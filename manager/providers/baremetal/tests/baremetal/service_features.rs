//! What a Service asks of the baremetal provider, and why it gets no address: the
//! `LoadBalancerProvisioned` condition's reasons, MetalLB's annotations read for a migration,
//! dual stack per `ipFamilyPolicy` and `ipFamilies`, on both API server backends.

use std::sync::Arc;
use std::time::Duration;

use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::run_controller;
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::CloudProvider;
use ccm_provider_baremetal::BaremetalProvider;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use testkit::{Meta, ServiceFixture, TestCluster, eventually, eventually_within, ingress, lb_service};

const CONFIG: &str = "\
loadBalancer:
  pools:
    - name: lan
      cidrs: [192.168.60.0/31]
      allowSharing: true
";

async fn wait_ip(api: &Api<Service>, name: &str) -> String {
    eventually(&format!("{name} gets an address"), || async {
        ingress(&api.get(name).await.ok()?).first().map(|(ip, _)| ip.clone())
    })
    .await
}

/// Waits for the Service's `LoadBalancerProvisioned` condition to be False with `reason`; returns
/// its message.
async fn wait_refused(api: &Api<Service>, name: &str, reason: &str) -> String {
    eventually(&format!("{name} is refused with {reason}"), || async {
        let svc = api.get(name).await.ok()?;
        let c = svc.status?.conditions?.into_iter().find(|c| c.type_ == "LoadBalancerProvisioned")?;
        (c.status == "False" && c.reason == reason).then_some(c.message)
    })
    .await
}

testkit::backend_tests! {
    async fn s25_a_service_without_an_address_has_a_condition_naming_the_reason(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), "default");
        let pp = PostParams::default();
        let provider = Arc::new(BaremetalProvider::from_cloud_config(Some(CONFIG.as_bytes())).unwrap());
        let running = run_controller(
            cluster.client(),
            provider as Arc<dyn CloudProvider>,
            ControllerOptions { concurrent_service_syncs: 2, ..Default::default() },
            Box::new(ServiceController::new()),
        )
        .await;

        // MetalLB's annotation is honoured, so a migration keeps the address.
        services.create(&pp, &lb_service("default", "migrated").with_annotations(&[("metallb.universe.tf/loadBalancerIPs", "192.168.60.1"), ("metallb.universe.tf/allow-shared-ip", "web")])).await.unwrap();
        assert_eq!(wait_ip(&services, "migrated").await, "192.168.60.1");
        // Our sharing key equals MetalLB's key: another port shares the address.
        services.create(&pp, &lb_service("default", "shares").with_port(443).with_annotations(&[("ccm.rs/load-balancer-ips", "192.168.60.1"), ("ccm.rs/allow-shared-ip", "web")])).await.unwrap();
        assert_eq!(wait_ip(&services, "shares").await, "192.168.60.1");

        // The same port under the same key: a sharing conflict.
        services.create(&pp, &lb_service("default", "clash").with_annotations(&[("ccm.rs/load-balancer-ips", "192.168.60.1"), ("ccm.rs/allow-shared-ip", "web")])).await.unwrap();
        let message = wait_refused(&services, "clash", "SharingConflict").await;
        assert!(message.contains("192.168.60.1"), "{message}");
        // Without a key: taken.
        services.create(&pp, &lb_service("default", "taken").with_annotations(&[("ccm.rs/load-balancer-ips", "192.168.60.1")])).await.unwrap();
        wait_refused(&services, "taken", "RequestedAddressTaken").await;
        // Outside every pool.
        services.create(&pp, &lb_service("default", "outside").with_annotations(&[("ccm.rs/load-balancer-ips", "203.0.113.9")])).await.unwrap();
        wait_refused(&services, "outside", "RequestedAddressUnavailable").await;
        // A malformed annotation names itself.
        services.create(&pp, &lb_service("default", "typo").with_annotations(&[("metallb.io/loadBalancerIPs", "192.168.60.x")])).await.unwrap();
        let message = wait_refused(&services, "typo", "InvalidAnnotation").await;
        assert!(message.contains("metallb.io/loadBalancerIPs"), "{message}");

        // The last free address goes, then the pool is exhausted.
        services.create(&pp, &lb_service("default", "first")).await.unwrap();
        assert_eq!(wait_ip(&services, "first").await, "192.168.60.0");
        services.create(&pp, &lb_service("default", "late")).await.unwrap();
        let message = wait_refused(&services, "late", "PoolExhausted").await;
        assert!(message.contains("2 of 2"), "{message}");

        // Freeing an address clears it without touching the Service: the refusal is retried
        // (backoff at most 30 s; here the second or third retry).
        services.delete("first", &DeleteParams::default()).await.unwrap();
        let late = eventually_within("late gets the freed address and loses the condition", Duration::from_secs(60), || async {
            let svc = services.get("late").await.ok()?;
            let no_condition = svc.status.as_ref()?.conditions.as_ref().is_none_or(|c| c.iter().all(|c| c.type_ != "LoadBalancerProvisioned"));
            (no_condition && !ingress(&svc).is_empty()).then_some(svc)
        })
        .await;
        assert_eq!(ingress(&late)[0].0, "192.168.60.0");
        running.stop().await.unwrap();
    }
}

const DUAL: &str = "\
loadBalancer:
  pools:
    - name: v4
      cidrs: [192.168.70.0/31]
    - name: v6
      cidrs: [fd00:70::/127]
";

fn dual(name: &str, policy: &str, families: &[&str]) -> Service {
    let mut svc = lb_service("default", name);
    let spec = svc.spec.as_mut().unwrap();
    spec.ip_family_policy = Some(policy.into());
    spec.ip_families = Some(families.iter().map(|f| f.to_string()).collect());
    svc
}

testkit::backend_tests! {
    async fn dual_stack_follows_ip_family_policy_and_ip_families(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), "default");
        let pp = PostParams::default();
        let provider = Arc::new(BaremetalProvider::from_cloud_config(Some(DUAL.as_bytes())).unwrap());
        let running = run_controller(
            cluster.client(),
            provider as Arc<dyn CloudProvider>,
            ControllerOptions { concurrent_service_syncs: 1, ..Default::default() },
            Box::new(ServiceController::new()),
        )
        .await;
        let ips = |svc: &Service| ingress(svc).into_iter().map(|(ip, _)| ip).collect::<Vec<_>>();

        // RequireDualStack: one address per family, in spec.ipFamilies order.
        services.create(&pp, &dual("both", "RequireDualStack", &["IPv6", "IPv4"])).await.unwrap();
        let both = eventually("both gets two addresses", || async {
            let svc = services.get("both").await.ok()?;
            (ips(&svc).len() == 2).then_some(svc)
        })
        .await;
        assert_eq!(ips(&both), ["fd00:70::", "192.168.70.0"]);

        // SingleStack IPv6 gets one IPv6 address.
        services.create(&pp, &dual("six", "SingleStack", &["IPv6"])).await.unwrap();
        assert_eq!(wait_ip(&services, "six").await, "fd00:70::1");

        // IPv6 is now exhausted: PreferDualStack continues with IPv4 alone, RequireDualStack is refused.
        services.create(&pp, &dual("prefer", "PreferDualStack", &["IPv4", "IPv6"])).await.unwrap();
        assert_eq!(wait_ip(&services, "prefer").await, "192.168.70.1");
        let prefer = services.get("prefer").await.unwrap();
        assert_eq!(ips(&prefer).len(), 1, "no IPv6 address left: single-stack for now");
        services.create(&pp, &dual("require", "RequireDualStack", &["IPv4", "IPv6"])).await.unwrap();
        let message = wait_refused(&services, "require", "PoolExhausted").await;
        assert!(message.contains("IPv4") || message.contains("IPv6"), "{message}");
        running.stop().await.unwrap();
    }
}
