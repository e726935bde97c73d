//! The lifecycle controller in shadow mode: the pass decides as usual, and each write it
//! would make (untaint, taint, delete) is collected here instead of sent.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::NAME;
use super::logic::SHUTDOWN_EFFECT;
use crate::controller::Context;
use crate::controllers::node::logic::TAINT_SHUTDOWN;
use crate::controllers::shadow::{Comparer, reference};
use crate::shadow::{DifferenceKind, FieldDifference, ObjectKey};

/// One write the pass would make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Intended {
    kind: DifferenceKind,
    field: FieldDifference,
}

/// Remove the shutdown taint from a Ready Node.
pub(crate) fn remove_shutdown_taint() -> Intended {
    Intended {
        kind: DifferenceKind::WouldPatch,
        field: FieldDifference::new(format!("spec.taints[{TAINT_SHUTDOWN}]"), ""),
    }
}

/// Add the shutdown taint to a Node whose instance is shut down.
pub(crate) fn add_shutdown_taint() -> Intended {
    Intended {
        kind: DifferenceKind::WouldPatch,
        field: FieldDifference::new(format!("spec.taints[{TAINT_SHUTDOWN}]"), SHUTDOWN_EFFECT),
    }
}

/// Delete a Node whose instance is gone.
pub(crate) fn delete_node() -> Intended {
    Intended { kind: DifferenceKind::WouldDelete, field: FieldDifference::new("instance", "absent from the cloud") }
}

/// What one pass would have written.
#[derive(Debug, Default)]
pub(crate) struct ShadowPass {
    intended: BTreeMap<String, (Arc<Node>, Intended)>,
    /// Nodes whose cloud check failed: their earlier comparison stands.
    pub(crate) unknown: HashSet<String>,
}

impl ShadowPass {
    /// The pass would write this to `node`.
    pub(crate) fn add(&mut self, node: Arc<Node>, intended: Intended) {
        self.intended.insert(node.name_any(), (node, intended));
    }

    /// Record every cached Node: what would be written, or agreement.
    pub(crate) fn commit(self, ctx: &Context, comparer: &Comparer) {
        let mut intended = self.intended;
        for node in ctx.nodes.state() {
            let name = node.name_any();
            if self.unknown.contains(&name) {
                continue;
            }
            let key = ObjectKey::node(&name);
            match intended.remove(&name) {
                Some((node, i)) => comparer.record(
                    key.clone(),
                    Some(reference(node.as_ref())),
                    vec![crate::shadow::Difference::new(NAME, key, i.kind, vec![i.field])],
                ),
                None => comparer.record(key, None, Vec::new()),
            }
        }
        let cache = ctx.nodes.clone();
        comparer.finish_pass(|k| cache.get(None, &k.name).is_some());
    }
}
