//! Operator scenario: restarts with existing resources. Every restart must reconcile every
//! CloudControllerManager that is already there (issue 12: reconciles that waited on the
//! shared stores' readiness were never woken again when several waited at once, which only
//! shows when the stores take a while to list, as on a genuine kube-apiserver).

use std::time::Duration;

use crate::kit::Env;
use crds::CloudControllerManager;
use crds::conditions::types;
use operator::names::FINALIZER;
use serde_json::json;
use testkit::poll_within;

/// Resources present across the restarts.
const RESOURCES: usize = 20;
/// Operator restarts.
const RESTARTS: usize = 10;

/// The spec of resource `i` in `round`: a new `clusterName` each round bumps the generation,
/// so a resource counts as reconciled only if this round's operator handled it. Every fifth
/// names an unknown provider, so invalid resources are among them too.
fn spec(i: usize, round: usize) -> serde_json::Value {
    let provider = if i % 5 == 0 { "nimbus" } else { "fake" };
    json!({"provider": provider, "controllers": ["cloud-node"], "configureCloudRoutes": false,
           "clusterName": format!("restart-{round}")})
}

/// Why `cr` does not yet count as reconciled at its current generation, if it does not.
fn unreconciled(cr: &CloudControllerManager) -> Option<String> {
    let name = cr.metadata.name.clone().unwrap_or_default();
    let generation = cr.metadata.generation;
    if !cr.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER) {
        return Some(format!("{name}: no finalizer"));
    }
    let Some(status) = &cr.status else { return Some(format!("{name}: no status")) };
    if status.observed_generation != generation {
        return Some(format!("{name}: observedGeneration {:?} of {generation:?}", status.observed_generation));
    }
    for type_ in [types::CONFIG_VALID, types::READY] {
        if !status.conditions.iter().any(|c| c.type_ == type_) {
            return Some(format!("{name}: no {type_}"));
        }
    }
    if let Some(c) = status.conditions.iter().find(|c| c.observed_generation != generation) {
        return Some(format!(
            "{name}: {} at observedGeneration {:?} of {generation:?}",
            c.type_, c.observed_generation
        ));
    }
    None
}

testkit::backend_tests! {
    /// Ten restarts with twenty existing resources (each changed while the operator was down):
    /// after every restart each has the finalizer and conditions at its current generation.
    async fn every_existing_resource_is_reconciled_after_each_of_ten_restarts(backend) {
        let env = Env::start(backend, "restart").await;
        for i in 0..RESOURCES {
            env.apply_cr(&format!("ccm-{i:02}"), spec(i, 0)).await;
        }
        for round in 1..=RESTARTS {
            let mut config = env.operator_config();
            config.identity = format!("operator-{round}");
            let mut election = operator::OperatorConfig::operator_lease(&env.ns, &config.identity);
            election.release_on_cancel = true;
            config.leader_election = Some(election);
            let op = operator::start(config).await.expect("the operator starts");
            let last = std::sync::Mutex::new(Vec::new());
            let started = tokio::time::Instant::now();
            let done = poll_within(Duration::from_secs(60), || async {
                let list = env.crs().list(&Default::default()).await.ok()?;
                let pending: Vec<String> = list.items.iter().filter_map(unreconciled).collect();
                let all = list.items.len() == RESOURCES && pending.is_empty();
                *last.lock().unwrap() = pending;
                all.then_some(())
            })
            .await;
            op.stop().await.expect("the operator stops");
            assert!(
                done.is_some(),
                "restart {round}: not every resource was reconciled:\n  {}",
                last.lock().unwrap().join("\n  ")
            );
            println!("restart {round}: {RESOURCES} resources reconciled in {:?}", started.elapsed());
            // Change every resource while no operator runs.
            for i in 0..RESOURCES {
                env.apply_cr(&format!("ccm-{i:02}"), spec(i, round)).await;
            }
        }
        env.finish().await;
    }
}
