//! The event sink against both API server backends: under bursts far above its pace, every
//! object's final event is written, repeats become events.k8s.io series, and
//! `ccm_events_dropped_total` counts exactly what was not written, also at shutdown.

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::run_controller;
use ccm_framework::events::EventSink;
use ccm_framework::metrics::Metrics;
use ccm_framework::options::ControllerOptions;
use ccm_provider_fake::FakeProvider;
use k8s_openapi::api::core::v1::{Node, NodeSpec, ObjectReference, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use testkit::{TestCluster, lb_service};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

const ENSURING: &str = "EnsuringLoadBalancer";
const ENSURED: &str = "EnsuredLoadBalancer";
const WAIT: Duration = Duration::from_secs(90);

fn service_ref(namespace: &str, i: usize) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(namespace.into()),
        name: Some(format!("svc-{i}")),
        uid: Some(format!("uid-{i}")),
        ..Default::default()
    }
}

/// Occurrences an Event stands for: its series count, or 1.
fn occurrences(e: &Event) -> u64 {
    e.series.as_ref().map_or(1, |s| u64::try_from(s.count).unwrap_or(0))
}

/// The value of one sample line in the Prometheus text, 0 when absent.
fn sample(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0)
}

testkit::backend_tests! {
    /// 300 objects each publish Ensuring, Ensuring again and Ensured at once into a queue of
    /// 400 paced at 100 writes/s: every object's Ensured event is on the server, the repeat
    /// is a series, and written occurrences plus the dropped metric add up to all 900.
    async fn a_burst_above_the_pace_keeps_every_objects_final_event(backend) {
        const OBJECTS: usize = 300;
        let cluster = TestCluster::start(backend).await.unwrap();
        let ns = cluster.fresh_namespace("events").await.unwrap();
        let metrics = Metrics::new();
        let stop = CancellationToken::new();
        let sink = EventSink::spawn_with(cluster.client(), Some("test".into()), 400, 100, Some(&metrics), stop.clone());
        for reason in [ENSURING, ENSURING, ENSURED] {
            for i in 0..OBJECTS {
                let note = format!("{reason} {i}");
                sink.publish("service-controller", service_ref(&ns, i), EventType::Normal, reason, note, "EnsureLoadBalancer");
            }
        }
        let api: Api<Event> = Api::namespaced(cluster.client(), &ns);
        let deadline = Instant::now() + WAIT;
        let events = loop {
            let events = api.list(&ListParams::default()).await.unwrap().items;
            let written: u64 = events.iter().map(occurrences).sum();
            if sink.pending() == 0 && written + sink.dropped() == (3 * OBJECTS) as u64 {
                break events;
            }
            assert!(
                Instant::now() < deadline,
                "not drained: {} pending, {written} written, {} dropped",
                sink.pending(),
                sink.dropped()
            );
            sleep(Duration::from_millis(250)).await;
        };
        let finals: BTreeSet<_> = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(ENSURED))
            .filter_map(|e| e.regarding.as_ref()?.name.clone())
            .collect();
        assert_eq!(finals.len(), OBJECTS, "every object's final event landed");
        let series = events.iter().filter(|e| e.reason.as_deref() == Some(ENSURING) && occurrences(e) == 2).count();
        assert!(series > 0, "a repeated pending event is written as a series of 2");
        assert!(sink.dropped() > 0, "the burst overflowed the queue, so some Ensuring events were superseded");
        let text = metrics.encode();
        assert_eq!(sample(&text, "ccm_events_dropped_total{reason=\"superseded\"}"), sink.dropped(), "{text}");
        assert_eq!(sample(&text, "ccm_events_dropped_total{reason=\"queue_full\"}"), 0, "{text}");
        // A repeat whose first occurrence was already written is a series update instead.
        let aggregated = sample(&text, "ccm_events_aggregated_total");
        assert!(aggregated > 0 && aggregated <= OBJECTS as u64, "{text}");
        assert_eq!(sample(&text, "ccm_events_pending"), 0, "{text}");
        stop.cancel();
    }

    /// 200 LoadBalancer Services converge at 32 workers, faster than events are written:
    /// each Service still gets its EnsuredLoadBalancer event and nothing is dropped.
    async fn every_service_gets_its_ensured_event_when_many_converge_at_once(backend) {
        const SERVICES: usize = 200;
        let cluster = TestCluster::start(backend).await.unwrap();
        let ns = cluster.fresh_namespace("events").await.unwrap();
        let node = Node {
            metadata: ObjectMeta { name: Some("events-node".into()), ..Default::default() },
            spec: Some(NodeSpec { provider_id: Some("fake://events-node".into()), ..Default::default() }),
            ..Default::default()
        };
        Api::<Node>::all(cluster.client()).create(&PostParams::default(), &node).await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        for i in 0..SERVICES {
            services.create(&PostParams::default(), &lb_service(&ns, &format!("svc-{i}"))).await.unwrap();
        }
        let options = ControllerOptions { concurrent_service_syncs: 32, ..Default::default() };
        let started = Instant::now();
        let running = run_controller(
            cluster.client(),
            std::sync::Arc::new(FakeProvider::new()),
            options,
            Box::new(ServiceController::new()),
        )
        .await;
        let api: Api<Event> = Api::namespaced(cluster.client(), &ns);
        let deadline = Instant::now() + WAIT;
        loop {
            let events = api.list(&ListParams::default()).await.unwrap().items;
            let ensured: BTreeSet<_> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some(ENSURED))
                .filter_map(|e| e.regarding.as_ref()?.name.clone())
                .collect();
            // Ensuring and Ensured for each, both written (their counter moves just after).
            if ensured.len() == SERVICES && running.context.events.published() >= 2 * SERVICES as u64 {
                eprintln!("{} backend: {SERVICES} EnsuredLoadBalancer events in {:.2} s", backend.name(), started.elapsed().as_secs_f64());
                break;
            }
            assert!(Instant::now() < deadline, "{} of {SERVICES} Services have their event", ensured.len());
            sleep(Duration::from_millis(250)).await;
        }
        let text = running.context.metrics.encode();
        assert_eq!(running.context.events.dropped(), 0, "nothing dropped: {text}");
        assert_eq!(sample(&text, "ccm_events_written_total"), running.context.events.published(), "{text}");
        running.stop().await.unwrap();
    }

    /// The sink is stopped right after events are published: a few are all written within
    /// the drain grace; a burst that needs longer than the grace at the sink's pace is written
    /// in part, and the rest is counted as dropped with `reason="shutdown"`, so written plus
    /// counted is every occurrence.
    async fn events_pending_at_shutdown_are_written_or_counted(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let ns = cluster.fresh_namespace("events").await.unwrap();
        let api: Api<Event> = Api::namespaced(cluster.client(), &ns);
        let publish_and_stop = |count: usize, per_second: u32, offset: usize| {
            let metrics = Metrics::new();
            let stop = CancellationToken::new();
            let sink = EventSink::spawn_with(cluster.client(), Some("test".into()), 1000, per_second, Some(&metrics), stop.clone());
            for i in offset..offset + count {
                sink.publish("service-controller", service_ref(&ns, i), EventType::Normal, ENSURED, "done", "EnsureLoadBalancer");
            }
            stop.cancel();
            async move {
                let unwritten = sink.closed().await.expect("the writer finished");
                (unwritten, metrics.encode())
            }
        };

        let (unwritten, text) = publish_and_stop(20, 1000, 0).await;
        assert_eq!(unwritten, 0, "{text}");
        assert_eq!(sample(&text, "ccm_events_written_total"), 20, "{text}");
        assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 20);

        // 400 at 100/s need 4 s; the 2 s grace writes at most about 200 of them.
        let (unwritten, text) = publish_and_stop(400, 100, 1000).await;
        let written = sample(&text, "ccm_events_written_total");
        assert!(unwritten >= 150, "the grace bounds the drain: {unwritten} unwritten\n{text}");
        assert_eq!(sample(&text, "ccm_events_dropped_total{reason=\"shutdown\"}"), unwritten, "{text}");
        assert_eq!(written + unwritten, 400, "{text}");
        let on_server = api.list(&ListParams::default()).await.unwrap().items.len() as u64;
        assert_eq!(on_server, 20 + written, "what the metric says was written is on the server");
    }
}
