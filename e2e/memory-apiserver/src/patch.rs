//! Strategic merge patch for built-in types.
//!
//! Supports what clients send in practice: maps merge, `null` deletes, lists keyed by a merge
//! key merge by that key (`$patch: delete` removes an item), primitive sets (finalizers) union,
//! `$patch: replace`, `$retainKeys` and `$deleteFromPrimitiveList/<field>`; `$setElementOrder`
//! is accepted and ignored. Other lists are replaced.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::resources::{ListKind, ResourceType, Seg, key_default, list_kind};

/// Applies a strategic merge patch to `doc`.
pub(crate) fn strategic_merge(rt: &ResourceType, doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request("strategic merge patch must be a JSON object"));
    }
    let mut path = vec![];
    merge_map(rt, doc, patch, &mut path)
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

fn without_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), without_directives(v))).collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_directives).collect()),
        other => other.clone(),
    }
}

fn merge_map(rt: &ResourceType, doc: &mut Value, patch: &Value, path: &mut Vec<Seg>) -> Result<(), ApiError> {
    let Some(pm) = patch.as_object() else {
        *doc = patch.clone();
        return Ok(());
    };
    match directive(patch) {
        Some("replace") => {
            *doc = without_directives(patch);
            return Ok(());
        }
        Some("delete") => {
            *doc = Value::Object(Map::new());
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(ApiError::bad_request(format!("unknown patch type: {other}"))),
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Some(keep) = pm.get("$retainKeys").and_then(Value::as_array)
        && let Some(dm) = doc.as_object_mut()
    {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        dm.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(dm), Some(remove)) = (doc.as_object_mut(), pv.as_array())
                && let Some(Value::Array(items)) = dm.get_mut(field)
            {
                items.retain(|i| !remove.contains(i));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let Some(dm) = doc.as_object_mut() else { break };
        if pv.is_null() {
            dm.remove(k);
            continue;
        }
        path.push(Seg::Field(k.clone()));
        match pv {
            Value::Object(_) if directive(pv) == Some("delete") => {
                dm.remove(k);
            }
            Value::Object(_) => {
                let entry = dm.entry(k.clone()).or_insert(Value::Null);
                merge_map(rt, entry, pv, path)?;
            }
            Value::Array(pa) => {
                let kind = list_kind(rt, path);
                let current = dm.remove(k);
                let merged = merge_list(rt, current, pa, kind, path)?;
                dm.insert(k.clone(), merged);
            }
            _ => {
                dm.insert(k.clone(), pv.clone());
            }
        }
        path.pop();
    }
    Ok(())
}

fn merge_list(
    rt: &ResourceType,
    current: Option<Value>,
    patch: &[Value],
    kind: ListKind,
    path: &mut Vec<Seg>,
) -> Result<Value, ApiError> {
    // A `{"$patch": "replace"}` item replaces the whole list with the other items.
    if patch.iter().any(|i| directive(i) == Some("replace")) {
        return Ok(Value::Array(
            patch.iter().filter(|i| directive(i) != Some("replace")).map(without_directives).collect(),
        ));
    }
    let mut items = match current {
        Some(Value::Array(a)) => a,
        _ => vec![],
    };
    match kind {
        ListKind::Map(keys) => {
            let Some(key) = keys.first() else {
                return Ok(Value::Array(patch.iter().map(without_directives).collect()));
            };
            let key_of = |v: &Value| v.get(key.as_str()).cloned().or_else(|| key_default(key));
            path.push(Seg::Item);
            for pi in patch {
                let pk = key_of(pi);
                let pos = items.iter().position(|i| pk.is_some() && key_of(i) == pk);
                match (directive(pi), pos) {
                    (Some("delete"), Some(_)) => items.retain(|i| key_of(i) != pk),
                    (Some("delete"), None) => {}
                    (_, Some(p)) => merge_map(rt, &mut items[p], pi, path)?,
                    (_, None) => items.push(without_directives(pi)),
                }
            }
            path.pop();
            Ok(Value::Array(items))
        }
        ListKind::Set => {
            for v in patch {
                if !items.contains(v) {
                    items.push(v.clone());
                }
            }
            Ok(Value::Array(items))
        }
        ListKind::Atomic => Ok(Value::Array(patch.iter().map(without_directives).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let rt = Registry::with_builtins().get("apps", "v1", "deployments").unwrap();
        let mut doc = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ]}}}});
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
            {"name": "b", "$patch": "delete"}
        ]}}}});
        strategic_merge(&rt, &mut doc, &patch).unwrap();
        let cs = doc.pointer("/spec/template/spec/containers").unwrap().as_array().unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0]["image"], "a:2");
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2);
    }
}
