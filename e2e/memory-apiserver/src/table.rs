//! `application/json;as=Table` responses (what `kubectl get` prints), for common types.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::{ResourceType, Strategy};
use crate::store::Obj;
use crate::util::age_seconds;

fn col(name: &str, ty: &str, format: &str) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": 0})
}

/// A column kubectl shows only with `-o wide`.
fn wide(name: &str) -> Value {
    json!({"name": name, "type": "string", "format": "", "description": "", "priority": 1})
}

fn int(v: &Value, ptr: &str) -> i64 {
    v.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

fn address(v: &Value, ty: &str) -> String {
    v.pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| x.get("type").and_then(Value::as_str) == Some(ty)))
        .and_then(|x| x.get("address").and_then(Value::as_str))
        .unwrap_or("<none>")
        .to_string()
}

fn containers_and_images(v: &Value) -> (String, String) {
    let cs = v.pointer("/spec/template/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
    let names: Vec<&str> = cs.iter().filter_map(|c| c.get("name").and_then(Value::as_str)).collect();
    let images: Vec<&str> = cs.iter().filter_map(|c| c.get("image").and_then(Value::as_str)).collect();
    (names.join(","), images.join(","))
}

fn selector(v: &Value) -> String {
    map_or_none(v, "/spec/selector/matchLabels")
}

fn map_or_none(v: &Value, ptr: &str) -> String {
    let m = v.pointer(ptr).and_then(Value::as_object).cloned().unwrap_or_default();
    let parts: Vec<String> = m.iter().map(|(k, x)| format!("{k}={}", x.as_str().unwrap_or(""))).collect();
    if parts.is_empty() { "<none>".into() } else { parts.join(",") }
}

/// Columns of the built-in kinds the genuine server prints beyond NAME and AGE.
fn builtin(rt: &ResourceType, v: &Value, name: Value, age: Value) -> Option<(Vec<Value>, Vec<Value>)> {
    let (containers, images) = containers_and_images(v);
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("apps", "deployments") => Some((
            vec![
                col("Name", "string", "name"),
                col("Ready", "string", ""),
                col("Up-to-date", "integer", ""),
                col("Available", "integer", ""),
                col("Age", "string", ""),
                wide("Containers"),
                wide("Images"),
                wide("Selector"),
            ],
            vec![
                name,
                json!(format!("{}/{}", int(v, "/status/readyReplicas"), int(v, "/spec/replicas"))),
                json!(int(v, "/status/updatedReplicas")),
                json!(int(v, "/status/availableReplicas")),
                age,
                json!(containers),
                json!(images),
                json!(selector(v)),
            ],
        )),
        ("apps", "daemonsets") => Some((
            vec![
                col("Name", "string", "name"),
                col("Desired", "integer", ""),
                col("Current", "integer", ""),
                col("Ready", "integer", ""),
                col("Up-to-date", "integer", ""),
                col("Available", "integer", ""),
                col("Node Selector", "string", ""),
                col("Age", "string", ""),
                wide("Containers"),
                wide("Images"),
                wide("Selector"),
            ],
            vec![
                name,
                json!(int(v, "/status/desiredNumberScheduled")),
                json!(int(v, "/status/currentNumberScheduled")),
                json!(int(v, "/status/numberReady")),
                json!(int(v, "/status/updatedNumberScheduled")),
                json!(int(v, "/status/numberAvailable")),
                json!(map_or_none(v, "/spec/template/spec/nodeSelector")),
                age,
                json!(containers),
                json!(images),
                json!(selector(v)),
            ],
        )),
        ("coordination.k8s.io", "leases") => Some((
            vec![col("Name", "string", "name"), col("Holder", "string", ""), col("Age", "string", "")],
            vec![name, json!(s(v, "/spec/holderIdentity")), age],
        )),
        ("", "events") => {
            let last = v
                .pointer("/lastTimestamp")
                .or(v.pointer("/eventTime"))
                .or(v.pointer("/metadata/creationTimestamp"))
                .and_then(Value::as_str);
            let first = v.pointer("/firstTimestamp").or(v.pointer("/eventTime")).and_then(Value::as_str);
            let object = format!("{}/{}", s(v, "/involvedObject/kind").to_lowercase(), s(v, "/involvedObject/name"));
            let source = match (s(v, "/source/component"), s(v, "/reportingComponent")) {
                ("", r) => r.to_string(),
                (c, _) => c.to_string(),
            };
            Some((
                vec![
                    col("Last Seen", "string", ""),
                    col("Type", "string", ""),
                    col("Reason", "string", ""),
                    col("Object", "string", ""),
                    wide("Subobject"),
                    wide("Source"),
                    col("Message", "string", ""),
                    wide("First Seen"),
                    wide("Count"),
                    wide("Name"),
                ],
                vec![
                    json!(human_age(last)),
                    json!(s(v, "/type")),
                    json!(s(v, "/reason")),
                    json!(object),
                    json!(s(v, "/involvedObject/fieldPath")),
                    json!(source),
                    json!(s(v, "/message")),
                    json!(human_age(first)),
                    json!(int(v, "/count").max(1)),
                    name,
                ],
            ))
        }
        _ => None,
    }
}

/// Human-readable age, as kubectl prints it.
fn human_age(ts: Option<&str>) -> String {
    let Some(s) = ts.and_then(age_seconds) else { return "<unknown>".into() };
    let s = s.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    match () {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => format!("{m}m{}s", s % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if d < 2 => format!("{h}h"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn condition<'a>(v: &'a Value, ty: &str) -> Option<&'a str> {
    v.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))?
        .get("status")?
        .as_str()
}

/// Evaluates the JSONPath subset CRD printer columns use: `.a.b`, `.a[0]`, `.a[?(@.k=="v")].b`.
fn json_path(v: &Value, path: &str) -> Option<Value> {
    let mut cur = v.clone();
    let mut rest = path.trim().trim_start_matches('{').trim_end_matches('}').trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            cur = cur.get(&r[..end])?.clone();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("[?(@.") {
            let end = r.find(")]")?;
            let (field, want) = r[..end].split_once("==")?;
            let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
            cur = cur.as_array()?.iter().find(|i| i.get(field.trim()).and_then(Value::as_str) == Some(want))?.clone();
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let idx: usize = r[..end].parse().ok()?;
            cur = cur.as_array()?.get(idx)?.clone();
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    Some(cur)
}

fn columns_and_cells(rt: &ResourceType, v: &Value) -> (Vec<Value>, Vec<Value>) {
    let name = json!(s(v, "/metadata/name"));
    let age = json!(human_age(v.pointer("/metadata/creationTimestamp").and_then(Value::as_str)));
    if let Some(table) = builtin(rt, v, name.clone(), age.clone()) {
        return table;
    }
    match rt.strategy {
        Strategy::Node => {
            let mut status = match condition(v, "Ready") {
                Some("True") => "Ready".to_string(),
                Some("False") => "NotReady".to_string(),
                _ => "Unknown".to_string(),
            };
            if v.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                status.push_str(",SchedulingDisabled");
            }
            (
                vec![
                    col("Name", "string", "name"),
                    col("Status", "string", ""),
                    col("Roles", "string", ""),
                    col("Age", "string", ""),
                    col("Version", "string", ""),
                    wide("Internal-IP"),
                    wide("External-IP"),
                    wide("OS-Image"),
                    wide("Kernel-Version"),
                    wide("Container-Runtime"),
                ],
                vec![
                    name,
                    json!(status),
                    json!("<none>"),
                    age,
                    json!(s(v, "/status/nodeInfo/kubeletVersion")),
                    json!(address(v, "InternalIP")),
                    json!(address(v, "ExternalIP")),
                    json!(s(v, "/status/nodeInfo/osImage")),
                    json!(s(v, "/status/nodeInfo/kernelVersion")),
                    json!(s(v, "/status/nodeInfo/containerRuntimeVersion")),
                ],
            )
        }
        Strategy::Namespace => (
            vec![col("Name", "string", "name"), col("Status", "string", ""), col("Age", "string", "")],
            vec![name, json!(s(v, "/status/phase")), age],
        ),
        Strategy::Pod => {
            let total = v.pointer("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
            let ready = v
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .map_or(0, |c| c.iter().filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true)).count());
            (
                vec![
                    col("Name", "string", "name"),
                    col("Ready", "string", ""),
                    col("Status", "string", ""),
                    col("Restarts", "string", ""),
                    col("Age", "string", ""),
                ],
                vec![name, json!(format!("{ready}/{total}")), json!(s(v, "/status/phase")), json!("0"), age],
            )
        }
        Strategy::Service => {
            let ty = s(v, "/spec/type");
            let ingress: Vec<&str> = v
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|i| i.get("ip").or(i.get("hostname")).and_then(Value::as_str)).collect())
                .unwrap_or_default();
            let external = match (ty, ingress.is_empty()) {
                (_, false) => ingress.join(","),
                ("LoadBalancer", true) => "<pending>".into(),
                _ => "<none>".into(),
            };
            let ports: Vec<String> = v
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                            let port = p.get("port").map(ToString::to_string).unwrap_or_default();
                            match p.get("nodePort") {
                                Some(np) => format!("{port}:{np}/{proto}"),
                                None => format!("{port}/{proto}"),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                vec![
                    col("Name", "string", "name"),
                    col("Type", "string", ""),
                    col("Cluster-IP", "string", ""),
                    col("External-IP", "string", ""),
                    col("Port(s)", "string", ""),
                    col("Age", "string", ""),
                ],
                vec![name, json!(ty), json!(s(v, "/spec/clusterIP")), json!(external), json!(ports.join(",")), age],
            )
        }
        Strategy::Custom if !rt.printer_columns.is_empty() => {
            let mut cols = vec![col("Name", "string", "name")];
            let mut cells = vec![name];
            for pc in &rt.printer_columns {
                cols.push(col(s(pc, "/name"), s(pc, "/type"), s(pc, "/format")));
                let cell = json_path(v, s(pc, "/jsonPath")).unwrap_or(Value::Null);
                // The real server prints date columns as ages.
                let cell = match (&cell, s(pc, "/type")) {
                    (Value::String(ts), "date") => json!(human_age(Some(ts))),
                    _ => cell,
                };
                cells.push(cell);
            }
            (cols, cells)
        }
        _ => (vec![col("Name", "string", "name"), col("Age", "string", "")], vec![name, age]),
    }
}

/// A `meta.k8s.io/v1` Table for `items`.
pub(crate) fn table(rt: &ResourceType, items: &[Arc<Obj>], rv: Option<u64>, cont: Option<String>) -> Value {
    let mut columns = None;
    let mut rows = vec![];
    for o in items {
        let (cols, cells) = columns_and_cells(rt, &o.value);
        columns.get_or_insert(cols);
        rows.push(json!({
            "cells": cells,
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": o.value.get("metadata").cloned().unwrap_or(json!({})),
            },
        }));
    }
    let columns = columns.unwrap_or_else(|| columns_and_cells(rt, &json!({})).0);
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv.to_string());
    }
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_handles_filters_and_indexes() {
        let v =
            json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(json_path(&v, ".status.conditions[?(@.type==\"Ready\")].status"), Some(json!("True")));
        assert_eq!(json_path(&v, ".status.conditions[0].type"), Some(json!("A")));
        assert_eq!(json_path(&v, ".spec.missing"), None);
    }
}
