//! The documentation against the code: every condition and event reason the code can emit is
//! explained in `docs/troubleshooting.md`, and relative links in `docs/` resolve.
//!
//! Reasons are found by scanning the source, not from a hand-kept list, so a new reason fails
//! this test until it is documented: string constants in any `reasons.rs` file or `mod
//! *reasons { .. }` block, `REASON_*` constants, and literal reasons passed to
//! `Health::unhealthy(..)` or next to an `EventType::..` argument.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use testkit::workspace_root;

/// Crates whose source may emit reasons.
const SOURCE_DIRS: [&str; 7] = [
    "crds/src",
    "manager/framework/src",
    "manager/providers/fake/src",
    "manager/providers/baremetal/src",
    "manager/providers/aws/src",
    "manager/cloud-controller-manager/src",
    "operator/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A reason: one CamelCase word.
fn is_reason(s: &str) -> bool {
    s.len() > 1 && s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The code before the first `#[cfg(test)]`: tests may use made-up reasons.
fn non_test_code(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// `(name, value)` of every `const NAME: &str = "value";` in `code`.
fn str_consts(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("const ") {
        rest = &rest[i + "const ".len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let after = rest[name.len()..].trim_start();
        if let Some(value) = after.strip_prefix(": &str = \"").or_else(|| after.strip_prefix(": &'static str = \""))
            && let Some(end) = value.find('"')
        {
            out.push((name, value[..end].to_string()));
        }
    }
    out
}

/// The bodies of `mod <something>reasons { ... }` blocks, braces matched.
fn reason_modules(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("mod ") {
        let start = from + i + "mod ".len();
        from = start;
        let name: String = code[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let after = code[start + name.len()..].trim_start();
        if !name.ends_with("reasons") || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0usize;
        for (j, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push(&code[open..open + j]);
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// String literals right after `marker` (skipping an identifier, whitespace and one comma), e.g.
/// `EventType::Warning, "Reason"` or `unhealthy("Reason"`.
fn literals_after(code: &str, marker: &str, skip_ident: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(marker) {
        rest = &rest[i + marker.len()..];
        let mut s = rest;
        if skip_ident {
            s = s.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
            s = s.trim_start();
            let Some(t) = s.strip_prefix(',') else { continue };
            s = t;
        }
        let s = s.trim_start();
        if let Some(t) = s.strip_prefix('"')
            && let Some(end) = t.find('"')
        {
            out.push(t[..end].to_string());
        }
    }
    out
}

/// Every reason the code can emit, with where it was found.
fn reasons_in_code() -> BTreeSet<(String, String)> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&workspace_root().join(dir), &mut files);
    }
    let mut found = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source file is readable");
        let code = non_test_code(&text);
        let at = file.strip_prefix(workspace_root()).unwrap_or(&file).display().to_string();
        let mut add = |value: String| {
            if is_reason(&value) {
                found.insert((value, at.clone()));
            }
        };
        if file.file_name().is_some_and(|n| n == "reasons.rs") {
            str_consts(code).into_iter().for_each(|(_, v)| add(v));
        }
        for body in reason_modules(code) {
            str_consts(body).into_iter().for_each(|(_, v)| add(v));
        }
        str_consts(code).into_iter().filter(|(n, _)| n.starts_with("REASON_")).for_each(|(_, v)| add(v));
        literals_after(code, "EventType::", true).into_iter().for_each(&mut add);
        literals_after(code, "unhealthy(", false).into_iter().for_each(&mut add);
    }
    found
}

fn troubleshooting() -> String {
    std::fs::read_to_string(workspace_root().join("docs/troubleshooting.md")).expect("docs/troubleshooting.md exists")
}

#[test]
fn every_reason_the_code_emits_is_in_the_troubleshooting_guide() {
    let doc = troubleshooting();
    let found = reasons_in_code();
    let missing: Vec<String> = found
        .iter()
        .filter(|(reason, _)| !doc.contains(&format!("`{reason}`")))
        .map(|(reason, at)| format!("{reason} ({at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md does not explain these reasons (write each as `Reason` in a table):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_scan_finds_the_reasons_the_crates_declare() {
    // Guards the scanner itself: if it stopped finding these, the test above would pass vacuously.
    let found: BTreeSet<String> = reasons_in_code().into_iter().map(|(r, _)| r).collect();
    let declared = crds::conditions::reasons::ALL
        .iter()
        .chain(operator::reasons::config_valid::ALL.iter())
        .chain(operator::reasons::available::ALL.iter())
        .chain(operator::reasons::degraded::ALL.iter())
        .chain(operator::reasons::events::ALL.iter())
        .chain(
            [ccm_framework::provider::health_reasons::HEALTHY, ccm_framework::provider::health_reasons::PROBE_ERROR]
                .iter(),
        );
    for reason in declared {
        assert!(found.contains(*reason), "the scan missed {reason}");
    }
    // And a literal event reason of the service controller, found by the EventType rule.
    assert!(found.contains("EnsuredLoadBalancer"), "the scan missed literal event reasons");
}

#[test]
fn scanner_reads_consts_modules_and_literals() {
    let code = r#"
        pub mod health_reasons { pub const A: &str = "Alpha"; pub mod inner { } }
        pub const B: &str = "NotAReasonHere";
        const REASON_C: &str = "Gamma";
        fn f() { publish(x, EventType::Warning, "Delta", "note"); Health::unhealthy("Epsilon", m); }
    "#;
    let modules = reason_modules(code);
    assert_eq!(modules.len(), 1);
    assert_eq!(str_consts(modules[0]), [("A".to_string(), "Alpha".to_string())]);
    assert_eq!(literals_after(code, "EventType::", true), ["Delta"]);
    assert_eq!(literals_after(code, "unhealthy(", false), ["Epsilon"]);
    assert!(str_consts(code).iter().any(|(n, v)| n == "REASON_C" && v == "Gamma"));
    assert!(is_reason("NoLeader") && !is_reason("no-leader") && !is_reason("Two words"));
}

/// GitHub's anchor for a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown.lines().filter_map(|l| l.strip_prefix('#')).map(|h| slug(h.trim_start_matches('#'))).collect()
}

/// Targets of `[text](target)` links, without external ones.
fn relative_links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = markdown;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push(target.to_string());
            }
        }
    }
    out
}

#[test]
fn links_between_docs_resolve() {
    let docs = workspace_root().join("docs");
    let mut broken = Vec::new();
    for entry in std::fs::read_dir(&docs).expect("docs/ exists").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        for link in relative_links(&text) {
            let (file, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if file.is_empty() { path.clone() } else { docs.join(file) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", path.display()));
            } else if !anchor.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let body = std::fs::read_to_string(&target).expect("readable");
                if !anchors(&body).contains(anchor) {
                    broken.push(format!("{}: {link} (no such heading)", path.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n  {}", broken.join("\n  "));
}

/// `cargo tree` lines `name version (source) [features]` for the packages `args` select, as a map
/// from package to features.
fn resolved_features(args: &[&str]) -> std::collections::BTreeMap<String, String> {
    let out = std::process::Command::new(env!("CARGO"))
        .arg("tree")
        .args(args)
        .args(["--format", "{p} [{f}]", "--prefix", "none"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_end_matches(" (*)");
            let (package, features) = l.rsplit_once(" [")?;
            Some((package.to_string(), features.to_string()))
        })
        .collect()
}

#[test]
fn the_readme_commands_resolve_the_same_features_so_neither_rebuilds_the_other() {
    // `cargo run -p e2e --bin sandbox` builds e2e's normal dependencies; `cargo test --workspace`
    // every member with its dev-dependencies. A dependency built with other features is built
    // twice, and each command then recompiles it after the other.
    let run = resolved_features(&["-p", "e2e", "--edges", "no-dev"]);
    let test = resolved_features(&["--workspace"]);
    // `cargo build --bin sandbox --bin ccm-operator` (the quick start) selects every member
    // without dev-dependencies: the same features again.
    let build = resolved_features(&["--workspace", "--edges", "no-dev"]);
    let differs_from_test: Vec<&String> =
        build.iter().filter(|(p, f)| test.get(*p) != Some(f)).map(|(p, _)| p).collect();
    assert!(
        differs_from_test.is_empty(),
        "`cargo build` resolves other features than `cargo test`: {differs_from_test:?}"
    );
    let mut differ = Vec::new();
    for (package, features) in &run {
        match test.get(package) {
            Some(f) if f == features => {}
            Some(f) => differ.push(format!("{package}: run [{features}, test [{f}")),
            None => differ.push(format!("{package}: only in the run build")),
        }
    }
    let workspace = workspace_root().canonicalize().unwrap().display().to_string();
    for package in test.keys().filter(|p| !run.contains_key(*p)) {
        // Members the sandbox does not depend on (the example provider) are built by the tests only.
        if !package.contains(&workspace) {
            differ.push(format!("{package}: only in the test build"));
        }
    }
    assert!(
        differ.is_empty(),
        "features differ between `cargo run -p e2e` and `cargo test --workspace`; enable the \
         dev-dependency features in e2e/Cargo.toml too:\n  {}",
        differ.join("\n  ")
    );
}

// ---- The behaviour reference (docs/behaviours.md) ------------------------------------------

/// Families of behaviour IDs: registry, manager, node, lifecycle, service, route, and the
/// shared controller mechanics.
const ID_FAMILIES: &str = "PMNLSRC";

/// Every behaviour ID cited in `text`: `S7`, ranges `S1–S24` or `S1-S24` (expanded), and
/// deliberate fixes as `§6 item 4`. An ID is a family letter and one or two digits standing
/// alone, so `EC2`, `P99x` and test names (lower case) are not citations.
fn cited_ids(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let digits_at = |i: usize| -> (usize, usize) {
        let mut j = i;
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
        (j, chars[i..j].iter().collect::<String>().parse().unwrap_or(0))
    };
    let boundary = |i: usize| i >= chars.len() || !(chars[i].is_alphanumeric() || chars[i] == '_');
    for i in 0..chars.len() {
        let c = chars[i];
        if !ID_FAMILIES.contains(c) || (i > 0 && !boundary(i - 1)) {
            continue;
        }
        let (end, first) = digits_at(i + 1);
        if end == i + 1 || end - (i + 1) > 2 || !boundary(end) {
            continue;
        }
        let mut last = first;
        // A range: `–` or `-`, the family letter again (optional), digits.
        let mut k = end;
        while k < chars.len() && chars[k] == ' ' {
            k += 1;
        }
        if k < chars.len() && (chars[k] == '–' || chars[k] == '-') {
            let mut m = k + 1;
            while m < chars.len() && chars[m] == ' ' {
                m += 1;
            }
            if m < chars.len() && chars[m] == c {
                m += 1;
            }
            let (e, n) = digits_at(m);
            if e > m && e - m <= 2 && boundary(e) && n > first {
                last = n;
            }
        }
        for n in first..=last {
            out.insert(format!("{c}{n}"));
        }
    }
    let mut rest = text;
    while let Some(i) = rest.find("§6 item ") {
        rest = &rest[i + "§6 item ".len()..];
        let n: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if !n.is_empty() {
            out.insert(format!("§6 item {n}"));
        }
    }
    out
}

/// Every `.rs` and `.md` file of the repository but the reference itself and build output.
fn cited_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if !matches!(name.to_str(), Some("target" | ".git" | "node_modules")) {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs" || e == "md") && !path.ends_with("docs/behaviours.md")
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&workspace_root(), &mut out);
    out
}

/// Names of every function in the repository's Rust files.
fn function_names(files: &[PathBuf]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("fn ") {
            rest = &rest[i + 3..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The rows of the reference: ID (or `§6 item N`) and the test column, `None` for `n/a`.
fn reference_rows() -> Vec<(String, Option<String>)> {
    let doc = std::fs::read_to_string(workspace_root().join("docs/behaviours.md")).expect("docs/behaviours.md");
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> =
                line.trim().strip_prefix('|')?.strip_suffix('|')?.split('|').map(str::trim).collect();
            let id = cells.first()?;
            let ids = cited_ids(id);
            if ids.len() != 1 || ids.first()? != id {
                return None;
            }
            let test = cells.last()?;
            let test = (*test != "n/a").then(|| test.trim_matches('`').to_string());
            Some((id.to_string(), test))
        })
        .collect()
}

/// Whether a test name carries an ID: `n6_n7_n8_labels` carries N6, N7 and N8.
fn names_id(test: &str, id: &str) -> bool {
    test.split('_').any(|part| part.eq_ignore_ascii_case(id))
}

#[test]
fn behaviour_reference_covers_every_cited_id() {
    let files = cited_files();
    let functions = function_names(&files);
    let rows = reference_rows();
    assert!(rows.len() > 60, "docs/behaviours.md has only {} rows: the table format changed?", rows.len());
    let listed: BTreeSet<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();

    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for id in cited_ids(&text) {
            if !listed.contains(id.as_str()) {
                missing
                    .push(format!("{id} (cited in {})", file.strip_prefix(workspace_root()).unwrap_or(file).display()));
            }
        }
    }
    assert!(missing.is_empty(), "cited but not in docs/behaviours.md: {missing:#?}");

    for (id, test) in &rows {
        match test {
            Some(test) => {
                assert!(functions.contains(test), "{id}: test `{test}` does not exist");
                if !id.starts_with('§') {
                    assert!(names_id(test, id), "{id}: test `{test}` does not carry the ID in its name");
                }
            }
            None => {
                let named: Vec<&String> = functions.iter().filter(|f| names_id(f, id)).collect();
                assert!(named.is_empty(), "{id} is marked n/a but {named:?} test it: name the test in its row");
            }
        }
    }
}

#[test]
fn citation_scanner_reads_ids_ranges_and_section_items() {
    let text = "Matches S1–S3 and N15 (L2-L3, R4), see §6 item 12; not EC2, P99x, s7_ or S100.";
    let ids: Vec<String> = cited_ids(text).into_iter().collect();
    assert_eq!(ids, ["L2", "L3", "N15", "R4", "S1", "S2", "S3", "§6 item 12"]);
    assert!(names_id("n6_n7_n8_labels", "N7"));
    assert!(!names_id("n17_refresh", "N1"));
}
