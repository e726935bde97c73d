//! Issue 47 item 2: a pool's `advertisement` policy, through the announcers' real sources (a
//! mounted cloud-config read again as it changes) and the Nodes' labels on the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ccm_framework::events::EventSink;
use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings};
use ccm_provider_baremetal::announce::bgp::Advertisement;
use ccm_provider_baremetal::announce::elect;
use ccm_provider_baremetal::announce::sources::{self, SourceSettings};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{ServiceFixture, TestCluster, lb_service};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const CLASS: &str = "ccm.rs/pool-policy-test";

/// One announcer with its own sources, as a node runs it.
struct Running {
    owned: watch::Receiver<BTreeSet<IpAddr>>,
    advertised: watch::Receiver<Advertisement>,
    /// Per owned address whose pool names L2 interfaces, those interfaces.
    only_on: watch::Receiver<BTreeMap<IpAddr, BTreeSet<String>>>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

fn start(client: &kube::Client, namespace: &str, node: &str, config: &Path) -> Running {
    let cancel = CancellationToken::new();
    let parsed = ccm_provider_baremetal::config::parse(&std::fs::read(config).unwrap()).unwrap();
    let mut source_settings = SourceSettings::new(config);
    source_settings.reread = Duration::from_millis(100);
    let mut settings = AnnouncerSettings::new(node, namespace);
    settings.facts = sources::spawn(client.clone(), parsed, source_settings, Default::default, cancel.clone());
    settings.class = Some(CLASS.into());
    (settings.lease_duration, settings.renew_interval, settings.settle) =
        (Duration::from_secs(2), Duration::from_millis(500), Duration::from_secs(1));
    let (bgp, advertised) = watch::channel(Advertisement::default());
    settings.bgp = Some(bgp);
    let (only_on_tx, only_on) = watch::channel(BTreeMap::new());
    settings.l2_interfaces = Some(only_on_tx);
    let (tx, owned) = watch::channel(BTreeSet::new());
    let events = EventSink::spawn(client.clone(), Some(node.into()), cancel.clone());
    let task = tokio::spawn({
        let (client, cancel) = (client.clone(), cancel.clone());
        async move { announcer::run(client, settings, tx, Some(events), cancel).await.expect("announcer runs") }
    });
    Running { owned, advertised, only_on, cancel, task }
}

async fn owns(running: &Running, want: &BTreeSet<IpAddr>, what: &str) {
    let mut owned = running.owned.clone();
    let waited = tokio::time::timeout(Duration::from_secs(20), owned.wait_for(|o| o == want)).await;
    assert!(waited.is_ok_and(|r| r.is_ok()), "{what}: wanted {want:?}, owns {:?}", *running.owned.borrow());
}

/// `count` addresses of `prefix` (`192.0.2.`) that the election gives to `node` among `nodes`.
fn elected(prefix: &str, nodes: [&str; 2], node: &str, count: usize) -> Vec<IpAddr> {
    (1u8..=250)
        .map(|n| format!("{prefix}{n}").parse::<IpAddr>().unwrap())
        .filter(|a| elect::elect(*a, nodes) == Some(node))
        .take(count)
        .collect()
}

fn cloud_config(edge: &str) -> String {
    format!(
        "loadBalancer:\n  pools:\n    - name: edge\n      cidrs: [192.0.2.0/24]\n      advertisement:\n{edge}\
         \x20   - name: any\n      cidrs: [198.51.100.0/24]\n  announcement:\n    l2: {{interfaces: [eth0, eth1]}}\n"
    )
}

testkit::backend_tests! {
    /// Issue 47 item 2: the `edge` pool's addresses are answered (L2) and advertised (BGP) only
    /// by Nodes its `nodeSelector` matches, and carry its communities and LOCAL_PREF; the `any`
    /// pool's go by election as before. A Node labelled later takes its elected share; the pool's
    /// `l2PreferredNodes` then puts every address of the pool on that node; its `l2Interfaces`
    /// are published for the responders of each address the node owns.
    async fn a_pools_node_selector_chooses_who_announces_its_addresses_and_its_routes_carry_its_attributes(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let client = cluster.client();
        let namespace = cluster.fresh_namespace("pool-policy").await.unwrap();
        let (a, b) = (format!("{namespace}-a"), format!("{namespace}-b"));
        let names = [a.as_str(), b.as_str()];
        let nodes: Api<Node> = Api::all(client.clone());
        for (name, edge) in [(&a, "false"), (&b, "true")] {
            let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"edge": edge}}})).unwrap();
            nodes.create(&PostParams::default(), &node).await.unwrap();
        }
        // Four edge addresses the election gives to each node, one `any` address each.
        let (edge_a, edge_b) = (elected("192.0.2.", names, &a, 4), elected("192.0.2.", names, &b, 4));
        let (any_a, any_b) = (elected("198.51.100.", names, &a, 1)[0], elected("198.51.100.", names, &b, 1)[0]);
        let all: Vec<IpAddr> = edge_a.iter().chain(&edge_b).copied().chain([any_a, any_b]).collect();
        let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
        services.create(&PostParams::default(), &lb_service(&namespace, "web").with_class(CLASS)).await.unwrap();
        let ingress: Vec<serde_json::Value> = all.iter().map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"})).collect();
        let status = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

        let dir = std::env::temp_dir().join(format!("ccm-pool-policy-{namespace}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cloud.yaml");
        let selector = "        nodeSelector: {matchLabels: {edge: 'true'}}\n\
                        \x20       bgp: {communities: ['65000:7'], largeCommunities: ['65000:1:2'], localPref: 300}\n";
        std::fs::write(&path, cloud_config(selector)).unwrap();
        let running_a = start(&client, &namespace, &a, &path);
        let running_b = start(&client, &namespace, &b, &path);
        let set = |v: &[IpAddr]| v.iter().copied().collect::<BTreeSet<IpAddr>>();
        let edge: BTreeSet<IpAddr> = set(&edge_a).union(&set(&edge_b)).copied().collect();

        // Only b is selected: it answers for every edge address, a for its `any` address alone.
        owns(&running_a, &set(&[any_a]), "a: no edge address").await;
        owns(&running_b, &edge.iter().copied().chain([any_b]).collect(), "b: every edge address").await;
        // BGP: a advertises the `any` addresses only; b every address, edge routes with the pool's attributes.
        let mut advertised_a = running_a.advertised.clone();
        let only_any = set(&[any_a, any_b]);
        // A bool, not the `Ref` wait_for returns: holding its read lock would block the
        // announcer's next send (and the worker thread with it).
        let got = tokio::time::timeout(Duration::from_secs(20), advertised_a.wait_for(|s| s.addresses == only_any))
            .await
            .is_ok_and(|r| r.is_ok());
        assert!(got, "a advertises {:?}", running_a.advertised.borrow().addresses);
        let mut advertised_b = running_b.advertised.clone();
        let every = set(&all);
        let got = tokio::time::timeout(Duration::from_secs(20), advertised_b.wait_for(|s| s.addresses == every))
            .await
            .is_ok_and(|r| r.is_ok());
        assert!(got, "b advertises {:?}", running_b.advertised.borrow().addresses);
        let routes: BTreeMap<IpAddr, _> = running_b.advertised.borrow().routes.clone();
        for address in &edge {
            let route = &routes[address];
            assert_eq!((route.communities.as_slice(), route.local_pref), (&[(65000, 7)][..], Some(300)), "{address}");
            assert_eq!(route.large_communities, [(65000, 1, 2)]);
        }
        assert!(!routes.contains_key(&any_a) && !routes.contains_key(&any_b), "the `any` pool sets no attributes");

        // a labelled: each node answers for the edge addresses the election gives it.
        nodes.patch(&a, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"edge": "true"}}}))).await.unwrap();
        owns(&running_a, &edge_a.iter().copied().chain([any_a]).collect(), "a: its elected edge addresses").await;
        owns(&running_b, &edge_b.iter().copied().chain([any_b]).collect(), "b: its elected edge addresses").await;

        // The pool prefers a: every edge address moves there; the `any` pool is untouched.
        let preferring = format!("{selector}        l2PreferredNodes: ['{a}']\n");
        std::fs::write(&path, cloud_config(&preferring)).unwrap();
        owns(&running_a, &edge.iter().copied().chain([any_a]).collect(), "a: the pool's preferred node").await;
        owns(&running_b, &set(&[any_b]), "b: its `any` address alone").await;

        // The pool answers on eth1 only: a publishes that for each edge address it owns (its
        // responders then answer for them there alone: `l2_interfaces`, namespaces), not for
        // the `any` pool's.
        std::fs::write(&path, cloud_config(&format!("{preferring}        l2Interfaces: [eth1]\n"))).unwrap();
        let eth1_only: BTreeMap<IpAddr, BTreeSet<String>> =
            edge.iter().map(|a| (*a, BTreeSet::from(["eth1".to_string()]))).collect();
        let mut only_on = running_a.only_on.clone();
        let got = tokio::time::timeout(Duration::from_secs(20), only_on.wait_for(|m| *m == eth1_only))
            .await
            .is_ok_and(|r| r.is_ok());
        assert!(got, "a publishes the edge pool's interface: {:?}", *running_a.only_on.borrow());
        owns(&running_a, &edge.iter().copied().chain([any_a]).collect(), "a: still every edge address").await;

        for running in [running_a, running_b] {
            running.cancel.cancel();
            running.task.await.unwrap();
        }
        for name in [&a, &b] {
            nodes.delete(name, &Default::default()).await.unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
