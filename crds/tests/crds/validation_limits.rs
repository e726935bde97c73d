//! Every limit the generated CRD states is enforced by the Rust validation, with the API
//! server's message: this test walks the CRD's `spec` schema, builds a spec breaking each
//! `maxLength`, `minLength`, `maxItems`, `maxProperties`, `enum`, `minimum` and `maximum` it finds, and
//! checks that `parse_spec` + `validate_spec` reject it naming that field. A limit added to the
//! types without Rust enforcement fails here.

use crds::validation::{FieldError, messages, parse_spec, validate_spec};
use serde_json::{Map, Value, json};

/// What `parse_spec` then `validate_spec` say about a spec, as `field: message` lines.
fn problems(spec: &Value) -> Vec<String> {
    match parse_spec(spec) {
        Err(FieldError { field, message }) => vec![format!("{field}: {message}")],
        Ok(parsed) => match validate_spec(&parsed) {
            Ok(()) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        },
    }
}

/// One step of a path into the spec.
#[derive(Clone, Debug)]
enum Step {
    Field(String),
    Item,
}

fn display(path: &[Step]) -> String {
    let mut out = String::from("spec");
    for s in path {
        match s {
            Step::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Step::Item => out.push_str("[0]"),
        }
    }
    out
}

/// The smallest valid value of a schema: required properties filled in, defaults left to serde.
fn minimal(schema: &Value) -> Value {
    if let Some(v) = schema.get("enum").and_then(|e| e.get(0)) {
        return v.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let mut obj = Map::new();
            for name in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                let name = name.as_str().unwrap();
                obj.insert(name.into(), minimal(&schema["properties"][name]));
            }
            Value::Object(obj)
        }
        Some("array") => json!([]),
        Some("integer") => json!(schema.get("minimum").and_then(Value::as_f64).unwrap_or(1.0) as i64),
        Some("boolean") => json!(true),
        _ => json!("x"),
    }
}

/// A valid spec (provider `fake`) with `value` placed at `path`; parents are made minimal.
fn spec_with(root: &Value, path: &[Step], value: Value) -> Value {
    fn place(schema: &Value, current: Value, path: &[Step], value: Value) -> Value {
        let Some((first, rest)) = path.split_first() else { return value };
        match first {
            Step::Field(f) => {
                let mut obj = match current {
                    Value::Object(o) => o,
                    _ => minimal(schema).as_object().cloned().unwrap_or_default(),
                };
                let child_schema = &schema["properties"][f];
                let child = obj.remove(f).unwrap_or_else(|| minimal(child_schema));
                obj.insert(f.clone(), place(child_schema, child, rest, value));
                Value::Object(obj)
            }
            Step::Item => {
                let items = &schema["items"];
                json!([place(items, minimal(items), rest, value)])
            }
        }
    }
    let base = json!({"provider": "fake"});
    place(root, base, path, value)
}

/// One limit found in the schema, the spec breaking it, and the message expected.
struct Case {
    path: String,
    spec: Value,
    expected: String,
}

fn walk(root: &Value, schema: &Value, path: &mut Vec<Step>, cases: &mut Vec<Case>) {
    let field = display(path);
    let mut case = |value: Value, expected: String| {
        cases.push(Case { path: field.clone(), spec: spec_with(root, path, value), expected });
    };
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
        case(json!("a".repeat(max as usize + 1)), messages::too_long(max as usize));
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
        assert_eq!(min, 1, "{field}: the test knows how to break a minLength of 1 only");
        case(json!(""), messages::too_short(&field, 1));
    }
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
        let item = minimal(&schema["items"]);
        // For item lists with their own rule (controllers), a valid entry.
        let item = if item == json!("x") && field == "spec.controllers" { json!("*") } else { item };
        let n = max as usize + 1;
        case(Value::Array(vec![item; n]), messages::too_many(n, max as usize));
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64) {
        let n = max as usize + 1;
        let obj: Map<String, Value> = (0..n).map(|i| (format!("k{i}"), json!("v"))).collect();
        case(Value::Object(obj), messages::too_many_properties(n, max as usize));
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let supported: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
        case(json!("NotOneOfThem"), messages::unsupported(&supported));
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let min = min as i64;
        case(json!(min - 1), messages::below_minimum(&field, min - 1, min));
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let max = max as i64;
        case(json!(max + 1), messages::above_maximum(&field, max + 1, max));
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            path.push(Step::Field(name.clone()));
            walk(root, child, path, cases);
            path.pop();
        }
    }
    if let Some(items) = schema.get("items") {
        path.push(Step::Item);
        walk(root, items, path, cases);
        path.pop();
    }
}

fn spec_schema() -> Value {
    let crd = serde_json::to_value(crds::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

#[test]
fn every_crd_limit_is_enforced_by_the_rust_validation_with_the_api_server_message() {
    let root = spec_schema();
    let mut cases = Vec::new();
    walk(&root, &root, &mut Vec::new(), &mut cases);
    // The walk found the limits this test was written against (and any added since).
    assert!(cases.len() >= 20, "only {} limits found in the CRD schema", cases.len());
    let mut missing = Vec::new();
    for c in &cases {
        let want = format!("{}: {}", c.path, c.expected);
        let got = problems(&c.spec);
        if !got.iter().any(|p| p == &want) {
            missing.push(format!("{want}\n    spec: {}\n    got: {got:?}", truncate(&c.spec.to_string())));
        }
    }
    assert!(
        missing.is_empty(),
        "limits the Rust validation does not enforce as the API server does:\n{}",
        missing.join("\n")
    );
}

fn truncate(s: &str) -> String {
    if s.len() > 300 { format!("{}...", &s[..300]) } else { s.to_string() }
}

#[test]
fn the_minimal_spec_of_the_walk_is_valid() {
    let root = spec_schema();
    assert!(problems(&spec_with(&root, &[], json!({"provider": "fake"}))).is_empty());
}

#[test]
fn issue_examples_give_the_api_server_messages() {
    let long = "n".repeat(100_000);
    let p = problems(&json!({"provider": "fake", "clusterName": long}));
    assert_eq!(p, ["spec.clusterName: Too long: may not be more than 253 bytes"]);
    let p = problems(&json!({"provider": "fake", "loadBalancerClass": long}));
    assert_eq!(p, ["spec.loadBalancerClass: Too long: may not be more than 253 bytes"]);
    let p = problems(&json!({"provider": "fake", "controllers": vec!["*"; 17]}));
    assert_eq!(p, ["spec.controllers: Too many: 17: must have at most 16 items"]);
    let p = problems(&json!({"provider": "fake", "mode": "X"}));
    assert_eq!(p, [r#"spec.mode: Unsupported value: supported values: "Deployment", "DaemonSet", "Embedded""#]);
    // A 100,000-character provider name yields a short message that does not repeat it.
    let p = problems(&json!({"provider": long}));
    assert_eq!(p, ["spec.provider: Too long: may not be more than 63 bytes"]);
}

#[test]
fn malformed_specs_name_the_path_and_type_but_never_the_value() {
    let token = "SECRET-TOKEN-12345";
    for (spec, want) in [
        (
            json!({"provider": "fake", "deployment": {"replicas": token}}),
            "spec.deployment.replicas: invalid type: string, expected i32",
        ),
        (
            json!({"provider": "fake", "concurrency": {"nodeSyncs": 1.5}}),
            "spec.concurrency.nodeSyncs: invalid type: floating point, expected i32",
        ),
        (
            json!({"provider": "fake", "controllers": ["*", 7]}),
            "spec.controllers[1]: invalid type: integer, expected a string",
        ),
        (json!({"provider": 5}), "spec.provider: invalid type: integer, expected a string"),
        (json!({"cloudConfig": {"secretRef": {"name": "x"}}}), "spec.provider: Required value"),
        (
            json!({"provider": "fake", "cloudConfig": {"secretRef": {}}}),
            "spec.cloudConfig.secretRef.name: Required value",
        ),
        (
            json!({"provider": "fake", "deployment": {"imagePullPolicy": token}}),
            r#"spec.deployment.imagePullPolicy: Unsupported value: supported values: "Always", "IfNotPresent", "Never""#,
        ),
        (json!({"provider": "fake", "paused": token}), "spec.paused: invalid type: string, expected a boolean"),
    ] {
        let e = parse_spec(&spec).expect_err("malformed");
        assert_eq!(e.to_string(), want);
        assert!(!e.to_string().contains(token));
    }
}

#[test]
fn go_durations_are_accepted_and_bad_ones_named() {
    let spec = json!({"provider": "fake", "leaderElection": {"leaseDuration": "1m30s", "renewDeadline": "15s", "retryPeriod": "500ms"}});
    let parsed = parse_spec(&spec).expect("Go durations parse");
    assert_eq!(std::time::Duration::from(parsed.leader_election.lease_duration).as_secs(), 90);
    assert_eq!(std::time::Duration::from(parsed.leader_election.retry_period).as_millis(), 500);
    assert!(validate_spec(&parsed).is_ok());
    for bad in ["forever", "", "15", "1x"] {
        let spec = json!({"provider": "fake", "leaderElection": {"leaseDuration": bad}});
        let e = parse_spec(&spec).expect_err(bad);
        assert_eq!(
            e.to_string(),
            "spec.leaderElection.leaseDuration: invalid duration; expected a Go duration such as 15s or 1m30s"
        );
    }
    let e = parse_spec(&json!({"provider": "fake", "leaderElection": {"renewDeadline": 15}})).unwrap_err();
    assert_eq!(e.to_string(), "spec.leaderElection.renewDeadline: invalid type: integer, expected a string");
}

#[test]
fn cel_rules_give_the_crd_messages_without_the_value() {
    let cases = [
        (
            json!({"provider": "fake", "controllers": ["nodeipam-SECRET"]}),
            "spec.controllers: Invalid value: \"array\": each entry must be",
        ),
        (
            json!({"provider": "fake", "clusterCIDR": "SECRET"}),
            "spec.clusterCIDR: Invalid value: \"string\": every entry must be a CIDR such as 10.244.0.0/16",
        ),
        (
            json!({"provider": "fake", "clusterCIDR": "10.0.0.0/16,10.1.0.0/16"}),
            "spec.clusterCIDR: Invalid value: \"string\": two CIDRs must be of different IP families",
        ),
        (
            json!({"provider": "fake", "clusterCIDR": "10.0.0.0/16,10.1.0.0/16,fd00::/48"}),
            "spec.clusterCIDR: Invalid value: \"string\": at most two CIDRs, one per IP family",
        ),
        (
            json!({"provider": "fake", "leaderElection": {"leaseDuration": "10s", "renewDeadline": "10s"}}),
            "spec.leaderElection: Invalid value: \"object\": leaseDuration must be greater than renewDeadline",
        ),
        (
            json!({"provider": "fake", "leaderElection": {"retryPeriod": "0s", "renewDeadline": "1s", "leaseDuration": "2s"}}),
            "which must be positive",
        ),
        (
            json!({"provider": "fake", "nodePlatforms": ["aws", "SECRET:"]}),
            "spec.nodePlatforms: Invalid value: \"array\": every entry must be a platform name",
        ),
        (
            json!({"provider": "baremetal", "announcer": {"l2": true, "bfd": true}}),
            "spec.announcer: Invalid value: \"object\": announcer: bfd and gracefulRestart configure the BIRD sidecar: set bgp to true",
        ),
        (
            json!({"provider": "baremetal", "announcer": {"gracefulRestart": true}}),
            "spec.announcer: Invalid value: \"object\": announcer: bfd and gracefulRestart configure the BIRD sidecar: set bgp to true",
        ),
    ];
    for (spec, want) in cases {
        let p = problems(&spec);
        assert!(p.iter().any(|m| m.contains(want)), "{spec}: {p:?}");
        assert!(p.iter().all(|m| !m.contains("SECRET")), "{p:?}");
    }
}
