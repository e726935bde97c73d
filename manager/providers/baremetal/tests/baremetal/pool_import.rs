//! Migrating from MetalLB and Cilium LB-IPAM (`loadBalancer.importPools`): their pools are read
//! in place and no Service changes address, on both API server backends. The CRDs are minimal
//! stand-ins named as theirs (any spec is kept), so the test needs neither project.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::{RunningController, run_controller};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::{CloudProvider, Health};
use ccm_provider_baremetal::BaremetalProvider;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testkit::{Meta, ServiceFixture, TestCluster, eventually, ingress, lb_service};

/// The cloud-config importing MetalLB's pools from `metallb_namespace` and Cilium's.
fn config(metallb_namespace: &str) -> String {
    format!(
        "loadBalancer:\n  poolResources: true\n  importPools: [{{source: metallb, namespace: {metallb_namespace}}}, cilium]\n"
    )
}

/// Waits until `count` Services of `events`' namespace have been through the service
/// controller (each has an `EnsuredLoadBalancer` event).
async fn all_ensured(events: &Api<Event>, count: usize) {
    eventually("every Service is ensured", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let ensured: BTreeSet<String> = list
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("EnsuredLoadBalancer"))
            .filter_map(|e| e.regarding.as_ref()?.name.clone())
            .collect();
        (ensured.len() == count).then_some(())
    })
    .await;
}

/// The `LoadBalancerProvisioned` condition's (reason, message) of a Service, once it has one.
fn refusal(service: &Service) -> Option<(String, String)> {
    let conditions = service.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "LoadBalancerProvisioned" && c.status == "False")?;
    Some((c.reason.clone(), c.message.clone()))
}

fn crd(group: &str, kind: &str, plural: &str, namespaced: bool, versions: &[&str]) -> CustomResourceDefinition {
    let versions: Vec<Value> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({"name": v, "served": true, "storage": i == 0, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }}})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
        },
    }))
    .expect("CRD deserializes")
}

fn dynamic(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// A Service as the previous allocator left it: name, port, annotations, address.
type Held<'a> = (&'a str, i32, &'a [(&'a str, &'a str)], &'a str);

/// Every address each Service showed while the test ran, from a watch.
type Seen = Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>;

fn watch_addresses(api: Api<Service>) -> Seen {
    let seen: Seen = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            let services = match event {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => vec![s],
                _ => continue,
            };
            for s in services {
                let name = s.metadata.name.clone().unwrap_or_default();
                let mut seen = out.lock().unwrap();
                seen.entry(name).or_default().extend(ingress(&s).into_iter().map(|(ip, _)| ip));
            }
        }
    });
    seen
}

fn health_message(health: Health) -> String {
    match health {
        Health::Healthy { message } | Health::Unhealthy { message, .. } => message,
    }
}

/// The provider from `config` leading, with the service controller running on `cluster`.
async fn start_leader(cluster: &TestCluster, config: &str) -> (Arc<BaremetalProvider>, RunningController) {
    let provider = Arc::new(BaremetalProvider::from_cloud_config(Some(config.as_bytes())).unwrap());
    let options = ControllerOptions { concurrent_service_syncs: 2, ..Default::default() };
    let running = run_controller(
        cluster.client(),
        provider.clone() as Arc<dyn CloudProvider>,
        options,
        Box::new(ServiceController::new()),
    )
    .await;
    (provider, running)
}

testkit::backend_tests! {
    async fn services_keep_the_addresses_metallb_and_cilium_gave_them_and_new_ones_come_from_their_pools(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        cluster.install_crd(&crds::pool_crd()).await.unwrap();
        let pp = PostParams::default();

        // No MetalLB or Cilium CRD yet: the leader starts and says so.
        let (provider, running) = start_leader(&cluster, &config("metallb-system")).await;
        let message = health_message(provider.health().await);
        assert!(message.contains("no IPAddressPool resource is served (metallb.io CRD not installed)"), "{message}");
        running.stop().await.unwrap();

        let metallb_crd = crd("metallb.io", "IPAddressPool", "ipaddresspools", true, &["v1beta1"]);
        let cilium_crd = crd("cilium.io", "CiliumLoadBalancerIPPool", "ciliumloadbalancerippools", false, &["v2", "v2alpha1"]);
        cluster.install_crd(&metallb_crd).await.unwrap();
        cluster.install_crd(&cilium_crd).await.unwrap();
        let metallb_ns = cluster.fresh_namespace("metallb").await.unwrap();
        let pools_resource = dynamic("metallb.io", "v1beta1", "IPAddressPool", "ipaddresspools");
        let metallb: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &metallb_ns, &pools_resource);
        let elsewhere_ns = cluster.fresh_namespace("not-metallb").await.unwrap();
        let elsewhere: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &elsewhere_ns, &pools_resource);
        let cilium: Api<DynamicObject> = Api::all_with(cluster.client(), &dynamic("cilium.io", "v2", "CiliumLoadBalancerIPPool", "ciliumloadbalancerippools"));
        let object = |api_version: &str, kind: &str, name: &str, spec: Value| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec})).unwrap()
        };
        let ns = cluster.fresh_namespace("apps").await.unwrap();
        metallb.create(&pp, &object("metallb.io/v1beta1", "IPAddressPool", "lan", json!({
            "addresses": ["198.51.100.0/29", "198.51.100.64-198.51.100.65"],
            "serviceAllocation": {"namespaces": [ns]},
        }))).await.unwrap();
        // Two service selectors: MetalLB admits either, which one pool cannot say: not imported
        // (it used to be imported admitting every Service).
        metallb.create(&pp, &object("metallb.io/v1beta1", "IPAddressPool", "wide", json!({
            "addresses": ["198.51.100.32/29"],
            "serviceAllocation": {"serviceSelectors": [{"matchLabels": {"a": "1"}}, {"matchLabels": {"b": "2"}}]},
        }))).await.unwrap();
        // A pool outside MetalLB's namespace is not MetalLB's: never read.
        elsewhere.create(&pp, &object("metallb.io/v1beta1", "IPAddressPool", "planted", json!({
            "addresses": ["198.51.100.96/29"],
        }))).await.unwrap();
        cilium.create(&pp, &object("cilium.io/v2", "CiliumLoadBalancerIPPool", "edge", json!({
            "allowFirstLastIPs": "No", "blocks": [{"cidr": "203.0.113.0/29"}],
        }))).await.unwrap();
        // A disabled Cilium pool: its Services keep their addresses, nobody gets a new one.
        cilium.create(&pp, &object("cilium.io/v2", "CiliumLoadBalancerIPPool", "off", json!({
            "disabled": true, "allowFirstLastIPs": "No", "blocks": [{"cidr": "203.0.113.64/29"}],
        }))).await.unwrap();

        // Services as MetalLB and Cilium left them: addresses in status, their annotations.
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let before: [Held; 8] = [
            ("m-plain", 80, &[("metallb.io/ip-allocated-from-pool", "lan")], "198.51.100.3"),
            ("m-asked", 80, &[("metallb.io/loadBalancerIPs", "198.51.100.64")], "198.51.100.64"),
            ("m-share-a", 80, &[("metallb.io/allow-shared-ip", "k")], "198.51.100.5"),
            ("m-share-b", 443, &[("metallb.io/allow-shared-ip", "k")], "198.51.100.5"),
            ("c-plain", 80, &[], "203.0.113.6"),
            ("c-share-a", 80, &[("lbipam.cilium.io/sharing-key", "s")], "203.0.113.1"),
            ("c-share-b", 53, &[("lbipam.cilium.io/sharing-key", "s")], "203.0.113.1"),
            ("c-held", 80, &[], "203.0.113.66"),
        ];
        for (name, port, annotations, ip) in before {
            services.create(&pp, &lb_service(&ns, name).with_port(port).with_annotations(annotations)).await.unwrap();
            let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
            services.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        }
        let seen = watch_addresses(services.clone());
        let mark = cluster.request_log().mark();

        let started = std::time::Instant::now();
        let (provider, running) = start_leader(&cluster, &config(&metallb_ns)).await;

        // A new Service gets the lowest free address of the first imported pool.
        services.create(&pp, &lb_service(&ns, "fresh")).await.unwrap();
        let fresh = eventually("the new Service gets an address", || async {
            ingress(&services.get("fresh").await.ok()?).first().map(|(ip, _)| ip.clone())
        }).await;
        assert_eq!(fresh, "198.51.100.0");
        // Every Service has been through the controller (it reports EnsuredLoadBalancer).
        all_ensured(&Api::namespaced(cluster.client(), &ns), before.len() + 1).await;
        let synced = started.elapsed();
        for (name, _, _, ip) in before {
            let now: Vec<String> = ingress(&services.get(name).await.unwrap()).into_iter().map(|(ip, _)| ip).collect();
            assert_eq!(now, [ip], "{name} kept its address");
            let ever = seen.lock().unwrap().get(name).cloned().unwrap_or_default();
            assert_eq!(ever, BTreeSet::from([ip.to_string()]), "{name} never showed another address");
        }
        // One status write per Service at most: its load-balancer conditions (S31). The addresses
        // are already right (ipMode unset reads as VIP), so none is rewritten (checked above).
        let names: BTreeSet<&str> = before.iter().map(|b| b.0).collect();
        let mut writes = 0;
        for name in &names {
            let these = cluster.request_log().count(|r| {
                r.seq >= mark && r.is_write() && r.subresource.as_deref() == Some("status")
                    && r.name.as_deref() == Some(*name)
            });
            assert!(these <= 1, "{name}: {these} status writes; only its conditions may be written, once");
            writes += these;
        }

        // The pool one pool cannot express says why it is not imported, as an event on it.
        let events: Api<Event> = Api::namespaced(cluster.client(), &metallb_ns);
        let note = eventually("a PoolNotImported event on the MetalLB pool wide", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PoolNotImported") && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("wide")
            }).and_then(|e| e.note)
        }).await;
        assert!(note.contains("spec.serviceAllocation.serviceSelectors") && note.contains("not imported"), "{note}");
        let message = health_message(provider.health().await);
        assert!(message.contains("3 pools imported (1 with warnings, 1 not imported)"), "{message}");
        let planted_events: Api<Event> = Api::namespaced(cluster.client(), &elsewhere_ns);
        assert!(planted_events.list(&ListParams::default()).await.unwrap().items.is_empty(), "the planted pool is never read");

        // Addresses of the pools left out cannot be had: none of them is in a pool.
        for (name, ip, why) in [
            ("w-asked", "198.51.100.33", "in no load-balancer pool"),
            ("p-asked", "198.51.100.97", "in no load-balancer pool"),
            ("c-asked", "203.0.113.67", "pool cilium:off is disabled"),
        ] {
            services.create(&pp, &lb_service(&ns, name).with_annotations(&[("metallb.io/loadBalancerIPs", ip)])).await.unwrap();
            let (reason, message) = eventually(&format!("{name} is refused {ip}"), || async {
                refusal(&services.get(name).await.ok()?)
            }).await;
            assert_eq!(reason, "RequestedAddressUnavailable", "{name}: {message}");
            assert!(message.contains(why), "{name}: {message}");
            assert!(ingress(&services.get(name).await.unwrap()).is_empty(), "{name} got no address");
        }
        println!(
            "pool import ({}): {} Services kept their addresses, {writes} status writes to them, all synced in {:.2?}",
            cluster.backend().name(), before.len(), synced
        );

        // An edit of a MetalLB pool is taken in without a restart: an address in the block it
        // adds can be asked for.
        metallb.patch("lan", &PatchParams::default(), &Patch::Merge(json!({"spec": {
            "addresses": ["198.51.100.0/29", "198.51.100.64-198.51.100.65", "198.51.100.128/30"],
        }}))).await.unwrap();
        services.create(&pp, &lb_service(&ns, "m-added").with_annotations(&[("metallb.io/loadBalancerIPs", "198.51.100.130")])).await.unwrap();
        let added = eventually("the Service asking for an address of the added block gets it", || async {
            ingress(&services.get("m-added").await.ok()?).first().map(|(ip, _)| ip.clone())
        }).await;
        assert_eq!(added, "198.51.100.130");
        for (name, _, _, ip) in before {
            let now: Vec<String> = ingress(&services.get(name).await.unwrap()).into_iter().map(|(ip, _)| ip).collect();
            assert_eq!(now, [ip], "{name} kept its address through the pool edit");
        }
        running.stop().await.unwrap();

        // Leave no cluster-wide object behind (the genuine server is shared by turns).
        let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
        for name in ["ipaddresspools.metallb.io", "ciliumloadbalancerippools.cilium.io"] {
            let _ = crds.delete(name, &DeleteParams::default()).await;
        }
    }
}

/// The cloud-config importing kube-vip-cloud-provider's ConfigMap `kubevip` from `namespace`.
fn kube_vip_config(namespace: &str) -> String {
    format!("loadBalancer:\n  poolResources: true\n  importPools: [{{source: kubevip, namespace: {namespace}}}]\n")
}

testkit::backend_tests! {
    async fn kube_vip_services_keep_their_addresses_when_its_configmap_pools_are_imported(backend) {
        use k8s_openapi::api::core::v1::ConfigMap;
        let cluster = TestCluster::start(backend).await.unwrap();
        cluster.install_crd(&crds::pool_crd()).await.unwrap();
        let pp = PostParams::default();
        // kube-vip's namespace (kube-system by default) is a fresh one here: the genuine server is shared.
        let kube_vip_ns = cluster.fresh_namespace("kube-vip").await.unwrap();

        // No ConfigMap yet: the leader starts, imports nothing and says so.
        let (provider, running) = start_leader(&cluster, &kube_vip_config(&kube_vip_ns)).await;
        let message = health_message(provider.health().await);
        assert!(message.contains(&format!("there is no ConfigMap {kube_vip_ns}/kubevip")), "{message}");
        running.stop().await.unwrap();

        let apps = cluster.fresh_namespace("apps").await.unwrap();
        let other = cluster.fresh_namespace("other").await.unwrap();
        // kube-vip's ConfigMap as its README writes them: a namespace CIDR, a global range, and
        // keys no pool can say (they are warnings naming the key).
        let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), &kube_vip_ns);
        let map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "kubevip"}, "data": {
            format!("cidr-{apps}"): "10.20.0.0/29,fd00:20::/126",
            "range-global": "10.30.0.250-10.30.1.5",
            "search-order": "desc",
            "interface-global": "eth3",
        }})).unwrap();
        configmaps.create(&pp, &map).await.unwrap();
        // Another ConfigMap beside it is never read.
        let planted: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "not-kubevip"}, "data": {"cidr-global": "10.99.0.0/24"}})).unwrap();
        configmaps.create(&pp, &planted).await.unwrap();

        // Services as kube-vip-cloud-provider left them: its label, its annotation (every family),
        // spec.loadBalancerIP (the first address only), and status written by kube-vip.
        let kube_vip = [("implementation", "kube-vip")];
        let before: [(&str, &str, Option<&str>, &[&str]); 4] = [
            // An address kube-vip gave from the namespace's CIDR.
            ("kv-plain", &apps, Some("10.20.0.4"), &["10.20.0.4"]),
            // Dual-stack: spec.loadBalancerIP names only the IPv4 address; the annotation both.
            ("kv-dual", &apps, Some("10.20.0.2"), &["10.20.0.2", "fd00:20::1"]),
            // Its address predefined in the annotation: kube-vip only added its label.
            ("kv-predefined", &other, None, &["10.30.0.253"]),
            // From the global range, in another namespace.
            ("kv-global", &other, Some("10.30.1.1"), &["10.30.1.1"]),
        ];
        let mut apis = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for ns in [&apps, &other] {
            let api: Api<Service> = Api::namespaced(cluster.client(), ns);
            seen.insert(ns.clone(), watch_addresses(api.clone()));
            apis.insert(ns.clone(), api);
        }
        for (name, ns, spec_ip, ips) in before {
            let joined = ips.join(",");
            let mut service = lb_service(ns, name).with_labels(&kube_vip).with_annotations(&[("kube-vip.io/loadbalancerIPs", &joined)]);
            if let Some(ip) = spec_ip {
                service.spec.as_mut().unwrap().load_balancer_ip = Some(ip.to_string());
            }
            apis[ns].create(&pp, &service).await.unwrap();
            let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip, "ipMode": "VIP"})).collect();
            let status = json!({"status": {"loadBalancer": {"ingress": ingress}}});
            apis[ns].patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        }
        let mark = cluster.request_log().mark();

        let started = std::time::Instant::now();
        let (provider, running) = start_leader(&cluster, &kube_vip_config(&kube_vip_ns)).await;

        // New Services get the lowest free address kube-vip would have given: the namespace's
        // CIDR first (10.20.0.0 skipped, as kube-vip skips .0), else the global range (.255 skipped).
        apis[&apps].create(&pp, &lb_service(&apps, "fresh-apps")).await.unwrap();
        apis[&other].create(&pp, &lb_service(&other, "fresh-other")).await.unwrap();
        let first = |ns: String, name: &'static str| {
            let api = apis[&ns].clone();
            async move { ingress(&api.get(name).await.ok()?).first().map(|(ip, _)| ip.clone()) }
        };
        let fresh_apps = eventually("the new Service in the namespace with a CIDR gets an address", || first(apps.clone(), "fresh-apps")).await;
        assert_eq!(fresh_apps, "10.20.0.1");
        let fresh_other = eventually("the new Service elsewhere gets an address", || first(other.clone(), "fresh-other")).await;
        assert_eq!(fresh_other, "10.30.0.250");
        // Every Service has been through the controller.
        for (ns, count) in [(&apps, 3), (&other, 3)] {
            all_ensured(&Api::namespaced(cluster.client(), ns), count).await;
        }
        let synced = started.elapsed();
        for (name, ns, _, ips) in before {
            let now: Vec<String> = ingress(&apis[ns].get(name).await.unwrap()).into_iter().map(|(ip, _)| ip).collect();
            assert_eq!(now, ips, "{name} kept its addresses");
            let ever = seen[ns].lock().unwrap().get(name).cloned().unwrap_or_default();
            let expected: BTreeSet<String> = ips.iter().map(|ip| ip.to_string()).collect();
            assert_eq!(ever, expected, "{name} never showed another address");
            // Its addresses were never rewritten: at most its conditions were written, once.
            let writes = cluster.request_log().count(|r| {
                r.seq >= mark && r.is_write() && r.subresource.as_deref() == Some("status") && r.name.as_deref() == Some(name)
            });
            assert!(writes <= 1, "{name}: {writes} status writes; only its conditions may be written, once");
        }

        // What no pool can say is in the health message, naming the keys; each pool is reported
        // as an event on the ConfigMap.
        let message = health_message(provider.health().await);
        assert!(message.contains("2 pools imported (0 with warnings, 0 not imported"), "{message}");
        assert!(message.contains("data.search-order") && message.contains("data.interface-global"), "{message}");
        let events: Api<Event> = Api::namespaced(cluster.client(), &kube_vip_ns);
        eventually("a PoolImported event on the ConfigMap", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PoolImported") && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("kubevip")
            })
        }).await;
        let regarding: BTreeSet<String> = events.list(&ListParams::default()).await.unwrap().items.iter()
            .filter_map(|e| e.regarding.as_ref()?.name.clone()).collect();
        assert!(!regarding.contains("not-kubevip"), "the other ConfigMap is never read");

        // An edit of the ConfigMap is taken in without a restart: a Service asking (as kube-vip's
        // users do) for an address of the added key gets it.
        configmaps.patch("kubevip", &PatchParams::default(), &Patch::Merge(json!({"data": {format!("range-{other}"): "10.40.0.1-10.40.0.9"}}))).await.unwrap();
        let asks = lb_service(&other, "kv-asks").with_labels(&kube_vip).with_annotations(&[("kube-vip.io/loadbalancerIPs", "10.40.0.7")]);
        apis[&other].create(&pp, &asks).await.unwrap();
        let asked = eventually("the Service asking for an address of the added key gets it", || first(other.clone(), "kv-asks")).await;
        assert_eq!(asked, "10.40.0.7");
        for (name, ns, _, ips) in before {
            let now: Vec<String> = ingress(&apis[ns].get(name).await.unwrap()).into_iter().map(|(ip, _)| ip).collect();
            assert_eq!(now, ips, "{name} kept its addresses through the ConfigMap edit");
        }
        println!(
            "kube-vip import ({}): {} Services kept their addresses, all synced in {:.2?}",
            cluster.backend().name(), before.len(), synced
        );
        running.stop().await.unwrap();
    }
}
