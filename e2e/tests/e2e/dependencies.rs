//! The dependency policy in `deny.toml` (cargo-deny's format), enforced offline: licenses from its
//! allow-list, no banned crate (OpenSSL, native-tls, a second crypto library), crates.io as the only
//! source, and duplicate versions reported. The dependency graph is `cargo metadata --locked
//! --offline`, so no network is needed; cargo-deny's advisory check, which needs its database from
//! github.com, stays for where that is reachable (CONTRIBUTING.md).
//!
//! The checks are pure ([`check`]); a crafted graph shows each rule refuses what it should, naming
//! the crate and the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;
use testkit::workspace_root;

// ---------------------------------------------------------------------------------------------
// deny.toml: the TOML subset it is written in (tables, strings, booleans, numbers, arrays and
// inline tables; arrays may span lines)

#[derive(Debug, Clone, PartialEq)]
enum Toml {
    Str(String),
    Bool(bool),
    Num(f64),
    Arr(Vec<Toml>),
    Table(BTreeMap<String, Toml>),
}

impl Toml {
    fn get(&self, key: &str) -> Option<&Toml> {
        match self {
            Toml::Table(t) => t.get(key),
            _ => None,
        }
    }
    fn str(&self) -> Option<&str> {
        if let Toml::Str(s) = self { Some(s) } else { None }
    }
    fn strings(&self) -> Vec<String> {
        match self {
            Toml::Arr(items) => items.iter().filter_map(|i| i.str().map(str::to_owned)).collect(),
            _ => Vec::new(),
        }
    }
}

struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while let Some(&c) = self.chars.peek() {
            if c.is_whitespace() {
                self.chars.next();
            } else if c == '#' {
                while self.chars.next_if(|&c| c != '\n').is_some() {}
            } else {
                break;
            }
        }
    }
    fn expect(&mut self, want: char) -> Result<(), String> {
        self.skip_space();
        match self.chars.next() {
            Some(c) if c == want => Ok(()),
            other => Err(format!("expected {want:?}, found {other:?}")),
        }
    }
    fn key(&mut self) -> Result<String, String> {
        self.skip_space();
        if self.chars.peek() == Some(&'"') {
            return self.string();
        }
        let mut key = String::new();
        while let Some(c) = self.chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_') {
            key.push(c);
        }
        if key.is_empty() { Err(format!("expected a key, found {:?}", self.chars.peek())) } else { Ok(key) }
    }
    fn string(&mut self) -> Result<String, String> {
        self.expect('"')?;
        let mut out = String::new();
        loop {
            match self.chars.next() {
                Some('"') => return Ok(out),
                Some('\\') => match self.chars.next() {
                    Some('n') => out.push('\n'),
                    Some(c @ ('"' | '\\')) => out.push(c),
                    other => return Err(format!("unsupported escape {other:?}")),
                },
                Some('\n') | None => return Err("unterminated string".into()),
                Some(c) => out.push(c),
            }
        }
    }
    fn value(&mut self) -> Result<Toml, String> {
        self.skip_space();
        match self.chars.peek() {
            Some('"') => self.string().map(Toml::Str),
            Some('[') => {
                self.chars.next();
                let mut items = Vec::new();
                loop {
                    self.skip_space();
                    if self.chars.next_if_eq(&']').is_some() {
                        return Ok(Toml::Arr(items));
                    }
                    items.push(self.value()?);
                    self.skip_space();
                    if self.chars.next_if_eq(&',').is_none() {
                        self.expect(']')?;
                        return Ok(Toml::Arr(items));
                    }
                }
            }
            Some('{') => {
                self.chars.next();
                let mut table = BTreeMap::new();
                loop {
                    self.skip_space();
                    if self.chars.next_if_eq(&'}').is_some() {
                        return Ok(Toml::Table(table));
                    }
                    let key = self.key()?;
                    self.expect('=')?;
                    table.insert(key, self.value()?);
                    self.skip_space();
                    if self.chars.next_if_eq(&',').is_none() {
                        self.expect('}')?;
                        return Ok(Toml::Table(table));
                    }
                }
            }
            _ => {
                let mut word = String::new();
                while let Some(c) = self.chars.next_if(|c| c.is_ascii_alphanumeric() || ".+-_".contains(*c)) {
                    word.push(c);
                }
                match word.as_str() {
                    "true" => Ok(Toml::Bool(true)),
                    "false" => Ok(Toml::Bool(false)),
                    w => w.parse().map(Toml::Num).map_err(|_| format!("unsupported value {w:?}")),
                }
            }
        }
    }
}

/// Parse the TOML subset `deny.toml` uses; anything else is an error, so the test cannot
/// misread a policy it does not understand.
fn parse_toml(text: &str) -> Result<Toml, String> {
    let mut root: BTreeMap<String, Toml> = BTreeMap::new();
    let mut path: Vec<String> = Vec::new();
    let mut p = Parser { chars: text.chars().peekable() };
    loop {
        p.skip_space();
        let Some(&c) = p.chars.peek() else { break };
        if c == '[' {
            p.chars.next();
            if p.chars.peek() == Some(&'[') {
                return Err("arrays of tables are not supported".into());
            }
            path = vec![p.key()?];
            while p.chars.next_if_eq(&'.').is_some() {
                path.push(p.key()?);
            }
            p.expect(']')?;
            continue;
        }
        let key = p.key()?;
        p.expect('=')?;
        let value = p.value()?;
        let mut table = &mut root;
        for part in &path {
            let entry = table.entry(part.clone()).or_insert_with(|| Toml::Table(BTreeMap::new()));
            let Toml::Table(inner) = entry else { return Err(format!("{part} is not a table")) };
            table = inner;
        }
        if table.insert(key.clone(), value).is_some() {
            return Err(format!("{key} is set twice"));
        }
    }
    Ok(Toml::Table(root))
}

// ---------------------------------------------------------------------------------------------
// The policy

#[derive(Debug, Default)]
struct Policy {
    allow: BTreeSet<String>,
    /// crate name -> licenses allowed for it on top of `allow`.
    exceptions: BTreeMap<String, BTreeSet<String>>,
    ignore_private: bool,
    /// crate name -> reason.
    deny: BTreeMap<String, String>,
    multiple_versions_deny: bool,
    skip: BTreeSet<String>,
    allow_registry: BTreeSet<String>,
    allow_git: BTreeSet<String>,
}

fn policy(text: &str) -> Policy {
    let toml = parse_toml(text).unwrap_or_else(|e| panic!("deny.toml: {e}"));
    let section = |name: &str| toml.get(name).cloned().unwrap_or(Toml::Table(BTreeMap::new()));
    let (licenses, bans, sources) = (section("licenses"), section("bans"), section("sources"));
    let crate_name = |t: &Toml| {
        t.get("crate")
            .or_else(|| t.get("name"))
            .and_then(Toml::str)
            .map(str::to_owned)
            .or_else(|| t.str().map(str::to_owned))
    };
    let mut exceptions = BTreeMap::new();
    if let Some(Toml::Arr(items)) = licenses.get("exceptions") {
        for item in items {
            let name = crate_name(item).expect("a [licenses] exception names its crate");
            exceptions.insert(name, item.get("allow").map(Toml::strings).unwrap_or_default().into_iter().collect());
        }
    }
    let mut deny = BTreeMap::new();
    if let Some(Toml::Arr(items)) = bans.get("deny") {
        for item in items {
            let name = crate_name(item).expect("a [bans] deny entry names its crate");
            deny.insert(name, item.get("reason").and_then(Toml::str).unwrap_or("").to_owned());
        }
    }
    Policy {
        allow: licenses.get("allow").map(Toml::strings).unwrap_or_default().into_iter().collect(),
        exceptions,
        ignore_private: licenses.get("private").and_then(|p| p.get("ignore")) == Some(&Toml::Bool(true)),
        deny,
        multiple_versions_deny: bans.get("multiple-versions").and_then(Toml::str) == Some("deny"),
        skip: bans
            .get("skip")
            .map(|s| match s {
                Toml::Arr(items) => items.iter().filter_map(crate_name).collect(),
                _ => BTreeSet::new(),
            })
            .unwrap_or_default(),
        allow_registry: sources.get("allow-registry").map(Toml::strings).unwrap_or_default().into_iter().collect(),
        allow_git: sources.get("allow-git").map(Toml::strings).unwrap_or_default().into_iter().collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// SPDX license expressions

/// Whether `expression` can be satisfied with `allowed` licenses: OR needs one side, AND both,
/// `X WITH Y` its own entry; `/` is the old spelling of OR. Unparsable is an error.
fn license_allowed(expression: &str, allowed: &dyn Fn(&str) -> bool) -> Result<bool, String> {
    let spaced = expression.replace('(', " ( ").replace(')', " ) ").replace('/', " OR ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut pos = 0;
    let value = or_expr(&tokens, &mut pos, allowed)?;
    if pos != tokens.len() {
        return Err(format!("unexpected {:?} in {expression:?}", tokens[pos]));
    }
    Ok(value)
}

fn or_expr(t: &[&str], pos: &mut usize, allowed: &dyn Fn(&str) -> bool) -> Result<bool, String> {
    let mut value = and_expr(t, pos, allowed)?;
    while t.get(*pos) == Some(&"OR") {
        *pos += 1;
        value |= and_expr(t, pos, allowed)?;
    }
    Ok(value)
}

fn and_expr(t: &[&str], pos: &mut usize, allowed: &dyn Fn(&str) -> bool) -> Result<bool, String> {
    let mut value = atom(t, pos, allowed)?;
    while t.get(*pos) == Some(&"AND") {
        *pos += 1;
        value &= atom(t, pos, allowed)?;
    }
    Ok(value)
}

fn atom(t: &[&str], pos: &mut usize, allowed: &dyn Fn(&str) -> bool) -> Result<bool, String> {
    let token = *t.get(*pos).ok_or("the expression ends early")?;
    *pos += 1;
    if token == "(" {
        let value = or_expr(t, pos, allowed)?;
        if t.get(*pos) != Some(&")") {
            return Err("unbalanced parenthesis".into());
        }
        *pos += 1;
        return Ok(value);
    }
    if ["AND", "OR", "WITH", ")"].contains(&token) {
        return Err(format!("unexpected {token:?}"));
    }
    if t.get(*pos) == Some(&"WITH") {
        let exception = *t.get(*pos + 1).ok_or("WITH without an exception")?;
        *pos += 2;
        return Ok(allowed(&format!("{token} WITH {exception}")));
    }
    Ok(allowed(token))
}

// ---------------------------------------------------------------------------------------------
// The graph and the check

#[derive(Debug, Clone)]
struct Package {
    name: String,
    version: String,
    license: Option<String>,
    /// `None` for path dependencies (the workspace's own crates).
    source: Option<String>,
    /// `publish = false`.
    private: bool,
}

/// What one rule refuses, naming the crate and the rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    krate: String,
    rule: &'static str,
    detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.krate, self.rule, self.detail)
    }
}

const CRATES_IO: [&str; 2] = ["https://github.com/rust-lang/crates.io-index", "https://index.crates.io/"];

/// The violations of `policy` in `packages`, and the crates present in several versions.
fn check(policy: &Policy, packages: &[Package]) -> (Vec<Violation>, BTreeMap<String, Vec<String>>) {
    let mut violations = Vec::new();
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in packages {
        let krate = format!("{}@{}", p.name, p.version);
        let mut refuse =
            |rule: &'static str, detail: String| violations.push(Violation { krate: krate.clone(), rule, detail });
        versions.entry(p.name.clone()).or_default().push(p.version.clone());

        if !(p.private && policy.ignore_private) {
            let extra = policy.exceptions.get(&p.name);
            let allowed = |l: &str| policy.allow.contains(l) || extra.is_some_and(|e| e.contains(l));
            match p.license.as_deref().map(|l| license_allowed(l, &allowed)) {
                None => refuse("[licenses] allow", "no license field".into()),
                Some(Err(e)) => refuse("[licenses] allow", format!("unparsable license: {e}")),
                Some(Ok(false)) => refuse(
                    "[licenses] allow",
                    format!("license {:?} is not in the allow-list", p.license.as_deref().unwrap_or_default()),
                ),
                Some(Ok(true)) => {}
            }
        }
        if let Some(reason) = policy.deny.get(&p.name) {
            refuse("[bans] deny", reason.clone());
        }
        match p.source.as_deref() {
            None => {}
            Some(source) => {
                let (kind, url) = source.split_once('+').unwrap_or(("", source));
                match kind {
                    "registry" | "sparse" => {
                        let crates_io = CRATES_IO.contains(&url);
                        let listed = policy.allow_registry.contains(url)
                            || (crates_io && policy.allow_registry.iter().any(|r| CRATES_IO.contains(&r.as_str())));
                        if !listed {
                            refuse("[sources] allow-registry", format!("from the registry {url}"));
                        }
                    }
                    "git" => {
                        let repo = url.split(['?', '#']).next().unwrap_or(url);
                        if !policy.allow_git.contains(repo) {
                            refuse("[sources] allow-git", format!("a git dependency on {repo}"));
                        }
                    }
                    _ => refuse("[sources] unknown-registry", format!("from {source}")),
                }
            }
        }
    }
    versions.retain(|name, v| v.len() > 1 && !policy.skip.contains(name));
    if policy.multiple_versions_deny {
        for (name, v) in &versions {
            violations.push(Violation { krate: name.clone(), rule: "[bans] multiple-versions", detail: v.join(", ") });
        }
    }
    violations.sort();
    (violations, versions)
}

/// The resolved graph, every feature on (deny.toml's `[graph] all-features`), from Cargo.lock.
/// Offline first; a fresh machine has only the host's crates downloaded (the graph names every
/// target's), so on a miss the locked crates are fetched from their registry once and it is read
/// again offline.
fn workspace_packages() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let metadata = || {
        Command::new(&cargo)
            .args(["metadata", "--format-version", "1", "--locked", "--offline", "--all-features"])
            .current_dir(workspace_root())
            .output()
            .expect("cargo metadata runs")
    };
    let mut out = metadata();
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--offline was specified") {
        let fetched = Command::new(&cargo)
            .args(["fetch", "--locked"])
            .current_dir(workspace_root())
            .output()
            .expect("cargo fetch runs");
        assert!(fetched.status.success(), "cargo fetch --locked failed: {}", String::from_utf8_lossy(&fetched.stderr));
        out = metadata();
    }
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap_or_default().to_owned(),
            version: p["version"].as_str().unwrap_or_default().to_owned(),
            license: p["license"].as_str().map(str::to_owned),
            source: p["source"].as_str().map(str::to_owned),
            private: p["publish"].as_array().is_some_and(Vec::is_empty),
        })
        .collect()
}

fn repo_policy() -> Policy {
    policy(&std::fs::read_to_string(workspace_root().join("deny.toml")).expect("deny.toml is readable"))
}

#[test]
fn every_dependency_follows_the_licenses_bans_and_sources_of_deny_toml() {
    let packages = workspace_packages();
    assert!(packages.len() > 100, "the graph is the whole workspace: {} packages", packages.len());
    let (violations, duplicates) = check(&repo_policy(), &packages);
    // Reported, not refused (multiple-versions = "warn").
    for (name, versions) in &duplicates {
        eprintln!("duplicate: {name} {}", versions.join(", "));
    }
    let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(list.is_empty(), "dependency policy (deny.toml) violations:\n{}", list.join("\n"));
}

#[test]
fn deny_toml_bans_other_tls_stacks_and_allows_crates_io_only() {
    let policy = repo_policy();
    for banned in ["openssl-sys", "openssl", "native-tls", "aws-lc-sys"] {
        assert!(policy.deny.contains_key(banned), "{banned} is not banned");
    }
    assert_eq!(policy.allow_registry, BTreeSet::from([CRATES_IO[0].to_owned()]));
    assert!(policy.allow_git.is_empty());
    assert!(policy.ignore_private);
    for copyleft in ["GPL-3.0", "GPL-2.0", "AGPL-3.0", "LGPL-2.1-or-later", "MPL-2.0", "SSPL-1.0"] {
        assert!(!policy.allow.contains(copyleft), "{copyleft} is allowed");
    }
}

#[test]
fn a_crafted_violation_of_each_rule_is_refused_naming_the_crate_and_the_rule() {
    let policy = repo_policy();
    let crates_io = Some("registry+https://github.com/rust-lang/crates.io-index".to_owned());
    let pkg = |name: &str, version: &str, license: Option<&str>, source: Option<String>| Package {
        name: name.into(),
        version: version.into(),
        license: license.map(Into::into),
        source,
        private: false,
    };
    let packages = vec![
        pkg("fine", "1.0.0", Some("MIT OR Apache-2.0"), crates_io.clone()),
        pkg("fine", "2.0.0", Some("MIT"), Some("sparse+https://index.crates.io/".into())),
        pkg("copyleft", "1.0.0", Some("GPL-3.0-only"), crates_io.clone()),
        pkg("both-needed", "1.0.0", Some("MIT AND GPL-2.0"), crates_io.clone()),
        pkg("unlicensed", "1.0.0", None, crates_io.clone()),
        pkg("openssl-sys", "0.9.0", Some("MIT"), crates_io.clone()),
        pkg("from-git", "0.1.0", Some("MIT"), Some("git+https://github.com/someone/from-git?rev=abc#abc".into())),
        pkg("other-registry", "0.1.0", Some("MIT"), Some("registry+https://my.registry/index".into())),
        Package { private: true, ..pkg("our-own", "0.1.0", Some("Proprietary"), None) },
    ];
    let (violations, duplicates) = check(&policy, &packages);
    let found: Vec<(String, &str)> = violations.iter().map(|v| (v.krate.clone(), v.rule)).collect();
    assert_eq!(
        found,
        [
            ("both-needed@1.0.0".to_owned(), "[licenses] allow"),
            ("copyleft@1.0.0".to_owned(), "[licenses] allow"),
            ("from-git@0.1.0".to_owned(), "[sources] allow-git"),
            ("openssl-sys@0.9.0".to_owned(), "[bans] deny"),
            ("other-registry@0.1.0".to_owned(), "[sources] allow-registry"),
            ("unlicensed@1.0.0".to_owned(), "[licenses] allow"),
        ]
    );
    assert!(violations[1].to_string().contains("GPL-3.0-only"), "{}", violations[1]);
    assert_eq!(duplicates, BTreeMap::from([("fine".to_owned(), vec!["1.0.0".to_owned(), "2.0.0".to_owned()])]));

    // multiple-versions = "deny" refuses the duplicate; a skip entry exempts it.
    let strict = Policy { multiple_versions_deny: true, ..repo_policy() };
    let (violations, _) = check(&strict, &packages[..2]);
    assert_eq!(violations.iter().map(|v| v.rule).collect::<Vec<_>>(), ["[bans] multiple-versions"]);
    let skipped = Policy { multiple_versions_deny: true, skip: BTreeSet::from(["fine".to_owned()]), ..repo_policy() };
    assert!(check(&skipped, &packages[..2]).0.is_empty());
    // A per-crate exception allows that crate only.
    let excepted = Policy {
        exceptions: BTreeMap::from([("copyleft".to_owned(), BTreeSet::from(["GPL-3.0-only".to_owned()]))]),
        ..repo_policy()
    };
    let (violations, _) = check(&excepted, &packages[2..4]);
    assert_eq!(violations.iter().map(|v| v.krate.as_str()).collect::<Vec<_>>(), ["both-needed@1.0.0"]);
}

#[test]
fn license_expressions_follow_spdx_precedence_with_and_binding_tighter_than_or() {
    let allow = |l: &str| ["MIT", "Apache-2.0", "Unicode-3.0", "Apache-2.0 WITH LLVM-exception"].contains(&l);
    let ok = |e: &str| license_allowed(e, &allow).unwrap_or_else(|err| panic!("{e}: {err}"));
    assert!(ok("MIT"));
    assert!(ok("MIT OR GPL-3.0"));
    assert!(!ok("MIT AND GPL-3.0"));
    assert!(ok("GPL-3.0 AND MIT OR Apache-2.0"), "AND binds tighter: (GPL AND MIT) OR Apache");
    assert!(!ok("GPL-3.0 AND (MIT OR Apache-2.0)"));
    assert!(ok("(MIT OR Apache-2.0) AND Unicode-3.0"));
    assert!(ok("MIT/Apache-2.0"), "the old slash spelling is OR");
    assert!(ok("Apache-2.0 WITH LLVM-exception"));
    assert!(!ok("GPL-2.0 WITH Classpath-exception-2.0"));
    for broken in ["MIT OR", "(MIT", "AND MIT", "MIT WITH"] {
        assert!(license_allowed(broken, &allow).is_err(), "{broken} parsed");
    }
}

#[test]
fn the_policy_parser_refuses_what_it_does_not_understand() {
    assert!(parse_toml("[[licenses.clarify]]\ncrate = \"x\"\n").is_err());
    assert!(parse_toml("a = 1\na = 2\n").is_err());
    assert!(parse_toml("a = 'single quotes'\n").is_err());
    let t = parse_toml("[x.y]\nlist = [\n  \"a\", # comment\n  { crate = \"b\", reason = \"c\" },\n]\n").unwrap();
    let list = t.get("x").and_then(|x| x.get("y")).and_then(|y| y.get("list")).unwrap();
    let Toml::Arr(items) = list else { panic!("{list:?}") };
    assert_eq!(items[0], Toml::Str("a".into()));
    assert_eq!(items[1].get("reason"), Some(&Toml::Str("c".into())));
}
