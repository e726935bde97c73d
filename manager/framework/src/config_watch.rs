//! Cloud-config edits while the manager runs.
//!
//! A Secret mounted as a volume is updated in place by kubelet (it writes the new files and
//! swaps a symlink) within about a minute of the edit. The manager reads the `--cloud-config`
//! file again every [`POLL_INTERVAL`] and hands a changed content to
//! [`CloudProvider::reload`](crate::provider::CloudProvider::reload): the provider applies
//! what it can in place (the baremetal pools) and says when a restart is needed instead.
//! Polling a small file is cheap and needs no inotify, which misses symlink swaps unless the
//! directory is watched. Only a SHA-256 digest of the content is kept, and nothing of it is
//! logged.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::provider::{CloudProvider, Reload};
use crate::registry::{FACTORY_TIME_LIMIT, MAX_CLOUD_CONFIG_BYTES, read_cloud_config_file};

/// How often the cloud-config file is read again.
pub const POLL_INTERVAL: Duration = Duration::from_secs(5);

/// SHA-256 of a cloud-config's content: what the watcher remembers instead of the content.
pub fn digest(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().to_vec()
}

/// Log what the provider did with an edit (field paths and counts, never content).
pub fn log_outcome(provider: &str, outcome: &Reload) {
    match outcome {
        Reload::Unchanged => {
            tracing::debug!(provider, "the cloud-config file changed but nothing the provider uses did")
        }
        Reload::Applied(what) => tracing::info!(provider, %what, "applied the cloud-config edit without a restart"),
        Reload::RestartNeeded(what) => tracing::info!(
            provider,
            %what,
            "the cloud-config edit needs a restart to take effect; running on with the previous configuration (the operator rolls managed pods for such edits)"
        ),
        Reload::Invalid(error) => tracing::warn!(
            provider,
            %error,
            "the edited cloud-config is invalid; running on with the previous configuration"
        ),
    }
}

/// Watch `path` until `shutdown`, handing each new content to `provider`. `last` is the
/// digest of the content the provider was built from.
pub async fn watch(
    path: PathBuf,
    provider: Arc<dyn CloudProvider>,
    mut last: Option<Vec<u8>>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut unreadable_logged = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let file = path.clone();
        let bytes = match tokio::task::spawn_blocking(move || read_cloud_config_file(&file)).await {
            Ok(Ok(bytes)) => bytes,
            // kubelet's symlink swap can make the file briefly absent; try again next round.
            Ok(Err(error)) => {
                if !unreadable_logged {
                    tracing::debug!(path = %path.display(), %error, "could not read the cloud-config file; trying again");
                    unreadable_logged = true;
                }
                continue;
            }
            Err(_) => continue,
        };
        unreadable_logged = false;
        let now = digest(&bytes);
        if last.as_ref() == Some(&now) {
            continue;
        }
        last = Some(now);
        if bytes.len() > MAX_CLOUD_CONFIG_BYTES {
            tracing::warn!(
                limit = MAX_CLOUD_CONFIG_BYTES,
                "the edited cloud-config is larger than the limit; running on with the previous configuration"
            );
            continue;
        }
        let target = provider.clone();
        let reload = tokio::task::spawn_blocking(move || target.reload(Some(&bytes)));
        let outcome = match tokio::time::timeout(FACTORY_TIME_LIMIT, reload).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => {
                tracing::warn!(provider = provider.name(), "the provider panicked reloading its cloud-config");
                continue;
            }
            Err(_) => {
                tracing::warn!(
                    provider = provider.name(),
                    limit = ?FACTORY_TIME_LIMIT,
                    "the provider did not finish reloading its cloud-config within the limit"
                );
                continue;
            }
        };
        log_outcome(provider.name(), &outcome);
    }
}

// The test builds kubelet's symlink layout.
#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records the contents it is handed.
    struct Recorder(Mutex<Vec<Vec<u8>>>);

    impl CloudProvider for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn reload(&self, cloud_config: Option<&[u8]>) -> Reload {
            self.0.lock().unwrap().push(cloud_config.unwrap_or_default().to_vec());
            Reload::Applied("recorded".into())
        }
    }

    /// Replace the file the way kubelet updates a Secret volume: a new directory, then an
    /// atomic rename of the `..data` symlink the file points through.
    fn publish(dir: &std::path::Path, version: u32, content: &[u8]) {
        let target = dir.join(format!("..v{version}"));
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("cloud.conf"), content).unwrap();
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
        let file = dir.join("cloud.conf");
        if std::fs::symlink_metadata(&file).is_err() {
            std::os::unix::fs::symlink("..data/cloud.conf", &file).unwrap();
        }
    }

    async fn seen_after(recorder: &Recorder, count: usize) -> Vec<Vec<u8>> {
        for _ in 0..200 {
            let seen = recorder.0.lock().unwrap().clone();
            if seen.len() >= count {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        recorder.0.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn each_new_content_is_handed_to_the_provider_once_through_a_symlink_swap() {
        let dir = std::env::temp_dir().join(format!("ccm-config-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        publish(&dir, 1, b"one");
        let recorder = Arc::new(Recorder(Mutex::new(Vec::new())));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(watch(
            dir.join("cloud.conf"),
            recorder.clone(),
            Some(digest(b"one")),
            Duration::from_millis(10),
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(recorder.0.lock().unwrap().is_empty(), "the content the provider was built from is not reloaded");

        publish(&dir, 2, b"two");
        assert_eq!(seen_after(&recorder, 1).await, [b"two".to_vec()]);
        // The same content written again (a new directory, same bytes) is no edit.
        publish(&dir, 3, b"two");
        publish(&dir, 4, b"three");
        assert_eq!(seen_after(&recorder, 2).await, [b"two".to_vec(), b"three".to_vec()]);

        shutdown.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
