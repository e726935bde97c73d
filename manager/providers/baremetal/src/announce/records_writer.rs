//! Keeps the `ServiceAnnouncement` records in the announcers' namespace as
//! [`super::records::plan`] says (I/O): a watch of the records, this node's writes by
//! server-side apply, and on stop the deletion of this node's records. Runs beside the
//! announcer loop, so a slow or refused write never delays an election or a failover.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crds::announcement::{ANNOUNCEMENT_LABEL, ANNOUNCEMENT_LABEL_VALUE, ServiceAnnouncement, ServiceAnnouncementSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::records::{self, RecordsView, Write};
use super::reflect::reflect;

/// How soon a failed write is tried again.
pub const RETRY: Duration = Duration::from_secs(2);
/// How long the deletion of this node's records may take on stop.
pub const STOP_BUDGET: Duration = Duration::from_secs(3);

/// Keep this node's records as `view` says until `cancel`, then delete them (best effort),
/// writing as `field_manager`. `view` is `None` until the announcer has read its caches:
/// nothing is written before.
pub async fn run(
    field_manager: &'static str,
    client: kube::Client,
    namespace: String,
    node: String,
    mut view: watch::Receiver<Option<RecordsView>>,
    cancel: CancellationToken,
) {
    let api: Api<ServiceAnnouncement> = Api::namespaced(client, &namespace);
    let changed = Arc::new(Notify::new());
    let watch_stop = CancellationToken::new();
    let selector = format!("{ANNOUNCEMENT_LABEL}={ANNOUNCEMENT_LABEL_VALUE}");
    let store = reflect(api.clone(), watcher::Config::default().labels(&selector), trim, changed.clone(), &watch_stop);
    let ready = tokio::select! {
        _ = cancel.cancelled() => false,
        ready = store.wait_until_ready() => ready.is_ok(),
    };
    if !ready {
        watch_stop.cancel();
        return;
    }
    let mut retry = false;
    // Names applied by this run: on stop they are deleted even before the watch shows them.
    let mut applied: BTreeSet<String> = BTreeSet::new();
    loop {
        let current = view.borrow_and_update().clone();
        if let Some(current) = current {
            let writes = records::plan(&node, &current, &existing(&store));
            retry = false;
            for write in writes {
                if let Write::Apply(name, _) = &write {
                    applied.insert(name.clone());
                }
                if let Err(error) = execute(&api, field_manager, &write).await {
                    tracing::warn!(%node, %error, "writing the announcement records failed; retrying");
                    retry = true;
                    break;
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            result = view.changed() => if result.is_err() { break },
            _ = changed.notified() => {}
            _ = tokio::time::sleep(RETRY), if retry => {}
        }
    }
    let mut own: BTreeSet<String> =
        existing(&store).into_iter().filter(|(_, s)| s.node == node).map(|(n, _)| n).collect();
    own.extend(applied);
    let deletions = async {
        for name in own {
            if let Err(error) = execute(&api, field_manager, &Write::Delete(name)).await {
                tracing::warn!(%node, %error, "deleting an announcement record on stop failed; the others delete it");
            }
        }
    };
    let _ = tokio::time::timeout(STOP_BUDGET, deletions).await;
    watch_stop.cancel();
}

fn existing(store: &Store<ServiceAnnouncement>) -> BTreeMap<String, ServiceAnnouncementSpec> {
    store.state().iter().map(|r| (r.name_any(), r.spec.clone())).collect()
}

async fn execute(api: &Api<ServiceAnnouncement>, field_manager: &str, write: &Write) -> Result<(), kube::Error> {
    match write {
        Write::Apply(name, spec) => {
            let record = json!({
                "apiVersion": "ccm.rs/v1alpha1",
                "kind": "ServiceAnnouncement",
                "metadata": {"name": name, "labels": {ANNOUNCEMENT_LABEL: ANNOUNCEMENT_LABEL_VALUE}},
                "spec": spec,
            });
            api.patch(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&record)).await.map(|_| ())
        }
        Write::Delete(name) => match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            // Someone else (its node, or the first live announcer) deleted it first.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        },
    }
}

fn trim(record: &mut ServiceAnnouncement) {
    record.metadata.managed_fields = None;
}
