//! Reports the provider's health on a CloudControllerManager (`--ccm-resource <ns>/<name>`).
//!
//! While leading, the manager runs the provider's health probe every interval and
//! server-side-applies, with field manager `cloud-controller-manager`, the `ProviderHealthy`
//! condition, in shadow mode the `ShadowAgrees` condition and `status.shadow`, and once the
//! service controller scanned, `status.orphans` (S34): the status fields it writes (docs/architecture.md, "Status fields and their writers"). Every other field, `status.controllers` and `status.leader` included, belongs to
//! the operator and is never touched: the CRD declares `conditions` a map list keyed by `type`. Nothing is written when nothing
//! changed, and `lastTransitionTime` moves only when the condition's status flips.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crds::conditions::{self, DesiredCondition, Status, types};
use crds::{CloudControllerManager, CloudControllerManagerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::orphans::{OrphanRecord, OrphanSummary};
use crate::provider::{CloudProvider, Health, health_reasons};
use crate::shadow::{REPORT_LIMIT, Shadow, Summary};

/// Reasons of `ShadowAgrees`, defined with every other reason in [`crds::reasons`].
pub use crds::reasons::shadow_agrees as shadow_reasons;

/// The field manager of the manager's status writes.
pub const FIELD_MANAGER: &str = "cloud-controller-manager";

/// Default interval between health probes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// How long a health probe may take before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The CloudControllerManager to report on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusTarget {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl FromStr for StatusTarget {
    type Err = String;

    /// Parse `<namespace>/<name>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self { namespace: ns.to_string(), name: name.to_string() })
            }
            _ => Err(format!("{s:?} is not <namespace>/<name>")),
        }
    }
}

impl std::fmt::Display for StatusTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The `ProviderHealthy` condition for a probe outcome.
pub fn provider_condition(health: &Health) -> DesiredCondition {
    let message = match health.message() {
        "" if health.is_healthy() => "the cloud provider's health probe passed".to_string(),
        m => m.to_string(),
    };
    DesiredCondition::new(types::PROVIDER_HEALTHY, Status::from_bool(health.is_healthy()), health.reason(), message)
}

/// The `ShadowAgrees` condition for a shadow record: Unknown until every controller compared
/// once, then True without differences and False with them; the message counts them by
/// controller and kind.
pub fn shadow_condition(summary: &Summary) -> DesiredCondition {
    let (status, reason, message) = if !summary.pending.is_empty() {
        (
            Status::Unknown,
            shadow_reasons::COMPARING,
            format!("waiting for the first comparison of {}", summary.pending.join(", ")),
        )
    } else if summary.total == 0 {
        let compared =
            if summary.compared.is_empty() { "no controller".to_string() } else { summary.compared.join(", ") };
        (Status::True, shadow_reasons::AGREES, format!("no differences; compared: {compared}"))
    } else {
        (
            Status::False,
            shadow_reasons::DIFFERS,
            format!("{} differences on {} objects: {}", summary.total, summary.objects, summary.counts_text()),
        )
    };
    DesiredCondition::new(types::SHADOW_AGREES, status, reason, message)
}

/// `status.shadow` for a shadow record: totals, counts, and the first differences.
pub fn shadow_report(summary: &Summary) -> crds::v1alpha1::ShadowReport {
    use crds::v1alpha1::{ShadowCount, ShadowDifference, ShadowField, ShadowReport};
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    ShadowReport {
        total: count(summary.total),
        objects: count(summary.objects),
        pending: summary.pending.iter().map(|c| c.to_string()).collect(),
        counts: summary
            .counts
            .iter()
            .map(|((controller, kind), n)| ShadowCount {
                controller: controller.to_string(),
                kind: kind.as_str().to_string(),
                count: count(*n),
            })
            .collect(),
        differences: summary
            .first
            .iter()
            .map(|d| ShadowDifference {
                controller: d.controller.to_string(),
                kind: d.kind.as_str().to_string(),
                object: d.object.to_string(),
                fields: d.fields.iter().map(|f| ShadowField { path: f.path.clone(), ours: f.ours.clone() }).collect(),
            })
            .collect(),
    }
}

/// The server-side-apply body to send, or `None` when the resource already says all of it.
///
/// `current` is the resource's status now, `generation` its `metadata.generation`.
pub fn desired_apply(
    current: Option<&CloudControllerManagerStatus>,
    generation: Option<i64>,
    health: &Health,
    now: &Time,
) -> Option<serde_json::Value> {
    desired_apply_with_shadow(current, generation, health, None, now)
}

/// [`desired_apply`] for a manager in shadow mode (`shadow`): also `ShadowAgrees` and
/// `status.shadow`. Every field this writer owns is in every body, as server-side apply
/// drops the owned fields a body leaves out.
pub fn desired_apply_with_shadow(
    current: Option<&CloudControllerManagerStatus>,
    generation: Option<i64>,
    health: &Health,
    shadow: Option<&Summary>,
    now: &Time,
) -> Option<serde_json::Value> {
    desired_apply_with_reports(current, generation, health, shadow, None, now)
}

/// [`desired_apply_with_shadow`] with the orphan report (`status.orphans`, S34) when the service
/// controller has scanned.
pub fn desired_apply_with_reports(
    current: Option<&CloudControllerManagerStatus>,
    generation: Option<i64>,
    health: &Health,
    shadow: Option<&Summary>,
    orphans: Option<&OrphanSummary>,
    now: &Time,
) -> Option<serde_json::Value> {
    let existing: &[Condition] = current.map_or(&[], |s| s.conditions.as_slice());
    let mut merged = existing.to_vec();
    let mut changed = conditions::set_condition(&mut merged, provider_condition(health), generation, now);
    let mut body_conditions = vec![conditions::find(&merged, types::PROVIDER_HEALTHY)?.clone()];
    let mut status = serde_json::Map::new();
    if let Some(summary) = shadow {
        changed |= conditions::set_condition(&mut merged, shadow_condition(summary), generation, now);
        body_conditions.push(conditions::find(&merged, types::SHADOW_AGREES)?.clone());
        let report = shadow_report(summary);
        changed |= current.and_then(|s| s.shadow.as_ref()) != Some(&report);
        status.insert("shadow".into(), serde_json::to_value(&report).ok()?);
    }
    if let Some(summary) = orphans {
        let report = crate::orphans::report(summary);
        changed |= current.and_then(|s| s.orphans.as_ref()) != Some(&report);
        status.insert("orphans".into(), serde_json::to_value(&report).ok()?);
    }
    if !changed {
        return None;
    }
    status.insert("conditions".into(), serde_json::to_value(&body_conditions).ok()?);
    Some(json!({
        "apiVersion": CloudControllerManager::api_version(&()),
        "kind": CloudControllerManager::kind(&()),
        "status": status
    }))
}

/// Run the provider's probe, turning a timeout into an unhealthy outcome.
pub async fn probe(provider: &dyn CloudProvider, timeout: Duration) -> Health {
    match tokio::time::timeout(timeout, provider.health()).await {
        Ok(h) => h,
        Err(_) => Health::unhealthy(
            health_reasons::PROBE_ERROR,
            format!("the health probe did not answer within {timeout:?}"),
        ),
    }
}

/// How soon the first report is checked again (then twice as long each time, up to the
/// reporting interval).
pub const FIRST_RECHECK: Duration = Duration::from_secs(1);

/// Probes the provider and writes the outcome.
pub struct StatusReporter {
    api: Api<CloudControllerManager>,
    target: StatusTarget,
    provider: Arc<dyn CloudProvider>,
    interval: Duration,
    probe_timeout: Duration,
    shadow: Option<Shadow>,
    orphans: Option<OrphanRecord>,
}

impl std::fmt::Debug for StatusReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusReporter").field("target", &self.target).field("interval", &self.interval).finish()
    }
}

impl StatusReporter {
    /// A reporter writing to `target`.
    pub fn new(client: Client, target: StatusTarget, provider: Arc<dyn CloudProvider>, interval: Duration) -> Self {
        Self {
            api: Api::namespaced(client, &target.namespace),
            target,
            provider,
            interval,
            probe_timeout: PROBE_TIMEOUT.min(interval.max(Duration::from_secs(1))),
            shadow: None,
            orphans: None,
        }
    }

    /// Also report this shadow record (`ShadowAgrees`, `status.shadow`): a manager in shadow mode.
    pub fn with_shadow(mut self, shadow: Option<Shadow>) -> Self {
        self.shadow = shadow;
        self
    }

    /// Also report the service controller's orphan scan (`status.orphans`, S34) once it ran.
    pub fn with_orphans(mut self, orphans: OrphanRecord) -> Self {
        self.orphans = Some(orphans);
        self
    }

    /// Probe and write until `stop` fires: every [`FIRST_RECHECK`], doubling up to the interval,
    /// so a first report that another writer's stale apply replaced, or that failed, is
    /// repaired within seconds instead of one interval later (a check that finds the report in
    /// place writes nothing).
    pub async fn run(self, stop: CancellationToken) {
        let mut wait = FIRST_RECHECK.min(self.interval);
        loop {
            match self.report_once().await {
                Ok(true) => tracing::debug!(resource = %self.target, "provider health reported"),
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, resource = %self.target, "could not report provider health"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = wait.saturating_mul(2).min(self.interval);
        }
    }

    /// One probe and, if something changed, one write. Returns whether it wrote.
    pub async fn report_once(&self) -> Result<bool, kube::Error> {
        let health = probe(self.provider.as_ref(), self.probe_timeout).await;
        let Some(current) = self.api.get_opt(&self.target.name).await? else {
            tracing::warn!(resource = %self.target, "the CloudControllerManager to report on does not exist");
            return Ok(false);
        };
        let now = Time(Timestamp::now());
        let summary = self.shadow.as_ref().map(|s| s.summary(REPORT_LIMIT));
        let orphans = self.orphans.as_ref().and_then(OrphanRecord::get);
        let Some(body) = desired_apply_with_reports(
            current.status.as_ref(),
            current.metadata.generation,
            &health,
            summary.as_ref(),
            orphans.as_ref(),
            &now,
        ) else {
            return Ok(false);
        };
        if !health.is_healthy() {
            tracing::warn!(resource = %self.target, reason = health.reason(), message = health.message(), "cloud provider unhealthy");
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.api.patch_status(&self.target.name, &params, &Patch::Apply(&body)).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn status_after(
        body: &serde_json::Value,
        before: Option<&CloudControllerManagerStatus>,
    ) -> CloudControllerManagerStatus {
        // What the API server would hold after applying `body` over `before`.
        let applied: CloudControllerManagerStatus = serde_json::from_value(body["status"].clone()).unwrap();
        let mut out = before.cloned().unwrap_or_default();
        for c in applied.conditions {
            out.conditions.retain(|x| x.type_ != c.type_);
            out.conditions.push(c);
        }
        out
    }

    #[test]
    fn target_parses_namespace_slash_name() {
        assert_eq!("kube-system/aws".parse(), Ok(StatusTarget { namespace: "kube-system".into(), name: "aws".into() }));
        for bad in ["aws", "/aws", "kube-system/", "a/b/c"] {
            assert!(bad.parse::<StatusTarget>().is_err(), "{bad}");
        }
    }

    #[test]
    fn first_report_applies_only_the_provider_healthy_condition() {
        let body = desired_apply(None, Some(3), &Health::healthy(""), &time(100)).unwrap();
        assert_eq!(body["apiVersion"], "ccm.rs/v1alpha1");
        assert_eq!(body["kind"], "CloudControllerManager");
        let c = &body["status"]["conditions"][0];
        assert_eq!(c["type"], "ProviderHealthy");
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "Healthy");
        assert_eq!(c["observedGeneration"], 3);
        assert_eq!(body["status"]["conditions"].as_array().unwrap().len(), 1, "only our condition is applied");
        // status.leader and status.controllers are the operator's (one writer per field).
        assert_eq!(body["status"].as_object().unwrap().len(), 1, "{body}");
    }

    #[test]
    fn nothing_is_written_when_nothing_changed() {
        let body = desired_apply(None, Some(1), &Health::healthy("ok"), &time(100)).unwrap();
        let now = status_after(&body, None);
        assert_eq!(desired_apply(Some(&now), Some(1), &Health::healthy("ok"), &time(200)), None);
        // A new generation is a change.
        assert!(desired_apply(Some(&now), Some(2), &Health::healthy("ok"), &time(200)).is_some());
    }

    #[test]
    fn last_transition_time_moves_only_when_the_status_flips() {
        let healthy = Health::healthy("");
        let b1 = desired_apply(None, None, &healthy, &time(100)).unwrap();
        let s1 = status_after(&b1, None);
        // A new message alone keeps the transition time.
        let b2 = desired_apply(Some(&s1), None, &Health::healthy("3 instances"), &time(200)).unwrap();
        let s2 = status_after(&b2, Some(&s1));
        assert_eq!(s2.conditions[0].last_transition_time, time(100));
        // Flipping to unhealthy moves it and carries the probe's reason.
        let sick = Health::unhealthy(health_reasons::CREDENTIALS_REJECTED, "401 from the API");
        let b3 = desired_apply(Some(&s2), None, &sick, &time(300)).unwrap();
        let s3 = status_after(&b3, Some(&s2));
        let c = &s3.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "CredentialsRejected"));
        assert_eq!(c.message, "401 from the API");
        assert_eq!(c.last_transition_time, time(300));
    }

    #[test]
    fn other_conditions_are_left_to_their_owner() {
        let mut current = CloudControllerManagerStatus::default();
        conditions::set_condition(
            &mut current.conditions,
            DesiredCondition::new(types::AVAILABLE, Status::True, "AsExpected", ""),
            None,
            &time(1),
        );
        let body = desired_apply(Some(&current), None, &Health::healthy(""), &time(5)).unwrap();
        let conds = body["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0]["type"], "ProviderHealthy");
    }

    fn summary_with(differences: usize) -> Summary {
        let shadow = Shadow::new();
        shadow.register("cloud-node-controller");
        for i in 0..differences {
            let key = crate::shadow::ObjectKey::node(format!("n{i}"));
            let d = crate::shadow::Difference::new(
                "cloud-node-controller",
                key.clone(),
                crate::shadow::DifferenceKind::Differs,
                vec![crate::shadow::FieldDifference::new("metadata.labels[topology.kubernetes.io/zone]", "z2")],
            );
            shadow.set("cloud-node-controller", key, vec![d]);
        }
        shadow.finish_pass("cloud-node-controller", |_| true);
        shadow.summary(REPORT_LIMIT)
    }

    #[test]
    fn shadow_agrees_is_unknown_until_compared_then_true_without_differences_and_false_with_counts() {
        let pending = Shadow::new();
        pending.register("service-lb-controller");
        let c = shadow_condition(&pending.summary(REPORT_LIMIT));
        assert_eq!((c.status, c.reason.as_str()), (Status::Unknown, shadow_reasons::COMPARING));
        let c = shadow_condition(&summary_with(0));
        assert_eq!((c.status, c.reason.as_str()), (Status::True, shadow_reasons::AGREES));
        let c = shadow_condition(&summary_with(3));
        assert_eq!((c.status, c.reason.as_str()), (Status::False, shadow_reasons::DIFFERS));
        assert_eq!(c.message, "3 differences on 3 objects: cloud-node-controller differs=3");
    }

    #[test]
    fn a_shadow_manager_applies_both_its_conditions_and_a_bounded_report_and_nothing_when_unchanged() {
        let summary = summary_with(30);
        let body = desired_apply_with_shadow(None, Some(1), &Health::healthy(""), Some(&summary), &time(100)).unwrap();
        let conds = body["status"]["conditions"].as_array().unwrap();
        let types: Vec<&str> = conds.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, vec!["ProviderHealthy", "ShadowAgrees"]);
        let report = &body["status"]["shadow"];
        assert_eq!(report["total"], 30);
        assert_eq!(report["differences"].as_array().unwrap().len(), REPORT_LIMIT);
        assert_eq!(report["differences"][0]["kind"], "differs");
        assert_eq!(report["differences"][0]["fields"][0]["ours"], "z2");
        assert_eq!(report["counts"][0]["count"], 30);
        // What the server then holds makes the next identical report a no-op.
        let mut held = status_after(&body, None);
        held.shadow = serde_json::from_value(report.clone()).unwrap();
        assert_eq!(
            desired_apply_with_shadow(Some(&held), Some(1), &Health::healthy(""), Some(&summary), &time(200)),
            None
        );
        assert!(
            desired_apply_with_shadow(Some(&held), Some(1), &Health::healthy(""), Some(&summary_with(2)), &time(200))
                .is_some()
        );
    }

    #[test]
    fn s34_the_orphan_report_is_applied_with_the_health_condition_and_nothing_when_unchanged() {
        use crate::provider::OwnedObject;
        let found = [OwnedObject::new("load-balancer", "a1", Some("ns/web".into()))];
        let summary = OrphanSummary::of(&found, true, false);
        let body =
            desired_apply_with_reports(None, Some(1), &Health::healthy(""), None, Some(&summary), &time(100)).unwrap();
        assert_eq!(body["status"]["orphans"]["total"], 1);
        assert_eq!(body["status"]["orphans"]["objects"][0]["id"], "a1");
        assert_eq!(body["status"]["orphans"]["objects"][0]["service"], "ns/web");
        assert_eq!(body["status"]["conditions"][0]["type"], "ProviderHealthy", "every owned field in every body");
        let mut held = status_after(&body, None);
        held.orphans = serde_json::from_value(body["status"]["orphans"].clone()).unwrap();
        let again =
            desired_apply_with_reports(Some(&held), Some(1), &Health::healthy(""), None, Some(&summary), &time(200));
        assert_eq!(again, None);
        let gone = OrphanSummary::of(&[], true, false);
        assert!(
            desired_apply_with_reports(Some(&held), Some(1), &Health::healthy(""), None, Some(&gone), &time(200))
                .is_some()
        );
    }

    struct Hangs;

    #[async_trait::async_trait]
    impl CloudProvider for Hangs {
        fn name(&self) -> &str {
            "hangs"
        }
        async fn health(&self) -> Health {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_hangs_is_reported_as_a_probe_error() {
        let h = probe(&Hangs, Duration::from_secs(10)).await;
        assert_eq!(h.reason(), health_reasons::PROBE_ERROR);
        assert!(!h.is_healthy());
    }
}
