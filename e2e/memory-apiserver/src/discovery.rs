//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}[/{version}]`.

use serde_json::{Value, json};

use crate::resources::Registry;

/// The Kubernetes version this server claims to be.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-memory-apiserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub(crate) fn core_versions(addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
    let preferred = vs.first().cloned().unwrap_or(json!({}));
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

pub(crate) fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> =
        reg.groups().iter().filter(|g| !g.name.is_empty()).map(|g| group_json(&g.name, &g.versions)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn group(reg: &Registry, name: &str) -> Option<Value> {
    let g = reg.groups().into_iter().find(|g| g.name == name && !name.is_empty())?;
    let mut v = group_json(&g.name, &g.versions);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

pub(crate) fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.has_group_version(group, version) {
        return None;
    }
    let mut resources = vec![];
    for rt in reg.resources(group, version) {
        let mut r = json!({
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": rt.verbs(),
        });
        if !rt.short_names.is_empty() {
            r["shortNames"] = json!(rt.short_names);
        }
        if !rt.categories.is_empty() {
            r["categories"] = json!(rt.categories);
        }
        resources.push(r);
        if rt.status {
            resources.push(json!({
                "name": format!("{}/status", rt.plural),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

fn fnv(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016X}")
}

/// The OpenAPI v3 root: one entry per group version. kubectl reads it to learn that the
/// server accepts `fieldValidation` (so it skips client-side schema validation).
pub(crate) fn openapi_v3_root(reg: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for g in reg.groups() {
        for v in &g.versions {
            let key = if g.name.is_empty() { format!("api/{v}") } else { format!("apis/{}/{v}", g.name) };
            let hash = fnv(&openapi_v3_group_version(reg, &g.name, v).map(|d| d.to_string()).unwrap_or_default());
            paths.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}));
        }
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for a group version: the object paths with their PATCH
/// operation, its group-version-kind and query parameters, and the schemas of custom resources
/// (built-in types have none here).
pub(crate) fn openapi_v3_group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.has_group_version(group, version) {
        return None;
    }
    let prefix = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for rt in reg.resources(group, version) {
        // Custom resources carry their CRD's schema, so that `kubectl explain` works.
        if let Some(schema) = &rt.schema {
            let reversed: Vec<&str> = rt.group.split('.').rev().collect();
            let mut doc = (**schema).clone();
            if let Some(props) = doc.get_mut("properties").and_then(Value::as_object_mut) {
                props.entry("apiVersion").or_insert(json!({"type": "string", "description": "The versioned schema of this representation of an object."}));
                props
                    .entry("kind")
                    .or_insert(json!({"type": "string", "description": "The REST resource this object represents."}));
                props
                    .entry("metadata")
                    .or_insert(json!({"type": "object", "description": "Standard object's metadata."}));
            }
            doc["x-kubernetes-group-version-kind"] =
                json!([{"group": rt.group, "version": rt.version, "kind": rt.kind}]);
            schemas.insert(format!("{}.{}.{}", reversed.join("."), rt.version, rt.kind), doc);
        }
        let item = if rt.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{prefix}/{}/{{name}}", rt.plural)
        };
        let gvk = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
        let op = json!({
            "operationId": format!("patch{}", rt.kind),
            "parameters": params,
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
        });
        paths.insert(item, json!({"patch": op}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
