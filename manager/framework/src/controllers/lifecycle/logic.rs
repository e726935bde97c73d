//! Pure decisions of the cloud-node-lifecycle controller: which Nodes need a cloud check, and
//! when an absent instance has been absent long enough to delete its Node.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint};

use crate::controllers::node::logic::TAINT_SHUTDOWN;

/// Effect of the shutdown taint.
pub const SHUTDOWN_EFFECT: &str = "NoSchedule";

/// The taint put on Nodes whose instance is shut down (no value, effect NoSchedule).
pub fn shutdown_taint() -> Taint {
    Taint { key: TAINT_SHUTDOWN.to_string(), effect: SHUTDOWN_EFFECT.to_string(), ..Default::default() }
}

/// Whether `t` is the shutdown taint (matched by key and effect, like upstream).
pub fn is_shutdown_taint(t: &Taint) -> bool {
    t.key == TAINT_SHUTDOWN && t.effect == SHUTDOWN_EFFECT
}

/// Whether the Node carries the shutdown taint.
pub fn has_shutdown_taint(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(is_shutdown_taint))
}

/// Whether the Node's `Ready` condition is `True`. A missing condition counts as Unknown (L2).
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// What one pass does with one Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Ready and untainted: no API call, no cloud call (L1).
    Nothing,
    /// Ready but still carrying the shutdown taint: remove it, no cloud call (L1).
    RemoveShutdownTaint,
    /// Not Ready: ask the cloud whether the instance exists, then whether it is shut down
    /// (L2–L5).
    CheckInstance,
}

/// Classify a cached Node.
pub fn classify(node: &Node) -> Action {
    match (is_ready(node), has_shutdown_taint(node)) {
        (true, true) => Action::RemoveShutdownTaint,
        (true, false) => Action::Nothing,
        (false, _) => Action::CheckInstance,
    }
}

/// Identity of a Node for the grace period: a re-created Node (new UID) starts afresh.
pub type NodeKey = (String, String);

/// When each instance was first reported absent, in memory (a restart starts the grace period
/// over, which errs towards keeping Nodes).
#[derive(Debug, Default)]
pub struct AbsenceTracker {
    first_absent: HashMap<NodeKey, Instant>,
}

impl AbsenceTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cloud reported the instance absent at `now`: whether it has now been absent for at
    /// least `grace` (a zero grace deletes at once, as upstream does).
    pub fn absent(&mut self, key: NodeKey, now: Instant, grace: Duration) -> bool {
        let since = *self.first_absent.entry(key).or_insert(now);
        now.saturating_duration_since(since) >= grace
    }

    /// The cloud reported the instance present: forget any absence.
    pub fn present(&mut self, key: &NodeKey) {
        self.first_absent.remove(key);
    }

    /// Keep only the entries `keep` accepts (for example Nodes still cached and not Ready).
    pub fn retain(&mut self, mut keep: impl FnMut(&NodeKey) -> bool) {
        self.first_absent.retain(|k, _| keep(k));
    }

    /// Since when the instance has been reported absent, if it is.
    pub fn absent_since(&self, key: &NodeKey) -> Option<Instant> {
        self.first_absent.get(key).copied()
    }

    /// Entries tracked.
    pub fn len(&self) -> usize {
        self.first_absent.len()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.first_absent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    fn node(ready: Option<&str>, taints: Vec<Taint>) -> Node {
        Node {
            spec: Some(NodeSpec { taints: Some(taints), ..Default::default() }),
            status: Some(NodeStatus {
                conditions: ready.map(|s| {
                    vec![
                        NodeCondition { type_: "MemoryPressure".into(), status: "False".into(), ..Default::default() },
                        NodeCondition { type_: "Ready".into(), status: s.into(), ..Default::default() },
                    ]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn l1_ready_nodes_need_nothing_unless_they_carry_the_shutdown_taint() {
        assert_eq!(classify(&node(Some("True"), vec![])), Action::Nothing);
        assert_eq!(classify(&node(Some("True"), vec![shutdown_taint()])), Action::RemoveShutdownTaint);
        let other_effect = Taint { effect: "NoExecute".into(), ..shutdown_taint() };
        assert_eq!(classify(&node(Some("True"), vec![other_effect])), Action::Nothing, "matched by key and effect");
    }

    #[test]
    fn l2_not_ready_unknown_or_missing_ready_condition_gets_checked() {
        assert_eq!(classify(&node(Some("False"), vec![])), Action::CheckInstance);
        assert_eq!(classify(&node(Some("Unknown"), vec![shutdown_taint()])), Action::CheckInstance);
        assert_eq!(classify(&node(None, vec![])), Action::CheckInstance);
        assert_eq!(classify(&Node::default()), Action::CheckInstance);
    }

    #[test]
    fn zero_grace_deletes_at_once() {
        let mut t = AbsenceTracker::new();
        assert!(t.absent(("a".into(), "u".into()), Instant::now(), Duration::ZERO));
    }

    #[test]
    fn grace_period_needs_continuous_absence() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        let key: NodeKey = ("a".into(), "u1".into());
        let mut t = AbsenceTracker::new();
        assert!(!t.absent(key.clone(), t0, grace));
        assert!(!t.absent(key.clone(), t0 + Duration::from_secs(29), grace));
        assert!(t.absent(key.clone(), t0 + Duration::from_secs(30), grace));
        // Reported present once: the clock starts over.
        t.present(&key);
        assert!(!t.absent(key.clone(), t0 + Duration::from_secs(31), grace));
        assert_eq!(t.absent_since(&key), Some(t0 + Duration::from_secs(31)));
        // A re-created Node (new UID) does not inherit the old one's absence.
        assert!(!t.absent(("a".into(), "u2".into()), t0 + Duration::from_secs(100), grace));
        t.retain(|k| k.1 == "u2");
        assert_eq!(t.len(), 1);
    }
}
