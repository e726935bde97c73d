//! The generated CRD: committed copy in sync, structural, with the right names and markers.

use std::path::PathBuf;

use crds::CloudControllerManager;
use crds::validation::validate_spec;
use serde_json::Value;
use testkit::workspace_root;

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = workspace_root().join(crds::CRD_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = crds::crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "{} is out of date with the Rust types in crds/. Regenerate it with:\n    {}",
        crds::CRD_PATH,
        crds::REGENERATE_COMMAND
    );
}

#[test]
fn committed_pool_crd_matches_the_rust_types() {
    let path = workspace_root().join(crds::POOL_CRD_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = crds::pool_crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "{} is out of date with the Rust types in crds/. Regenerate it with:\n    {}",
        crds::POOL_CRD_PATH,
        crds::REGENERATE_POOL_COMMAND
    );
}

#[test]
fn committed_announcement_crd_matches_the_rust_types() {
    let path = workspace_root().join(crds::ANNOUNCEMENT_CRD_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = crds::announcement_crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "{} is out of date with the Rust types in crds/. Regenerate it with:\n    {}",
        crds::ANNOUNCEMENT_CRD_PATH,
        crds::REGENERATE_ANNOUNCEMENT_COMMAND
    );
}

#[test]
fn announcement_crd_is_namespaced_with_service_node_and_since_columns() {
    let crd = serde_json::to_value(crds::announcement_crd()).expect("CRD serializes");
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], "serviceannouncements.ccm.rs");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["shortNames"], serde_json::json!(["svcann"]));
    let version = &spec["versions"][0];
    assert!(version["subresources"].is_null(), "a record without a status subresource: {version}");
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["Service Namespace", "Service", "Node", "Address", "Since"]);
    let schema = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(schema["properties"]["addresses"]["maxItems"], 16);
    assert_eq!(schema["properties"]["node"]["maxLength"], 253);
    let protocol = &schema["properties"]["addresses"]["items"]["properties"]["protocol"]["enum"];
    assert_eq!(protocol, &serde_json::json!(["ARP", "NDP"]));
}

#[test]
fn pool_crd_is_cluster_scoped_with_status_usage_columns_and_a_structural_schema() {
    let crd = serde_json::to_value(crds::pool_crd()).expect("CRD serializes");
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], "loadbalancerippools.ccm.rs");
    assert_eq!(spec["scope"], "Cluster");
    assert_eq!(spec["names"]["shortNames"], serde_json::json!(["lbpool"]));
    let version = &spec["versions"][0];
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> =
        version["additionalPrinterColumns"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(columns, ["Auto", "IPv4 Assigned", "IPv4 Available", "IPv6 Assigned", "IPv6 Available", "Valid", "Age"]);
    let schema = &version["schema"]["openAPIV3Schema"];
    assert_structural("pool", schema);
    let conditions = &schema["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
}

fn crd_json() -> Value {
    serde_json::to_value(crds::crd()).expect("CRD serializes")
}

#[test]
fn crd_names_scope_and_subresources() {
    let crd = crd_json();
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], "cloudcontrollermanagers.ccm.rs");
    assert_eq!(spec["group"], "ccm.rs");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["plural"], "cloudcontrollermanagers");
    assert_eq!(spec["names"]["kind"], "CloudControllerManager");
    assert_eq!(spec["names"]["shortNames"], serde_json::json!(["ccm"]));
    assert_eq!(spec["names"]["categories"], serde_json::json!(["cloud"]));
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> =
        version["additionalPrinterColumns"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(columns, ["Provider", "Mode", "Ready", "ProviderHealthy", "Age"]);
}

#[test]
fn status_conditions_are_a_list_map_keyed_by_type() {
    let crd = crd_json();
    let conditions =
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], serde_json::json!(["type"]));
}

/// Structural schema rules (apiextensions): every node has a type (or preserves unknown fields
/// or is int-or-string), and no `$ref`, `anyOf`/`oneOf` type unions, or `additionalProperties`
/// beside `properties` appear.
fn assert_structural(path: &str, schema: &Value) {
    let obj = schema.as_object().unwrap_or_else(|| panic!("{path}: not an object"));
    assert!(!obj.contains_key("$ref"), "{path}: $ref is not allowed");
    let typed = obj.contains_key("type")
        || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    assert!(typed, "{path}: no type");
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = obj.get(key) {
            for (i, alt) in list.as_array().unwrap().iter().enumerate() {
                assert!(alt.get("type").is_none(), "{path}.{key}[{i}]: a type inside {key} is not structural");
            }
        }
    }
    assert!(
        !(obj.contains_key("properties") && obj.contains_key("additionalProperties")),
        "{path}: properties and additionalProperties together"
    );
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            assert_structural(&format!("{path}.{k}"), v);
        }
    }
    if let Some(items) = obj.get("items") {
        assert_structural(&format!("{path}[]"), items);
    }
    if let Some(ap) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        assert_structural(&format!("{path}{{}}"), ap);
    }
}

#[test]
fn crd_schema_is_structural() {
    let crd = crd_json();
    assert_structural("openAPIV3Schema", &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
}

#[test]
fn cel_rules_are_in_the_crd_for_the_api_server() {
    let text = serde_json::to_string(&crd_json()).unwrap();
    for rule in [
        "self == oldSelf",
        "isCIDR(c.trim())",
        "duration(self.leaseDuration) > duration(self.renewDeadline)",
        "self >= 1",
    ] {
        assert!(text.contains(rule), "rule {rule:?} missing from the CRD");
    }
}

#[test]
fn spec_defaults_are_in_the_schema() {
    let crd = crd_json();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["mode"]["default"], "Deployment");
    assert_eq!(spec["controllers"]["default"], serde_json::json!(["*"]));
    assert_eq!(spec["clusterName"]["default"], "kubernetes");
    assert_eq!(spec["configureCloudRoutes"]["default"], true);
    assert_eq!(spec["leaderElection"]["default"]["leaseDuration"], "15s");
    assert_eq!(spec["concurrency"]["default"]["routeSyncs"], 1);
    assert_eq!(spec["deployment"]["default"]["replicas"], 2);
}

fn examples() -> Vec<(PathBuf, CloudControllerManager)> {
    let dir = workspace_root().join("charts/ccm-operator/examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples directory exists") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = <Value as serde::Deserialize>::deserialize(doc).unwrap();
            if value["kind"] == "CloudControllerManager" {
                let ccm: CloudControllerManager =
                    serde_json::from_value(value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((path.clone(), ccm));
            }
        }
    }
    out
}

#[test]
fn every_example_parses_and_validates() {
    let found = examples();
    let names: Vec<String> = found.iter().map(|(_, c)| c.metadata.name.clone().unwrap()).collect();
    for expected in ["baremetal", "baremetal-embedded", "fake-full"] {
        assert!(names.iter().any(|n| n == expected), "example {expected} missing: {names:?}");
    }
    for (path, ccm) in &found {
        validate_spec(&ccm.spec).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn minimal_example_takes_the_documented_defaults() {
    let (_, ccm) = examples().into_iter().find(|(_, c)| c.metadata.name.as_deref() == Some("baremetal")).unwrap();
    let spec = ccm.spec;
    assert_eq!(spec.mode, crds::Mode::Deployment);
    assert_eq!(spec.controllers, ["*"]);
    assert_eq!(spec.cluster_name, "kubernetes");
    assert!(spec.configure_cloud_routes);
    assert_eq!(spec.cloud_config.unwrap().secret_ref.key, "cloud.conf");
    assert_eq!(spec.concurrency.node_syncs, 5);
    assert_eq!(spec.concurrency.service_syncs, 32, "the binary's --concurrent-service-syncs default");
    assert_eq!(spec.concurrency.route_syncs, 1);
    assert_eq!(spec.deployment.replicas, 2);
    assert_eq!(spec.deployment.priority_class_name, "system-cluster-critical");
    assert!(spec.deployment.host_network);
    assert_eq!(spec.leader_election.lease_duration.to_string(), "15s");
}

#[test]
fn full_example_sets_every_field() {
    let (_, ccm) = examples().into_iter().find(|(_, c)| c.metadata.name.as_deref() == Some("fake-full")).unwrap();
    let spec = serde_json::to_value(&ccm.spec).unwrap();
    let defaults = serde_json::to_value(
        serde_json::from_value::<crds::CloudControllerManagerSpec>(serde_json::json!({"provider": "x"})).unwrap(),
    )
    .unwrap();
    for key in defaults.as_object().unwrap().keys() {
        assert!(spec.get(key).is_some(), "full example lacks spec.{key}");
    }
    for key in ["cloudConfig", "clusterCIDR", "loadBalancerClass", "extraArgs"] {
        assert!(spec.get(key).is_some(), "full example lacks spec.{key}");
    }
}

/// Field paths under `spec` and `status`, stopping at embedded Kubernetes types.
fn field_paths(prefix: &str, schema: &Value, out: &mut Vec<String>) {
    const OPAQUE: [&str; 3] = ["resources", "tolerations", "nodeSelector"];
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        out.push(prefix.to_string());
        return;
    };
    for (name, sub) in props {
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        if OPAQUE.contains(&name.as_str()) || name == "conditions" {
            out.push(path);
        } else {
            field_paths(&path, sub, out);
        }
    }
}

#[test]
fn crd_reference_documents_every_field() {
    let doc =
        std::fs::read_to_string(workspace_root().join("docs/crd-reference.md")).expect("docs/crd-reference.md exists");
    let crd = crd_json();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut paths = Vec::new();
    field_paths("", &root["spec"], &mut paths);
    field_paths("", &root["status"], &mut paths);
    assert!(paths.len() > 20, "{paths:?}");
    let missing: Vec<_> = paths.iter().filter(|p| !doc.contains(&format!("`{p}`"))).collect();
    // `cloudConfig.secretRef.*` and the status fields are documented by their full path or name.
    assert!(missing.is_empty(), "docs/crd-reference.md does not document: {missing:?}");
    for t in crds::conditions::types::ALL {
        assert!(doc.contains(&format!("`{t}`")), "condition {t} undocumented");
    }
    for r in crds::conditions::reasons::ALL {
        assert!(doc.contains(&format!("`{r}`")), "Ready reason {r} undocumented");
    }
}
