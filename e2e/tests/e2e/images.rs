//! The images `e2e/realcluster/mkimage.py` builds without a registry agree with the `Dockerfile`.
//!
//! The script runs on stand-in binaries (coreutils' `echo`, a small glibc-dynamic ELF, linked under
//! both names) and the archives are opened by an independent reader (a few lines of Python's
//! `tarfile`, below). The Dockerfile is parsed here, separately from the script, and each image's
//! entrypoint, user, exposed ports and binaries are checked against it. Without python3 the tests
//! that need it are skipped with one printed line. Running the binaries inside the image (chroot,
//! as root) and `ctr images import` (when a containerd answers) are checked where possible.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use testkit::workspace_root;

fn script() -> PathBuf {
    workspace_root().join("e2e/realcluster/mkimage.py")
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile, read here on its own

/// One `FROM <runtime> AS <name>` stage.
#[derive(Debug)]
struct Target {
    entrypoint: Vec<String>,
    /// `PORT/PROTOCOL`, as in an image configuration's `ExposedPorts`.
    ports: BTreeSet<String>,
    user: String,
}

#[derive(Debug)]
struct Dockerfile {
    /// Paths in the image of the binaries the runtime stage copies.
    binaries: BTreeSet<String>,
    targets: BTreeMap<String, Target>,
}

fn dockerfile() -> Dockerfile {
    let text = std::fs::read_to_string(workspace_root().join("Dockerfile")).expect("the Dockerfile is readable");
    parse_dockerfile(&text)
}

/// A `FROM base [AS name]` stage and its (INSTRUCTION, arguments).
struct Stage {
    base: String,
    name: String,
    instructions: Vec<(String, String)>,
}

fn parse_dockerfile(text: &str) -> Dockerfile {
    // Logical lines: comments dropped, continuations joined.
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || (current.is_empty() && line.is_empty()) {
            continue;
        }
        if let Some(start) = line.strip_suffix('\\') {
            current.push_str(start);
            current.push(' ');
        } else {
            current.push_str(line);
            lines.push(std::mem::take(&mut current));
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in lines {
        let (instruction, args) = line.split_once(' ').unwrap_or((&line, ""));
        let instruction = instruction.to_ascii_uppercase();
        if instruction == "FROM" {
            let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            let name = if words.len() == 3 { words[2] } else { "" };
            stages.push(Stage { base: words[0].to_owned(), name: name.to_owned(), instructions: Vec::new() });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((instruction, args.trim().to_owned()));
        }
    }
    let names: BTreeSet<&str> = stages.iter().map(|s| s.name.as_str()).filter(|n| !n.is_empty()).collect();
    let image_stages: Vec<&Stage> = stages.iter().filter(|s| names.contains(s.base.as_str())).collect();
    let runtime_name = &image_stages.first().expect("the Dockerfile has `FROM <runtime> AS <image>` stages").base;
    let runtime = stages.iter().find(|s| &s.name == runtime_name).expect("the runtime stage exists");

    let mut binaries = BTreeSet::new();
    let mut runtime_user = None;
    for (instruction, args) in &runtime.instructions {
        match instruction.as_str() {
            "COPY" => {
                let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
                let (dest, sources) = words.split_last().expect("COPY has a destination");
                for source in sources {
                    let name = source.rsplit('/').next().expect("a file name");
                    binaries.insert(format!("{}/{name}", dest.trim_end_matches('/')));
                }
            }
            "USER" => runtime_user = Some(args.clone()),
            _ => {}
        }
    }
    let mut targets = BTreeMap::new();
    for Stage { name, instructions, .. } in image_stages {
        let mut target = Target { entrypoint: Vec::new(), ports: BTreeSet::new(), user: String::new() };
        let mut user = runtime_user.clone();
        for (instruction, args) in instructions {
            match instruction.as_str() {
                "ENTRYPOINT" => target.entrypoint = serde_json::from_str(args).expect("ENTRYPOINT is a JSON array"),
                "EXPOSE" => target.ports.extend(
                    args.split_whitespace().map(|p| if p.contains('/') { p.to_owned() } else { format!("{p}/tcp") }),
                ),
                "USER" => user = Some(args.clone()),
                _ => {}
            }
        }
        target.user = user.expect("the image stage has a USER (its own or the runtime stage's)");
        targets.insert(name.clone(), target);
    }
    Dockerfile { binaries, targets }
}

#[test]
fn the_dockerfile_declares_the_entrypoints_user_and_ports_the_chart_relies_on() {
    let df = dockerfile();
    let operator = &df.targets["ccm-operator"];
    let manager = &df.targets["cloud-controller-manager"];
    assert_eq!(df.targets.len(), 2, "{df:?}");
    assert_eq!(operator.entrypoint, ["/usr/local/bin/ccm-operator"]);
    assert_eq!(manager.entrypoint, ["/usr/local/bin/cloud-controller-manager"]);
    assert_eq!(operator.ports, BTreeSet::from(["8080/tcp".to_owned(), "8081/tcp".to_owned()]));
    assert_eq!(manager.ports, BTreeSet::from(["10258/tcp".to_owned()]));
    assert_eq!(operator.user, "65532:65532");
    assert_eq!(manager.user, "65532:65532");
    assert_eq!(
        df.binaries,
        BTreeSet::from([
            "/usr/local/bin/ccm-operator".to_owned(),
            "/usr/local/bin/cloud-controller-manager".to_owned()
        ])
    );
}

/// The providers the Dockerfile compiles into both binaries by default: the builder stage's
/// `ARG PROVIDERS=...`, checked to be what its one `cargo build` of the manager and the operator
/// selects (and nothing else: `--no-default-features`).
fn dockerfile_features(text: &str) -> Vec<String> {
    let default = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("ARG PROVIDERS="))
        .expect("the Dockerfile declares ARG PROVIDERS=<default>");
    let build = dockerfile_build(text, "cloud-controller-manager");
    assert!(
        build.contains("--no-default-features") && build.contains(r#"--features "${PROVIDERS}""#),
        "the build must select exactly PROVIDERS: {build}"
    );
    default.trim_matches('"').split(',').map(|f| f.trim().to_owned()).filter(|f| !f.is_empty()).collect()
}

/// The Dockerfile's `cargo build -p <package>` command, continuation lines joined.
fn dockerfile_build(text: &str, package: &str) -> String {
    text.replace("\\\n", " ")
        .split("&&")
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .find(|c| c.contains("cargo build") && c.contains(&format!("-p {package} ")))
        .unwrap_or_else(|| panic!("the Dockerfile builds {package} with `cargo build -p {package}`"))
}

/// The crates `cloud-controller-manager` links (normal dependencies, host platform) with these
/// cargo arguments, from Cargo.lock without network.
fn manager_crates(feature_args: &[&str]) -> BTreeSet<String> {
    crates_of("cloud-controller-manager", feature_args)
}

/// The crates `package` links (normal dependencies, host platform) with these cargo arguments.
fn crates_of(package: &str, feature_args: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .args(["--locked", "--offline"])
        .args(feature_args)
        .current_dir(workspace_root())
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_production_image_builds_the_manager_without_the_fake_provider_and_cargo_run_keeps_it() {
    let text = std::fs::read_to_string(workspace_root().join("Dockerfile")).expect("the Dockerfile is readable");
    let features = dockerfile_features(&text);
    assert!(!features.iter().any(|f| f == "fake"), "the production default must leave out fake: {features:?}");
    let production = manager_crates(&["--no-default-features", "--features", &features.join(",")]);
    assert!(!production.contains("ccm-provider-fake"), "the production manager links the fake provider");
    for provider in ["ccm-provider-baremetal", "ccm-provider-aws"] {
        assert!(production.contains(provider), "the production manager lacks {provider}: {features:?}");
    }
    // Issue 24: `cargo run -p cloud-controller-manager` has every built-in provider, no feature to remember.
    let default = manager_crates(&[]);
    for provider in ["ccm-provider-fake", "ccm-provider-baremetal", "ccm-provider-aws"] {
        assert!(default.contains(provider), "the default build lacks {provider}");
    }
}

#[test]
fn the_production_operator_knows_only_the_providers_its_manager_image_has() {
    let text = std::fs::read_to_string(workspace_root().join("Dockerfile")).expect("the Dockerfile is readable");
    let features = dockerfile_features(&text);
    // One cargo build of both binaries: ccm-builtin, the one provider list, is compiled once with
    // one feature set and linked into both.
    let build = dockerfile_build(&text, "operator");
    assert_eq!(build, dockerfile_build(&text, "cloud-controller-manager"), "both binaries come from one cargo build");
    let production = crates_of("operator", &["--no-default-features", "--features", &features.join(",")]);
    assert_eq!(
        production.iter().filter(|c| c.starts_with("ccm-provider-")).collect::<Vec<_>>(),
        manager_crates(&["--no-default-features", "--features", &features.join(",")])
            .iter()
            .filter(|c| c.starts_with("ccm-provider-"))
            .collect::<Vec<_>>(),
        "the operator and the manager link the same providers"
    );
    assert!(!production.contains("ccm-provider-fake"), "the production operator links the fake provider");
    assert!(crates_of("operator", &[]).contains("ccm-provider-fake"), "the default operator build lacks fake");
}

// ---------------------------------------------------------------------------------------------
// Running the script and reading its archives

/// Prints a skip line past libtest's output capture (which takes only `eprintln!` and friends), so
/// it shows in a normal run.
fn skip(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {message}");
}

/// `true` when python3 runs; otherwise prints the skip line (once per test run).
fn python3() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let ok = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
        if !ok {
            skip("image tests: python3 is not installed");
        }
        ok
    })
}

/// A directory under the target dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("images-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the temp dir is created");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The stand-in for both binaries: a small program dynamically linked against glibc, as the real
/// ones are. Not this test executable: the test binary holds every end-to-end module, and
/// archiving it twice per image made these tests slow.
const STAND_IN: &str = "/usr/bin/echo";

/// The stand-in binaries: [`STAND_IN`] under both names the Dockerfile copies. Hard links where
/// possible: a copy is a file open for writing, and a child another test forks meanwhile would
/// inherit it and make `ldd` (which executes the stand-in) fail with "text file busy".
fn stand_in_binaries(dir: &Path) -> PathBuf {
    let exe = PathBuf::from(STAND_IN);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    for path in dockerfile().binaries {
        let to = bin.join(path.rsplit('/').next().expect("a file name"));
        if std::fs::hard_link(&exe, &to).is_err() {
            std::fs::copy(&exe, &to).expect("the stand-in is copied");
        }
    }
    bin
}

fn mkimage(args: &[&str], extra: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("python3");
    cmd.arg(script()).args(args).env_remove("SOURCE_DATE_EPOCH").env("PYTHONDONTWRITEBYTECODE", "1");
    for (flag, path) in extra {
        cmd.arg(flag).arg(path);
    }
    cmd.output().expect("python3 runs mkimage.py")
}

/// One printed line of the script: an archive and its image.
#[derive(Debug, Clone, PartialEq)]
struct Built {
    archive: PathBuf,
    name: String,
    digest: String,
}

fn build(bin: &Path, out: &Path, tag: &str) -> Vec<Built> {
    let output = mkimage(&["--tag", tag], &[("--bin-dir", bin), ("--out-dir", out)]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "mkimage.py failed:\n{stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "an output line is `archive name digest size`: {line:?}");
            Built { archive: PathBuf::from(fields[0]), name: fields[1].to_owned(), digest: fields[2].to_owned() }
        })
        .collect()
}

/// Reads an image archive with Python's tarfile, independently of mkimage.py: its members, JSON
/// documents, each blob's sha256 and size, each layer's uncompressed sha256 (diff_id), and the
/// merged file system (type, mode, owner, size, mtime; the text of small files under /etc).
const INSPECT: &str = r#"
import gzip, hashlib, io, json, sys, tarfile
out = {"blob_sha256": {}, "blob_size": {}, "files": {}, "diff_ids": []}
with tarfile.open(sys.argv[1]) as archive:
    members = archive.getmembers()
    out["members"] = [m.name for m in members]
    data = {m.name: archive.extractfile(m).read() for m in members if m.isfile()}
for name, blob in data.items():
    if name.startswith("blobs/sha256/"):
        out["blob_sha256"][name[13:]] = "sha256:" + hashlib.sha256(blob).hexdigest()
        out["blob_size"][name[13:]] = len(blob)
blob = lambda digest: data["blobs/sha256/" + digest[7:]]
out["oci_layout"] = json.loads(data["oci-layout"])
out["index"] = index = json.loads(data["index.json"])
out["docker_manifest"] = json.loads(data["manifest.json"])
out["manifest"] = manifest = json.loads(blob(index["manifests"][0]["digest"]))
out["config"] = json.loads(blob(manifest["config"]["digest"]))
kinds = {tarfile.REGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}
for layer in manifest["layers"]:
    raw = gzip.decompress(blob(layer["digest"]))
    out["diff_ids"].append("sha256:" + hashlib.sha256(raw).hexdigest())
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for m in tar.getmembers():
            entry = {"type": kinds.get(m.type, "other"), "mode": m.mode, "uid": m.uid, "gid": m.gid,
                     "size": m.size, "mtime": m.mtime}
            if m.isfile() and m.name.startswith("etc/") and m.size < 4096:
                entry["text"] = tar.extractfile(m).read().decode()
            out["files"]["/" + m.name.rstrip("/")] = entry
print(json.dumps(out))
"#;

/// Extracts an image archive's layers, in order, into a directory.
const EXTRACT: &str = r#"
import gzip, io, json, sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    read = lambda name: archive.extractfile(name).read()
    index = json.loads(read("index.json"))
    manifest = json.loads(read("blobs/sha256/" + index["manifests"][0]["digest"][7:]))
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(read("blobs/sha256/" + layer["digest"][7:])))) as tar:
            tar.extractall(sys.argv[2])
"#;

fn inspect(archive: &Path) -> Value {
    let output = Command::new("python3").arg("-c").arg(INSPECT).arg(archive).output().expect("python3 runs");
    assert!(output.status.success(), "inspecting {}: {}", archive.display(), String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("the inspector prints JSON")
}

/// The images built from the stand-ins, each with its Dockerfile target and inspection.
fn built_images(dir: &TempDir, tag: &str) -> Vec<(String, Built, Value)> {
    let bin = stand_in_binaries(&dir.0);
    build(&bin, &dir.0.join("out"), tag)
        .into_iter()
        .map(|built| {
            let target = built
                .name
                .strip_prefix("localhost/")
                .and_then(|n| n.strip_suffix(&format!(":{tag}")))
                .unwrap_or_else(|| panic!("image name {} is localhost/<target>:{tag}", built.name))
                .to_owned();
            let inspected = inspect(&built.archive);
            (target, built, inspected)
        })
        .collect()
}

/// The ELF interpreter (PT_INTERP) of a 64-bit little-endian executable.
fn elf_interpreter(path: &Path) -> Option<String> {
    let data = std::fs::read(path).ok()?;
    if data.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| usize::from(u16::from_le_bytes([data[o], data[o + 1]]));
    let u64_at = |o: usize| {
        usize::try_from(u64::from_le_bytes(data[o..o + 8].try_into().expect("8 bytes"))).expect("fits usize")
    };
    let (offset, size, count) = (u64_at(32), u16_at(54), u16_at(56));
    (0..count).map(|i| offset + i * size).find(|&p| data[p..p + 4] == 3u32.to_le_bytes()).map(|p| {
        let (start, len) = (u64_at(p + 8), u64_at(p + 32));
        String::from_utf8_lossy(&data[start..start + len]).trim_end_matches('\0').to_owned()
    })
}

// ---------------------------------------------------------------------------------------------
// The tests

#[test]
fn images_match_the_dockerfile_entrypoints_user_and_ports() {
    if !python3() {
        return;
    }
    let df = dockerfile();
    let dir = TempDir::new("match");
    let images = built_images(&dir, "dev");
    let targets: BTreeSet<&String> = images.iter().map(|(t, ..)| t).collect();
    assert_eq!(targets, df.targets.keys().collect(), "one image per `FROM runtime AS <target>` stage");

    for (target, built, image) in &images {
        let expected = &df.targets[target];
        let config = &image["config"]["config"];
        assert_eq!(built.archive.file_name().and_then(|n| n.to_str()), Some(format!("{target}.tar").as_str()));
        assert_eq!(config["Entrypoint"], serde_json::json!(expected.entrypoint), "{target}: entrypoint");
        assert_eq!(config["User"], expected.user.as_str(), "{target}: user");
        assert_eq!(config["User"], "65532:65532", "{target}: the numeric nonroot user");
        let ports: BTreeSet<String> =
            config["ExposedPorts"].as_object().map(|p| p.keys().cloned().collect()).unwrap_or_default();
        assert_eq!(ports, expected.ports, "{target}: exposed ports");
        assert!(config.get("Cmd").is_none(), "{target}: the Dockerfile sets no CMD");
        assert_eq!(image["config"]["os"], "linux");

        // The name containerd gives the import, and the docker-style manifest's tag.
        let descriptor = &image["index"]["manifests"][0];
        assert_eq!(descriptor["annotations"]["io.containerd.image.name"], built.name.as_str());
        assert_eq!(descriptor["annotations"]["org.opencontainers.image.ref.name"], "dev");
        assert_eq!(descriptor["digest"], built.digest.as_str(), "the printed digest is the manifest's");
        assert_eq!(image["docker_manifest"][0]["RepoTags"], serde_json::json!([built.name]));
    }
    let operator = &images.iter().find(|(t, ..)| t == "ccm-operator").expect("the operator image").2;
    let manager = &images.iter().find(|(t, ..)| t == "cloud-controller-manager").expect("the manager image").2;
    assert_eq!(operator["config"]["config"]["ExposedPorts"], serde_json::json!({"8080/tcp": {}, "8081/tcp": {}}));
    assert_eq!(manager["config"]["config"]["ExposedPorts"], serde_json::json!({"10258/tcp": {}}));
    // Both images carry the same layers (both binaries); only the configuration differs.
    assert_eq!(operator["manifest"]["layers"], manager["manifest"]["layers"]);
}

#[test]
fn images_hold_both_binaries_ca_certificates_and_libraries_but_no_shell() {
    if !python3() {
        return;
    }
    let df = dockerfile();
    let dir = TempDir::new("layout");
    let stand_in = PathBuf::from(STAND_IN);
    let stand_in_size = std::fs::metadata(&stand_in).expect("stand-in metadata").len();
    let host_ca = std::fs::metadata("/etc/ssl/certs/ca-certificates.crt").expect("the host has ca-certificates").len();
    for (target, _, image) in built_images(&dir, "dev") {
        let files = image["files"].as_object().expect("files");
        let file = |path: &str| files.get(path).unwrap_or_else(|| panic!("{target}: no {path} in the image"));

        // Both binaries in /usr/local/bin, executable by anyone, and nothing else there.
        let in_bin: BTreeSet<String> = files.keys().filter(|p| p.starts_with("/usr/local/bin/")).cloned().collect();
        assert_eq!(in_bin, df.binaries, "{target}: /usr/local/bin");
        for path in &df.binaries {
            let entry = file(path);
            assert_eq!(entry["type"], "file", "{target}: {path}");
            assert_eq!(entry["mode"], 0o755, "{target}: {path} mode");
            assert_eq!(entry["size"], stand_in_size, "{target}: {path} is the binary from --bin-dir");
        }

        // The CA bundle, the users, /tmp and the nonroot home.
        let ca = file("/etc/ssl/certs/ca-certificates.crt");
        assert_eq!((ca["type"].as_str(), ca["size"].as_u64()), (Some("file"), Some(host_ca)), "{target}: CA bundle");
        let passwd = file("/etc/passwd")["text"].as_str().expect("passwd text").to_owned();
        assert!(passwd.lines().any(|l| l.starts_with("nonroot:x:65532:65532:")), "{target}: passwd\n{passwd}");
        assert!(passwd.lines().any(|l| l.starts_with("root:x:0:0:")), "{target}: passwd\n{passwd}");
        let group = file("/etc/group")["text"].as_str().expect("group text").to_owned();
        assert!(group.lines().any(|l| l.starts_with("nonroot:x:65532:")), "{target}: group\n{group}");
        assert_eq!((file("/tmp")["type"].as_str(), file("/tmp")["mode"].as_u64()), (Some("dir"), Some(0o1777)));
        let home = file("/home/nonroot");
        assert_eq!((home["uid"].as_u64(), home["gid"].as_u64()), (Some(65532), Some(65532)), "{target}: home");

        // The loader and libc, at the paths the binaries name: they run without the host.
        let interpreter = elf_interpreter(&stand_in).expect("the stand-in is a dynamic ELF");
        assert_eq!(file(&interpreter)["type"], "file", "{target}: the ELF interpreter {interpreter}");
        assert!(files.keys().any(|p| p.ends_with("/libc.so.6")), "{target}: libc.so.6");

        // No shell, no other program.
        for shell in ["/bin/sh", "/bin/bash", "/bin/busybox", "/usr/bin/sh", "/usr/bin/bash"] {
            assert!(!files.contains_key(shell), "{target}: {shell} is in the image");
        }
        let programs: Vec<&String> = files
            .iter()
            .filter(|(_, e)| e["type"] == "file" && e["mode"].as_u64().is_some_and(|m| m & 0o111 != 0))
            .map(|(p, _)| p)
            .filter(|p| !df.binaries.contains(*p) && !p.contains(".so"))
            .collect();
        assert!(programs.is_empty(), "{target}: executables other than the binaries and libraries: {programs:?}");

        // Files owned by root, fixed mtimes; only the nonroot home belongs to 65532.
        for (path, entry) in files {
            assert_eq!(entry["mtime"], 0, "{target}: {path} mtime");
            if path != "/home/nonroot" {
                assert_eq!(
                    (entry["uid"].as_u64(), entry["gid"].as_u64()),
                    (Some(0), Some(0)),
                    "{target}: {path} owner"
                );
            }
        }
    }
}

#[test]
fn archives_are_oci_layouts_whose_digests_verify() {
    if !python3() {
        return;
    }
    let dir = TempDir::new("digests");
    for (target, _, image) in built_images(&dir, "dev") {
        assert_eq!(image["oci_layout"]["imageLayoutVersion"], "1.0.0");
        let members: BTreeSet<&str> =
            image["members"].as_array().expect("members").iter().filter_map(Value::as_str).collect();
        for required in ["oci-layout", "index.json", "manifest.json"] {
            assert!(members.contains(required), "{target}: {required} is missing from {members:?}");
        }
        // Every blob is stored under its own digest, at the size its descriptor gives.
        for (name, sha) in image["blob_sha256"].as_object().expect("blobs") {
            assert_eq!(sha.as_str(), Some(format!("sha256:{name}").as_str()), "{target}: blob {name}");
        }
        let manifest = &image["manifest"];
        let mut descriptors = vec![&image["index"]["manifests"][0], &manifest["config"]];
        descriptors.extend(manifest["layers"].as_array().expect("layers"));
        for d in descriptors {
            let digest = d["digest"].as_str().expect("digest");
            assert_eq!(image["blob_size"][&digest[7..]], d["size"], "{target}: size of {digest}");
        }
        // diff_ids are the uncompressed layers' digests; the docker manifest names the same blobs.
        assert_eq!(image["config"]["rootfs"]["diff_ids"], image["diff_ids"], "{target}: diff_ids");
        let layer_paths: Vec<String> = manifest["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| format!("blobs/sha256/{}", &l["digest"].as_str().expect("digest")[7..]))
            .collect();
        assert_eq!(image["docker_manifest"][0]["Layers"], serde_json::json!(layer_paths));
        let config_path = format!("blobs/sha256/{}", &manifest["config"]["digest"].as_str().expect("digest")[7..]);
        assert_eq!(image["docker_manifest"][0]["Config"], config_path.as_str());
    }
}

#[test]
fn building_twice_gives_the_same_digests() {
    if !python3() {
        return;
    }
    let dir = TempDir::new("twice");
    let bin = stand_in_binaries(&dir.0);
    let first = build(&bin, &dir.0.join("first"), "dev");
    let second = build(&bin, &dir.0.join("second"), "dev");
    assert_eq!(first.len(), 2);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!((&a.name, &a.digest), (&b.name, &b.digest), "same inputs, same manifest digest");
        let (bytes_a, bytes_b) =
            (std::fs::read(&a.archive).expect("first"), std::fs::read(&b.archive).expect("second"));
        assert!(bytes_a == bytes_b, "{} and {} differ", a.archive.display(), b.archive.display());
    }
    // Another tag only renames: the manifests, and so what the kubelet runs, are the same.
    let retagged = build(&bin, &dir.0.join("retagged"), "other");
    for (a, b) in first.iter().zip(&retagged) {
        assert_eq!(b.name, a.name.replace(":dev", ":other"));
        assert_eq!(b.digest, a.digest);
    }
}

#[test]
fn an_unsupported_dockerfile_form_is_refused_with_its_line() {
    if !python3() {
        return;
    }
    let dir = TempDir::new("refused");
    let bin = stand_in_binaries(&dir.0);
    let original = std::fs::read_to_string(workspace_root().join("Dockerfile")).expect("the Dockerfile");
    let cases = [
        // An instruction the script does not reproduce, in the runtime stage.
        ("USER 65532:65532", "USER 65532:65532\nRUN true", "RUN in the runtime stage is not supported"),
        // A shell-form entrypoint: the image has no shell to run it.
        (
            r#"ENTRYPOINT ["/usr/local/bin/ccm-operator"]"#,
            "ENTRYPOINT /usr/local/bin/ccm-operator",
            "ENTRYPOINT must be the exec (JSON array) form",
        ),
        // A port the script cannot know.
        ("EXPOSE 10258", "EXPOSE $PORT", "variables are not supported"),
    ];
    for (from, to, message) in cases {
        assert!(original.contains(from), "the Dockerfile still has {from:?}");
        let changed = original.replacen(from, to, 1);
        let line = changed.lines().position(|l| l == to.lines().last().expect("a line")).expect("changed line") + 1;
        let path = dir.0.join("Dockerfile");
        std::fs::write(&path, changed).expect("the changed Dockerfile is written");
        let output = mkimage(&[], &[("--bin-dir", &bin), ("--out-dir", &dir.0.join("out")), ("--dockerfile", &path)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{to:?} is refused: {stderr}");
        assert!(stderr.contains(message), "{to:?}: {stderr}");
        assert!(stderr.contains(&format!("Dockerfile:{line}:")), "{to:?}: the message names line {line}: {stderr}");
        assert!(output.stdout.is_empty(), "no image is reported");
    }
    assert!(!dir.0.join("out/ccm-operator.tar").exists(), "no archive is written");
}

#[test]
fn the_binaries_start_inside_the_image_as_its_user() {
    if !python3() {
        return;
    }
    // Root, judged by the owner of this process's /proc entry.
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).ok();
    if uid != Some(0) || Command::new("chroot").arg("--version").output().is_err() {
        skip("running the binaries inside the image: needs root and chroot");
        return;
    }
    let dir = TempDir::new("run");
    for (target, built, image) in built_images(&dir, "dev") {
        let rootfs = dir.0.join(format!("rootfs-{target}"));
        let output = Command::new("python3").arg("-c").arg(EXTRACT).arg(&built.archive).arg(&rootfs).output();
        let output = output.expect("python3 runs");
        assert!(output.status.success(), "extracting: {}", String::from_utf8_lossy(&output.stderr));
        let config = &image["config"]["config"];
        let user = config["User"].as_str().expect("user");
        let entrypoint: Vec<&str> =
            config["Entrypoint"].as_array().expect("entrypoint").iter().filter_map(Value::as_str).collect();
        // The stand-in is `echo`: it prints its argument and exits.
        let output = Command::new("chroot")
            .arg(format!("--userspec={user}"))
            .arg(&rootfs)
            .args(&entrypoint)
            .arg("--list")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("chroot runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        if stderr.contains("cannot change root directory") {
            skip("running the binaries inside the image: chroot is not permitted here");
            return;
        }
        assert!(output.status.success(), "{target}: {entrypoint:?} as {user} in the image: {stderr}");
        assert_eq!(stdout, "--list\n", "{target}: the stand-in ran");
    }
}

/// A containerd that answers: `$CONTAINERD_ADDRESS`, the real-cluster harness's, or the system's.
fn containerd() -> Option<String> {
    let candidates = std::env::var("CONTAINERD_ADDRESS")
        .into_iter()
        .chain(["/run/realcluster/containerd/containerd.sock", "/run/containerd/containerd.sock"].map(String::from));
    candidates.filter(|s| Path::new(s).exists()).find(|sock| {
        Command::new("ctr")
            .args(["--connect-timeout", "2s", "-a", sock, "version"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn containerd_imports_both_archives() {
    if !python3() {
        return;
    }
    let Some(sock) = containerd() else {
        skip("ctr images import: no containerd answers (CONTAINERD_ADDRESS or a known socket)");
        return;
    };
    // A namespace of its own: the kubelet's `k8s.io` and its images are left alone.
    let namespace = format!("ccm-e2e-images-{}", std::process::id());
    let ctr = |args: &[&str]| {
        Command::new("ctr").args(["-a", &sock, "-n", &namespace]).args(args).output().expect("ctr runs")
    };
    let dir = TempDir::new("ctr");
    let images = built_images(&dir, "dev");
    let mut failures = Vec::new();
    for (_, built, _) in &images {
        let output = ctr(&["images", "import", &built.archive.to_string_lossy()]);
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            failures.push(format!("ctr images import {}: {stderr}", built.archive.display()));
        }
    }
    let listed = String::from_utf8_lossy(&ctr(&["images", "ls", "-q"]).stdout).into_owned();
    let names: Vec<&str> = images.iter().map(|(_, b, _)| b.name.as_str()).collect();
    let missing: Vec<&&str> = names.iter().filter(|name| !listed.lines().any(|l| l == **name)).collect();

    // Clean up before asserting: the images, then the (then empty) namespace.
    let mut rm = vec!["images", "rm", "--sync"];
    rm.extend(names.iter().filter(|name| listed.lines().any(|l| l == **name)));
    let _ = ctr(&rm);
    let _ = Command::new("ctr").args(["-a", &sock, "namespaces", "rm", &namespace]).output();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(missing.is_empty(), "not listed after the import: {missing:?}\n{listed}");
}
