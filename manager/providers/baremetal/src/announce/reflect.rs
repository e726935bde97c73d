//! A watch cache for the announcer's loops (I/O): a reflector kept current by a task, which
//! notifies on every event so the loop looks again.

use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A reflector's store, kept current by a task until `cancel`; `changed` is notified on every
/// event.
pub fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    changed: Arc<Notify>,
    cancel: &CancellationToken,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, config).modify(trim)).default_backoff();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                event = stream.next() => match event {
                    None => return,
                    Some(Err(error)) => tracing::warn!(%error, "announcer watch failed; retrying"),
                    Some(Ok(_)) => changed.notify_one(),
                },
            }
        }
    });
    reader
}
