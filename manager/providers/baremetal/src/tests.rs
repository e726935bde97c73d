//! Provider-level tests: the factory, lookups through the `Instances` trait, load balancers
//! through the `LoadBalancer` trait, health, the example configs, and a concurrency stress test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use testkit::{Meta, NodeFixture};

use super::*;
use ccm_framework::registry::ClusterSettings;

const INVENTORY: &str = "\
instances:
  - name: node-1
    addresses:
      - {type: InternalIP, address: 10.0.0.11}
      - {type: Hostname, address: Node-1.lan}
    instanceType: small
    zone: rack-a
    region: home
    labels: {example.com/disk: ssd}
  - name: node-2
    providerID: metal://serial-2
    state: shutdown
loadBalancer:
  retryAfter: 5s
  pools:
    - name: v4
      cidrs: [192.168.50.0/30]
";

fn provider(doc: &str) -> BaremetalProvider {
    BaremetalProvider::from_cloud_config(Some(doc.as_bytes())).unwrap()
}

/// A LoadBalancer Service `default/<name>` with a uid, as the API server would give it.
fn service(name: &str) -> Service {
    testkit::lb_service("default", name).with_uid(&format!("uid-{name}"))
}

fn ingress_ips(status: &LoadBalancerStatus) -> Vec<String> {
    status.ingress.iter().flatten().filter_map(|i| i.ip.clone()).collect()
}

#[test]
fn the_factory_validates_without_side_effects_and_is_registered_as_baremetal() {
    let mut registry = Registry::new();
    register(&mut registry).unwrap();
    let settings = ClusterSettings::default();
    let p = registry.create(NAME, Some(INVENTORY.as_bytes()), &settings).unwrap();
    assert_eq!(p.name(), "baremetal");
    assert!(p.instances().is_some() && p.load_balancer().is_some());
    assert!(p.routes().is_none(), "routes are not supported");
    assert!(p.zones().is_none() && p.clusters().is_none());

    let err = registry.create(NAME, Some(b"instances:\n  - name: a\n  - name: a\n"), &settings).unwrap_err();
    assert!(
        matches!(err, RegistryError::Init { source: CloudError::InvalidConfig(ref m), .. } if m.contains("instances[1].name"))
    );
    let err = registry.create(NAME, None, &settings).unwrap_err();
    assert!(matches!(err, RegistryError::Init { source: CloudError::InvalidConfig(_), .. }));
}

#[test]
fn without_pools_there_is_no_load_balancer_capability() {
    let p = provider("instances:\n  - name: a\n");
    assert!(p.load_balancer().is_none(), "the service controller stays off");
    assert!(p.instances().is_some());
}

#[test]
fn the_builtin_registry_has_baremetal() {
    assert!(crate::test_registry().contains(NAME));
}

#[test]
fn config_health_reports_invalid_cloud_config_with_the_culprit() {
    let bad = config_health(Some(
        b"loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/8]}\n    - {name: b, cidrs: [10.1.0.0/16]}\n",
    ));
    assert_eq!(bad.reason(), health_reasons::INVALID_CLOUD_CONFIG);
    assert!(bad.message().contains("loadBalancer.pools[1].cidrs[0]"), "{}", bad.message());
    let good = config_health(Some(INVENTORY.as_bytes()));
    assert!(good.is_healthy());
    assert!(good.message().contains("2 instances") && good.message().contains("1 pools"), "{}", good.message());
}

#[tokio::test]
async fn lookup_by_provider_id_and_by_name_return_the_inventory_metadata() {
    let p = provider(INVENTORY);
    let by_name = p.instance_metadata(&testkit::node("node-1")).await.unwrap().unwrap();
    assert_eq!(by_name.provider_id, "baremetal://node-1");
    assert_eq!(by_name.instance_type, "small");
    assert_eq!((by_name.zone.as_str(), by_name.region.as_str()), ("rack-a", "home"));
    assert_eq!(by_name.additional_labels, BTreeMap::from([("example.com/disk".to_string(), "ssd".to_string())]));
    let by_hostname = p.instance_metadata(&testkit::node("NODE-1.LAN")).await.unwrap().unwrap();
    assert_eq!(by_hostname, by_name);
    let by_id =
        p.instance_metadata(&testkit::node("renamed").with_provider_id("metal://serial-2")).await.unwrap().unwrap();
    assert_eq!(by_id.provider_id, "metal://serial-2");
    assert_eq!(p.instance_metadata(&testkit::node("stranger")).await.unwrap(), None);
}

#[tokio::test]
async fn declared_shutdown_is_reported_and_running_instances_are_not() {
    let p = provider(INVENTORY);
    assert!(p.instance_shutdown(&testkit::node("node-2")).await.unwrap());
    assert!(!p.instance_shutdown(&testkit::node("node-1")).await.unwrap());
    assert!(!p.instance_shutdown(&testkit::node("stranger")).await.unwrap());
    // A shut-down instance still exists (L5 before L4).
    assert!(p.instance_exists(&testkit::node("node-2")).await.unwrap());
}

#[tokio::test]
async fn absent_nodes_exist_unless_delete_absent_nodes_is_on() {
    let keep = provider(INVENTORY);
    assert!(keep.instance_exists(&testkit::node("stranger")).await.unwrap(), "default: never delete on a typo");
    let delete = provider(&format!("{INVENTORY}lifecycle:\n  deleteAbsentNodes: true\n"));
    assert!(!delete.instance_exists(&testkit::node("stranger")).await.unwrap());
    assert!(delete.instance_exists(&testkit::node("node-1")).await.unwrap());
}

#[tokio::test]
async fn batch_lookups_answer_in_input_order_from_the_index() {
    let p = provider(&format!("{INVENTORY}lifecycle:\n  deleteAbsentNodes: true\n"));
    let nodes = [testkit::node("stranger"), testkit::node("node-2"), testkit::node("node-1")];
    let refs: Vec<&Node> = nodes.iter().collect();
    let exist: Vec<bool> = p.instances_exist(&refs).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(exist, [false, true, true]);
    let down: Vec<bool> = p.instances_shutdown(&refs).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(down, [false, true, false]);
    let ids: Vec<Option<String>> =
        p.instances_metadata(&refs).await.into_iter().map(|m| m.unwrap().map(|m| m.provider_id)).collect();
    assert_eq!(ids, [None, Some("metal://serial-2".into()), Some("baremetal://node-1".into())]);
    assert!(p.batch_size() >= 10_000);
}

#[tokio::test]
async fn load_balancers_get_vip_ingress_and_are_released_on_delete() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    let svc = service("web");
    assert_eq!(p.get_load_balancer("kubernetes", &svc).await.unwrap(), None, "absence is a value");
    let status = p.ensure_load_balancer("kubernetes", &svc, &[]).await.unwrap();
    let ingress = &status.ingress.as_ref().unwrap()[0];
    assert_eq!(ingress.ip.as_deref(), Some("192.168.50.0"));
    assert_eq!(ingress.ip_mode.as_deref(), Some("VIP"));
    assert_eq!(p.get_load_balancer("kubernetes", &svc).await.unwrap(), Some(status.clone()));
    assert_eq!(p.ensure_load_balancer("kubernetes", &svc, &[]).await.unwrap(), status, "idempotent");
    p.update_load_balancer("kubernetes", &svc, &[]).await.unwrap();
    p.ensure_load_balancer_deleted("kubernetes", &svc).await.unwrap();
    assert_eq!(p.get_load_balancer("kubernetes", &svc).await.unwrap(), None);
    p.ensure_load_balancer_deleted("kubernetes", &svc).await.unwrap();
}

#[tokio::test]
async fn s34_s35_held_addresses_are_listed_for_their_services_and_a_sweep_gives_a_gone_ones_back() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    let (kept, gone) = (service("kept"), service("gone"));
    p.ensure_load_balancer("kubernetes", &kept, &[]).await.unwrap();
    let status = p.ensure_load_balancer("kubernetes", &gone, &[]).await.unwrap();
    let freed = ingress_ips(&status);
    let listed = p.list_owned("kubernetes").await.unwrap();
    let services: Vec<(&str, Option<&str>, Option<&str>)> =
        listed.iter().map(|o| (o.kind.as_str(), o.service.as_deref(), o.service_uid.as_deref())).collect();
    assert_eq!(
        services,
        [("address", Some("default/gone"), Some("uid-gone")), ("address", Some("default/kept"), Some("uid-kept"))]
    );
    // The scan found default/gone without its Service (its deletion was missed): swept, the
    // address is its pool's again and the next Service gets it; the kept one is untouched.
    let orphan: Vec<_> = listed.iter().filter(|o| o.service.as_deref() == Some("default/gone")).cloned().collect();
    let results = p.delete_owned("kubernetes", &orphan).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(p.list_owned("kubernetes").await.unwrap().len(), 1);
    assert!(p.get_load_balancer("kubernetes", &kept).await.unwrap().is_some());
    let next = p.ensure_load_balancer("kubernetes", &service("next"), &[]).await.unwrap();
    assert_eq!(ingress_ips(&next), freed, "the swept address is handed out again");
    // A second sweep of the same listing finds it held for another Service: nothing is released.
    assert!(p.delete_owned("kubernetes", &orphan).await.iter().all(Result::is_ok));
    assert_eq!(p.list_owned("kubernetes").await.unwrap().len(), 2);
}

#[tokio::test]
async fn asking_proxy_without_the_data_path_is_an_invalid_annotation_and_takes_no_address() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    let mut svc = service("web");
    svc.metadata.annotations = Some([(proxy::IP_MODE_ANNOTATION.to_string(), "Proxy".to_string())].into());
    let err = p.ensure_load_balancer("kubernetes", &svc, &[]).await.unwrap_err();
    assert!(
        matches!(&err, CloudError::Refused { reason: Refusal::InvalidAnnotation, message } if message.contains("loadBalancer.mode: proxy")),
        "{err:?}"
    );
    assert_eq!(p.get_load_balancer("kubernetes", &svc).await.unwrap(), None, "no address was taken");
    svc.metadata.annotations = Some([(proxy::IP_MODE_ANNOTATION.to_string(), "VIP".to_string())].into());
    let status = p.ensure_load_balancer("kubernetes", &svc, &[]).await.unwrap();
    assert_eq!(status.ingress.unwrap()[0].ip_mode.as_deref(), Some("VIP"));
}

#[tokio::test]
async fn exhaustion_is_a_pool_exhausted_refusal_naming_the_usage() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    for i in 0..4 {
        p.ensure_load_balancer("k", &service(&format!("s{i}")), &[]).await.unwrap();
    }
    let err = p.ensure_load_balancer("k", &service("late"), &[]).await.unwrap_err();
    assert!(matches!(err, CloudError::Refused { reason: Refusal::PoolExhausted, .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("default/late") && message.contains("4 of 4"), "{message}");
}

#[tokio::test]
async fn malformed_requests_are_invalid_annotation_refusals_and_ensure_waits_for_the_restore() {
    let p = provider(INVENTORY);
    let err = p.ensure_load_balancer("k", &service("early"), &[]).await.unwrap_err();
    assert!(matches!(err, CloudError::RetryAfter { .. }), "{err:?}");
    p.restore_services(&[]);
    let mut bad = service("bad");
    bad.metadata.annotations = Some([(ipam::LOAD_BALANCER_IPS_ANNOTATION.to_string(), "not-an-ip".to_string())].into());
    let err = p.ensure_load_balancer("k", &bad, &[]).await.unwrap_err();
    assert!(
        matches!(err, CloudError::Refused { reason: Refusal::InvalidAnnotation, ref message } if message.contains("not-an-ip")),
        "{err:?}"
    );
}

#[tokio::test]
async fn health_is_probe_failing_only_when_every_probed_instance_fails() {
    let doc = "instances:\n  - name: a\n    addresses: [{type: InternalIP, address: 127.0.0.1}]\n  - name: b\n    addresses: [{type: InternalIP, address: 127.0.0.1}]\nlifecycle:\n  probe: {port: 1, failureThreshold: 1}\n";
    let p = provider(doc);
    assert!(p.health().await.is_healthy(), "not probed yet");
    let probe = p.lifecycle.probe.clone().unwrap();
    p.probes.record(0, false, &probe);
    let h = p.health().await;
    assert!(h.is_healthy() && h.message().contains("1 of 2 probed failing"), "{h:?}");
    p.probes.record(1, false, &probe);
    let h = p.health().await;
    assert_eq!(h.reason(), health_reasons::PROBE_FAILING);
    assert!(h.message().contains("all 2 probed instances") && h.message().contains("a, b"), "{}", h.message());
    assert!(p.instance_shutdown(&testkit::node("a")).await.unwrap(), "a failing probe reports shutdown");
    p.probes.record(0, true, &probe);
    assert!(!p.instance_shutdown(&testkit::node("a")).await.unwrap(), "and recovers");
    assert!(p.health().await.is_healthy());
}

#[tokio::test]
async fn start_probes_marks_a_closed_listener_shut_down_and_stops_on_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let doc = format!(
        "instances:\n  - name: a\n    addresses: [{{type: InternalIP, address: 127.0.0.1}}]\nlifecycle:\n  probe: {{port: {port}, interval: 20ms, timeout: 20ms, failureThreshold: 2}}\n"
    );
    let p = provider(&doc);
    let shutdown = CancellationToken::new();
    p.start_probes(shutdown.clone());
    let a = testkit::node("a");
    let wait_until = |want: bool| {
        let p = &p;
        let a = &a;
        async move {
            for _ in 0..500 {
                if p.probes.status(0).is_some_and(|s| s.probed) && p.instance_shutdown(a).await.unwrap() == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("shutdown never became {want}");
        }
    };
    wait_until(false).await;
    drop(listener);
    wait_until(true).await;
    shutdown.cancel();
}

#[tokio::test]
async fn a_pool_only_edit_reloads_in_place_and_keeps_live_addresses() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    let lb = p.load_balancer().unwrap();
    let web = lb.ensure_load_balancer("c", &service("web"), &[]).await.unwrap();
    assert_eq!(ingress_ips(&web), ["192.168.50.0"]);
    let fingerprint = p.restart_fingerprint();

    let edited = INVENTORY.replace("cidrs: [192.168.50.0/30]", "cidrs: [192.168.50.0/30, 192.168.60.0/30]");
    assert!(matches!(p.reload(Some(edited.as_bytes())), Reload::Applied(_)));
    assert_eq!(p.reload(Some(edited.as_bytes())), Reload::Unchanged, "the same edit again changes nothing");
    assert_eq!(p.restart_fingerprint(), fingerprint, "a pool edit keeps the restart fingerprint");
    assert_eq!(provider(&edited).restart_fingerprint(), fingerprint, "and agrees with a fresh provider");
    assert_eq!(ingress_ips(&lb.ensure_load_balancer("c", &service("web"), &[]).await.unwrap()), ["192.168.50.0"]);

    // The first pool is replaced: web keeps its address, outside the pools, and health says so.
    let moved = INVENTORY.replace("cidrs: [192.168.50.0/30]", "cidrs: [192.168.60.0/30]");
    match p.reload(Some(moved.as_bytes())) {
        Reload::Applied(text) => assert!(text.contains("1 kept outside"), "{text}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ingress_ips(&lb.ensure_load_balancer("c", &service("web"), &[]).await.unwrap()), ["192.168.50.0"]);
    assert_eq!(ingress_ips(&lb.ensure_load_balancer("c", &service("api"), &[]).await.unwrap()), ["192.168.60.0"]);
    let health = p.health().await;
    assert!(health.message().contains("1 assigned addresses outside the pools"), "{health:?}");
    lb.ensure_load_balancer_deleted("c", &service("web")).await.unwrap();
    assert!(!p.health().await.message().contains("outside the pools"));
}

#[tokio::test]
async fn an_edit_beyond_the_pools_needs_a_restart_and_changes_nothing() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    let fingerprint = p.restart_fingerprint();
    let edited = INVENTORY
        .replace("zone: rack-a", "zone: rack-b")
        .replace("cidrs: [192.168.50.0/30]", "cidrs: [192.168.60.0/30]");
    match p.reload(Some(edited.as_bytes())) {
        Reload::RestartNeeded(text) => assert_eq!(text, "changed: instances"),
        other => panic!("{other:?}"),
    }
    assert_ne!(provider(&edited).restart_fingerprint(), fingerprint);
    let api = p.load_balancer().unwrap().ensure_load_balancer("c", &service("api"), &[]).await.unwrap();
    assert_eq!(ingress_ips(&api), ["192.168.50.0"], "the old pools stay until the restart");
    assert_eq!(p.instance_metadata(&testkit::node("node-1")).await.unwrap().unwrap().zone, "rack-a");
}

#[tokio::test]
async fn an_invalid_edit_is_refused_with_its_path_and_the_running_pools_stay() {
    let p = provider(INVENTORY);
    p.restore_services(&[]);
    let edited = INVENTORY.replace("cidrs: [192.168.50.0/30]", "cidrs: [192.168.50.0/30, secret-banana]");
    match p.reload(Some(edited.as_bytes())) {
        Reload::Invalid(CloudError::InvalidConfig(m)) => {
            assert!(m.contains("loadBalancer.pools[0].cidrs[1]") && !m.contains("banana"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(p.reload(None), Reload::Invalid(_)));
    let api = p.load_balancer().unwrap().ensure_load_balancer("c", &service("api"), &[]).await.unwrap();
    assert_eq!(ingress_ips(&api), ["192.168.50.0"]);
}

#[test]
fn every_example_cloud_config_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut parsed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        BaremetalProvider::from_cloud_config(Some(&bytes)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        parsed += 1;
    }
    assert!(parsed >= 3, "expected the example configs in {}", dir.display());
}

#[test]
fn the_readme_example_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let section = readme.split("# ccm-provider-baremetal").nth(1).expect("the README documents the provider");
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap();
    let p = BaremetalProvider::from_cloud_config(Some(block.as_bytes())).unwrap();
    // The complete example sets every section.
    assert!(!p.inventory().is_empty() && !p.allocator().pools().is_empty() && p.lifecycle.probe.is_some());
}

/// 500 Services against exactly 256 usable addresses with 16 concurrent callers: exactly 256
/// distinct addresses are handed out, every other caller gets a retry-after error, and once
/// 10 Services are deleted, 10 of the waiting ones get exactly the freed addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_500_services_16_callers_256_addresses_never_duplicate() {
    let p = Arc::new(provider("loadBalancer:\n  retryAfter: 1s\n  pools:\n    - {name: v4, cidrs: [10.20.0.0/24]}\n"));
    p.restore_services(&[]);
    let services: Arc<Vec<Service>> = Arc::new((0..500).map(|i| service(&format!("svc-{i:03}"))).collect());

    // 16 callers drain a shared queue, like 16 service workers.
    async fn drain(
        p: Arc<BaremetalProvider>,
        services: Arc<Vec<Service>>,
        queue: Vec<usize>,
    ) -> Vec<(usize, CloudResult<LoadBalancerStatus>)> {
        let queue = Arc::new(std::sync::Mutex::new(queue));
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let workers: Vec<_> = (0..16)
            .map(|_| {
                let (p, services, queue, barrier) = (p.clone(), services.clone(), queue.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut results = Vec::new();
                    loop {
                        let next = queue.lock().unwrap().pop();
                        let Some(i) = next else { return results };
                        results.push((i, p.ensure_load_balancer("k", &services[i], &[]).await));
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await.unwrap());
        }
        all
    }

    let results = drain(p.clone(), services.clone(), (0..500).collect()).await;
    let mut holders: BTreeMap<String, usize> = BTreeMap::new();
    let mut waiting = Vec::new();
    for (i, result) in results {
        match result {
            Ok(status) => {
                let ips = ingress_ips(&status);
                assert_eq!(ips.len(), 1);
                assert!(holders.insert(ips[0].clone(), i).is_none(), "{} handed out twice", ips[0]);
            }
            Err(CloudError::Refused { reason: Refusal::PoolExhausted, .. }) => waiting.push(i),
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(holders.len(), 256, "exactly the pool's usable addresses");
    assert_eq!(waiting.len(), 244);

    // Delete 10 Services; the waiting ones retry concurrently.
    let freed: BTreeSet<String> = holders.keys().step_by(25).take(10).cloned().collect();
    for ip in &freed {
        p.ensure_load_balancer_deleted("k", &services[holders[ip]]).await.unwrap();
    }
    let retried = drain(p.clone(), services.clone(), waiting).await;
    let mut got = BTreeSet::new();
    for (_, result) in retried {
        if let Ok(status) = result {
            assert!(got.insert(ingress_ips(&status)[0].clone()));
        }
    }
    assert_eq!(got, freed, "exactly the freed addresses, each to one waiting Service");
    assert_eq!(p.allocator().usage()[0].in_use, 256);
}

/// Random interleavings of ensure and delete from 16 tasks never give one address to two
/// Services, and every Service's addresses stay put while it lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_concurrent_ensure_and_delete_keep_addresses_unique_and_stable() {
    let p = Arc::new(provider(
        "loadBalancer:\n  pools:\n    - {name: a, ranges: [\"10.0.0.10-10.0.0.40\"], avoidBuggyIPs: true}\n    - {name: b, cidrs: [\"fd00::/122\"]}\n",
    ));
    p.restore_services(&[]);
    let tasks: Vec<_> = (0..16u64)
        .map(|seed| {
            let p = p.clone();
            tokio::spawn(async move {
                // xorshift: deterministic per task, no extra dependency.
                let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut seen: BTreeMap<usize, Vec<String>> = BTreeMap::new();
                for _ in 0..400 {
                    // Each task owns 8 Services, so per-key calls are never concurrent (as in the controller).
                    let n = (next() % 8) as usize;
                    let mut svc = service(&format!("t{seed}-s{n}"));
                    if n.is_multiple_of(3) {
                        let spec = svc.spec.as_mut().unwrap();
                        spec.ip_family_policy = Some("PreferDualStack".into());
                        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
                    }
                    if next() % 4 == 0 {
                        p.ensure_load_balancer_deleted("k", &svc).await.unwrap();
                        seen.remove(&n);
                    } else if let Ok(status) = p.ensure_load_balancer("k", &svc, &[]).await {
                        let ips = ingress_ips(&status);
                        if let Some(before) = seen.get(&n) {
                            assert!(ips.starts_with(before), "addresses moved: {before:?} -> {ips:?}");
                        }
                        seen.insert(n, ips);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Invariant: every address recorded once.
    let mut all = BTreeSet::new();
    for seed in 0..16 {
        for n in 0..8 {
            let svc = service(&format!("t{seed}-s{n}"));
            for ip in p.allocator().assigned(&ServiceKey::of(&svc), &svc.metadata.uid).unwrap_or_default() {
                assert!(all.insert(ip), "{ip} assigned twice");
            }
        }
    }
    let in_use: usize = p.allocator().usage().iter().map(|u| u.in_use).sum();
    assert_eq!(in_use, all.len());
}

#[test]
fn no_factory_or_health_error_quotes_the_document() {
    // What the manager and the operator print: the factory's error and the config health.
    for doc in crate::config::tests::token_documents() {
        let e = BaremetalProvider::from_cloud_config(Some(doc.as_bytes())).err().expect("refused by the factory");
        for message in [e.to_string(), format!("{e:?}")] {
            assert!(!message.contains("SECRET"), "{doc}\n=> {message}");
        }
        let health = config_health(Some(doc.as_bytes()));
        assert!(!health.message().contains("SECRET"), "{doc}\n=> {}", health.message());
    }
}

#[test]
fn hostile_documents_are_refused_by_the_registry_with_the_limit_they_break() {
    let registry = test_registry();
    let cluster = ClusterSettings::default();
    for (name, doc, _) in ccm_framework::safe_yaml::hostile::all() {
        let e = registry.create(NAME, Some(&doc), &cluster).err().expect("refused");
        assert!(e.to_string().contains("limit of"), "{name}: {e}");
    }
}
