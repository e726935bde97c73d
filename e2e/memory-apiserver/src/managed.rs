//! Field ownership (`metadata.managedFields`, FieldsV1) and server-side apply.
//!
//! A simplified structured-merge-diff: field sets are trees keyed by FieldsV1 path elements
//! (`f:name`, `k:{...}`, `v:value`). List typing comes from [`crate::resources::list_kind`].

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::resources::{ListKind, ResourceType, Seg, key_default, list_kind};
use crate::util::now_rfc3339;

/// A set of field paths, as a tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSet {
    /// This path itself is in the set (a leaf, or a list item's ".").
    pub member: bool,
    pub children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    pub fn from_fields_v1(v: &Value) -> FieldSet {
        let mut fs = FieldSet::default();
        if let Some(obj) = v.as_object() {
            for (k, child) in obj {
                if k == "." {
                    fs.member = true;
                    continue;
                }
                let mut c = FieldSet::from_fields_v1(child);
                if c.children.is_empty() {
                    c.member = true;
                }
                fs.children.insert(k.clone(), c);
            }
        }
        fs
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (k, c) in &self.children {
            m.insert(k.clone(), c.to_fields_v1());
        }
        Value::Object(m)
    }

    pub fn union(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (k, c) in &other.children {
            self.children.entry(k.clone()).or_default().union(c);
        }
    }

    pub fn subtract(&mut self, other: &FieldSet) {
        if other.member {
            self.member = false;
        }
        for (k, oc) in &other.children {
            if let Some(sc) = self.children.get_mut(k) {
                sc.subtract(oc);
                if sc.is_empty() {
                    self.children.remove(k);
                }
            }
        }
    }

    /// Paths that are members of both sets, rendered for conflict messages.
    pub fn intersection_paths(&self, other: &FieldSet) -> Vec<String> {
        let mut out = vec![];
        intersect(self, other, String::new(), &mut out);
        out
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet { member: self.member && other.member, children: BTreeMap::new() };
        for (k, c) in &self.children {
            if let Some(oc) = other.children.get(k) {
                let i = c.intersection(oc);
                if !i.is_empty() {
                    out.children.insert(k.clone(), i);
                }
            }
        }
        out
    }

    fn child(&mut self, key: String) -> &mut FieldSet {
        self.children.entry(key).or_default()
    }
}

fn intersect(a: &FieldSet, b: &FieldSet, path: String, out: &mut Vec<String>) {
    if a.member && b.member {
        out.push(if path.is_empty() { ".".into() } else { path.clone() });
    }
    for (k, ac) in &a.children {
        if let Some(bc) = b.children.get(k) {
            intersect(ac, bc, format!("{path}{}", render_element(k)), out);
        }
    }
}

/// `f:spec` -> `.spec`, `k:{"type":"Ready"}` -> `[type="Ready"]`, `v:"x"` -> `[="x"]`.
fn render_element(k: &str) -> String {
    if let Some(f) = k.strip_prefix("f:") {
        return format!(".{f}");
    }
    if let Some(key) = k.strip_prefix("k:")
        && let Ok(Value::Object(m)) = serde_json::from_str::<Value>(key)
    {
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        return format!("[{}]", parts.join(","));
    }
    if let Some(v) = k.strip_prefix("v:") {
        return format!("[={v}]");
    }
    format!("[{k}]")
}

/// The key element (`k:{...}`) of a list-map item.
fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        let v = item.get(k).cloned().or_else(|| key_default(k)).unwrap_or(Value::Null);
        m.insert(k.clone(), v);
    }
    // serde_json sorts object keys unless preserve_order is on; sort explicitly either way.
    let mut sorted: Vec<(String, Value)> = m.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let body: Vec<String> = sorted.iter().map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v)).collect();
    format!("k:{{{}}}", body.join(","))
}

fn value_key(v: &Value) -> String {
    format!("v:{v}")
}

/// Drops what field ownership never covers: type meta and server-owned metadata.
pub(crate) fn strip_for_fields(v: &Value) -> Value {
    let mut out = Map::new();
    if let Some(obj) = v.as_object() {
        for (k, val) in obj {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    let mut meta = Map::new();
                    if let Some(m) = val.as_object() {
                        for key in ["labels", "annotations", "finalizers", "ownerReferences"] {
                            if let Some(x) = m.get(key) {
                                meta.insert(key.into(), x.clone());
                            }
                        }
                    }
                    if !meta.is_empty() {
                        out.insert(k.clone(), Value::Object(meta));
                    }
                }
                _ => {
                    out.insert(k.clone(), val.clone());
                }
            }
        }
    }
    Value::Object(out)
}

/// Every leaf (and list item) path in `v`.
pub(crate) fn fieldset_of(rt: &ResourceType, v: &Value) -> FieldSet {
    let mut fs = FieldSet::default();
    if is_granular_obj(v) {
        let mut path = vec![];
        collect(rt, v, &mut path, &mut fs);
    }
    fs
}

fn collect(rt: &ResourceType, v: &Value, path: &mut Vec<Seg>, fs: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(Seg::Field(k.clone()));
                let node = fs.child(format!("f:{k}"));
                collect_field(rt, child, path, node);
                path.pop();
            }
        }
        _ => fs.member = true,
    }
}

/// `node` is the set node for the field at `path` holding `v`.
fn collect_field(rt: &ResourceType, v: &Value, path: &mut Vec<Seg>, node: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => collect(rt, v, path, node),
        Value::Array(items) if !items.is_empty() => match list_kind(rt, path) {
            ListKind::Map(keys) => {
                path.push(Seg::Item);
                for item in items {
                    let c = node.child(item_key(item, &keys));
                    c.member = true;
                    collect(rt, item, path, c);
                    c.member = true;
                }
                path.pop();
            }
            ListKind::Set => {
                for item in items {
                    node.child(value_key(item)).member = true;
                }
            }
            ListKind::Atomic => node.member = true,
        },
        _ => node.member = true,
    }
}

/// Paths added or changed, and paths removed, going from `old` to `new`.
pub(crate) fn diff(rt: &ResourceType, old: &Value, new: &Value) -> (FieldSet, FieldSet) {
    let mut changed = FieldSet::default();
    let mut removed = FieldSet::default();
    let mut path = vec![];
    diff_obj(rt, old, new, &mut path, &mut changed, &mut removed);
    (changed, removed)
}

fn diff_obj(rt: &ResourceType, old: &Value, new: &Value, path: &mut Vec<Seg>, ch: &mut FieldSet, rm: &mut FieldSet) {
    let empty = Map::new();
    let om = old.as_object().unwrap_or(&empty);
    let nm = new.as_object().unwrap_or(&empty);
    for (k, nv) in nm {
        path.push(Seg::Field(k.clone()));
        let key = format!("f:{k}");
        match om.get(k) {
            None => {
                let mut c = FieldSet::default();
                collect_field(rt, nv, path, &mut c);
                ch.child(key).union(&c);
            }
            Some(ov) => {
                let mut c = FieldSet::default();
                let mut r = FieldSet::default();
                diff_field(rt, ov, nv, path, &mut c, &mut r);
                if !c.is_empty() {
                    ch.child(key.clone()).union(&c);
                }
                if !r.is_empty() {
                    rm.child(key).union(&r);
                }
            }
        }
        path.pop();
    }
    for (k, ov) in om {
        if !nm.contains_key(k) {
            path.push(Seg::Field(k.clone()));
            let mut r = FieldSet::default();
            collect_field(rt, ov, path, &mut r);
            rm.child(format!("f:{k}")).union(&r);
            path.pop();
        }
    }
}

fn is_granular_obj(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty())
}

fn diff_field(rt: &ResourceType, ov: &Value, nv: &Value, path: &mut Vec<Seg>, ch: &mut FieldSet, rm: &mut FieldSet) {
    if ov == nv {
        return;
    }
    if is_granular_obj(ov) && is_granular_obj(nv) {
        diff_obj(rt, ov, nv, path, ch, rm);
        return;
    }
    if let (Value::Array(oa), Value::Array(na)) = (ov, nv) {
        match list_kind(rt, path) {
            ListKind::Map(keys) => {
                path.push(Seg::Item);
                let old_items: BTreeMap<String, &Value> = oa.iter().map(|i| (item_key(i, &keys), i)).collect();
                let new_items: BTreeMap<String, &Value> = na.iter().map(|i| (item_key(i, &keys), i)).collect();
                for (k, ni) in &new_items {
                    match old_items.get(k) {
                        None => {
                            let c = ch.child(k.clone());
                            collect(rt, ni, path, c);
                            c.member = true;
                        }
                        Some(oi) => {
                            let mut c = FieldSet::default();
                            let mut r = FieldSet::default();
                            diff_obj(rt, oi, ni, path, &mut c, &mut r);
                            if !c.is_empty() {
                                ch.child(k.clone()).union(&c);
                            }
                            if !r.is_empty() {
                                rm.child(k.clone()).union(&r);
                            }
                        }
                    }
                }
                for (k, oi) in &old_items {
                    if !new_items.contains_key(k) {
                        let r = rm.child(k.clone());
                        collect(rt, oi, path, r);
                        r.member = true;
                    }
                }
                path.pop();
                return;
            }
            ListKind::Set => {
                for v in na.iter().filter(|v| !oa.contains(v)) {
                    ch.child(value_key(v)).member = true;
                }
                for v in oa.iter().filter(|v| !na.contains(v)) {
                    rm.child(value_key(v)).member = true;
                }
                return;
            }
            ListKind::Atomic => {}
        }
    }
    // Scalars, atomic lists, or a change of shape: the old leaves go, the new ones come.
    let mut r = FieldSet::default();
    collect_field(rt, ov, path, &mut r);
    let mut c = FieldSet::default();
    collect_field(rt, nv, path, &mut c);
    ch.union(&c);
    if r != c {
        let mut only_old = r;
        only_old.subtract(&c);
        rm.union(&only_old);
    }
}

/// Merges an apply configuration into the live object (maps recurse, list-maps merge by key,
/// sets union, everything else is replaced).
pub(crate) fn apply_merge(rt: &ResourceType, live: &Value, cfg: &Value) -> Value {
    let mut path = vec![];
    merge_value(rt, live, cfg, &mut path)
}

fn merge_value(rt: &ResourceType, live: &Value, cfg: &Value, path: &mut Vec<Seg>) -> Value {
    match (live, cfg) {
        (Value::Object(lm), Value::Object(cm)) => {
            let mut out = lm.clone();
            for (k, cv) in cm {
                path.push(Seg::Field(k.clone()));
                let merged = match lm.get(k) {
                    Some(lv) => merge_value(rt, lv, cv, path),
                    None => cv.clone(),
                };
                out.insert(k.clone(), merged);
                path.pop();
            }
            Value::Object(out)
        }
        (Value::Array(la), Value::Array(ca)) => match list_kind(rt, path) {
            ListKind::Map(keys) => {
                path.push(Seg::Item);
                let mut out: Vec<Value> = la.clone();
                for ci in ca {
                    let ck = item_key(ci, &keys);
                    match out.iter().position(|li| item_key(li, &keys) == ck) {
                        Some(pos) => out[pos] = merge_value(rt, &out[pos], ci, path),
                        None => out.push(ci.clone()),
                    }
                }
                path.pop();
                Value::Array(out)
            }
            ListKind::Set => {
                let mut out = la.clone();
                for v in ca {
                    if !out.contains(v) {
                        out.push(v.clone());
                    }
                }
                Value::Array(out)
            }
            ListKind::Atomic => cfg.clone(),
        },
        _ => cfg.clone(),
    }
}

/// Removes every path in `set` from `v` (fields, list-map items, set values).
pub(crate) fn remove_paths(rt: &ResourceType, v: &mut Value, set: &FieldSet) {
    let mut path = vec![];
    remove_in(rt, v, set, &mut path);
}

fn remove_in(rt: &ResourceType, v: &mut Value, set: &FieldSet, path: &mut Vec<Seg>) {
    let Value::Object(m) = v else { return };
    for (k, child) in &set.children {
        let Some(field) = k.strip_prefix("f:") else { continue };
        if child.member {
            m.remove(field);
            continue;
        }
        let Some(fv) = m.get_mut(field) else { continue };
        path.push(Seg::Field(field.to_string()));
        match fv {
            Value::Object(_) => {
                remove_in(rt, fv, child, path);
                // A map emptied by the removal goes too, as kube-apiserver's structured-merge-diff
                // does: `{}` left behind would fail a schema that requires its fields.
                if fv.as_object().is_some_and(Map::is_empty) {
                    m.remove(field);
                }
            }
            Value::Array(items) => match list_kind(rt, path) {
                ListKind::Map(keys) => {
                    path.push(Seg::Item);
                    items.retain_mut(|item| {
                        let ik = item_key(item, &keys);
                        match child.children.get(&ik) {
                            Some(c) if c.member => false,
                            Some(c) => {
                                remove_in(rt, item, c, path);
                                true
                            }
                            None => true,
                        }
                    });
                    path.pop();
                }
                ListKind::Set => items.retain(|item| !child.children.get(&value_key(item)).is_some_and(|c| c.member)),
                ListKind::Atomic => {}
            },
            _ => {}
        }
        path.pop();
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub set: FieldSet,
}

impl Entry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

/// Entries from a stored object's serialized `managedFields`.
pub(crate) fn parse_entries(json: Option<&str>) -> Vec<Entry> {
    match json.and_then(|j| serde_json::from_str::<Value>(j).ok()) {
        Some(list) => entries_from(&list),
        None => vec![],
    }
}

fn entries_from(list: &Value) -> Vec<Entry> {
    let Some(list) = list.as_array() else { return vec![] };
    list.iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            Entry {
                manager: s("manager"),
                operation: s("operation"),
                api_version: s("apiVersion"),
                time: s("time"),
                subresource: s("subresource"),
                set: e.get("fieldsV1").map(FieldSet::from_fields_v1).unwrap_or_default(),
            }
        })
        .collect()
}

pub(crate) fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.set.is_empty())
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), Value::String(e.manager.clone()));
            m.insert("operation".into(), Value::String(e.operation.clone()));
            m.insert("apiVersion".into(), Value::String(e.api_version.clone()));
            m.insert("time".into(), Value::String(e.time.clone()));
            m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
            m.insert("fieldsV1".into(), e.set.to_fields_v1());
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), Value::String(e.subresource.clone()));
            }
            Value::Object(m)
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Who is writing, for ownership bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: String,
    pub subresource: &'a str,
}

/// Records a non-apply write (create, update, patch): the writer takes what it changed.
pub(crate) fn record_update(
    rt: &ResourceType,
    old: Option<&Value>,
    mut entries: Vec<Entry>,
    new: &mut Value,
    w: &Writer,
) {
    let empty = Value::Object(Map::new());
    let (changed, removed) = diff(rt, &strip_for_fields(old.unwrap_or(&empty)), &strip_for_fields(new));
    if changed.is_empty() && removed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    let mut touched = changed.clone();
    touched.union(&removed);
    for e in entries.iter_mut().filter(|e| !e.same_owner(w.manager, "Update", w.subresource)) {
        e.set.subtract(&touched);
    }
    let now = now_rfc3339();
    match entries.iter_mut().find(|e| e.same_owner(w.manager, "Update", w.subresource)) {
        Some(e) => {
            e.set.union(&changed);
            e.set.subtract(&removed);
            e.time = now;
            e.api_version = w.api_version.clone();
        }
        None => {
            let mut set = changed;
            set.subtract(&removed);
            entries.push(Entry {
                manager: w.manager.into(),
                operation: "Update".into(),
                api_version: w.api_version.clone(),
                time: now,
                subresource: w.subresource.into(),
                set,
            });
        }
    }
    entries.retain(|e| !e.set.is_empty());
    write_entries(new, &entries);
}

/// The applied configuration's own field set (what the applier will own).
pub(crate) fn applied_set(rt: &ResourceType, cfg: &Value) -> FieldSet {
    fieldset_of(rt, &strip_for_fields(cfg))
}

/// Merges an apply configuration: the result, before conflict checks.
/// Fields the applier owned before, no longer applies, and nobody else owns are removed.
pub(crate) fn apply(rt: &ResourceType, live: &Value, entries: &[Entry], cfg: &Value, w: &Writer) -> Value {
    let mut merged = apply_merge(rt, live, cfg);
    if let Some(prev) = entries.iter().find(|e| e.same_owner(w.manager, "Apply", w.subresource)) {
        let mut drop = prev.set.clone();
        drop.subtract(&applied_set(rt, cfg));
        for e in entries.iter().filter(|e| !e.same_owner(w.manager, "Apply", w.subresource)) {
            drop.subtract(&e.set);
        }
        if !drop.is_empty() {
            remove_paths(rt, &mut merged, &drop);
        }
    }
    merged
}

/// Records an apply: conflicts (manager, path) unless forced; the applier owns what it applied.
pub(crate) fn record_apply(
    rt: &ResourceType,
    old: Option<&Value>,
    mut entries: Vec<Entry>,
    new: &mut Value,
    w: &Writer,
    applied: FieldSet,
    force: bool,
) -> Result<(), Vec<(String, String)>> {
    let empty = Value::Object(Map::new());
    let (changed, _removed) = diff(rt, &strip_for_fields(old.unwrap_or(&empty)), &strip_for_fields(new));
    let contested = changed.intersection(&applied);
    let mut conflicts = vec![];
    for e in entries.iter().filter(|e| !e.same_owner(w.manager, "Apply", w.subresource)) {
        for p in e.set.intersection_paths(&contested) {
            conflicts.push((e.manager.clone(), p));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for e in entries.iter_mut().filter(|e| !e.same_owner(w.manager, "Apply", w.subresource)) {
        e.set.subtract(&contested);
    }
    match entries.iter_mut().find(|e| e.same_owner(w.manager, "Apply", w.subresource)) {
        Some(e) => {
            if e.set != applied {
                e.set = applied;
                e.time = now_rfc3339();
            }
            e.api_version = w.api_version.clone();
        }
        None => entries.push(Entry {
            manager: w.manager.into(),
            operation: "Apply".into(),
            api_version: w.api_version.clone(),
            time: now_rfc3339(),
            subresource: w.subresource.into(),
            set: applied,
        }),
    }
    entries.retain(|e| !e.set.is_empty());
    write_entries(new, &entries);
    Ok(())
}

/// The field manager a write is attributed to when the client names none.
pub fn default_manager(user_agent: &str) -> String {
    let prefix = user_agent.split('/').next().unwrap_or("").trim();
    if prefix.is_empty() { "unknown".into() } else { prefix.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    fn node_type() -> std::sync::Arc<ResourceType> {
        Registry::with_builtins().get("", "v1", "nodes").unwrap()
    }

    #[test]
    fn fields_v1_round_trips_with_list_map_items() {
        let rt = node_type();
        let v = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}, "metadata": {"labels": {"a": "b"}}});
        let fs = fieldset_of(&rt, &v);
        let f = fs.to_fields_v1();
        assert_eq!(
            f,
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
        );
        assert_eq!(FieldSet::from_fields_v1(&f), fs);
    }

    #[test]
    fn a_map_whose_applied_fields_are_all_dropped_goes_with_them() {
        let rt = node_type();
        let w = Writer { manager: "op", subresource: "", api_version: "v1".into() };
        let first = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"podCIDR": "10.0.0.0/24"}});
        let mut stored = apply(&rt, &json!({}), &[], &first, &w);
        record_apply(&rt, None, vec![], &mut stored, &w, applied_set(&rt, &first), false).unwrap();
        let entries = entries_from(&stored["metadata"]["managedFields"]);
        // The next apply leaves out every label: the emptied map is not kept as `{}`.
        let next = json!({"spec": {"podCIDR": "10.0.0.0/24"}});
        let merged = apply(&rt, &stored, &entries, &next, &w);
        assert!(merged["metadata"].get("labels").is_none(), "{merged}");
        assert_eq!(merged["spec"]["podCIDR"], "10.0.0.0/24");
    }

    #[test]
    fn list_map_merge_keeps_items_from_both_sides() {
        let rt = node_type();
        let live = json!({"status": {"conditions": [{"type": "A", "status": "True"}]}});
        let cfg = json!({"status": {"conditions": [{"type": "B", "status": "False"}]}});
        let merged = apply_merge(&rt, &live, &cfg);
        assert_eq!(merged["status"]["conditions"].as_array().unwrap().len(), 2);
    }
}
