//! In-memory storage: objects with their serialized bytes, one global resource version, and a
//! bounded event history per resource for watch resume (older versions answer 410 Gone).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;

use crate::resources::{Registry, ResourceType, Strategy};
use crate::services::Allocator;

/// A stored object: the full object serialized, and its JSON value without
/// `metadata.managedFields`, which stay serialized (as a `Value` tree of many one-entry maps
/// they would cost several times the object's size).
#[derive(Debug)]
pub(crate) struct Obj {
    pub value: Value,
    pub managed: Option<Box<str>>,
    pub bytes: Bytes,
    pub rv: u64,
    pub api_version: Box<str>,
    /// Labels, sorted, for selector matching without walking the value.
    pub labels: Box<[(Box<str>, Box<str>)]>,
}

impl Obj {
    /// Wraps a full object (with managedFields, if any).
    pub fn new(mut value: Value, rv: u64) -> Arc<Obj> {
        // Serializing a serde_json::Value cannot fail (keys are strings).
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        let managed = value
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .and_then(|m| m.remove("managedFields"))
            .map(|mf| serde_json::to_string(&mf).unwrap_or_default().into_boxed_str());
        let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default().into();
        let labels = value
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|l| {
                let mut v: Vec<(Box<str>, Box<str>)> =
                    l.iter().map(|(k, v)| (k.as_str().into(), v.as_str().unwrap_or_default().into())).collect();
                v.sort();
                v.into_boxed_slice()
            })
            .unwrap_or_default();
        Arc::new(Obj { value, managed, bytes, rv, api_version, labels })
    }

    /// The full object, managedFields included.
    pub fn full(&self) -> Value {
        let mut v = self.value.clone();
        if let Some(mf) = self.managed.as_deref().and_then(|m| serde_json::from_str::<Value>(m).ok())
            && let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.insert("managedFields".into(), mf);
        }
        v
    }

    /// The value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*self.labels[i].1)
    }
}

pub(crate) fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// Kinds of watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvType {
    Added,
    Modified,
    Deleted,
}

impl EvType {
    pub fn as_str(self) -> &'static str {
        match self {
            EvType::Added => "ADDED",
            EvType::Modified => "MODIFIED",
            EvType::Deleted => "DELETED",
        }
    }
}

/// One change, kept in the history ring.
#[derive(Debug)]
pub(crate) struct Ev {
    pub rv: u64,
    pub ty: EvType,
    pub obj: Arc<Obj>,
    pub prev: Option<Arc<Obj>>,
}

/// Objects of one resource and its recent events.
pub(crate) struct Store {
    pub rt: Arc<ResourceType>,
    pub objects: BTreeMap<String, Arc<Obj>>,
    pub history: VecDeque<Arc<Ev>>,
    /// Events at or below this version are gone from history.
    pub compacted: u64,
    /// Version of the newest event recorded.
    pub head: u64,
    /// Version of the newest event dropped from history (a watcher behind it missed events).
    pub lost: u64,
    pub notify: watch::Sender<u64>,
}

impl Store {
    fn new(rt: Arc<ResourceType>, rv: u64) -> Self {
        let (notify, _) = watch::channel(rv);
        Store { rt, objects: BTreeMap::new(), history: VecDeque::new(), compacted: 0, head: 0, lost: 0, notify }
    }

    /// Events newer than `rv`, or `None` when history no longer reaches back that far.
    /// `strict` (new watches) fails for any version below the compaction point, as etcd does;
    /// established watches only fail when they really missed an event.
    pub fn events_after(&self, rv: u64, strict: bool) -> Option<Vec<Arc<Ev>>> {
        if (strict && rv < self.compacted) || rv < self.lost {
            return None;
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        Some(self.history.range(start..).cloned().collect())
    }
}

/// Where an object lives.
pub(crate) type ObjRef = (Arc<str>, String);

/// The storage key: `ns/name` for namespaced objects, `name` otherwise.
pub(crate) fn key(ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// Everything the server holds; guarded by one mutex.
pub(crate) struct State {
    pub rv: u64,
    pub registry: Registry,
    pub stores: HashMap<Arc<str>, Store>,
    /// uid -> where the object is.
    pub uids: HashMap<String, ObjRef>,
    /// owner uid -> dependents.
    pub dependents: HashMap<String, BTreeSet<ObjRef>>,
    pub alloc: Allocator,
    pub history_size: usize,
    /// Garbage collector work: owners that went away, objects to re-check.
    pub gc_owners: Vec<String>,
    pub gc_objects: BTreeSet<ObjRef>,
}

impl State {
    pub fn new(registry: Registry, alloc: Allocator, history_size: usize) -> Self {
        let mut st = State {
            rv: 1,
            registry,
            stores: HashMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            alloc,
            history_size: history_size.max(1),
            gc_owners: vec![],
            gc_objects: BTreeSet::new(),
        };
        let stores: Vec<Arc<str>> = st.registry.all().map(|rt| rt.store.clone()).collect();
        for s in stores {
            st.ensure_store(&s);
        }
        st
    }

    /// Creates the store for a (new) resource if needed.
    pub fn ensure_store(&mut self, store: &Arc<str>) {
        if self.stores.contains_key(store) {
            return;
        }
        if let Some(rt) = self.registry.storage_type(store) {
            self.stores.insert(store.clone(), Store::new(rt, self.rv));
        }
    }

    pub fn get(&self, store: &str, key: &str) -> Option<Arc<Obj>> {
        self.stores.get(store).and_then(|s| s.objects.get(key)).cloned()
    }

    /// Stores `value` under a new resource version and records the event.
    pub fn put(&mut self, store: &Arc<str>, key: String, mut value: Value) -> Arc<Obj> {
        self.rv += 1;
        let rv = self.rv;
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let obj = Obj::new(value, rv);
        let Some(s) = self.stores.get_mut(store) else { return obj };
        let prev = s.objects.insert(key.clone(), obj.clone());
        let ty = if prev.is_some() { EvType::Modified } else { EvType::Added };
        self.index(store, &key, prev.as_deref(), Some(&obj));
        self.record(store, Arc::new(Ev { rv, ty, obj: obj.clone(), prev }));
        obj
    }

    /// Removes an object for good and records the DELETED event (with a new resource version).
    pub fn remove(&mut self, store: &Arc<str>, key: &str) -> Option<Arc<Obj>> {
        let old = self.stores.get_mut(store)?.objects.remove(key)?;
        self.rv += 1;
        let rv = self.rv;
        let mut value = old.full();
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let obj = Obj::new(value, rv);
        self.index(store, key, Some(&old), None);
        if self.stores.get(store).is_some_and(|s| s.rt.strategy == Strategy::Service) {
            self.alloc.release(&old.value);
        }
        self.record(store, Arc::new(Ev { rv, ty: EvType::Deleted, obj: obj.clone(), prev: Some(old) }));
        Some(obj)
    }

    fn record(&mut self, store: &Arc<str>, ev: Arc<Ev>) {
        let cap = self.history_size;
        if let Some(s) = self.stores.get_mut(store) {
            let rv = ev.rv;
            s.head = rv;
            s.history.push_back(ev);
            while s.history.len() > cap {
                if let Some(old) = s.history.pop_front() {
                    s.compacted = old.rv;
                    s.lost = old.rv;
                }
            }
            s.notify.send_replace(rv);
        }
    }

    /// Keeps the uid and owner indexes in step with a write.
    fn index(&mut self, store: &Arc<str>, key: &str, old: Option<&Obj>, new: Option<&Obj>) {
        let r: ObjRef = (store.clone(), key.to_string());
        if let Some(old) = old {
            for owner in owner_uids(&old.value) {
                if let Some(set) = self.dependents.get_mut(&owner) {
                    set.remove(&r);
                    if set.is_empty() {
                        self.dependents.remove(&owner);
                    }
                }
            }
            if new.is_none() {
                if let Some(uid) = meta_str(&old.value, "uid") {
                    self.uids.remove(uid);
                    self.gc_owners.push(uid.to_string());
                }
                // Owners waiting in foreground deletion, and terminating namespaces, re-check.
                for owner in owner_uids(&old.value) {
                    if let Some(r) = self.uids.get(&owner).cloned() {
                        self.gc_objects.insert(r);
                    }
                }
                if let Some(ns) = meta_str(&old.value, "namespace")
                    && self.namespace_state(ns).1
                {
                    self.gc_objects.insert((Arc::from("/namespaces"), ns.to_string()));
                }
            }
        }
        if let Some(new) = new {
            if let Some(uid) = meta_str(&new.value, "uid") {
                self.uids.insert(uid.to_string(), r.clone());
            }
            let owners = owner_uids(&new.value);
            let mut dangling = false;
            for owner in owners {
                dangling |= !self.uids.contains_key(&owner);
                self.dependents.entry(owner).or_default().insert(r.clone());
            }
            let deleting = new.value.pointer("/metadata/deletionTimestamp").is_some();
            if dangling || deleting {
                self.gc_objects.insert(r);
            }
        }
    }

    /// Drops all event history (as an etcd compaction would), forcing 410 on older versions.
    pub fn compact(&mut self) {
        // Compact past the current version so every version a client holds is too old.
        self.rv += 1;
        let rv = self.rv;
        for s in self.stores.values_mut() {
            s.history.clear();
            s.lost = s.head;
            s.compacted = rv;
        }
    }

    /// Whether a namespace exists and is not terminating: (exists, terminating).
    pub fn namespace_state(&self, ns: &str) -> (bool, bool) {
        match self.get("/namespaces", ns) {
            Some(o) => (true, o.value.pointer("/metadata/deletionTimestamp").is_some()),
            None => (false, false),
        }
    }

    pub fn object_count(&self) -> usize {
        self.stores.values().map(|s| s.objects.len()).sum()
    }
}

pub(crate) fn owner_uids(v: &Value) -> Vec<String> {
    v.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| refs.iter().filter_map(|r| r.get("uid").and_then(Value::as_str)).map(String::from).collect())
        .unwrap_or_default()
}
