//! Per-type rules: names, defaults on create, status isolation, generation, validation.

use serde_json::{Map, Value, json};

use crate::error::Cause;
use crate::resources::{ResourceType, Strategy};

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

/// Checks `metadata.name` the way the real server does for this type.
pub(crate) fn validate_name(rt: &ResourceType, name: &str) -> Option<Cause> {
    let v = Value::String(name.into());
    match rt.strategy {
        Strategy::Namespace if !dns_label(name) => Some(Cause::invalid(
            "metadata.name",
            &v,
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
        )),
        Strategy::Service if !dns_label(name) || name.starts_with(|c: char| c.is_ascii_digit()) => {
            Some(Cause::invalid(
                "metadata.name",
                &v,
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            ))
        }
        Strategy::Rbac if name.is_empty() || name == "." || name == ".." || name.contains(['/', '%']) => {
            Some(Cause::invalid("metadata.name", &v, "may not contain '/' or '%' and may not be '.' or '..'"))
        }
        Strategy::Namespace | Strategy::Service | Strategy::Rbac => None,
        _ if !dns_subdomain(name) => Some(Cause::invalid(
            "metadata.name",
            &v,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        )),
        _ => None,
    }
}

/// Defaults and resets applied to a new object.
pub(crate) fn prepare_create(rt: &ResourceType, obj: &mut Value) {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let Some(o) = obj.as_object_mut() else { return };
    match rt.strategy {
        Strategy::Namespace => {
            o.insert("status".into(), json!({"phase": "Active"}));
            let spec = o.entry("spec").or_insert(json!({}));
            if let Some(s) = spec.as_object_mut() {
                s.entry("finalizers").or_insert(json!(["kubernetes"]));
            }
            set_label(o, "kubernetes.io/metadata.name", &name);
        }
        Strategy::Pod => {
            o.insert("status".into(), json!({"phase": "Pending"}));
        }
        Strategy::Service => {
            o.insert("status".into(), json!({"loadBalancer": {}}));
            o.entry("spec").or_insert(json!({}));
        }
        Strategy::Workload => {
            o.insert("status".into(), json!({}));
            if rt.plural != "daemonsets"
                && let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut)
            {
                spec.entry("replicas").or_insert(json!(1));
            }
        }
        Strategy::Custom if rt.status => {
            o.remove("status");
        }
        Strategy::Generic if rt.status => {
            o.insert("status".into(), json!({}));
        }
        _ => {}
    }
}

/// Rewrites a written object the way decoding it into the internal type does on the real
/// server: a Secret's `stringData` is folded into `data` (base64; its keys win over `data`'s) and
/// is never stored. Runs on every create, update, patch and apply; `Err` is the message of a
/// 400, as when the real server cannot decode the body.
pub(crate) fn normalize(rt: &ResourceType, obj: &mut Value) -> Result<(), String> {
    if let (Strategy::Custom, Some(schema)) = (rt.strategy, &rt.schema) {
        crate::schema::default(schema, obj);
        crate::schema::prune(schema, obj);
        return Ok(());
    }
    if !(rt.group.is_empty() && rt.plural == "secrets") {
        return Ok(());
    }
    let Some(o) = obj.as_object_mut() else { return Ok(()) };
    let Some(string_data) = o.remove("stringData") else { return Ok(()) };
    let entries = match string_data {
        Value::Null => return Ok(()),
        Value::Object(m) => m,
        other => return Err(format!("Secret.stringData: expected an object of strings, got {other}")),
    };
    let mut folded = Map::new();
    for (key, value) in entries {
        let Value::String(text) = value else {
            return Err(format!("Secret.stringData[{key:?}]: expected a string, got {value}"));
        };
        // ByteString serializes as standard base64, as `data` is stored.
        let encoded = serde_json::to_value(k8s_openapi::ByteString(text.into_bytes())).map_err(|e| e.to_string())?;
        folded.insert(key, encoded);
    }
    if folded.is_empty() {
        return Ok(());
    }
    let data = o.entry("data").or_insert(json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    if let Some(d) = data.as_object_mut() {
        d.extend(folded);
    }
    Ok(())
}

fn set_label(o: &mut Map<String, Value>, key: &str, value: &str) {
    let meta = o.entry("metadata").or_insert(json!({}));
    if let Some(m) = meta.as_object_mut() {
        let labels = m.entry("labels").or_insert(json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert(key.into(), json!(value));
        }
    }
}

/// Keeps what a write through `sub` may not change: status on the main resource, everything
/// but status (and, for built-ins, labels and annotations) on `/status`.
pub(crate) fn isolate(rt: &ResourceType, sub: Option<&str>, old: &Value, new: &mut Value) {
    match sub {
        Some("status") => {
            let mut out = old.clone();
            match new.get("status") {
                Some(s) => out["status"] = s.clone(),
                None => {
                    if let Some(o) = out.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            if !rt.is_custom() {
                for field in ["labels", "annotations"] {
                    let v = new.pointer(&format!("/metadata/{field}")).cloned();
                    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
                        match v {
                            Some(v) => meta.insert(field.into(), v),
                            None => meta.remove(field),
                        };
                    }
                }
            }
            if let (Some(meta), Some(mf)) =
                (out.get_mut("metadata").and_then(Value::as_object_mut), new.pointer("/metadata/resourceVersion"))
            {
                meta.insert("resourceVersion".into(), mf.clone());
            }
            *new = out;
        }
        _ => {
            if rt.status {
                copy_field(old, new, "status");
            }
            if rt.strategy == Strategy::Namespace {
                copy_field(old, new, "spec");
                let name = old.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
                if let Some(o) = new.as_object_mut() {
                    set_label(o, "kubernetes.io/metadata.name", &name);
                }
            }
        }
    }
}

fn copy_field(from: &Value, to: &mut Value, field: &str) {
    let Some(o) = to.as_object_mut() else { return };
    match from.get(field) {
        Some(v) => o.insert(field.into(), v.clone()),
        None => o.remove(field),
    };
}

/// Whether anything other than metadata (and status, when it is a subresource) changed.
pub(crate) fn spec_changed(rt: &ResourceType, old: &Value, new: &Value) -> bool {
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else { return old != new };
    let skip = |k: &str| k == "metadata" || k == "apiVersion" || k == "kind" || (rt.status && k == "status");
    let differs = o.iter().filter(|(k, _)| !skip(k)).any(|(k, v)| n.get(k) != Some(v));
    differs || n.keys().filter(|k| !skip(k)).any(|k| !o.contains_key(k))
}

/// Field validation the server does for every type (labels) plus per-type checks.
pub(crate) fn validate(rt: &ResourceType, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = vec![];
    if let (Strategy::Custom, Some(schema)) = (rt.strategy, &rt.schema) {
        causes.extend(crate::schema::validate(schema, obj, old));
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let val = v.as_str().unwrap_or("");
            if !label_key_ok(k) {
                causes.push(Cause::invalid(
                    "metadata.labels",
                    &json!(k),
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                ));
            }
            if !v.is_string() || !label_value_ok(val) {
                causes.push(Cause::invalid(
                    "metadata.labels",
                    v,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
        }
    }
    if rt.strategy == Strategy::Service {
        causes.extend(crate::services::validate_service(obj));
    }
    causes
}

fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn label_key_ok(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(dns_subdomain) && !name.is_empty() && label_value_ok(name)
}

/// The status a CRD gets when it is accepted: names accepted and established.
pub(crate) fn crd_status(crd: &Value) -> Value {
    let now = crate::util::now_rfc3339();
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    let mut stored: Vec<Value> =
        crd.pointer("/status/storedVersions").and_then(Value::as_array).cloned().unwrap_or_default();
    for v in storage {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    let cond = |t: &str, reason: &str, msg: &str| json!({"type": t, "status": "True", "lastTransitionTime": now, "reason": reason, "message": msg});
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "storedVersions": stored,
        "conditions": [
            cond("NamesAccepted", "NoConflicts", "no conflicts found"),
            cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
    })
}
