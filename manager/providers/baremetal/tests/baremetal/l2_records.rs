//! Issue 47 item 1: which node answers, as data. Two announcers on the API server keep one
//! `ServiceAnnouncement` per Service naming the answering node, its addresses (ARP, NDP) and
//! since when; after a graceful failover the record names the new node; a gone node's record is
//! deleted by the first live announcer; nothing is left once every announcer stopped. And when
//! no node may answer (`externalTrafficPolicy: Local`, endpoints only where no announcer runs),
//! the Service says so.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings};
use ccm_provider_baremetal::announce::elect;
use ccm_provider_baremetal::announce::guard::Facts;
use ccm_provider_baremetal::ipam::IpBlock;
use crds::announcement::{AnnouncementProtocol, ServiceAnnouncement};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::ServiceFixture;
use testkit::{TestCluster, eventually_within, lb_service};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A class of this test's own, so that on a shared genuine server only its Service counts.
const CLASS: &str = "ccm.rs/l2-records-test";
const NODES: [&str; 2] = ["rec-a", "rec-b"];
const WAIT: Duration = Duration::from_secs(20);

struct Running {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

fn start(client: &kube::Client, namespace: &str, node: &str) -> Running {
    let mut settings = crate::kit::fast_announcer(node, namespace, CLASS);
    settings.record = true;
    settings.interfaces = vec!["eth9".into()];
    let (tx, _owned) = watch::channel(BTreeSet::new());
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (client, cancel) = (client.clone(), cancel.clone());
        async move { announcer::run(client, settings, tx, None, cancel).await.expect("announcer runs") }
    });
    Running { cancel, task }
}

/// The nodes the records of Service `web` name, once they are exactly `want`.
async fn records_name(api: &Api<ServiceAnnouncement>, want: &[&str], within: Duration) -> Vec<ServiceAnnouncement> {
    let what = format!("the records of web name exactly {want:?}");
    eventually_within(&what, within, || async {
        let list = api.list(&ListParams::default()).await.ok()?.items;
        let web: Vec<ServiceAnnouncement> = list.into_iter().filter(|r| r.spec.service.name == "web").collect();
        let nodes: Vec<&str> = web.iter().map(|r| r.spec.node.as_str()).collect();
        (nodes == want).then_some(web)
    })
    .await
}

testkit::backend_tests! {
    async fn the_answering_node_is_recorded_per_service_and_follows_a_failover_and_a_gone_nodes_record_is_deleted(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        cluster.install_crd(&crds::announcement_crd()).await.expect("the announcement CRD");
        let client = cluster.client();
        let namespace = cluster.fresh_namespace("l2rec").await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
        services.create(&PostParams::default(), &lb_service(&namespace, "web").with_class(CLASS)).await.unwrap();
        // Two addresses the same node wins, so one record lists both.
        let (v4, v6) = crate::kit::pair_one_node_wins(NODES);
        let status = json!({"status": {"loadBalancer": {"ingress": [
            {"ip": v4.to_string(), "ipMode": "VIP"}, {"ip": v6.to_string(), "ipMode": "VIP"}]}}});
        services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        let owner = elect::elect(v4, NODES).unwrap();
        let other = NODES.into_iter().find(|n| *n != owner).unwrap();
        let records: Api<ServiceAnnouncement> = Api::namespaced(client.clone(), &namespace);

        // A record left by a node that is gone (a crash): no Lease, so it is deleted.
        let stale = json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "ServiceAnnouncement",
            "metadata": {"name": "rec-gone.x.web", "labels": {"ccm.rs/announcer": "l2"}},
            "spec": {"node": "rec-gone", "service": {"namespace": "x", "name": "web"},
                     "since": "2026-01-01T00:00:00Z", "addresses": [{"address": "192.0.2.200", "protocol": "ARP", "since": "2026-01-01T00:00:00Z"}]}});
        records.patch("rec-gone.x.web", &PatchParams::apply("test").force(), &Patch::Apply(&stale)).await.unwrap();

        let started = k8s_openapi::jiff::Timestamp::now();
        let mut running: Vec<(&str, Running)> = NODES.iter().map(|n| (*n, start(&client, &namespace, n))).collect();
        let first = records_name(&records, &[owner], WAIT).await;
        let record = &first[0];
        assert_eq!(record.metadata.name.as_deref(), Some(format!("{owner}.{namespace}.web").as_str()));
        assert_eq!(record.spec.service.namespace, namespace);
        let addresses: Vec<(String, AnnouncementProtocol)> =
            record.spec.addresses.iter().map(|a| (a.address.clone(), a.protocol)).collect();
        assert_eq!(addresses, [(v4.to_string(), AnnouncementProtocol::Arp), (v6.to_string(), AnnouncementProtocol::Ndp)]);
        assert_eq!(record.spec.interfaces, ["eth9"]);
        assert!(record.spec.since.0 >= started.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(1)).unwrap(), "since {:?}", record.spec.since);
        if cluster.is_genuine() {
            // What `kubectl get svcann` shows: the CRD's columns as the server renders them.
            let path = format!("/apis/ccm.rs/v1alpha1/namespaces/{namespace}/serviceannouncements/{owner}.{namespace}.web");
            let request = http::Request::get(path)
                .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
                .body(Vec::new())
                .unwrap();
            let table: serde_json::Value = client.request(request).await.expect("the table");
            let cells = &table["rows"][0]["cells"];
            assert_eq!(cells[1], json!(namespace), "{table}");
            assert_eq!((&cells[2], &cells[3]), (&json!("web"), &json!(owner)), "{table}");
            // A CRD column shows one value: the first address (`-o yaml` lists them all).
            assert_eq!(cells[4], json!(v4.to_string()), "the Address column: {table}");
        }
        eventually_within("the gone node's record is deleted", WAIT, || async {
            records.get_opt("rec-gone.x.web").await.ok()?.is_none().then_some(())
        })
        .await;

        // Graceful stop of the owner: its record goes, the other node's names it as answering.
        let position = running.iter().position(|(n, _)| *n == owner).unwrap();
        let (_, stopped) = running.remove(position);
        let t0 = Instant::now();
        stopped.cancel.cancel();
        stopped.task.await.unwrap();
        let moved = records_name(&records, &[other], WAIT).await;
        let took = t0.elapsed();
        assert!(moved[0].spec.since > record.spec.since, "the new node answers since the failover");
        assert_eq!(moved[0].spec.addresses.len(), 2);

        // The owner comes back and wins its addresses back: the record names it again.
        let back = start(&client, &namespace, owner);
        records_name(&records, &[owner], WAIT).await;
        eprintln!("ServiceAnnouncement ({backend:?}): the record names the new node {} ms after a graceful stop", took.as_millis());

        // Every announcer stopped: no record is left.
        back.cancel.cancel();
        back.task.await.unwrap();
        for (_, r) in running {
            r.cancel.cancel();
            r.task.await.unwrap();
        }
        let left = records.list(&ListParams::default()).await.unwrap().items;
        assert!(left.is_empty(), "records left after every announcer stopped: {:?}", left.iter().map(|r| r.metadata.name.clone()).collect::<Vec<_>>());
    }
}

testkit::backend_tests! {
    async fn a_local_service_whose_endpoints_run_where_no_announcer_lives_gets_a_warning_naming_those_nodes(backend) {
        use ccm_provider_baremetal::announce::announce_reasons::NO_ELIGIBLE_ANNOUNCER;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let cluster = TestCluster::start(backend).await.unwrap();
        let client = cluster.client();
        let namespace = cluster.fresh_namespace("l2strand").await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
        let mut svc = lb_service(&namespace, "web").with_class(CLASS);
        svc.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
        services.create(&PostParams::default(), &svc).await.unwrap();
        let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.33", "ipMode": "VIP"}]}}});
        services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.5"], "nodeName": "no-announcer-here", "conditions": {"ready": true}}],
            "ports": [{"port": 8080, "protocol": "TCP"}],
        });
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
        slices.create(&PostParams::default(), &serde_json::from_value(slice).unwrap()).await.unwrap();

        let pools = ["192.0.2.0/24"].map(|p| IpBlock::parse_cidr(p).expect("pool")).to_vec();
        let mut settings = AnnouncerSettings::new("rec-a", namespace.as_str()).with_facts(Facts::of_pools(pools));
        settings.class = Some(CLASS.into());
        settings.settle = Duration::from_millis(500);
        let (tx, owned) = watch::channel(BTreeSet::new());
        let cancel = CancellationToken::new();
        let events = ccm_framework::events::EventSink::spawn(client.clone(), Some("rec-a".into()), cancel.clone());
        let task = tokio::spawn({
            let (client, cancel) = (client.clone(), cancel.clone());
            async move { announcer::run(client, settings, tx, Some(events), cancel).await.expect("announcer runs") }
        });
        let note = eventually_within("a NoEligibleAnnouncer event on the Service", WAIT, || async {
            cluster.events(NO_ELIGIBLE_ANNOUNCER).await.ok()?.into_iter().find_map(|e| {
                let on = e.regarding.as_ref()?;
                (on.namespace.as_deref() == Some(namespace.as_str()) && on.name.as_deref() == Some("web")).then(|| e.note.unwrap_or_default())
            })
        })
        .await;
        assert!(note.starts_with("192.0.2.33 not announced") && note.contains("run on no-announcer-here"), "{note}");
        assert!(owned.borrow().is_empty(), "nobody answers for it");
        cancel.cancel();
        task.await.unwrap();
    }
}
