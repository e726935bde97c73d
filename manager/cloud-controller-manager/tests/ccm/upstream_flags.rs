//! M8: every flag of upstream's `cloud-controller-manager` v1.36 (`k8s.io/cloud-provider`'s
//! `options` package, with component-base's logging and feature gates) is accepted by this
//! manager's parser, alone and all together at upstream's defaults.
//!
//! The flag set is read from upstream's `--help`: the committed snapshot
//! `tests/fixtures/upstream-v1.36-help.txt` everywhere, and, when the upstream binary is here
//! (`CCM_UPSTREAM`, else `../shared/upstream/upstream-ccm-bench.xz` beside the repository,
//! unpacked with Python's `lzma` and checked against `SHA256SUMS`), its live `--help`, which
//! must equal the snapshot. `CCM_UPDATE_UPSTREAM_HELP=1` rewrites the snapshot from the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use ccm_framework::program::flags::Flags;

const SNAPSHOT: &str = "tests/fixtures/upstream-v1.36-help.txt";
/// Set to rewrite the snapshot from the live binary.
const UPDATE_ENV: &str = "CCM_UPDATE_UPSTREAM_HELP";

/// One flag as upstream's `--help` lists it.
#[derive(Debug, Clone, PartialEq)]
struct UpstreamFlag {
    name: String,
    /// pflag's type word (`string`, `duration`, ...); empty for a boolean.
    kind: String,
    /// The `(default ...)` value, if shown.
    default: Option<String>,
}

/// Every flag of a pflag `--help` text: lines `  -x, --name type   description` or
/// `      --name type   description`, the description's `(default ...)` possibly on a later line.
fn parse_help(text: &str) -> Vec<UpstreamFlag> {
    let mut out: Vec<UpstreamFlag> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let flag_part = trimmed.strip_prefix("-h, ").or_else(|| trimmed.strip_prefix("-v, ")).unwrap_or(trimmed);
        if let Some(rest) = flag_part.strip_prefix("--")
            && (line.starts_with("      --") || line.starts_with("  -"))
        {
            let (head, description) = rest.split_once("  ").unwrap_or((rest, ""));
            let mut words = head.split_whitespace();
            let name = words.next().unwrap_or_default().to_string();
            let kind = words.next().unwrap_or_default().to_string();
            out.push(UpstreamFlag { name, kind, default: default_in(description) });
        } else if let Some(last) = out.last_mut()
            && last.default.is_none()
            && line.starts_with("      ")
        {
            last.default = default_in(trimmed);
        }
    }
    out
}

/// The value of a trailing `(default X)`, brackets of a list removed.
fn default_in(description: &str) -> Option<String> {
    let start = description.rfind("(default ")?;
    let value = description[start + "(default ".len()..].strip_suffix(')')?;
    Some(value.trim_matches(|c| c == '[' || c == ']').trim_matches('"').to_string())
}

/// A value of pflag type `kind` that upstream would take.
fn sample(kind: &str) -> &'static str {
    match kind {
        "string" => "x",
        "strings" => "a,b",
        "duration" => "1m30s",
        "int" | "int32" | "Level" => "3",
        "float32" => "2.5",
        "ip" => "127.0.0.1",
        "mapStringBool" => "WatchList=true,CloudControllerManagerWebhook=false",
        "int32Slice" => "23,29",
        "namedCertKey" => "c.crt,c.key:*.example.com",
        "quantity" => "2Ki",
        "pattern=N,..." => "route*=4",
        other => panic!("a pflag type this test does not know: {other}"),
    }
}

fn parses(args: &[String]) -> Result<Flags, clap::Error> {
    Flags::try_parse_args(std::iter::once("cloud-controller-manager".to_string()).chain(args.iter().cloned()))
}

fn snapshot_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOT)
}

#[test]
fn m8_every_upstream_1_36_flag_is_accepted_alone_with_a_value_of_its_type() {
    let help = std::fs::read_to_string(snapshot_path()).expect("the committed snapshot of upstream's --help");
    let flags = parse_help(&help);
    assert!(flags.len() >= 80, "only {} flags read from the snapshot: its format changed?", flags.len());
    let mut refused = Vec::new();
    for flag in &flags {
        let arg = match (flag.name.as_str(), flag.kind.as_str()) {
            ("help", _) => continue,
            ("version", _) => vec!["--version=false".to_string(), "--version=v1.36.2".to_string()],
            (name, "") => vec![format!("--{name}"), format!("--{name}=false"), format!("--{name}=true")],
            (name, kind) => vec![format!("--{name}={}", sample(kind)), format!("--{name}"), sample(kind).to_string()],
        };
        // Booleans three ways; a valued flag as `--name=value` and as `--name value`.
        let forms: Vec<Vec<String>> = if flag.kind.is_empty() || flag.name == "version" {
            arg.into_iter().map(|a| vec![a]).collect()
        } else {
            vec![vec![arg[0].clone()], vec![arg[1].clone(), arg[2].clone()]]
        };
        for form in forms {
            if let Err(e) = parses(&form) {
                refused.push(format!("{form:?}: {}", e.kind()));
            }
        }
    }
    assert!(refused.is_empty(), "upstream flags our parser refuses:\n{}", refused.join("\n"));
    // -h and --help still print the help; -v is the verbosity.
    assert_eq!(parses(&["-h".into()]).unwrap_err().kind(), clap::error::ErrorKind::DisplayHelp);
    assert_eq!(parses(&["-v".into(), "4".into()]).unwrap().verbosity, 4);
}

#[test]
fn m8_all_upstream_flags_at_upstreams_defaults_make_a_valid_configuration() {
    let help = std::fs::read_to_string(snapshot_path()).expect("the committed snapshot of upstream's --help");
    let mut args = vec!["--cloud-provider=fake".to_string()];
    for flag in parse_help(&help) {
        match (flag.name.as_str(), flag.kind.as_str(), flag.default.as_deref()) {
            ("help" | "version" | "cloud-provider", _, _) => {}
            (name, "", default) => args.push(format!("--{name}={}", default.unwrap_or("false"))),
            (name, "int" | "int32" | "Level", None) => args.push(format!("--{name}=0")),
            (name, "quantity", None) => args.push(format!("--{name}=0")),
            (name, _, default) => args.push(format!("--{name}={}", default.unwrap_or_default())),
        }
    }
    let flags = parses(&args).unwrap_or_else(|e| panic!("{e}\n{args:#?}"));
    let settings = flags.settings().unwrap_or_else(|e| panic!("upstream's defaults refused: {e}"));
    // Upstream's defaults where they differ from ours: one worker each.
    assert_eq!((settings.options.concurrent_node_syncs, settings.options.concurrent_service_syncs), (1, 1));
    assert!(settings.webhook.is_none(), "webhooks stay off without the feature gate");
    assert!(!settings.options.watch_based_routes, "watch-based routes are alpha and off in v1.36");
}

#[test]
fn m8_the_help_parser_reads_types_defaults_and_continuation_lines() {
    let text = "Generic flags:\n\n      --controllers strings    A list.\n                               More text. (default [*])\n      --leader-elect           Elect. (default true)\n  -v, --v Level                number\n      --bind-address ip        Where. (default 0.0.0.0)\n";
    let flags = parse_help(text);
    let got: Vec<(&str, &str, Option<&str>)> =
        flags.iter().map(|f| (f.name.as_str(), f.kind.as_str(), f.default.as_deref())).collect();
    assert_eq!(
        got,
        [
            ("controllers", "strings", Some("*")),
            ("leader-elect", "", Some("true")),
            ("v", "Level", None),
            ("bind-address", "ip", Some("0.0.0.0")),
        ]
    );
}

/// The upstream binary, unpacked and checked, or why it is not here.
fn upstream_binary() -> Result<PathBuf, String> {
    let source = match std::env::var_os("CCM_UPSTREAM").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/upstream/upstream-ccm-bench.xz"),
    };
    if !source.is_file() {
        return Err(format!("{} is absent", source.display()));
    }
    if source.extension().and_then(|e| e.to_str()) != Some("xz") {
        return Ok(source);
    }
    let sums = std::fs::read_to_string(source.with_file_name("SHA256SUMS")).map_err(|e| format!("SHA256SUMS: {e}"))?;
    let want = sums
        .lines()
        .find_map(|l| {
            l.split_once(char::is_whitespace).filter(|(_, n)| n.trim() == "upstream-ccm-bench").map(|(s, _)| s)
        })
        .ok_or("SHA256SUMS lists no upstream-ccm-bench")?
        .to_string();
    let target = std::env::temp_dir().join(format!("ccm-upstream-{}", &want[..16])).join("upstream-ccm-bench");
    let script = "import hashlib, lzma, os, shutil, sys\n\
                  src, dst, want = sys.argv[1:4]\n\
                  ok = os.path.exists(dst) and hashlib.file_digest(open(dst, 'rb'), 'sha256').hexdigest() == want\n\
                  if not ok:\n\
                  \x20   os.makedirs(os.path.dirname(dst), exist_ok=True)\n\
                  \x20   tmp = dst + '.' + str(os.getpid())\n\
                  \x20   shutil.copyfileobj(lzma.open(src), open(tmp, 'wb'))\n\
                  \x20   if hashlib.file_digest(open(tmp, 'rb'), 'sha256').hexdigest() != want: sys.exit('checksum mismatch')\n\
                  \x20   os.chmod(tmp, 0o755); os.replace(tmp, dst)\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&source)
        .arg(&target)
        .arg(&want)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!("unpacking failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(target)
}

#[test]
fn m8_the_snapshot_is_upstreams_live_help_when_the_binary_is_here() {
    let binary = match upstream_binary() {
        Ok(b) => b,
        Err(reason) => {
            println!("SKIPPED (the snapshot alone is used): upstream binary: {reason}");
            return;
        }
    };
    let out = Command::new(&binary).arg("--help").output().expect("the upstream binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let live = String::from_utf8(out.stdout).expect("UTF-8 help");
    if std::env::var_os(UPDATE_ENV).is_some() {
        std::fs::write(snapshot_path(), &live).expect("write the snapshot");
    }
    let snapshot = std::fs::read_to_string(snapshot_path()).expect("the snapshot");
    assert!(
        live == snapshot,
        "upstream's --help drifted from {SNAPSHOT}; rerun with {UPDATE_ENV}=1 and review the new flags"
    );
    // And every live flag parses (the same check as on the snapshot).
    assert_eq!(parse_help(&live), parse_help(&snapshot));
}
