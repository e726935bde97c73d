//! Scenarios on a real kubelet-backed cluster (`e2e::realcluster`): the images and the chart
//! installed as a user would, the manager in Pods the kubelet starts, a real Node initialized,
//! load-balancer traffic to a real Pod.
//!
//! One cluster serves the whole run, so this binary has its own runner (`harness = false`):
//! it starts the cluster once, runs the scenarios in order (each builds on what the earlier
//! ones installed, as a user's session would), stops the cluster, and checks last that the
//! host is as it was found. It prints libtest's lines, so `cargo test` and CI count it.
//! Without `CCM_REALCLUSTER_ASSETS` it prints one line saying how to enable it.
//!
//! With `CCM_REALCLUSTER_NODES=3` the three-Node scenarios follow the others: the runner grows
//! the running cluster by two Nodes (`RealCluster::add_nodes`) first. Without it they are
//! reported as ignored.

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::realcluster::{self, Place, RealCluster, images};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

// The three-Node scenarios, in `realcluster/` beside this crate root.
#[path = "realcluster/announcer_metrics.rs"]
mod announcer_metrics;
#[path = "realcluster/bgp.rs"]
mod bgp;
#[path = "realcluster/bgp_bfd.rs"]
mod bgp_bfd;
#[path = "realcluster/daemonset.rs"]
mod daemonset;
#[path = "realcluster/failover.rs"]
mod failover;
#[path = "realcluster/join.rs"]
mod join;
#[path = "realcluster/l2.rs"]
mod l2;
#[path = "realcluster/l2_health.rs"]
mod l2_health;
#[path = "realcluster/l2_policy.rs"]
mod l2_policy;
#[path = "realcluster/lifecycle.rs"]
mod lifecycle;
#[path = "realcluster/local.rs"]
mod local;
#[path = "realcluster/multinode.rs"]
mod multinode;
#[path = "realcluster/routes.rs"]
mod routes;
#[path = "realcluster/tokens.rs"]
mod tokens;
#[path = "realcluster/upstream_aws.rs"]
mod upstream_aws;
#[path = "realcluster/upstream_image.rs"]
mod upstream_image;

/// What every scenario gets.
struct Ctx {
    cluster: RealCluster,
    client: Client,
    repo: PathBuf,
    /// Whether the BIRD sidecar image was built and imported (needs Debian's bird2 on the host).
    bird_image: bool,
}

type Scenario = fn(Arc<Ctx>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// The scenarios, in the order they run.
const SCENARIOS: &[(&str, Scenario)] = &[
    ("operator_installs_from_the_chart_under_restricted_pod_security_and_starts_on_a_fresh_tainted_node", |c| {
        Box::pin(chart_install(c))
    }),
    ("deployment_mode_manager_reads_its_mounted_cloud_config_and_initializes_the_kubelets_node", |c| {
        Box::pin(deployment_initializes_node(c))
    }),
    ("load_balancer_address_carries_traffic_from_the_host_to_a_pod", |c| Box::pin(lb_traffic(c))),
    ("two_replicas_on_one_node_one_leads_and_a_leader_delete_hands_over_while_traffic_continues", |c| {
        Box::pin(leader_handover(c))
    }),
    ("pod_template_change_rolls_out_on_one_node_with_the_default_two_replicas", |c| Box::pin(rollout_one_node(c))),
    ("m7_a_leader_migration_file_reaches_the_manager_pod_through_the_kubelet_and_the_leader_takes_both_leases", |c| {
        Box::pin(leader_migration_file(c))
    }),
    ("cloud_config_rotation_reaches_the_pods_pool_edits_reload_other_edits_roll", |c| Box::pin(rotation(c))),
    ("operator_and_manager_metrics_are_scraped_with_the_metrics_reader_token", |c| Box::pin(metrics(c))),
    ("vip_mode_address_announced_by_l2_reaches_a_pod_through_kube_proxy_from_a_client_namespace", |c| {
        Box::pin(vip_by_l2(c))
    }),
    ("a_crash_looping_manager_shows_degraded_within_a_minute_and_provider_health_is_not_claimed", |c| {
        Box::pin(crash_loop(c))
    }),
    ("daemonset_mode_replaces_the_deployment_and_keeps_carrying_traffic", |c| Box::pin(to_daemonset(c))),
    ("embedded_mode_when_the_chart_did_not_enable_it_is_refused_before_anything_is_torn_down", |c| {
        Box::pin(embedded_not_enabled(c))
    }),
    ("embedded_mode_with_proxy_is_refused_before_anything_is_torn_down", |c| Box::pin(embedded_proxy_refused(c))),
    ("embedded_mode_runs_in_the_operator_and_the_garbage_collector_removes_the_daemonset", |c| {
        Box::pin(to_embedded(c))
    }),
    ("deleting_the_resource_removes_every_child_and_its_finalizer_and_releases_the_lease", |c| {
        Box::pin(delete_resource(c))
    }),
    ("helm_upgrade_to_another_tag_rolls_the_operator_and_uninstall_leaves_only_helms_keeps", |c| {
        Box::pin(helm_upgrade_and_uninstall(c))
    }),
];

/// The scenarios on three Nodes, after the others, when `CCM_REALCLUSTER_NODES=3`.
/// Every name starts `three_nodes_`, so `-- three_nodes_` runs just these.
const THREE_NODE_SCENARIOS: &[(&str, Scenario)] = &[
    (
        "three_nodes_ready_pods_reach_each_other_across_nodes_nodeports_answer_the_client_and_a_stopped_node_goes_not_ready_and_comes_back",
        |c| Box::pin(three_nodes(c)),
    ),
    (
        "three_nodes_leader_failover_a_powered_off_leaders_node_hands_over_to_another_nodes_manager_and_traffic_resumes",
        |c| Box::pin(failover::leader_failover(c)),
    ),
    ("three_nodes_a_drain_evicts_one_manager_and_the_pod_disruption_budget_holds_back_the_last", |c| {
        Box::pin(failover::drain_respects_the_pdb(c))
    }),
    ("three_nodes_daemonset_mode_runs_one_manager_per_node_and_rolls_out_node_by_node", |c| {
        Box::pin(daemonset::daemonset_one_per_node_rolls_node_by_node(c))
    }),
    ("three_nodes_l2_one_node_answers_for_an_address_and_another_claims_it_when_that_node_loses_power", |c| {
        Box::pin(l2::l2_address_moves_when_its_node_loses_power(c))
    }),
    ("three_nodes_l2_a_node_whose_kube_proxy_fails_gives_its_address_up_and_takes_it_back_when_it_returns", |c| {
        Box::pin(l2_health::l2_address_moves_when_its_nodes_kube_proxy_fails_and_comes_back(c))
    }),
    ("three_nodes_l2_a_pools_node_selector_chooses_the_answering_node_and_a_node_labelled_later_takes_over", |c| {
        Box::pin(l2_policy::l2_address_follows_the_pools_node_selector(c))
    }),
    ("three_nodes_external_traffic_policy_local_is_answered_only_where_an_endpoint_runs_and_follows_it", |c| {
        Box::pin(local::local_policy_answered_only_where_an_endpoint_runs(c))
    }),
    ("three_nodes_bgp_every_nodes_bird_sidecar_peers_with_the_router_ecmp_and_a_powered_off_node_is_withdrawn", |c| {
        Box::pin(bgp::bgp_every_node_peers_with_the_router_ecmp_and_a_stopped_node_is_withdrawn(c))
    }),
    (
        "three_nodes_bgp_bfd_withdraws_a_powered_off_node_before_the_hold_time_and_graceful_restart_keeps_routes_while_an_announcer_pod_is_replaced",
        |c| Box::pin(bgp_bfd::bgp_bfd_and_graceful_restart_through_the_operator(c)),
    ),
    (
        "three_nodes_an_announcer_pods_own_token_writes_only_its_nodes_lease_and_the_manager_listens_on_its_pod_address",
        |c| {
            Box::pin(
                tokens::an_announcer_pods_token_writes_only_its_nodes_lease_and_the_manager_listens_on_its_pod_address(
                    c,
                ),
            )
        },
    ),
    ("three_nodes_lifecycle_a_removed_machines_node_is_deleted_and_a_shut_down_machines_node_is_tainted", |c| {
        Box::pin(lifecycle::lifecycle_a_removed_machines_node_is_deleted_and_a_shut_down_ones_is_tainted(c))
    }),
    // Late: it gives the Nodes pod CIDRs, which stay.
    ("three_nodes_r14_watch_based_routes_follow_the_kubelets_nodes_and_count_passes_by_trigger", |c| {
        Box::pin(routes::watch_based_routes_follow_the_kubelets_nodes_and_count_passes_by_trigger(c))
    }),
    // It deletes the resource and runs managers on the host.
    ("three_nodes_a_registering_nodes_wait_for_initialization_ours_beside_upstream", |c| {
        Box::pin(join::a_registering_nodes_wait_for_initialization_ours_beside_upstream(c))
    }),
    // After the resource is gone: its own resource runs an upstream image.
    (
        "three_nodes_an_upstream_ccm_image_from_the_resource_initializes_a_registering_node_reports_its_leader_and_rolls_on_rotation",
        |c| {
            Box::pin(upstream_image::an_upstream_image_initializes_a_registering_node_reports_its_leader_and_rolls_on_rotation(c))
        },
    ),
    (
        "three_nodes_an_upstream_ccm_started_by_hand_is_reported_on_a_new_resource_which_starts_nothing_until_it_stops",
        |c| Box::pin(upstream_image::a_foreign_ccm_started_by_hand_is_reported_and_nothing_fights_it(c)),
    ),
    (
        "three_nodes_an_upstream_aws_image_initializes_instances_nodes_makes_an_nlb_and_one_edit_hands_it_to_the_rust_manager",
        |c| Box::pin(upstream_aws::an_upstream_aws_image_makes_an_nlb_and_one_edit_hands_it_to_the_rust_manager(c)),
    ),
];

/// How many Nodes the run may grow to (default 1: the three-Node scenarios are ignored).
const NODES_ENV: &str = "CCM_REALCLUSTER_NODES";

/// `CCM_REALCLUSTER_HOLD=SECONDS` keeps the cluster that long after the scenarios (only after
/// a failure with `CCM_REALCLUSTER_HOLD=failure:SECONDS`), to look at it with kubectl.
const HOLD_ENV: &str = "CCM_REALCLUSTER_HOLD";

/// The check that runs after the cluster stopped.
const HOST_CHECK: &str = "host_is_left_as_it_was_found";

const OPERATOR_NS: &str = "ccm-system";
const CCM_NS: &str = "kube-system";
const CCM_NAME: &str = "baremetal";
const SECRET: &str = "baremetal-cloud-config";
const APP_NS: &str = "lb-demo";
/// The load-balancer pool: loopback, so the host reaches the proxy's listener and nothing
/// leaves the machine.
const POOL: &str = "127.0.0.240/28";
const SERVICE_PORT: u16 = 8000;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<&str> = SCENARIOS.iter().chain(THREE_NODE_SCENARIOS).map(|(n, _)| *n).chain([HOST_CHECK]).collect();
    if args.iter().any(|a| a == "--list") {
        for name in &names {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    // Several filters pick every scenario any of them matches (`-- three_nodes_ready three_nodes_leader three_nodes_l2`:
    // a later scenario with the ones it builds on).
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let pick = |list: &'static [(&'static str, Scenario)]| -> Vec<&'static (&'static str, Scenario)> {
        list.iter().filter(|(n, _)| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str()))).collect()
    };
    let (selected, three) = (pick(SCENARIOS), pick(THREE_NODE_SCENARIOS));
    let filtered_out = SCENARIOS.len() + THREE_NODE_SCENARIOS.len() - selected.len() - three.len();
    let nodes: usize = std::env::var(NODES_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    println!("\nrunning {} tests", selected.len() + three.len() + 1);
    let Some(assets) = realcluster::assets_dir() else {
        println!("{}", realcluster::HOW_TO_ENABLE);
        println!(
            "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; {filtered_out} filtered out\n",
            names.len()
        );
        return ExitCode::SUCCESS;
    };
    let started = Instant::now();
    let state = Path::new(env!("CARGO_TARGET_TMPDIR")).join("realcluster");
    // Started from this (the main) thread, which outlives every scenario: the daemons die
    // with the thread that started them.
    let cluster = match RealCluster::start(&assets, &state) {
        Ok(c) => c,
        Err(e) => {
            println!("real cluster did not start: {e}");
            println!("\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; {filtered_out} filtered out\n");
            return ExitCode::FAILURE;
        }
    };
    println!("real cluster: Node {} Ready in {:.1} s ({})", cluster.node_name, cluster.start_seconds, cluster.api_url);

    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            println!("tokio runtime: {e}");
            let _ = cluster.stop();
            return ExitCode::FAILURE;
        }
    };
    let mut outcome = Outcome { passed: 0, failed: Vec::new(), ignored: 0 };
    let prepared = runtime.block_on(prepare(&cluster));
    match prepared {
        Err(e) => {
            println!("preparing the cluster failed: {e}");
            outcome.failed.push("prepare".to_string());
        }
        Ok((client, bird_image)) => {
            let ctx = Arc::new(Ctx { client, repo: repo(), cluster, bird_image });
            for (name, scenario) in &selected {
                run_scenario(&runtime, &ctx, name, *scenario, &mut outcome);
            }
            if !three.is_empty() && nodes < 3 {
                for (name, _) in &three {
                    println!("test {name} ... ignored (three Nodes: {NODES_ENV}=3)");
                    outcome.ignored += 1;
                }
            } else if !three.is_empty() {
                match grow(&ctx.cluster, 3) {
                    Ok(()) => {
                        for (name, scenario) in &three {
                            run_scenario(&runtime, &ctx, name, *scenario, &mut outcome);
                        }
                        // The closing table: every number the three-Node scenarios measured.
                        println!("three-Node measurements:");
                        for line in multinode::all_measured() {
                            println!("    {line}");
                        }
                    }
                    Err(e) => {
                        for (name, _) in &three {
                            println!("test {name} ... FAILED (growing the cluster to 3 Nodes: {e})");
                            outcome.failed.push(name.to_string());
                        }
                    }
                }
            }
            runtime.shutdown_timeout(Duration::from_secs(5));
            let Ok(ctx) = Arc::try_unwrap(ctx) else {
                println!("a scenario still holds the cluster; stopping it anyway is not possible");
                return ExitCode::FAILURE;
            };
            return finish(ctx.cluster, outcome, filtered_out, started);
        }
    }
    runtime.shutdown_timeout(Duration::from_secs(5));
    finish(cluster, outcome, filtered_out, started)
}

/// The run's results so far.
struct Outcome {
    passed: usize,
    failed: Vec<String>,
    ignored: usize,
}

/// Runs one scenario within 300 s and prints its libtest line.
fn run_scenario(
    runtime: &tokio::runtime::Runtime,
    ctx: &Arc<Ctx>,
    name: &str,
    scenario: Scenario,
    outcome: &mut Outcome,
) {
    // The scenario's own lines (its timings) come first; the result line follows in
    // libtest's form, `test NAME ... ok`, which CI's summary counts.
    println!("{name}:");
    let t = Instant::now();
    let result = runtime.block_on(async {
        let task = tokio::spawn(scenario(ctx.clone()));
        let abort = task.abort_handle();
        let result = tokio::time::timeout(Duration::from_secs(300), task).await;
        abort.abort();
        result
    });
    match result {
        Ok(Ok(())) => {
            println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
            outcome.passed += 1;
        }
        Ok(Err(e)) => {
            println!("test {name} ... FAILED ({:.1} s)\n  {}", t.elapsed().as_secs_f64(), panic_text(e));
            diagnose(&ctx.cluster);
            outcome.failed.push(name.to_string());
        }
        Err(_) => {
            println!("test {name} ... FAILED (timed out after 300 s)");
            diagnose(&ctx.cluster);
            outcome.failed.push(name.to_string());
        }
    }
}

/// Grows the running cluster to `total` Nodes and prints how long that took and the
/// cluster's memory then.
fn grow(cluster: &RealCluster, total: usize) -> Result<(), String> {
    let t = Instant::now();
    let mut added = Vec::new();
    while cluster.node_names().len() < total {
        let one = Instant::now();
        let name = cluster.add_node().map_err(|e| e.to_string())?;
        added.push(format!("{name} {:.1} s", one.elapsed().as_secs_f64()));
    }
    println!(
        "real cluster: grew to {total} Nodes in {:.1} s ({}); Nodes {}",
        t.elapsed().as_secs_f64(),
        added.join(", "),
        cluster.node_names().join(", ")
    );
    let memory = cluster.memory();
    let total_kib: u64 = memory.iter().map(|(_, kib)| kib).sum();
    let parts: Vec<String> = memory.iter().map(|(what, kib)| format!("{what} {:.0}", *kib as f64 / 1024.0)).collect();
    println!("real cluster: {total} Nodes use {:.0} MiB ({} MiB)", total_kib as f64 / 1024.0, parts.join(", "));
    Ok(())
}

fn finish(cluster: RealCluster, outcome: Outcome, filtered_out: usize, started: Instant) -> ExitCode {
    let Outcome { mut passed, mut failed, ignored } = outcome;
    hold(&cluster, !failed.is_empty());
    let t = Instant::now();
    let stopped = cluster.stop();
    let left = stopped.leftovers;
    let steps: Vec<String> = stopped.steps.iter().map(|(s, secs)| format!("{s} {secs:.1} s")).collect();
    print!("test {HOST_CHECK} ... ");
    if left.is_empty() {
        println!("ok (stopped in {:.1} s: {})", t.elapsed().as_secs_f64(), steps.join(", "));
        passed += 1;
        // Nothing mounted any more: the data can go (the logs stay for a reader).
        cluster.remove_data();
    } else {
        println!("FAILED\n  after stopping, the host differs:\n    {}", left.join("\n    "));
        failed.push(HOST_CHECK.to_string());
    }
    if !failed.is_empty() {
        println!("\nfailures:\n    {}", failed.join("\n    "));
        println!("(component logs: {})", cluster.state_dir().join("logs").display());
    }
    println!(
        "\ntest result: {}. {passed} passed; {} failed; {ignored} ignored; 0 measured; {filtered_out} filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn hold(cluster: &RealCluster, failed: bool) {
    let Ok(value) = std::env::var(HOLD_ENV) else { return };
    let (only_on_failure, seconds) = match value.strip_prefix("failure:") {
        Some(rest) => (true, rest),
        None => (false, value.as_str()),
    };
    let Ok(seconds) = seconds.parse::<u64>() else {
        println!("{HOLD_ENV}={value}: expected SECONDS or failure:SECONDS");
        return;
    };
    if only_on_failure && !failed {
        return;
    }
    println!(
        "holding the cluster for {seconds} s ({HOLD_ENV}):\n  export KUBECONFIG={} PATH={}:$PATH",
        cluster.kubeconfig().display(),
        cluster.assets().display()
    );
    std::thread::sleep(Duration::from_secs(seconds));
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
        Err(e) => e.to_string(),
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// `target/debug` (or whichever profile built this test): `cargo test --workspace` builds
/// the workspace's binaries there.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default()
}

/// The most recently changed `.rs` file of the crates the two images are built from.
fn newest_rust_source(repo: &Path) -> Option<(PathBuf, std::time::SystemTime)> {
    let mut newest: Option<(PathBuf, std::time::SystemTime)> = None;
    let mut dirs: Vec<PathBuf> = ["crds/src", "manager", "operator/src"].iter().map(|d| repo.join(d)).collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                // A provider's tests are not in the binary.
                if path.file_name().is_some_and(|n| n != "tests") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && let Ok(changed) = entry.metadata().and_then(|m| m.modified())
                && newest.as_ref().is_none_or(|(_, t)| changed > *t)
            {
                newest = Some((path, changed));
            }
        }
    }
    newest
}

/// Builds and imports the images every scenario needs.
async fn prepare(cluster: &RealCluster) -> Result<(Client, bool), String> {
    let t = Instant::now();
    let bins = bin_dir();
    let newest_source = newest_rust_source(&repo());
    for b in ["ccm-operator", "cloud-controller-manager"] {
        let bin = bins.join(b);
        let built = std::fs::metadata(&bin)
            .and_then(|m| m.modified())
            .map_err(|_| format!("{} is missing: build it first (cargo build --workspace --bins)", bin.display()))?;
        // Cargo builds only this package's binaries for this test: after `cargo test -p e2e
        // --test realcluster` alone the images would carry whatever binary an earlier build left.
        if let Some((source, changed)) = &newest_source
            && *changed > built
        {
            return Err(format!(
                "{} is older than {}: the images would run stale code; run `cargo build --workspace --bins` first (`cargo test --workspace` does)",
                bin.display(),
                source.display()
            ));
        }
    }
    let out = cluster.state_dir().join("images");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let mut archives = images::build_project(&bins, &out).map_err(|e| e.to_string())?;
    let web = out.join("web.tar");
    images::build_web(Path::new("/bin/busybox"), &web).map_err(|e| e.to_string())?;
    archives.push(web);
    let curl = out.join("curl.tar");
    images::build_curl(Path::new("/usr/bin/curl"), &curl).map_err(|e| e.to_string())?;
    archives.push(curl);
    // The BIRD sidecar, from the host's bird2 package (CI installs it); without it the BGP
    // scenario says so.
    let bird = out.join("bird.tar");
    let bird_image = match images::build_bird(Path::new("/bin/busybox"), &bird) {
        Ok(()) => {
            archives.push(bird);
            true
        }
        Err(e) => {
            println!("    no BIRD sidecar image ({e}): the BGP scenario fails if it runs");
            false
        }
    };
    // Kept by the cluster for the Nodes added later.
    for a in &archives {
        cluster.import_image(a).map_err(|e| e.to_string())?;
    }
    println!("images built from {} and imported in {:.1} s", bins.display(), t.elapsed().as_secs_f64());
    cluster.client().await.map(|c| (c, bird_image)).map_err(|e| e.to_string())
}

/// Polls `check` every 250 ms until it answers `Some`; panics naming `what` after `within`.
async fn wait<T, F, Fut>(what: &str, within: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match wait_quietly(within, check).await {
        Some(v) => v,
        None => panic!("timed out after {within:?} waiting for {what}"),
    }
}

/// Polls `check` every 250 ms until it answers `Some`, or `None` after `within`.
async fn wait_quietly<T, F, Fut>(within: Duration, check: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What a reader of a failure needs: every Pod, recent events, and the last lines of our
/// components' logs.
fn diagnose(cluster: &RealCluster) {
    let show = |title: &str, args: &[&str]| {
        let out = cluster.kubectl_raw(args).unwrap_or_else(|e| e.to_string());
        println!("  --- {title}\n{}", out.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n"));
    };
    show("pods", &["get", "pods", "-A", "-o", "wide"]);
    show("events", &["get", "events", "-A", "--sort-by=.lastTimestamp"]);
    show("resources", &["get", "ccm", "-A", "-o", "yaml"]);
    for (ns, selector) in [
        (OPERATOR_NS, "app.kubernetes.io/name=ccm-operator"),
        (CCM_NS, "app.kubernetes.io/name=cloud-controller-manager"),
    ] {
        show(
            &format!("logs {ns} {selector}"),
            &["logs", "-n", ns, "-l", selector, "--tail=40", "--all-containers", "--prefix"],
        );
    }
}

/// Runs the helm-compatible tool the docs name (charts/ccm-operator/tests/helm_cli.py).
fn helm(ctx: &Ctx, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(ctx.repo.join("charts/ccm-operator/tests/helm_cli.py"))
        .args(args)
        .env("KUBECONFIG", ctx.cluster.kubeconfig())
        .env_remove("HELM_DRIVER")
        .current_dir(&ctx.repo)
        .output()
        .expect("running helm_cli.py");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm {} failed: {text}", args.join(" "));
    text
}

fn helm_install_args(tag: &str) -> Vec<String> {
    helm_args(tag, true)
}

fn helm_args(tag: &str, embedded: bool) -> Vec<String> {
    [
        "--namespace",
        OPERATOR_NS,
        "--set",
        &format!("image.repository={}", images::OPERATOR),
        "--set",
        &format!("image.tag={tag}"),
        "--set",
        "image.pullPolicy=Never",
        "--set",
        &format!("manager.image.repository={}", images::MANAGER),
        "--set",
        &format!("manager.image.tag={}", images::TAG),
        "--set",
        &format!("embedded.enabled={embedded}"),
        // The scenarios' resource and Secret live in kube-system (not the chart's default).
        "--set",
        &format!("cloudConfig.namespaces=[\"{CCM_NS}\"]"),
        // The VIP scenario's resource asks for an announcer.
        "--set",
        "announcer.enabled=true",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn deployment_available(client: &Client, ns: &str, name: &str) -> Option<Deployment> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let d = api.get_opt(name).await.ok()??;
    let status = d.status.as_ref()?;
    let want = d.spec.as_ref()?.replicas.unwrap_or(1);
    let current = status.observed_generation == d.metadata.generation
        && status.updated_replicas.unwrap_or(0) == want
        && status.available_replicas.unwrap_or(0) == want
        && status.replicas.unwrap_or(0) == want;
    current.then_some(d)
}

async fn chart_install(ctx: Arc<Ctx>) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = nodes.get(&ctx.cluster.node_name).await.expect("the Node");
    let tainted = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        tainted.iter().any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"),
        "the kubelet (--cloud-provider=external) registers its Node tainted uninitialized: {tainted:?}"
    );
    // Pod Security admission enforces `restricted` on the operator's namespace, as docs/helm.md
    // recommends; the operator's Pod must pass it.
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}}),
    )
    .await;
    let t = Instant::now();
    let mut args = vec!["install", "ccm-operator", "charts/ccm-operator", "--create-namespace"];
    let rest = helm_install_args(images::TAG);
    args.extend(rest.iter().map(String::as_str));
    helm(&ctx, &args);
    wait("the operator Deployment available", Duration::from_secs(120), || {
        deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator")
    })
    .await;
    println!("    helm install to operator available: {:.1} s", t.elapsed().as_secs_f64());
    operator_pod_delete_hands_the_lease_over(&ctx).await;
}

/// The one operator replica leads on Lease `ccm-operator`, so its Pod's replacement (started by
/// the ReplicaSet while the deleted one still terminates) waits until the old one released it.
async fn operator_pod_delete_hands_the_lease_over(ctx: &Ctx) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), OPERATOR_NS);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), OPERATOR_NS);
    let holder =
        || async { leases.get_opt("ccm-operator").await.ok()??.spec?.holder_identity.filter(|h| !h.is_empty()) };
    let old = wait("the operator holding Lease ccm-operator", Duration::from_secs(60), holder).await;
    let t = Instant::now();
    // The identity is `HOSTNAME_uuid`, and a Pod's hostname is its name.
    let old_pod = old.split('_').next().unwrap_or_default();
    pods.delete(old_pod, &Default::default()).await.expect("deleting the operator Pod");
    // Until the old process let go, the Lease names it or no one, never its replacement.
    let new = wait("the replacement operator leading", Duration::from_secs(90), || async {
        let h = holder().await?;
        (h != old).then_some(h)
    })
    .await;
    println!(
        "    operator Pod deleted: {new} leads after {:.1} s (the Lease kept them apart)",
        t.elapsed().as_secs_f64()
    );
    wait("the replacement operator available", Duration::from_secs(60), || {
        deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator")
    })
    .await;
}

fn cloud_config(node: &str, node_ip: &str) -> String {
    format!(
        "instances:\n  - name: {node}\n    addresses:\n      - {{type: InternalIP, address: {node_ip}}}\n      - {{type: Hostname, address: {node}}}\n    instanceType: e2e-small\n    zone: zone-a\n    region: region-1\nloadBalancer:\n  mode: proxy\n  proxy:\n    healthCheckInterval: 1s\n    drainTimeout: 5s\n  pools:\n    - name: loopback\n      cidrs: [\"{POOL}\"]\n      allowedPorts: [\"{SERVICE_PORT}\"]\n      allowLoopback: true\n"
    )
}

async fn apply(client: &Client, obj: serde_json::Value) {
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
    let params = PatchParams::apply("realcluster-e2e").force();
    let patch = Patch::Apply(&obj);
    let result = match kind.as_str() {
        "Secret" => Api::<Secret>::namespaced(client.clone(), ns.as_deref().unwrap_or("default"))
            .patch(&name, &params, &patch)
            .await
            .map(drop),
        "Service" => Api::<Service>::namespaced(client.clone(), ns.as_deref().unwrap_or("default"))
            .patch(&name, &params, &patch)
            .await
            .map(drop),
        "Deployment" => Api::<Deployment>::namespaced(client.clone(), ns.as_deref().unwrap_or("default"))
            .patch(&name, &params, &patch)
            .await
            .map(drop),
        "Namespace" => Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .patch(&name, &params, &patch)
            .await
            .map(drop),
        "CloudControllerManager" => {
            Api::<crds::CloudControllerManager>::namespaced(client.clone(), ns.as_deref().unwrap_or("default"))
                .patch(&name, &params, &patch)
                .await
                .map(drop)
        }
        other => panic!("apply: unexpected kind {other}"),
    };
    result.unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
}

async fn deployment_initializes_node(ctx: Arc<Ctx>) {
    let node_name = ctx.cluster.node_name.clone();
    let node_ip = ctx.cluster.network.node_ip.to_string();
    put_cloud_config(&ctx, &cloud_config(&node_name, &node_ip)).await;
    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": CCM_NAME, "namespace": CCM_NS},
            "spec": {"provider": "baremetal", "mode": "Deployment",
                "cloudConfig": {"secretRef": {"name": SECRET}},
                "deployment": {"replicas": 1}}}),
    )
    .await;
    let workload = format!("ccm-{CCM_NAME}");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    wait("the manager Deployment available", Duration::from_secs(120), || async {
        if let Some(d) = deployment_available(&ctx.client, CCM_NS, &workload).await {
            return Some(d);
        }
        // A crash-looping manager fails fast with its own words.
        for p in pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=cloud-controller-manager"))
            .await
            .ok()?
            .items
        {
            for cs in p.status.and_then(|s| s.container_statuses).unwrap_or_default() {
                let restarted = cs.restart_count > 0;
                let message = cs.last_state.and_then(|s| s.terminated).and_then(|t| t.message).unwrap_or_default();
                assert!(!restarted, "manager Pod {} restarted: {message}", p.metadata.name.unwrap_or_default());
            }
        }
        None
    })
    .await;
    println!("    resource applied to manager Pod available: {:.1} s", t.elapsed().as_secs_f64());
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = wait("the Node initialized", Duration::from_secs(60), || async {
        let n = nodes.get(&node_name).await.ok()?;
        let taints = n.spec.as_ref()?.taints.clone().unwrap_or_default();
        let initialized = n.spec.as_ref()?.provider_id.is_some()
            && !taints.iter().any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized");
        initialized.then_some(n)
    })
    .await;
    println!("    resource applied to Node initialized: {:.1} s", t.elapsed().as_secs_f64());
    let labels = node.labels();
    assert_eq!(labels.get("topology.kubernetes.io/zone").map(String::as_str), Some("zone-a"), "{labels:?}");
    assert_eq!(labels.get("topology.kubernetes.io/region").map(String::as_str), Some("region-1"), "{labels:?}");
    assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("e2e-small"), "{labels:?}");
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(format!("baremetal://{node_name}").as_str())
    );
    let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
    assert!(addresses.iter().any(|a| a.type_ == "InternalIP" && a.address == node_ip), "{addresses:?}");
}

/// One HTTP/1.0 GET; the body, or why not.
fn http_get(addr: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect_timeout(&addr.parse().map_err(|e| format!("{e}"))?, Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: e2e\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    stream.read_to_string(&mut body).map_err(|e| e.to_string())?;
    Ok(body)
}

async fn lb_traffic(ctx: Arc<Ctx>) {
    apply(&ctx.client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}})).await;
    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": APP_NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": images::WEB, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "mkdir -p /www && echo \"pod=$POD_NAME\" > /www/index.html && exec httpd -f -p 8080 -h /www"],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}}]}}}}),
    )
    .await;
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": APP_NS},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), APP_NS);
    let ip = wait("the Service's load-balancer address", Duration::from_secs(60), || async {
        let s = services.get("web").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    println!("    Service to address {ip}: {:.1} s", t.elapsed().as_secs_f64());
    wait("the web Deployment available", Duration::from_secs(120), || deployment_available(&ctx.client, APP_NS, "web"))
        .await;
    let addr = format!("{ip}:{SERVICE_PORT}");
    let body = wait(&format!("an answer from the web Pod through {addr}"), Duration::from_secs(60), || {
        let addr = addr.clone();
        async move { http_get(&addr).ok().filter(|b| b.contains("pod=web-")) }
    })
    .await;
    println!("    Service created to traffic through {addr}: {:.1} s", t.elapsed().as_secs_f64());
    let started = Instant::now();
    for _ in 0..20 {
        let b = http_get(&addr).expect("a request through the load balancer");
        assert!(b.contains("pod=web-"), "{b}");
    }
    println!("    20 requests: {:.1} ms each", started.elapsed().as_secs_f64() * 1000.0 / 20.0);
    assert!(body.contains("200 OK"), "{body}");
}

async fn helm_upgrade_and_uninstall(ctx: Arc<Ctx>) {
    // Another tag of the same image: the operator's pod template changes, so it rolls.
    let retag = format!("{}-next", images::TAG);
    let out = Command::new("ctr")
        .args(["-a", &RealCluster::containerd_socket().to_string_lossy(), "-n", "k8s.io", "images", "tag", "--force"])
        .arg(format!("{}:{}", images::OPERATOR, images::TAG))
        .arg(format!("{}:{retag}", images::OPERATOR))
        .output()
        .expect("ctr images tag");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = Instant::now();
    let mut args = vec!["upgrade", "ccm-operator", "charts/ccm-operator"];
    let rest = helm_install_args(&retag);
    args.extend(rest.iter().map(String::as_str));
    helm(&ctx, &args);
    let d = wait("the operator rolled to the new tag", Duration::from_secs(120), || async {
        let d = deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator").await?;
        let image = d.spec.as_ref()?.template.spec.as_ref()?.containers.first()?.image.clone()?;
        image.ends_with(&retag).then_some(d)
    })
    .await;
    println!("    helm upgrade to the new tag available: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(d.status.and_then(|s| s.updated_replicas), Some(1));

    // Uninstall: resources go first (their finalizer needs the operator), as docs/helm.md says;
    // the deletion scenario removed the last one.
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(CCM_NAME, &Default::default()).await;
    wait("the CloudControllerManager gone", Duration::from_secs(60), || async {
        crs.get_opt(CCM_NAME).await.ok().and_then(|o| o.is_none().then_some(()))
    })
    .await;
    let t = Instant::now();
    helm(&ctx, &["uninstall", "ccm-operator", "--namespace", OPERATOR_NS]);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), OPERATOR_NS);
    wait("the operator Deployment gone", Duration::from_secs(60), || async {
        deployments.get_opt("ccm-operator").await.ok().and_then(|o| o.is_none().then_some(()))
    })
    .await;
    println!("    helm uninstall to nothing left: {:.1} s", t.elapsed().as_secs_f64());
    // What Helm keeps by convention: the CRD (crds/ is never deleted by Helm).
    let crd = ctx.cluster.kubectl_raw(&["get", "crd", "cloudcontrollermanagers.ccm.rs", "-o", "name"]);
    assert!(crd.is_ok(), "Helm keeps CRDs it installed from crds/");
    // The garbage collector removes the operator's Pods after their ReplicaSet.
    let leftovers = || {
        ctx.cluster
            .kubectl_raw(&[
                "get",
                "all,sa,role,rolebinding,clusterrole,clusterrolebinding,secret,configmap,lease",
                "-A",
                "-l",
                "app.kubernetes.io/instance=ccm-operator",
                "-o",
                "name",
            ])
            .unwrap_or_default()
    };
    let gone = wait_quietly(Duration::from_secs(60), || async { leftovers().trim().is_empty().then_some(()) }).await;
    assert!(gone.is_some(), "left 60 s after uninstall:\n{}", leftovers());
    println!("    helm uninstall to nothing of ours left: {:.1} s", t.elapsed().as_secs_f64());
}

/// The CloudControllerManager's spec with the given mode and deployment settings.
fn ccm_spec(mode: &str, deployment: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": CCM_NAME, "namespace": CCM_NS},
        "spec": {"provider": "baremetal", "mode": mode,
            "cloudConfig": {"secretRef": {"name": SECRET}},
            "deployment": deployment}})
}

fn manager_selector() -> ListParams {
    ListParams::default().labels("app.kubernetes.io/name=cloud-controller-manager")
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        && p.metadata.deletion_timestamp.is_none()
}

async fn manager_pods(ctx: &Ctx) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    pods.list(&manager_selector()).await.map(|l| l.items).unwrap_or_default()
}

async fn lease_holder(ctx: &Ctx) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    leases.get_opt(CCM_NAME).await.ok()??.spec?.holder_identity.filter(|h| !h.is_empty())
}

async fn lb_address(ctx: &Ctx) -> String {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), APP_NS);
    let s = services.get("web").await.expect("the web Service");
    let ip = s.status.and_then(|s| s.load_balancer).and_then(|l| l.ingress).and_then(|i| i.first()?.ip.clone());
    format!("{}:{SERVICE_PORT}", ip.expect("the web Service's address"))
}

/// Sends a request every 50 ms until stopped; returns (requests, failures, longest run of
/// failures in seconds).
fn traffic(addr: String, stop: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<(u32, u32, f64)> {
    std::thread::spawn(move || {
        let (mut total, mut failures, mut longest) = (0u32, 0u32, 0f64);
        let mut failing_since: Option<Instant> = None;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            total += 1;
            let ok = http_get(&addr).is_ok_and(|b| b.contains("pod=web-"));
            match (ok, failing_since) {
                (true, Some(since)) => {
                    longest = longest.max(since.elapsed().as_secs_f64());
                    failing_since = None;
                }
                (false, None) => {
                    failures += 1;
                    failing_since = Some(Instant::now());
                }
                (false, Some(_)) => failures += 1,
                (true, None) => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(since) = failing_since {
            longest = longest.max(since.elapsed().as_secs_f64());
        }
        (total, failures, longest)
    })
}

async fn leader_handover(ctx: Arc<Ctx>) {
    apply(&ctx.client, ccm_spec("Deployment", json!({"replicas": 2}))).await;
    // Host network on one Node: the second replica cannot have the port and waits Pending.
    // A host-network Pod's identity is the Node's host name and a UUID (upstream's format), so
    // the leader is the one Ready Pod and a handover shows as a new identity.
    let (leader, holder) = wait("one Ready manager leading, the other Pending", Duration::from_secs(90), || async {
        let pods = manager_pods(&ctx).await;
        let ready: Vec<&Pod> = pods.iter().filter(|p| is_ready(p)).collect();
        let pending =
            pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")).count();
        let holder = lease_holder(&ctx).await?;
        (pods.len() == 2 && ready.len() == 1 && pending == 1).then(|| (ready[0].name_any(), holder))
    })
    .await;
    let addr = lb_address(&ctx).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = traffic(addr.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    pods.delete(&leader, &Default::default()).await.expect("deleting the leader Pod");
    let new_leader = wait("another manager leading", Duration::from_secs(90), || async {
        let now = lease_holder(&ctx).await?;
        let pods = manager_pods(&ctx).await;
        let ready = pods.iter().find(|p| is_ready(p) && p.name_any() != leader)?;
        (now != holder).then(|| ready.name_any())
    })
    .await;
    println!("    leader {leader} deleted to {new_leader} leading: {:.1} s", t.elapsed().as_secs_f64());
    wait(&format!("traffic through {addr} again"), Duration::from_secs(30), || {
        let addr = addr.clone();
        async move { http_get(&addr).ok().filter(|b| b.contains("pod=web-")) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (total, failures, longest) = load.join().expect("the traffic thread");
    println!("    traffic during the handover: {failures} of {total} requests failed, longest gap {longest:.2} s");
    assert!(failures < total, "no request succeeded during the handover");
}

async fn rollout_one_node(ctx: Arc<Ctx>) {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let workload = format!("ccm-{CCM_NAME}");
    let before = deployments.get(&workload).await.expect("the manager Deployment");
    let t = Instant::now();
    // The chart's defaults (two replicas, host network) and a template change.
    let mut spec = ccm_spec("Deployment", json!({}));
    spec["spec"]["extraArgs"] = json!(["--node-status-update-frequency=1m"]);
    apply(&ctx.client, spec).await;
    let generation = before.metadata.generation.unwrap_or(0);
    wait("the rollout complete", Duration::from_secs(120), || async {
        let d = deployments.get(&workload).await.ok()?;
        let status = d.status.as_ref()?;
        let done = d.metadata.generation? > generation
            && status.observed_generation == d.metadata.generation
            && status.updated_replicas == Some(2)
            && status.replicas == Some(2)
            && status.ready_replicas.unwrap_or(0) >= 1;
        let args: Vec<String> = manager_pods(&ctx)
            .await
            .iter()
            .filter(|p| is_ready(p))
            .flat_map(|p| p.spec.as_ref().map(|s| s.containers[0].args.clone().unwrap_or_default()).unwrap_or_default())
            .collect();
        (done && args.iter().any(|a| a == "--node-status-update-frequency=1m")).then_some(())
    })
    .await;
    println!("    template change to rolled out on one Node: {:.1} s", t.elapsed().as_secs_f64());
    let addr = lb_address(&ctx).await;
    wait(&format!("traffic through {addr} after the rollout"), Duration::from_secs(30), || {
        let addr = addr.clone();
        async move { http_get(&addr).ok().filter(|b| b.contains("pod=web-")) }
    })
    .await;
}

/// The migration Lease of [`leader_migration_file`]: a name of this test's own, so the file
/// form (not upstream's default) is what the manager runs with.
const MIGRATION_LEASE: &str = "ccm-e2e-migration";

/// Leader migration with a file of the resource's own: the operator renders it into a
/// pod-template annotation that a projected downward-API volume turns into a file; the kubelet
/// writes it, the manager (uid 65532) reads and validates it at start, and its leader holds the
/// main Lease and the migration Lease. Left on for the scenarios after it.
async fn leader_migration_file(ctx: Arc<Ctx>) {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let workload = format!("ccm-{CCM_NAME}");
    let before = deployments.get(&workload).await.expect("the manager Deployment");
    let generation = before.metadata.generation.unwrap_or(0);
    let t = Instant::now();
    let mut spec = ccm_spec("Deployment", json!({}));
    spec["spec"]["extraArgs"] = json!(["--node-status-update-frequency=1m"]);
    spec["spec"]["leaderElection"] = json!({"migration": {"enabled": true, "leaderName": MIGRATION_LEASE,
        "controllerLeaders": [{"name": "service", "component": "*"}, {"name": "cloud-node-lifecycle", "component": "*"},
                              {"name": "route", "component": "cloud-controller-manager"}]}});
    apply(&ctx.client, spec).await;
    wait("the rollout with the migration file complete", Duration::from_secs(120), || async {
        let d = deployments.get(&workload).await.ok()?;
        let status = d.status.as_ref()?;
        let done = d.metadata.generation? > generation
            && status.observed_generation == d.metadata.generation
            && status.updated_replicas == Some(2)
            && status.ready_replicas.unwrap_or(0) >= 1;
        let pods = manager_pods(&ctx).await;
        for p in &pods {
            for cs in p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default() {
                let message = cs.last_state.and_then(|s| s.terminated).and_then(|t| t.message).unwrap_or_default();
                assert_eq!(cs.restart_count, 0, "manager Pod {} restarted: {message}", p.name_any());
            }
        }
        let args: Vec<String> = pods
            .iter()
            .filter(|p| is_ready(p))
            .flat_map(|p| p.spec.as_ref().map(|s| s.containers[0].args.clone().unwrap_or_default()).unwrap_or_default())
            .collect();
        (done && args.iter().any(|a| a.starts_with("--leader-migration-config="))).then_some(())
    })
    .await;
    println!("    migration file applied to rolled out: {:.1} s", t.elapsed().as_secs_f64());
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let holder = wait("the leader holding the main and the migration Lease", Duration::from_secs(60), || async {
        let main = lease_holder(&ctx).await?;
        let migration = leases.get_opt(MIGRATION_LEASE).await.ok()??.spec?.holder_identity?;
        (migration == main).then_some(main)
    })
    .await;
    println!("    rolled out to both Leases held by {holder}: {:.1} s", t.elapsed().as_secs_f64());
    // The migrated service controller serves the load balancer again.
    let addr = lb_address(&ctx).await;
    wait(&format!("traffic through {addr} with the migrated service controller"), Duration::from_secs(30), || {
        let addr = addr.clone();
        async move { http_get(&addr).ok().filter(|b| b.contains("pod=web-")) }
    })
    .await;
}

async fn rotation(ctx: Arc<Ctx>) {
    let node_name = ctx.cluster.node_name.clone();
    let node_ip = ctx.cluster.network.node_ip.to_string();
    let before: Vec<String> = manager_pods(&ctx).await.iter().filter(|p| is_ready(p)).map(|p| p.name_any()).collect();
    // A pool-only edit: the manager reloads its mounted file; no Pod rolls.
    let t = Instant::now();
    let config = cloud_config(&node_name, &node_ip).replace(POOL, "127.0.0.240/28\", \"127.0.0.224/28");
    put_cloud_config(&ctx, &config).await;
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-b", "namespace": APP_NS},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "loadBalancerIP": "127.0.0.230",
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), APP_NS);
    // The kubelet refreshes Secret volumes on its sync period (a minute) plus its cache's.
    wait("an address from the reloaded pool", Duration::from_secs(180), || async {
        let s = services.get("web-b").await.ok()?;
        let ip = s.status?.load_balancer?.ingress?.first()?.ip.clone()?;
        (ip == "127.0.0.230").then_some(())
    })
    .await;
    println!("    pool-only Secret edit to an address from the new pool: {:.1} s", t.elapsed().as_secs_f64());
    let after: Vec<String> = manager_pods(&ctx).await.iter().filter(|p| is_ready(p)).map(|p| p.name_any()).collect();
    assert_eq!(before, after, "a pool-only edit is reloaded in place; no Pod rolls");
    let _ = services.delete("web-b", &Default::default()).await;

    // Any other edit rolls the Pods, which read it at start.
    let t = Instant::now();
    let config = cloud_config(&node_name, &node_ip).replace("e2e-small", "e2e-large");
    put_cloud_config(&ctx, &config).await;
    wait("new manager Pods for the rotated Secret", Duration::from_secs(120), || async {
        let pods = manager_pods(&ctx).await;
        pods.iter().any(|p| is_ready(p) && !before.contains(&p.name_any())).then_some(())
    })
    .await;
    println!("    other Secret edit to a new Pod Ready: {:.1} s", t.elapsed().as_secs_f64());
}

/// A token of a ServiceAccount bound to the chart's metrics-reader ClusterRole.
async fn metrics_token(ctx: &Ctx) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let params = PatchParams::apply("realcluster-e2e").force();
    let sas: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), APP_NS);
    let sa =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "scraper", "namespace": APP_NS}});
    sas.patch("scraper", &params, &Patch::Apply(&sa)).await.expect("the scraper ServiceAccount");
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(ctx.client.clone());
    let role = roles
        .list(&ListParams::default())
        .await
        .expect("ClusterRoles")
        .items
        .into_iter()
        .map(|r| r.name_any())
        .find(|n| n.contains("metrics-reader"))
        .expect("the chart's metrics-reader ClusterRole");
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": APP_NS}]});
    bindings.patch("e2e-scraper", &params, &Patch::Apply(&binding)).await.expect("the scraper's binding");
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(600), ..Default::default() },
        ..Default::default()
    };
    sas.create_token_request("scraper", &Default::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a token in the answer")
        .token
}

/// Scrapes `/metrics` from a Pod running curl, i.e. from inside the cluster's network; returns
/// what it printed.
async fn scrape_in_cluster(ctx: &Ctx, url: &str, token: &str) -> String {
    let name = format!("scrape-{}", std::process::id());
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), APP_NS);
    // -k: the servers' certificates are self-signed (no --tls-cert-file in the chart's defaults).
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": APP_NS},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "scrape", "image": images::CURL, "imagePullPolicy": "Never",
            "args": ["-sSk", "--max-time", "10", "-H", format!("Authorization: Bearer {token}"), url]}]}});
    let _ = pods.delete(&name, &Default::default()).await;
    wait("the previous scrape Pod gone", Duration::from_secs(30), || async {
        pods.get_opt(&name).await.ok().and_then(|o| o.is_none().then_some(()))
    })
    .await;
    pods.create(&Default::default(), &serde_json::from_value(pod).expect("a Pod")).await.expect("the scrape Pod");
    wait("the scrape Pod finished", Duration::from_secs(60), || async {
        let p = pods.get(&name).await.ok()?;
        matches!(p.status?.phase.as_deref(), Some("Succeeded" | "Failed")).then_some(())
    })
    .await;
    let logs = pods.logs(&name, &Default::default()).await.unwrap_or_default();
    let _ = pods.delete(&name, &Default::default()).await;
    logs
}

async fn metrics(ctx: Arc<Ctx>) {
    let token = metrics_token(&ctx).await;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), OPERATOR_NS);
    let operator = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=ccm-operator"))
        .await
        .expect("operator Pods")
        .items
        .into_iter()
        .find(is_ready)
        .expect("a Ready operator Pod");
    let ip = operator.status.and_then(|s| s.pod_ip).expect("the operator's Pod IP");
    let text = scrape_in_cluster(&ctx, &format!("https://{ip}:8080/metrics"), &token).await;
    assert!(text.contains("# TYPE"), "operator /metrics: {text}");
    let manager = manager_pods(&ctx).await.into_iter().find(is_ready).expect("a Ready manager Pod");
    let ip = manager.status.and_then(|s| s.pod_ip).expect("the manager's Pod IP");
    let text = scrape_in_cluster(&ctx, &format!("https://{ip}:10258/metrics"), &token).await;
    assert!(text.contains("# TYPE"), "manager /metrics: {text}");
    // The probes passed all along: nothing restarted.
    for p in manager_pods(&ctx).await {
        for cs in p.status.and_then(|s| s.container_statuses).unwrap_or_default() {
            assert_eq!(cs.restart_count, 0, "{} restarted", p.metadata.name.unwrap_or_default());
        }
    }
}

/// The VIP scenario's client network: a bridge on the host with an address of the benchmarking
/// range, and a network namespace on it (a veth pair). The pool's addresses are on that segment
/// and configured nowhere, so only the announcer's ARP answers draw them to the node.
const VIP_BRIDGE: &str = "ccmvip0";
const VIP_NETNS: &str = "ccm-vip-client";
const VIP_HOST: &str = "198.18.0.1/24";
const VIP_CLIENT: &str = "198.18.0.2/24";
const VIP_POOL: &str = "198.18.0.100/30";

/// Runs `ip` with `args`; the error carries its stderr.
fn ip_cmd(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The client network while it exists; deleted when dropped, also while panicking, so the host
/// check finds no link left.
struct ClientNet;

impl ClientNet {
    fn create() -> Result<ClientNet, String> {
        let net = ClientNet;
        ip_cmd(&["netns", "add", VIP_NETNS])?;
        ip_cmd(&["link", "add", VIP_BRIDGE, "type", "bridge"])?;
        ip_cmd(&["addr", "add", VIP_HOST, "dev", VIP_BRIDGE])?;
        ip_cmd(&["link", "set", VIP_BRIDGE, "up"])?;
        ip_cmd(&["link", "add", "ccmvip-h", "type", "veth", "peer", "name", "ccmvip-c"])?;
        ip_cmd(&["link", "set", "ccmvip-h", "master", VIP_BRIDGE, "up"])?;
        ip_cmd(&["link", "set", "ccmvip-c", "netns", VIP_NETNS])?;
        ip_cmd(&["-n", VIP_NETNS, "addr", "add", VIP_CLIENT, "dev", "ccmvip-c"])?;
        ip_cmd(&["-n", VIP_NETNS, "link", "set", "ccmvip-c", "up"])?;
        ip_cmd(&["-n", VIP_NETNS, "link", "set", "lo", "up"])?;
        Ok(net)
    }

    /// Runs `f` on a thread inside the client namespace: its sockets are the client's.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
        use std::os::fd::AsRawFd;
        let path = format!("/var/run/netns/{VIP_NETNS}");
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            // SAFETY: setns(2) on this new thread only, with a namespace file held open.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
            }
            Ok(f())
        })
        .join()
        .map_err(|_| "the client thread panicked".to_string())?
    }

    /// The client's neighbour entry for `ip` (`ip neigh` output).
    fn neighbour(&self, ip: &str) -> String {
        Command::new("ip")
            .args(["-n", VIP_NETNS, "neigh", "show", ip])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }
}

impl Drop for ClientNet {
    fn drop(&mut self) {
        let _ = ip_cmd(&["netns", "del", VIP_NETNS]);
        let _ = ip_cmd(&["link", "del", VIP_BRIDGE]);
    }
}

/// The MAC address of a host link.
fn link_mac(link: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{link}/address")).map(|m| m.trim().to_string()).unwrap_or_default()
}

/// The cloud-config Secret's `cloud.conf` now.
async fn current_cloud_config(ctx: &Ctx) -> String {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let secret = secrets.get(SECRET).await.expect("the cloud-config Secret");
    let data = secret.data.and_then(|d| d.get("cloud.conf").cloned()).expect("cloud.conf");
    String::from_utf8(data.0).expect("UTF-8")
}

async fn put_cloud_config(ctx: &Ctx, config: &str) {
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": CCM_NS, "labels": {(crds::CLOUD_CONFIG_LABEL): crds::CLOUD_CONFIG_LABEL_VALUE}},
        "stringData": {"cloud.conf": config}}),
    )
    .await;
}

/// `ipMode: VIP` on the real cluster (issue 27 item 4): the resource asks for an announcer, the
/// operator renders it (host network, NET_RAW), the kubelet starts it, and a Service of the
/// `vip` pool annotated `ccm.rs/ip-mode: VIP` gets an address that a client in its own network
/// namespace resolves by the announcer's ARP answer and reaches the web Pod through kube-proxy's
/// rules, while the proxied Service keeps its listener. Everything is removed at the end.
async fn vip_by_l2(ctx: Arc<Ctx>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let net = ClientNet::create().unwrap_or_else(|e| panic!("the client network: {e}"));
    let original = current_cloud_config(&ctx).await;
    assert!(original.trim_end().ends_with("allowLoopback: true"), "the pools end the cloud-config: {original}");
    let with_vip = format!(
        "{original}    - name: vip\n      cidrs: [\"{VIP_POOL}\"]\n  announcement:\n    l2:\n      interfaces: [{VIP_BRIDGE}]\n"
    );
    let rolled_from: Vec<String> = manager_pods(&ctx).await.iter().map(|p| p.name_any()).collect();
    let t = Instant::now();
    put_cloud_config(&ctx, &with_vip).await;
    let ccms: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let announce = json!({"spec": {"announcer": {}}});
    ccms.patch(CCM_NAME, &PatchParams::default(), &Patch::Merge(&announce)).await.expect("spec.announcer");
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let announcer = format!("ccm-{CCM_NAME}-announcer");
    wait("the announcer DaemonSet's Pod available on the node", Duration::from_secs(120), || async {
        let ds = daemon_sets.get_opt(&announcer).await.ok()??;
        let status = ds.status?;
        (status.observed_generation == ds.metadata.generation
            && status.desired_number_scheduled == 1
            && status.number_available.unwrap_or(0) == 1
            && status.updated_number_scheduled.unwrap_or(0) == 1)
            .then_some(())
    })
    .await;
    println!("    spec.announcer applied to the announcer Pod available: {:.1} s", t.elapsed().as_secs_f64());
    wait("status.announcers counting the ready announcer", Duration::from_secs(60), || async {
        let a = ccms.get(CCM_NAME).await.ok()?.status?.announcers?;
        (a.desired == 1 && a.ready == 1 && a.updated == 1).then_some(())
    })
    .await;
    // The cloud-config edit (not pools only) rolls the manager; the Service needs it leading.
    manager_rolled(&ctx, &rolled_from).await;

    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web-vip", "namespace": APP_NS,
                "annotations": {"ccm.rs/address-pool": "vip", "ccm.rs/ip-mode": "VIP"}},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), APP_NS);
    let (ip, mode) = wait("web-vip's address", Duration::from_secs(60), || async {
        let s = services.get("web-vip").await.ok()?;
        let ingress = s.status?.load_balancer?.ingress?.first()?.clone();
        Some((ingress.ip?, ingress.ip_mode))
    })
    .await;
    assert!(ip.starts_with("198.18.0.10"), "an address of the vip pool: {ip}");
    assert_eq!(mode.as_deref(), Some("VIP"));
    println!("    VIP Service to address {ip}: {:.1} s", t.elapsed().as_secs_f64());
    let addr = format!("{ip}:{SERVICE_PORT}");
    let body = wait(
        &format!("an answer from the web Pod through {addr} from the client namespace"),
        Duration::from_secs(90),
        || {
            let addr = addr.clone();
            let answer = net.run(move || http_get(&addr));
            async move { answer.ok()?.ok().filter(|b| b.contains("pod=web-")) }
        },
    )
    .await;
    assert!(body.contains("200 OK"), "{body}");
    println!("    VIP Service created to traffic from the client namespace: {:.1} s", t.elapsed().as_secs_f64());
    let neighbour = net.neighbour(&ip);
    let mac = link_mac(VIP_BRIDGE);
    assert!(
        !mac.is_empty() && neighbour.contains(&mac),
        "{ip} resolves to the node's bridge ({mac}) by ARP: {neighbour}"
    );
    let started = Instant::now();
    for _ in 0..20 {
        let a = addr.clone();
        let b = net.run(move || http_get(&a)).expect("the client thread").expect("a request through the VIP");
        assert!(b.contains("pod=web-"), "{b}");
    }
    println!(
        "    20 requests from the client namespace: {:.1} ms each",
        started.elapsed().as_secs_f64() * 1000.0 / 20.0
    );
    // The announcer says which node announces.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ctx.client.clone(), APP_NS);
    let note = wait("the L2Announcing event on web-vip", Duration::from_secs(30), || async {
        events.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
            (e.reason.as_deref() == Some("L2Announcing") && e.regarding.as_ref()?.name.as_deref() == Some("web-vip"))
                .then(|| e.note.unwrap_or_default())
        })
    })
    .await;
    assert!(note.contains(&ctx.cluster.node_name) && note.contains(&ip), "{note}");
    // The proxied Service still answers on the node through the manager's listener.
    let proxied = lb_address(&ctx).await;
    assert!(http_get(&proxied).is_ok_and(|b| b.contains("pod=web-")), "the proxied Service still answers");

    // Undo: the Service, the announcer (its Lease goes with its graceful stop), the config.
    let _ = services.delete("web-vip", &Default::default()).await;
    let remove = json!({"spec": {"announcer": null}});
    ccms.patch(CCM_NAME, &PatchParams::default(), &Patch::Merge(&remove)).await.expect("announcer removed");
    wait("the announcer DaemonSet pruned and status.announcers cleared", Duration::from_secs(60), || async {
        let cleared = ccms.get(CCM_NAME).await.ok()?.status?.announcers.is_none();
        (daemon_sets.get_opt(&announcer).await.ok()?.is_none() && cleared).then_some(())
    })
    .await;
    let rolled_from: Vec<String> = manager_pods(&ctx).await.iter().map(|p| p.name_any()).collect();
    put_cloud_config(&ctx, &original).await;
    manager_rolled(&ctx, &rolled_from).await;
    drop(net);
}

/// Waits until a manager Pod not in `before` is Ready, a manager leads, and the proxied Service
/// answers again.
async fn manager_rolled(ctx: &Ctx, before: &[String]) {
    wait("a new manager Pod Ready and leading, the proxied Service answering", Duration::from_secs(180), || async {
        let pods = manager_pods(ctx).await;
        let rolled = pods.iter().any(|p| is_ready(p) && !before.contains(&p.name_any()));
        let addr = lb_address(ctx).await;
        (rolled && lease_holder(ctx).await.is_some() && http_get(&addr).is_ok_and(|b| b.contains("pod=web-")))
            .then_some(())
    })
    .await;
}

async fn to_daemonset(ctx: Arc<Ctx>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let t = Instant::now();
    apply(&ctx.client, ccm_spec("DaemonSet", json!({}))).await;
    let workload = format!("ccm-{CCM_NAME}");
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), CCM_NS);
    // The default nodeSelector is the control plane's; this Node has no such label yet, and
    // the resource says so.
    let (_, reason, message) = wait("Available False for want of a Node", Duration::from_secs(60), || async {
        condition(&ctx, "Available").await.filter(|(s, r, _)| s == "False" && r == "NoMatchingNodes")
    })
    .await;
    println!("    Available=False {reason}: {message}");
    // Meanwhile the Deployment keeps serving, and the resource says why it is kept.
    let (_, _, message) = wait("Progressing True ModeSwitching", Duration::from_secs(30), || async {
        condition(&ctx, "Progressing").await.filter(|(s, r, _)| s == "True" && r == "ModeSwitching")
    })
    .await;
    println!("    Progressing=True ModeSwitching: {message}");
    let addr = lb_address(&ctx).await;
    for _ in 0..5 {
        let d =
            deployments.get_opt(&workload).await.expect("get").expect("the Deployment is kept while no Node matches");
        assert!(d.status.and_then(|s| s.available_replicas).unwrap_or(0) >= 1, "the kept Deployment is not available");
        let body = http_get(&addr).expect("traffic while the DaemonSet waits for a Node");
        assert!(body.contains("pod=web-"), "{body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("    the Deployment kept serving {addr}: {:.1} s", t.elapsed().as_secs_f64());
    ctx.cluster
        .kubectl_raw(&[
            "label",
            "node",
            &ctx.cluster.node_name,
            "node-role.kubernetes.io/control-plane=",
            "--overwrite",
        ])
        .expect("labelling the Node as control plane");
    wait("the DaemonSet ready and the Deployment gone", Duration::from_secs(120), || async {
        let ds = daemonsets.get_opt(&workload).await.ok()??;
        let status = ds.status?;
        let gone = deployments.get_opt(&workload).await.ok()?.is_none();
        (gone && status.number_ready == 1 && status.desired_number_scheduled == 1).then_some(())
    })
    .await;
    println!("    Deployment to DaemonSet switch done: {:.1} s", t.elapsed().as_secs_f64());
    wait(&format!("traffic through {addr} in DaemonSet mode"), Duration::from_secs(60), || {
        let addr = addr.clone();
        async move { http_get(&addr).ok().filter(|b| b.contains("pod=web-")) }
    })
    .await;
    println!("    traffic again: {:.1} s", t.elapsed().as_secs_f64());
}

async fn condition(ctx: &Ctx, type_: &str) -> Option<(String, String, String)> {
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let cr = crs.get_opt(CCM_NAME).await.ok()??;
    let status = cr.status?;
    (status.observed_generation == cr.metadata.generation).then_some(())?;
    let c = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

async fn embedded_proxy_refused(ctx: Arc<Ctx>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    apply(&ctx.client, ccm_spec("Embedded", json!({}))).await;
    // The operator the last `helm upgrade` rolled leads only once the old one released the
    // Lease; until then the old one (without Embedded mode) answers EmbeddedNotEnabled.
    let (status, reason, message) =
        wait("ConfigValid False ProxyNeedsHostNetwork", Duration::from_secs(60), || async {
            condition(&ctx, "ConfigValid").await.filter(|(s, r, _)| s == "False" && r == "ProxyNeedsHostNetwork")
        })
        .await;
    println!("    ConfigValid={status} {reason}: {message}");
    // Nothing was torn down: the DaemonSet still runs and carries traffic.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let ds = daemonsets.get_opt(&format!("ccm-{CCM_NAME}")).await.expect("get").expect("the DaemonSet is kept");
    assert_eq!(ds.status.map(|s| s.number_ready), Some(1));
    let addr = lb_address(&ctx).await;
    http_get(&addr).expect("traffic continues while the resource is refused");
}

async fn to_embedded(ctx: Arc<Ctx>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    // Without proxy mode the operator's own Pod can run the controllers.
    let node_name = ctx.cluster.node_name.clone();
    let node_ip = ctx.cluster.network.node_ip.to_string();
    let config = cloud_config(&node_name, &node_ip)
        .replace("  mode: proxy\n  proxy:\n    healthCheckInterval: 1s\n    drainTimeout: 5s\n", "")
        .replace(POOL, "192.0.2.0/28")
        .replace("      allowLoopback: true\n", "");
    let t = Instant::now();
    put_cloud_config(&ctx, &config).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    wait("Embedded mode Ready and the DaemonSet gone", Duration::from_secs(120), || async {
        let gone = daemonsets.get_opt(&format!("ccm-{CCM_NAME}")).await.ok()?.is_none();
        let ready = condition(&ctx, "Ready").await?.0 == "True";
        (gone && ready && manager_pods(&ctx).await.is_empty()).then_some(())
    })
    .await;
    let holder = wait("the operator holding the Lease", Duration::from_secs(60), || lease_holder(&ctx)).await;
    // The operator's Pod is not on the host network: its identity starts with its Pod name.
    assert!(holder.starts_with("ccm-operator-"), "{holder}");
    println!("    DaemonSet to Embedded switch done: {:.1} s (Lease held by {holder})", t.elapsed().as_secs_f64());
}

async fn delete_resource(ctx: Arc<Ctx>) {
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    // Back to Deployment mode, so the deletion has Pods, RBAC and a Lease to clean up.
    apply(&ctx.client, ccm_spec("Deployment", json!({"replicas": 1}))).await;
    let workload = format!("ccm-{CCM_NAME}");
    wait("the manager Deployment available", Duration::from_secs(120), || {
        deployment_available(&ctx.client, CCM_NS, &workload)
    })
    .await;
    // A host-network Pod's identity is the Node's host name and a UUID (upstream's format).
    wait("a manager leading", Duration::from_secs(60), || async {
        let holder = lease_holder(&ctx).await?;
        (!holder.starts_with("ccm-operator-")).then_some(())
    })
    .await;
    let t = Instant::now();
    crs.delete(CCM_NAME, &Default::default()).await.expect("deleting the resource");
    wait("the resource gone", Duration::from_secs(60), || async {
        crs.get_opt(CCM_NAME).await.ok().and_then(|o| o.is_none().then_some(()))
    })
    .await;
    println!("    delete to resource gone: {:.1} s", t.elapsed().as_secs_f64());
    let children = || {
        ctx.cluster
            .kubectl_raw(&[
                "get",
                "deploy,ds,rs,pod,sa,role,rolebinding,pdb",
                "-n",
                CCM_NS,
                "-l",
                "app.kubernetes.io/managed-by=ccm-operator",
                "-o",
                "name",
            ])
            .unwrap_or_default()
    };
    let gone = wait_quietly(Duration::from_secs(60), || async { children().trim().is_empty().then_some(()) }).await;
    assert!(gone.is_some(), "children left after the deletion:\n{}", children());
    // The manager released its Lease on the way out (it still had the RBAC to do so).
    assert_eq!(lease_holder(&ctx).await, None, "the Lease is released (or removed) when the resource goes");
    println!("    delete to every child gone: {:.1} s", t.elapsed().as_secs_f64());
}

async fn crash_loop(ctx: Arc<Ctx>) {
    // A value the manager's flag parser refuses (the operator's allow-list checks flag names
    // only): it exits at start, again and again.
    let mut spec = ccm_spec("Deployment", json!({"replicas": 1}));
    spec["spec"]["extraArgs"] = json!(["--concurrent-node-status-updates=not-a-number"]);
    let t = Instant::now();
    apply(&ctx.client, spec).await;
    let (_, reason, message) = wait("Degraded True", Duration::from_secs(60), || async {
        condition(&ctx, "Degraded").await.filter(|(s, _, _)| s == "True")
    })
    .await;
    println!("    crash-looping manager to Degraded=True {reason}: {:.1} s ({message})", t.elapsed().as_secs_f64());
    assert_eq!(reason, "ManagerCrashLooping", "{message}");
    let provider = wait("ProviderHealthy no longer True", Duration::from_secs(60), || async {
        condition(&ctx, "ProviderHealthy").await.filter(|(s, _, _)| s != "True")
    })
    .await;
    println!("    ProviderHealthy={} {}: {:.1} s", provider.0, provider.1, t.elapsed().as_secs_f64());
    // Fixed: the resource recovers.
    apply(&ctx.client, ccm_spec("Deployment", json!({"replicas": 1}))).await;
    wait("Degraded False again", Duration::from_secs(120), || async {
        condition(&ctx, "Degraded").await.filter(|(s, _, _)| s == "False")
    })
    .await;
    wait("the manager Deployment available again", Duration::from_secs(120), || {
        deployment_available(&ctx.client, CCM_NS, "ccm-baremetal")
    })
    .await;
}

/// Upgrades the release with `embedded.enabled` set as given and waits for the operator to
/// run with it.
async fn set_embedded(ctx: &Ctx, enabled: bool) {
    let mut args = vec!["upgrade", "ccm-operator", "charts/ccm-operator"];
    let rest = helm_args(images::TAG, enabled);
    args.extend(rest.iter().map(String::as_str));
    helm(ctx, &args);
    let flag = format!("--embedded-enabled={enabled}");
    wait("the operator running with the new embedded setting", Duration::from_secs(120), || async {
        let d = deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator").await?;
        let c = d.spec.as_ref()?.template.spec.as_ref()?.containers.first()?.clone();
        let args = c.args.unwrap_or_default();
        // The chart passes the flag only when it says something; absent means disabled.
        let matches = args.contains(&flag) || (!enabled && !args.iter().any(|a| a.starts_with("--embedded-enabled")));
        matches.then_some(())
    })
    .await;
}

async fn embedded_not_enabled(ctx: Arc<Ctx>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    set_embedded(&ctx, false).await;
    let t = Instant::now();
    apply(&ctx.client, ccm_spec("Embedded", json!({}))).await;
    let (_, reason, message) = wait("ConfigValid False", Duration::from_secs(60), || async {
        condition(&ctx, "ConfigValid").await.filter(|(s, _, _)| s == "False")
    })
    .await;
    println!("    ConfigValid=False {reason}: {:.1} s ({message})", t.elapsed().as_secs_f64());
    assert_eq!(reason, "EmbeddedNotEnabled", "{message}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let ds = daemonsets.get_opt(&format!("ccm-{CCM_NAME}")).await.expect("get").expect("the DaemonSet is kept");
    assert_eq!(ds.status.map(|s| s.number_ready), Some(1), "the running manager is left alone");
    http_get(&lb_address(&ctx).await).expect("traffic continues while the resource is refused");
    set_embedded(&ctx, true).await;
}

/// The three-Node scenario's namespace.
const MULTI_NS: &str = "multinode";

/// Whether Node `name` reports Ready=True.
async fn node_ready(ctx: &Ctx, name: &str) -> Option<bool> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let n = nodes.get(name).await.ok()?;
    let conditions = n.status?.conditions?;
    Some(conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `GET /` on a Pod's web server from inside another Pod (busybox `nc`: its `wget` crashes in
/// this image).
fn get_from_pod(ctx: &Ctx, pod: &str, ip: &str) -> Result<String, String> {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080");
    ctx.cluster.kubectl_raw(&["exec", "-n", MULTI_NS, pod, "--", "sh", "-c", &script]).map_err(|e| e.to_string())
}

/// Issue 46 item 1: three Nodes (two added in network namespaces of their own) are Ready;
/// Pods on different Nodes reach each other by Pod IP (routes between the Nodes' ranges); a
/// host-network Pod on an added Node has that Node's address and name; the client namespace
/// (behind the router) reaches a NodePort on every Node; an added Node stopped abruptly goes
/// NotReady and, started again, Ready with its Pod running again.
async fn three_nodes(ctx: Arc<Ctx>) {
    let names = ctx.cluster.node_names();
    assert_eq!(names.len(), 3, "{names:?}");
    wait("three Nodes Ready", Duration::from_secs(60), || async {
        for n in &names {
            node_ready(&ctx, n).await.filter(|r| *r)?;
        }
        Some(())
    })
    .await;
    apply(&ctx.client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MULTI_NS}})).await;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), MULTI_NS);
    let toleration = json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"}]);
    let t = Instant::now();
    for (i, node) in names.iter().enumerate() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-{}", i + 1), "namespace": MULTI_NS, "labels": {"app": "mn-web"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": toleration,
                "containers": [{"name": "web", "image": images::WEB, "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "mkdir -p /www && echo \"pod=$POD_NAME\" > /www/index.html && exec httpd -f -p 8080 -h /www"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}}]}});
        pods.create(&Default::default(), &serde_json::from_value(pod).expect("a Pod")).await.expect("a web Pod");
    }
    let host_net = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hostnet-2", "namespace": MULTI_NS},
        "spec": {"hostNetwork": true, "nodeSelector": {"kubernetes.io/hostname": names[1]}, "tolerations": toleration,
            "containers": [{"name": "sleep", "image": images::WEB, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "exec sleep 3600"]}]}});
    pods.create(&Default::default(), &serde_json::from_value(host_net).expect("a Pod"))
        .await
        .expect("the host-network Pod");
    let ips: Vec<String> = wait("the web Pods Ready, one on each Node", Duration::from_secs(120), || async {
        let mut ips = Vec::new();
        for (i, node) in names.iter().enumerate() {
            let p = pods.get(&format!("web-{}", i + 1)).await.ok()?;
            (is_ready(&p) && p.spec.as_ref()?.node_name.as_deref() == Some(node.as_str())).then_some(())?;
            ips.push(p.status?.pod_ip?);
        }
        Some(ips)
    })
    .await;
    println!("    three web Pods Ready, one per Node ({}): {:.1} s", ips.join(", "), t.elapsed().as_secs_f64());
    // Each Node's Pod range, routed between the Nodes.
    for (i, ip) in ips.iter().enumerate() {
        let range = ctx.cluster.node(&names[i]).expect("the Node's plan").pod_cidr;
        let prefix = range.rsplit_once('.').map(|(p, _)| format!("{p}.")).unwrap_or_default();
        assert!(ip.starts_with(&prefix), "web-{} on {} has {ip}, outside {range}", i + 1, names[i]);
    }
    let t = Instant::now();
    for (from, to) in [(2, 3), (3, 1), (1, 2)] {
        let body = get_from_pod(&ctx, &format!("web-{from}"), &ips[to - 1]).expect("a request between Pods");
        assert!(body.contains(&format!("pod=web-{to}")), "web-{from} to web-{to} at {}: {body}", ips[to - 1]);
    }
    println!("    Pod to Pod across Nodes (2 to 3, 3 to 1, 1 to 2): {:.1} s", t.elapsed().as_secs_f64());

    // A host-network Pod on an added Node is on that Node's network and has its host name.
    let node2 = ctx.cluster.node(&names[1]).expect("node 2's plan");
    let hostnet = wait("the host-network Pod running", Duration::from_secs(60), || async {
        let p = pods.get("hostnet-2").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await;
    assert_eq!(hostnet.status.and_then(|s| s.pod_ip), Some(node2.ip.to_string()));
    let hostname = ctx.cluster.kubectl_raw(&["exec", "-n", MULTI_NS, "hostnet-2", "--", "hostname"]).expect("exec");
    assert_eq!(hostname.trim(), names[1], "a host-network Pod sees its Node's host name");

    // A NodePort on every Node, from the client (behind the router).
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), MULTI_NS);
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "mn-web", "namespace": MULTI_NS},
        "spec": {"type": "NodePort", "selector": {"app": "mn-web"}, "ports": [{"port": 8080, "targetPort": 8080}]}});
    let svc = services
        .create(&Default::default(), &serde_json::from_value(svc).expect("a Service"))
        .await
        .expect("the Service");
    let port = svc.spec.and_then(|s| s.ports?.first()?.node_port).expect("a nodePort");
    let t = Instant::now();
    let addresses: Vec<String> =
        names.iter().map(|n| format!("{}:{port}", ctx.cluster.node(n).expect("a Node's plan").ip)).collect();
    for addr in &addresses {
        wait(&format!("the client reaching NodePort {addr}"), Duration::from_secs(60), || {
            let addr = addr.clone();
            let answer = ctx.cluster.run_in(Place::Client, move || http_get(&addr));
            async move { answer.ok()?.ok().filter(|b| b.contains("pod=web-")) }
        })
        .await;
    }
    println!("    the client reaches the NodePort on {}: {:.1} s", addresses.join(", "), t.elapsed().as_secs_f64());

    // Node 3 stopped abruptly: its Node goes NotReady; nothing answers at its address.
    let third = names[2].clone();
    let t = Instant::now();
    let cluster = ctx.clone();
    let stopping = third.clone();
    tokio::task::spawn_blocking(move || cluster.cluster.stop_node(&stopping))
        .await
        .expect("the stop thread")
        .expect("stopping node 3");
    println!("    {third} stopped (every process killed, its namespace gone): {:.1} s", t.elapsed().as_secs_f64());
    let gone = addresses[2].clone();
    let answer = ctx.cluster.run_in(Place::Client, move || http_get(&gone)).expect("the client thread");
    assert!(answer.is_err(), "a stopped Node answers nothing: {answer:?}");
    wait(&format!("{third} NotReady"), Duration::from_secs(150), || async {
        node_ready(&ctx, &third).await.filter(|r| !r).map(drop)
    })
    .await;
    println!("    {third} stopped to NotReady: {:.1} s", t.elapsed().as_secs_f64());
    // The others still serve.
    let addr = addresses[1].clone();
    let answer = ctx.cluster.run_in(Place::Client, move || http_get(&addr)).expect("the client thread");
    assert!(answer.is_ok_and(|b| b.contains("pod=web-")), "node 2's NodePort still answers");

    // Started again: Ready, its Pod running again in a new sandbox, its NodePort answering.
    let t = Instant::now();
    let cluster = ctx.clone();
    let starting = third.clone();
    tokio::task::spawn_blocking(move || cluster.cluster.start_node(&starting))
        .await
        .expect("the start thread")
        .expect("starting node 3");
    println!("    {third} started to Ready: {:.1} s", t.elapsed().as_secs_f64());
    wait("web-3 Ready again", Duration::from_secs(120), || async { pods.get("web-3").await.ok().filter(is_ready) })
        .await;
    let addr = addresses[2].clone();
    wait(&format!("the client reaching NodePort {addr} again"), Duration::from_secs(60), || {
        let addr = addr.clone();
        let answer = ctx.cluster.run_in(Place::Client, move || http_get(&addr));
        async move { answer.ok()?.ok().filter(|b| b.contains("pod=web-")) }
    })
    .await;
    println!("    {third} started to its Pod Ready and its NodePort answering: {:.1} s", t.elapsed().as_secs_f64());
    router_runs_bird(&ctx);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let _ = namespaces.delete(MULTI_NS, &Default::default()).await;
}

/// The router namespace forwards and runs BIRD (when installed: CI's bird2) from the harness,
/// answering on its control socket; the cluster's stop kills it with the namespace.
fn router_runs_bird(ctx: &Ctx) {
    let routes = ctx.cluster.command_in(Place::Router, "ip", &["route", "show", "default"]).expect("ip in the router");
    assert!(routes.contains("via 198.19.0.1"), "the router's default route is the host: {routes}");
    if Command::new("bird").arg("--version").output().is_err() {
        println!("    no bird on this host: BIRD in the router not checked");
        return;
    }
    let dir = ctx.cluster.state_dir().join("router");
    std::fs::create_dir_all(&dir).expect("the router's directory");
    let (conf, sock) = (dir.join("bird.conf"), dir.join("bird.ctl"));
    std::fs::write(&conf, "router id 198.19.0.254;\nprotocol device {}\n").expect("bird.conf");
    let args = ["-f", "-c", &conf.to_string_lossy(), "-s", &sock.to_string_lossy()].map(String::from);
    ctx.cluster.spawn_in(Place::Router, "bird", Path::new("bird"), &args).expect("bird in the router");
    let t = Instant::now();
    let status = loop {
        let out = Command::new("birdc").arg("-s").arg(&sock).args(["show", "status"]).output();
        match out {
            Ok(o) if o.status.success() => break String::from_utf8_lossy(&o.stdout).into_owned(),
            _ if t.elapsed() > Duration::from_secs(10) => panic!("birdc never answered on {}", sock.display()),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(status.contains("198.19.0.254"), "{status}");
    println!("    BIRD in the router answering: {:.1} s", t.elapsed().as_secs_f64());
}
