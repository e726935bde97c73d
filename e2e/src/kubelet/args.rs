//! A pod's command line: the Deployment's arguments with the cloud-config copied out of its
//! Secret into a private file, and the local kubeconfig, address and port.

use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{PodTemplateSpec, Secret};
use kube::Client;
use kube::api::Api;
use operator::names;

use crate::Error;

/// The Deployment's arguments for one pod: the cloud-config copied out of its Secret into
/// `pod_dir`, and the local kubeconfig, port and address.
pub(super) async fn resolve_args(
    client: &Client,
    namespace: &str,
    template: &PodTemplateSpec,
    kubeconfig: &Path,
    port: u16,
    pod_dir: &Path,
) -> Result<(Vec<String>, Option<PathBuf>), Error> {
    let spec = template.spec.as_ref().ok_or_else(|| Error::Other("the pod template has no spec".into()))?;
    let container = spec
        .containers
        .iter()
        .find(|c| c.name == names::CONTAINER_NAME)
        .ok_or_else(|| Error::Other("no cloud-controller-manager container".into()))?;
    let mut args = Vec::new();
    let mut cloud_config = None;
    for arg in container.args.iter().flatten() {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        if matches!(flag, "--kubeconfig" | "--master" | "--secure-port" | "--bind-address") {
            continue;
        }
        if let Some(path) = arg.strip_prefix("--cloud-config=") {
            let file = copy_mounted_secret(client, namespace, template, path, pod_dir).await?;
            args.push(format!("--cloud-config={}", file.display()));
            cloud_config = Some(file);
            continue;
        }
        args.push(arg.clone());
    }
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    args.push("--bind-address=127.0.0.1".into());
    args.push(format!("--secure-port={port}"));
    // The sandbox's API server serves no TokenReview, so a token cannot be checked: open
    // /metrics to anyone on loopback, as the demo's instructions use it.
    args.push("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into());
    Ok((args, cloud_config))
}

/// Write the Secret key mounted at `path` to a private file under `pod_dir` (mode 0600).
async fn copy_mounted_secret(
    client: &Client,
    namespace: &str,
    template: &PodTemplateSpec,
    path: &str,
    pod_dir: &Path,
) -> Result<PathBuf, Error> {
    let spec = template.spec.as_ref().ok_or_else(|| Error::Other("the pod template has no spec".into()))?;
    let container = spec.containers.iter().find(|c| c.name == names::CONTAINER_NAME);
    let mount = container
        .and_then(|c| c.volume_mounts.as_ref())
        .into_iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .ok_or_else(|| Error::Other(format!("nothing is mounted at {path}")))?;
    let relative = path[mount.mount_path.len()..].trim_start_matches('/').to_string();
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .ok_or_else(|| Error::Other(format!("volume {} is not defined", mount.name)))?;
    let source = volume
        .secret
        .as_ref()
        .ok_or_else(|| Error::Other(format!("volume {} is not a Secret (only Secrets are supported)", mount.name)))?;
    let secret_name = source.secret_name.clone().unwrap_or_default();
    let key = source
        .items
        .iter()
        .flatten()
        .find(|i| i.path == relative)
        .map(|i| i.key.clone())
        .unwrap_or_else(|| relative.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(&secret_name)
        .await?
        .ok_or_else(|| Error::Other(format!("Secret {namespace}/{secret_name} does not exist")))?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .ok_or_else(|| Error::Other(format!("Secret {namespace}/{secret_name} has no key {key}")))?;
    let file = pod_dir.join("cloud-config").join(&relative);
    if let Some(parent) = file.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    write_private(&file, &value.0)?;
    Ok(file)
}

/// Write `data` to `file`, readable by this user only.
fn write_private(file: &Path, data: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| Error::io(format!("writing {}", file.display()), e))?;
    f.write_all(data).map_err(|e| Error::io(format!("writing {}", file.display()), e))
}
