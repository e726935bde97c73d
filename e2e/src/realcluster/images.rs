//! Images for the real cluster, built without a registry by `e2e/realcluster/mkimage.py` and
//! imported into the node's containerd.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// The sandbox (pause) image containerd runs for every Pod.
pub const PAUSE: &str = "localhost/ccm-e2e-pause:dev";
/// A web server (busybox `httpd`) that answers with its Pod's name: the backend of the
/// load-balancer scenarios.
pub const WEB: &str = "localhost/ccm-e2e-web:dev";
/// curl, for requests from inside the cluster's network (busybox's TLS client cannot talk to
/// the rustls servers' cipher suites).
pub const CURL: &str = "localhost/ccm-e2e-curl:dev";
/// The tag of the project's own images in the scenarios.
pub const TAG: &str = "e2e";
/// The operator image the scenarios install.
pub const OPERATOR: &str = "localhost/ccm-operator";
/// The manager image the scenarios install.
pub const MANAGER: &str = "localhost/cloud-controller-manager";

/// The upstream Go CCM (`../shared/upstream`, `bench` provider) as an image, for
/// `spec.upstream` with the `generic` profile: its entrypoint is the binary.
pub const UPSTREAM_BENCH: &str = "localhost/upstream-ccm-bench:e2e";

/// Builds [`UPSTREAM_BENCH`] from the unpacked, static upstream binary.
pub fn build_upstream_bench(binary: &Path, out: &Path) -> Result<(), Error> {
    generic(
        UPSTREAM_BENCH,
        out,
        &["--file".into(), format!("{}:/usr/local/bin/upstream-ccm-bench:0755", binary.display())],
        r#"["/usr/local/bin/upstream-ccm-bench"]"#,
    )
}

/// Upstream cloud-provider-aws (`../shared/upstream-aws`) as an image, for `spec.upstream` with
/// the `aws` profile: the binary where the published image has it, so the profile's command
/// runs it.
pub const UPSTREAM_AWS: &str = "localhost/upstream-aws-ccm:e2e";

/// Builds [`UPSTREAM_AWS`] from the unpacked, static upstream binary.
pub fn build_upstream_aws(binary: &Path, out: &Path) -> Result<(), Error> {
    generic(
        UPSTREAM_AWS,
        out,
        &["--file".into(), format!("{}:/bin/aws-cloud-controller-manager:0755", binary.display())],
        r#"["/bin/aws-cloud-controller-manager"]"#,
    )
}

/// The BIRD sidecar image of `spec.announcer.bgp` (the chart's `announcer.birdImage`), built
/// as the Dockerfile's `bird` target lays it out.
pub const BIRD: &str = "localhost/bird:e2e";

/// The image builder script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("realcluster/mkimage.py")
}

fn python(args: &[String]) -> Result<String, Error> {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .map_err(|e| Error::io("running python3 e2e/realcluster/mkimage.py", e))?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "mkimage.py {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A one-layer test image from host files (`mkimage.py generic`).
fn generic(name: &str, out: &Path, contents: &[String], entrypoint: &str) -> Result<(), Error> {
    let mut args: Vec<String> =
        vec!["generic".into(), "--name".into(), name.into(), "--out".into(), out.display().to_string()];
    args.extend_from_slice(contents);
    args.extend(["--entrypoint".into(), entrypoint.into()]);
    python(&args).map(drop)
}

/// Builds the pause image from the kit's static `pause` binary.
pub fn build_pause(pause: &Path, out: &Path) -> Result<(), Error> {
    generic(PAUSE, out, &["--file".into(), format!("{}:/pause:0755", pause.display())], r#"["/pause"]"#)
}

/// Builds the web image from a static busybox: `httpd` serving `/www`, whose index a Pod
/// writes at start with its own name (see the scenarios' web Deployment).
pub fn build_web(busybox: &Path, out: &Path) -> Result<(), Error> {
    generic(WEB, out, &["--busybox".into(), busybox.display().to_string()], r#"["/bin/sh"]"#)
}

/// Builds the curl image from the host's (dynamic) curl and its libraries.
pub fn build_curl(curl: &Path, out: &Path) -> Result<(), Error> {
    generic(CURL, out, &["--file".into(), format!("{}:/usr/bin/curl:0755", curl.display())], r#"["/usr/bin/curl"]"#)
}

/// Builds the BIRD sidecar image as the Dockerfile's `bird` target says (Debian's `bird2`, a
/// shell, its entrypoint) from the host's installed `bird2` package and a static busybox as the
/// shell (`mkimage.py bird`).
pub fn build_bird(busybox: &Path, out: &Path) -> Result<(), Error> {
    python(&[
        "bird".into(),
        "--name".into(),
        BIRD.into(),
        "--out".into(),
        out.display().to_string(),
        "--busybox".into(),
        busybox.display().to_string(),
    ])
    .map(drop)
}

/// Builds the operator and manager images from the binaries in `bin_dir`, as the Dockerfile
/// lays them out; returns the two archives.
pub fn build_project(bin_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>, Error> {
    python(&[
        "--bin-dir".into(),
        bin_dir.display().to_string(),
        "--out-dir".into(),
        out_dir.display().to_string(),
        "--tag".into(),
        TAG.into(),
    ])?;
    Ok(["ccm-operator", "cloud-controller-manager"].iter().map(|n| out_dir.join(format!("{n}.tar"))).collect())
}

/// Imports an image archive into the host's Node's containerd (namespace `k8s.io`, the
/// kubelet's); [`super::RealCluster::import_image`] imports into every Node.
pub fn import(archive: &Path) -> Result<(), Error> {
    import_into(&super::RealCluster::containerd_socket(), archive)
}

/// Imports an image archive into the containerd at `socket`.
pub fn import_into(socket: &Path, archive: &Path) -> Result<(), Error> {
    let out = Command::new("ctr")
        .args(["-a", &socket.to_string_lossy(), "-n", "k8s.io", "images", "import"])
        .arg(archive)
        .output()
        .map_err(|e| Error::io("running ctr images import", e))?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
