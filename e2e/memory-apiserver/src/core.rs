//! The API semantics: create, get, list, update, patch, apply, delete, deletecollection,
//! finalizers and garbage collection, over the in-memory [`State`].

use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, watch};

use crate::convert::{from_view, needs_conversion, to_view};
use crate::error::{ApiError, Cause};
use crate::faults::{FaultConfig, FaultTarget};
use crate::managed::{self, Writer};
use crate::request_log::{LogData, LogSource, RequestRecord};
use crate::resources::{ResourceType, Strategy, crd_name};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Obj, State, key, meta_str, owner_uids};
use crate::strategy;
use crate::util::{hex_decode, hex_encode, now_rfc3339, random_suffix};

/// Server options fixed at start.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub bookmark_interval: Duration,
    pub request_log_capacity: usize,
}

/// Shared server internals.
pub(crate) struct Core {
    pub state: Mutex<State>,
    pub opts: Options,
    pub faults: Mutex<FaultConfig>,
    pub log: Mutex<LogData>,
    /// Bumped to end every open watch.
    pub watch_close: watch::Sender<u64>,
    pub gc_wake: Notify,
    pub open_watches: AtomicUsize,
    pub runtime: tokio::runtime::Handle,
    pub close_every: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// `host:port` the server listens on (discovery reports it).
    pub addr: String,
}

/// How a write is attributed in `managedFields`.
pub(crate) enum Ownership<'a> {
    Update(Writer<'a>),
    Apply { writer: Writer<'a>, applied: managed::FieldSet, force: bool },
}

/// What to render objects as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Full,
    Metadata,
}

/// Options of a delete.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOpts {
    pub grace: Option<i64>,
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

/// Parameters of a list.
#[derive(Debug, Default)]
pub(crate) struct ListOpts {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub version_match: Option<String>,
}

/// Patch flavours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

/// Serializes an object as seen through `rt`.
pub(crate) fn render(rt: &ResourceType, obj: &Obj, shape: Shape) -> Bytes {
    match shape {
        Shape::Metadata => {
            let v = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.value.get("metadata").cloned().unwrap_or(json!({})),
            });
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
        Shape::Full if needs_conversion(rt, &obj.api_version) => {
            Bytes::from(serde_json::to_vec(&to_view(rt, &obj.full())).unwrap_or_default())
        }
        Shape::Full => obj.bytes.clone(),
    }
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    // Just ensured it is an object.
    match v.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just set to an object"),
    }
}

fn finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|f| f.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn set_finalizers(v: &mut Value, f: &[String]) {
    let m = meta_mut(v);
    if f.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(f));
    }
}

fn is_deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

/// Namespace deletion waits on `spec.finalizers` as well as metadata finalizers.
fn blocking_finalizers(rt: &ResourceType, v: &Value) -> bool {
    !finalizers(v).is_empty()
        || (rt.strategy == Strategy::Namespace
            && v.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty()))
}

impl Core {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in this crate; keep serving anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn resolve_ns<'a>(rt: &ResourceType, ns: Option<&'a str>) -> Option<&'a str> {
        if rt.namespaced { ns } else { None }
    }

    // ---- reads ----

    pub fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> Result<Arc<Obj>, ApiError> {
        let st = self.lock();
        st.get(&rt.store, &key(Self::resolve_ns(rt, ns), name)).ok_or_else(|| ApiError::not_found(&rt.target(), name))
    }

    /// Lists matching objects; returns the full list body.
    pub fn list(&self, rt: &ResourceType, ns: Option<&str>, opts: &ListOpts, shape: Shape) -> Result<Bytes, ApiError> {
        let (items, rv, cont, remaining) = self.list_objects(rt, ns, opts)?;
        let (kind, api_version) = match shape {
            Shape::Full => (rt.list_kind(), rt.api_version().to_string()),
            Shape::Metadata => ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1".to_string()),
        };
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(c) = cont {
            meta["continue"] = json!(c);
            if let Some(r) = remaining {
                meta["remainingItemCount"] = json!(r);
            }
        }
        let head = format!(
            "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
            Value::String(kind),
            Value::String(api_version),
            meta
        );
        let rendered: Vec<Bytes> = items.iter().map(|o| render(rt, o, shape)).collect();
        let size = head.len() + rendered.iter().map(|b| b.len() + 1).sum::<usize>() + 2;
        let mut buf = BytesMut::with_capacity(size);
        buf.put_slice(head.as_bytes());
        for (i, b) in rendered.iter().enumerate() {
            if i > 0 {
                buf.put_u8(b',');
            }
            buf.put_slice(b);
        }
        buf.put_slice(b"]}");
        Ok(buf.freeze())
    }

    /// The objects of a list, the list's resource version, continue token and remaining count.
    #[allow(clippy::type_complexity)]
    pub fn list_objects(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        opts: &ListOpts,
    ) -> Result<(Vec<Arc<Obj>>, u64, Option<String>, Option<u64>), ApiError> {
        let ns = Self::resolve_ns(rt, ns);
        let (mut list_rv, start_after) = match &opts.continue_token {
            Some(tok) if !tok.is_empty() => decode_continue(tok)?,
            _ => (0, None),
        };
        let st = self.lock();
        let store = st.stores.get(&rt.store).ok_or_else(ApiError::not_found_path)?;
        if list_rv == 0 {
            list_rv = st.rv;
            if let Some(rv) = opts.resource_version.as_deref().filter(|r| !r.is_empty() && *r != "0") {
                let want: u64 =
                    rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
                if want > st.rv {
                    return Err(ApiError::timeout(format!("Too large resource version: {want}, current: {}", st.rv)));
                }
                if opts.version_match.as_deref() == Some("Exact") && want != st.rv {
                    // Only the current state is kept; older snapshots are "compacted".
                    return Err(ApiError::gone(format!("too old resource version: {want} ({})", st.rv)));
                }
            }
        }
        let prefix = ns.map(|n| format!("{n}/"));
        let lower = match (&start_after, &prefix) {
            (Some(s), _) => std::ops::Bound::Excluded(s.clone()),
            (None, Some(p)) => std::ops::Bound::Included(p.clone()),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let upper = match &prefix {
            Some(_) => std::ops::Bound::Excluded(format!("{}0", ns.unwrap_or_default())),
            None => std::ops::Bound::Unbounded,
        };
        let unfiltered = opts.labels.is_empty() && opts.fields.is_empty();
        let matches = |o: &Obj| opts.labels.matches_with(|k| o.label(k)) && opts.fields.matches(&o.value);
        let limit = opts.limit.filter(|l| *l > 0);
        let mut items = vec![];
        let mut last_key: Option<String> = None;
        let mut more = false;
        let mut remaining: u64 = 0;
        if let Some(name) = opts.fields.pinned_name() {
            // Fast path for `metadata.name=` (kubectl wait/delete, controllers watching one object).
            let candidates: Vec<(String, Arc<Obj>)> = match ns {
                Some(n) => store
                    .objects
                    .get(&key(Some(n), name))
                    .map(|o| (key(Some(n), name), o.clone()))
                    .into_iter()
                    .collect(),
                None if rt.namespaced => store
                    .objects
                    .iter()
                    .filter(|(_, o)| meta_str(&o.value, "name") == Some(name))
                    .map(|(k, o)| (k.clone(), o.clone()))
                    .collect(),
                None => store.objects.get(name).map(|o| (name.to_string(), o.clone())).into_iter().collect(),
            };
            for (k, o) in candidates {
                if start_after.as_ref().is_none_or(|s| &k > s) && matches(&o) {
                    items.push(o);
                }
            }
        } else {
            let mut iter = store.objects.range((lower, upper));
            for (k, o) in iter.by_ref() {
                if !unfiltered && !matches(o) {
                    continue;
                }
                if let Some(l) = limit
                    && items.len() >= l
                {
                    more = true;
                    break;
                }
                items.push(o.clone());
                last_key = Some(k.clone());
            }
            if more && unfiltered {
                // The object that did not fit plus the rest.
                remaining = 1 + iter.count() as u64;
            }
        }
        drop(st);
        let cont = if more { last_key.map(|k| encode_continue(list_rv, &k)) } else { None };
        let remaining = (more && unfiltered).then_some(remaining);
        Ok((items, list_rv, cont, remaining))
    }

    // ---- writes ----

    /// Creates an object (POST). Returns it as seen through `rt`.
    pub fn create(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        body: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Bytes, ApiError> {
        let mut st = self.lock();
        let writer = Writer { manager, api_version: rt.api_version().to_string(), subresource: "" };
        let obj = self.create_in(&mut st, rt, ns, body, Ownership::Update(writer), dry_run)?;
        drop(st);
        self.gc_wake.notify_one();
        Ok(render(rt, &obj, Shape::Full))
    }

    fn check_type_meta(rt: &ResourceType, body: &Value) -> Result<(), ApiError> {
        if let Some(k) = body.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind of the provided object ({k}) does not match the kind of the resource ({})",
                rt.kind
            )));
        }
        if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
            && !av.is_empty()
            && av != rt.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
        Ok(())
    }

    /// Create under the lock; `body` is in `rt`'s view. Returns the stored value.
    fn create_in(
        &self,
        st: &mut State,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        mut body: Value,
        ownership: Ownership,
        dry_run: bool,
    ) -> Result<Arc<Obj>, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the object provided is not a JSON object"));
        }
        Self::check_type_meta(rt, &body)?;
        body["apiVersion"] = json!(rt.api_version());
        body["kind"] = json!(rt.kind);
        let ns = Self::resolve_ns(rt, ns);
        let meta = meta_mut(&mut body);
        let body_ns = meta.get("namespace").and_then(Value::as_str).map(String::from);
        if rt.namespaced {
            match (ns, body_ns.as_deref()) {
                (Some(u), Some(b)) if !b.is_empty() && u != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(u), _) => {
                    meta.insert("namespace".into(), json!(u));
                }
                (None, _) => return Err(ApiError::not_found_path()),
            }
        } else {
            meta.remove("namespace");
        }
        if meta.get("resourceVersion").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_request("resourceVersion should not be set on objects to be created"));
        }
        let name = meta.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let generate = meta.get("generateName").and_then(Value::as_str).unwrap_or_default().to_string();
        if name.is_empty() && generate.is_empty() {
            return Err(ApiError::invalid(
                &rt.group,
                &rt.kind,
                "",
                vec![Cause::required("metadata.name", "name or generateName is required")],
            ));
        }
        let store_id = rt.store.clone();
        let name = if name.is_empty() {
            let mut candidate = String::new();
            for _ in 0..16 {
                candidate = format!("{generate}{}", random_suffix());
                if st.get(&store_id, &key(ns, &candidate)).is_none() {
                    break;
                }
            }
            candidate
        } else {
            name
        };
        if let Some(cause) = strategy::validate_name(rt, &name) {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, vec![cause]));
        }
        if let Some(n) = ns {
            match st.namespace_state(n) {
                (false, _) => {
                    let t = crate::error::Target { group: "", plural: "namespaces" };
                    return Err(ApiError::not_found(&t, n));
                }
                (true, true) => {
                    return Err(ApiError::forbidden(
                        &rt.target(),
                        &name,
                        &format!("unable to create new content in namespace {n} because it is being terminated"),
                    ));
                }
                _ => {}
            }
        }
        let k = key(ns, &name);
        if st.get(&store_id, &k).is_some() {
            return Err(ApiError::already_exists(&rt.target(), &name));
        }
        let meta = meta_mut(&mut body);
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(crate::util::new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        // Only types whose spec is versioned by generation get one (ConfigMaps, Services, Nodes
        // and the like have none on a genuine server).
        if matches!(rt.strategy, Strategy::Custom | Strategy::Crd | Strategy::Workload | Strategy::Pod) {
            meta.insert("generation".into(), json!(1));
        }
        for f in ["deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"] {
            meta.remove(f);
        }
        strategy::prepare_create(rt, &mut body);
        strategy::normalize(rt, &mut body).map_err(ApiError::bad_request)?;
        let causes = strategy::validate(rt, &body, None);
        if !causes.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, causes));
        }
        let stored_api_version =
            st.stores.get(&store_id).map(|s| s.rt.api_version()).unwrap_or_else(|| rt.api_version());
        let mut stored = from_view(rt, body, stored_api_version);
        match ownership {
            Ownership::Update(w) => managed::record_update(rt, None, vec![], &mut stored, &w),
            Ownership::Apply { writer, applied, force } => {
                managed::record_apply(rt, None, vec![], &mut stored, &writer, applied, force)
                    .map_err(|c| ApiError::apply_conflict(&rt.target(), &name, &c))?;
            }
        }
        let allocated = if rt.strategy == Strategy::Service {
            Some(st.alloc.prepare(None, &mut stored).map_err(|c| ApiError::invalid(&rt.group, &rt.kind, &name, c))?)
        } else {
            None
        };
        if rt.strategy == Strategy::Crd {
            crate::resources::parse_crd(&stored)?;
            if !dry_run {
                st.registry.add_crd(&stored)?;
                stored["status"] = strategy::crd_status(&stored);
                self.crd_registered(st, &stored);
            }
        }
        if dry_run {
            if let Some(a) = allocated {
                st.alloc.rollback(a);
            }
            return Ok(Obj::new(stored, 0));
        }
        Ok(st.put(&store_id, k, stored))
    }

    fn crd_registered(&self, st: &mut State, crd: &Value) {
        let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
        let plural = crd.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
        let store: Arc<str> = Arc::from(format!("{group}/{plural}"));
        st.ensure_store(&store);
        // The storage type may have changed (scope, subresources): refresh it.
        if let Some(rt) = st.registry.storage_type(&store)
            && let Some(s) = st.stores.get_mut(&store)
        {
            s.rt = rt;
        }
    }

    /// Replaces an object (PUT).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        sub: Option<&str>,
        body: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Bytes, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the object provided is not a JSON object"));
        }
        Self::check_type_meta(rt, &body)?;
        if let Some(n) = body.pointer("/metadata/name").and_then(Value::as_str)
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        let ns = Self::resolve_ns(rt, ns);
        if let (Some(u), Some(b)) = (ns, body.pointer("/metadata/namespace").and_then(Value::as_str))
            && !b.is_empty()
            && u != b
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut st = self.lock();
        let Some(old) = st.get(&rt.store, &key(ns, name)) else {
            return Err(ApiError::not_found(&rt.target(), name));
        };
        if let Some(rv) = body.pointer("/metadata/resourceVersion").and_then(Value::as_str)
            && !rv.is_empty()
            && rv != old.rv.to_string()
        {
            return Err(ApiError::stale(&rt.target(), name));
        }
        let writer = Writer { manager, api_version: rt.api_version().to_string(), subresource: sub.unwrap_or("") };
        let out = self.finish_update(&mut st, rt, sub, &old, body, Ownership::Update(writer), dry_run)?;
        drop(st);
        self.gc_wake.notify_one();
        Ok(render(rt, &out, Shape::Full))
    }

    /// Patches an object; apply patches create it when missing. Returns (object, created).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        sub: Option<&str>,
        kind: PatchKind,
        patch: Value,
        manager: &str,
        force: bool,
        dry_run: bool,
    ) -> Result<(Bytes, bool), ApiError> {
        let ns = Self::resolve_ns(rt, ns);
        if kind == PatchKind::Strategic && rt.is_custom() {
            return Err(ApiError::unsupported_media_type(
                "application/strategic-merge-patch+json",
                &["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"],
            ));
        }
        let mut st = self.lock();
        let old = st.get(&rt.store, &key(ns, name));
        let writer = Writer { manager, api_version: rt.api_version().to_string(), subresource: sub.unwrap_or("") };
        let result = match (kind, old) {
            (PatchKind::Apply, old) => {
                let cfg = self.prepare_apply_config(rt, sub, name, patch)?;
                let applied = managed::applied_set(rt, &cfg);
                match old {
                    None => {
                        if sub.is_some() {
                            return Err(ApiError::not_found(&rt.target(), name));
                        }
                        let mut live =
                            json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": {"name": name}});
                        if let Some(n) = ns {
                            live["metadata"]["namespace"] = json!(n);
                        }
                        let merged = managed::apply(rt, &live, &[], &cfg, &writer);
                        let own = Ownership::Apply { writer, applied, force };
                        (self.create_in(&mut st, rt, ns, merged, own, dry_run)?, true)
                    }
                    Some(old) => {
                        let live = to_view(rt, &old.value);
                        let merged =
                            managed::apply(rt, &live, &managed::parse_entries(old.managed.as_deref()), &cfg, &writer);
                        let own = Ownership::Apply { writer, applied, force };
                        (self.finish_update(&mut st, rt, sub, &old, merged, own, dry_run)?, false)
                    }
                }
            }
            (_, None) => return Err(ApiError::not_found(&rt.target(), name)),
            (kind, Some(old)) => {
                let mut doc = to_view(rt, &old.value);
                match kind {
                    PatchKind::Merge => {
                        if !patch.is_object() {
                            return Err(ApiError::bad_request("merge patch must be a JSON object"));
                        }
                        json_patch::merge(&mut doc, &patch);
                    }
                    PatchKind::Json => {
                        let ops: json_patch::Patch = serde_json::from_value(patch)
                            .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                        json_patch::patch(&mut doc, &ops.0).map_err(|e| {
                            ApiError::unprocessable(format!(
                                "the server rejected our request due to an error in our request: {e}"
                            ))
                        })?;
                    }
                    PatchKind::Strategic => crate::patch::strategic_merge(rt, &mut doc, &patch)?,
                    PatchKind::Apply => {}
                }
                if let Some(rv) = doc.pointer("/metadata/resourceVersion").and_then(Value::as_str)
                    && !rv.is_empty()
                    && rv != old.rv.to_string()
                {
                    return Err(ApiError::stale(&rt.target(), name));
                }
                if doc.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
                    return Err(ApiError::bad_request("metadata.name may not be changed by a patch"));
                }
                (self.finish_update(&mut st, rt, sub, &old, doc, Ownership::Update(writer), dry_run)?, false)
            }
        };
        drop(st);
        self.gc_wake.notify_one();
        Ok((render(rt, &result.0, Shape::Full), result.1))
    }

    fn prepare_apply_config(
        &self,
        rt: &ResourceType,
        sub: Option<&str>,
        name: &str,
        mut cfg: Value,
    ) -> Result<Value, ApiError> {
        if !cfg.is_object() {
            return Err(ApiError::bad_request("apply configuration must be an object"));
        }
        let av = cfg.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let kind = cfg.get("kind").and_then(Value::as_str).unwrap_or_default();
        if av.is_empty() || kind.is_empty() {
            return Err(ApiError::bad_request("apiVersion and kind must be set in an apply configuration"));
        }
        Self::check_type_meta(rt, &cfg)?;
        if let Some(n) = cfg.pointer("/metadata/name").and_then(Value::as_str)
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(meta) = cfg.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
            meta.remove("resourceVersion");
        }
        // Fields the write cannot change are not part of what the applier owns.
        if let Some(o) = cfg.as_object_mut() {
            match sub {
                Some("status") => o.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")),
                _ if rt.status => {
                    o.remove("status");
                }
                _ => {}
            }
        }
        if sub == Some("status")
            && let Some(meta) = cfg.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.retain(|k, _| matches!(k.as_str(), "name" | "namespace"));
        }
        Ok(cfg)
    }

    /// Turns a candidate (in `rt`'s view) into the stored object: isolation, immutable metadata,
    /// type rules, ownership, generation, finalizer rules, no-op detection, then stores it.
    #[allow(clippy::too_many_arguments)]
    fn finish_update(
        &self,
        st: &mut State,
        rt: &Arc<ResourceType>,
        sub: Option<&str>,
        old: &Arc<Obj>,
        candidate: Value,
        ownership: Ownership,
        dry_run: bool,
    ) -> Result<Arc<Obj>, ApiError> {
        let name = meta_str(&old.value, "name").unwrap_or_default().to_string();
        let store_id = rt.store.clone();
        let stored_api_version = old.value.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
        let old_view = to_view(rt, &old.value);
        let mut new = candidate;
        if !new.is_object() {
            return Err(ApiError::bad_request("the object provided is not a JSON object"));
        }
        Self::check_type_meta(rt, &new)?;
        new["apiVersion"] = json!(rt.api_version());
        new["kind"] = json!(rt.kind);
        strategy::isolate(rt, sub, &old_view, &mut new);
        {
            let old_meta = old_view.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
            let meta = meta_mut(&mut new);
            for f in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "managedFields",
            ] {
                match old_meta.get(f) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
            meta.remove("selfLink");
            meta.insert("resourceVersion".into(), json!(old.rv.to_string()));
        }
        let deleting = is_deleting(&old.value);
        if deleting {
            let before = finalizers(&old.value);
            let added: Vec<String> = finalizers(&new).into_iter().filter(|f| !before.contains(f)).collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    &name,
                    vec![Cause::forbidden(
                        "metadata.finalizers",
                        &format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                            added.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
                        ),
                    )],
                ));
            }
        }
        if rt.strategy == Strategy::Crd && sub.is_none() {
            let g_old = old_view.pointer("/spec/group");
            let g_new = new.pointer("/spec/group");
            if g_old != g_new {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    &name,
                    vec![Cause::invalid("spec.group", g_new.unwrap_or(&Value::Null), "field is immutable")],
                ));
            }
        }
        strategy::normalize(rt, &mut new).map_err(ApiError::bad_request)?;
        let causes = strategy::validate(rt, &new, Some(&old_view));
        if !causes.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, causes));
        }
        let mut new = from_view(rt, new, &stored_api_version);
        if strategy::spec_changed(rt, &old.value, &new)
            && let Some(g) = old.value.pointer("/metadata/generation").and_then(Value::as_i64)
        {
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        let allocated = if rt.strategy == Strategy::Service && sub.is_none() {
            Some(
                st.alloc
                    .prepare(Some(&old.value), &mut new)
                    .map_err(|c| ApiError::invalid(&rt.group, &rt.kind, &name, c))?,
            )
        } else {
            None
        };
        let rollback = |st: &mut State, allocated: Option<crate::services::Allocated>| {
            if let Some(a) = allocated {
                st.alloc.rollback(a);
            }
        };
        let old_entries = managed::parse_entries(old.managed.as_deref());
        match ownership {
            Ownership::Update(w) => managed::record_update(rt, Some(&old.value), old_entries, &mut new, &w),
            Ownership::Apply { writer, applied, force } => {
                if let Err(c) =
                    managed::record_apply(rt, Some(&old.value), old_entries, &mut new, &writer, applied, force)
                {
                    rollback(st, allocated);
                    return Err(ApiError::apply_conflict(&rt.target(), &name, &c));
                }
            }
        }
        if same_object(&mut new, old) {
            rollback(st, allocated);
            return Ok(old.clone());
        }
        if dry_run {
            rollback(st, allocated);
            return Ok(Obj::new(new, old.rv));
        }
        if rt.strategy == Strategy::Crd && sub.is_none() {
            st.registry.add_crd(&new)?;
            new["status"] = strategy::crd_status(&new);
            self.crd_registered(st, &new);
        }
        if rt.strategy == Strategy::Service && sub.is_none() {
            st.alloc.release_unused(&old.value, &new);
        }
        let k = key(meta_str(&old.value, "namespace"), &name);
        if deleting && !blocking_finalizers(&st.stores[&store_id].rt, &new) {
            let gone = self.remove_object(st, &store_id, &k).unwrap_or(new);
            return Ok(Obj::new(gone, 0));
        }
        Ok(st.put(&store_id, k, new))
    }

    /// Deletes an object. Returns (object, deleted now).
    pub fn delete(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let ns = Self::resolve_ns(rt, ns);
        let mut st = self.lock();
        let res = self.delete_in(&mut st, &rt.store, &key(ns, name), Some(rt), opts)?;
        drop(st);
        self.gc_wake.notify_one();
        Ok(res)
    }

    fn delete_in(
        &self,
        st: &mut State,
        store: &Arc<str>,
        k: &str,
        view: Option<&Arc<ResourceType>>,
        opts: &DeleteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let Some(srt) = st.stores.get(store).map(|s| s.rt.clone()) else { return Err(ApiError::not_found_path()) };
        let rt = view.cloned().unwrap_or(srt.clone());
        let name = k.rsplit('/').next().unwrap_or(k).to_string();
        let Some(old) = st.get(store, k) else { return Err(ApiError::not_found(&rt.target(), &name)) };
        if let Some(uid) = &opts.uid
            && Some(uid.as_str()) != meta_str(&old.value, "uid")
        {
            return Err(ApiError::conflict(
                &rt.target(),
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old.value, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && *rv != old.rv.to_string()
        {
            return Err(ApiError::conflict(
                &rt.target(),
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old.rv
                ),
            ));
        }
        let mut fins = finalizers(&old.value);
        let deleting = is_deleting(&old.value);
        if !deleting {
            match opts.propagation.as_deref() {
                Some("Foreground") if !fins.iter().any(|f| f == "foregroundDeletion") => {
                    fins.push("foregroundDeletion".into())
                }
                Some("Orphan") if !fins.iter().any(|f| f == "orphan") => fins.push("orphan".into()),
                Some("Foreground" | "Orphan" | "Background") | None => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "",
                        "DeleteOptions",
                        "",
                        vec![Cause::invalid(
                            "propagationPolicy",
                            &json!(other),
                            "must be Orphan, Foreground or Background",
                        )],
                    ));
                }
            }
        }
        let mut candidate = old.full();
        set_finalizers(&mut candidate, &fins);
        if !blocking_finalizers(&srt, &candidate) {
            if opts.dry_run {
                return Ok((to_view(&rt, &old.full()), true));
            }
            let gone = self.remove_object(st, store, k).unwrap_or_default();
            return Ok((to_view(&rt, &gone), true));
        }
        if deleting {
            return Ok((to_view(&rt, &old.full()), false));
        }
        let meta = meta_mut(&mut candidate);
        meta.insert("deletionTimestamp".into(), json!(now_rfc3339()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(opts.grace.unwrap_or(0).max(0)));
        if let Some(g) = meta.get("generation").and_then(Value::as_i64) {
            meta.insert("generation".into(), json!(g + 1));
        }
        if srt.strategy == Strategy::Namespace {
            candidate["status"] = json!({"phase": "Terminating"});
        }
        if opts.dry_run {
            return Ok((to_view(&rt, &candidate), false));
        }
        let obj = st.put(store, k.to_string(), candidate);
        Ok((to_view(&rt, &obj.full()), false))
    }

    /// Removes an object for good (a CRD also takes its objects and types with it).
    fn remove_object(&self, st: &mut State, store: &Arc<str>, k: &str) -> Option<Value> {
        let is_crd = st.stores.get(store).is_some_and(|s| s.rt.strategy == Strategy::Crd);
        if is_crd && let Some(old) = st.get(store, k) {
            self.drop_crd(st, &old.value);
        }
        st.remove(store, k).map(|o| o.full())
    }

    /// Removes a CRD's objects and stops serving its types.
    fn drop_crd(&self, st: &mut State, crd: &Value) {
        let Some(store) = st.registry.remove_crd(&crd_name(crd)) else { return };
        let keys: Vec<String> = st.stores.get(&store).map(|s| s.objects.keys().cloned().collect()).unwrap_or_default();
        for k in keys {
            st.remove(&store, &k);
        }
        // Dropping the store drops its notifier, which ends open watches.
        st.stores.remove(&store);
    }

    /// Deletes every matching object (DELETE on a collection). Returns the list body.
    pub fn delete_collection(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        list: &ListOpts,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let (items, _, _, _) = self.list_objects(rt, ns, list)?;
        let mut st = self.lock();
        let mut deleted = vec![];
        for o in items {
            let k = key(meta_str(&o.value, "namespace"), meta_str(&o.value, "name").unwrap_or_default());
            match self.delete_in(&mut st, &rt.store, &k, Some(rt), opts) {
                Ok((v, _)) => deleted.push(v),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let rv = st.rv;
        drop(st);
        self.gc_wake.notify_one();
        Ok(
            json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": deleted}),
        )
    }

    // ---- garbage collection and namespace cleanup ----

    /// Processes pending garbage collector work until nothing changes.
    pub fn gc_sweep(&self) {
        let mut st = self.lock();
        for _ in 0..10_000 {
            let owners = std::mem::take(&mut st.gc_owners);
            let mut objects = std::mem::take(&mut st.gc_objects);
            if owners.is_empty() && objects.is_empty() {
                break;
            }
            for uid in owners {
                if let Some(deps) = st.dependents.get(&uid) {
                    objects.extend(deps.iter().cloned());
                }
            }
            for r in objects {
                self.gc_check(&mut st, &r.0, &r.1);
            }
        }
    }

    fn system_update(&self, st: &mut State, store: &Arc<str>, k: &str, f: impl FnOnce(&mut Value)) {
        let Some(old) = st.get(store, k) else { return };
        let Some(rt) = st.stores.get(store).map(|s| s.rt.clone()) else { return };
        let mut new = old.full();
        f(&mut new);
        if same_object(&mut new, &old) {
            return;
        }
        if is_deleting(&new) && !blocking_finalizers(&rt, &new) {
            self.remove_object(st, store, k);
        } else {
            st.put(store, k.to_string(), new);
        }
    }

    fn gc_check(&self, st: &mut State, store: &Arc<str>, k: &str) {
        let Some(obj) = st.get(store, k) else { return };
        let Some(rt) = st.stores.get(store).map(|s| s.rt.clone()) else { return };
        let v = &obj.value;
        let uid = meta_str(v, "uid").unwrap_or_default().to_string();
        let deleting = is_deleting(v);
        // Dependents whose owners are all gone are deleted; dangling references are dropped.
        let owners = owner_uids(v);
        if !owners.is_empty() && !deleting {
            let missing: Vec<&String> = owners.iter().filter(|o| !st.uids.contains_key(*o)).collect();
            if missing.len() == owners.len() {
                let _ = self.delete_in(st, store, k, None, &DeleteOpts::default());
                return;
            }
            if !missing.is_empty() {
                let missing: Vec<String> = missing.into_iter().cloned().collect();
                self.system_update(st, store, k, |v| remove_owner_refs(v, &missing));
                return;
            }
        }
        if !deleting {
            return;
        }
        let fins = finalizers(v);
        if fins.iter().any(|f| f == "orphan") {
            let deps: Vec<_> = st.dependents.get(&uid).map(|d| d.iter().cloned().collect()).unwrap_or_default();
            for (s, dk) in deps {
                let u = vec![uid.clone()];
                self.system_update(st, &s, &dk, |v| remove_owner_refs(v, &u));
            }
            self.system_update(st, store, k, |v| {
                let f: Vec<String> = finalizers(v).into_iter().filter(|f| f != "orphan").collect();
                set_finalizers(v, &f);
            });
            return;
        }
        if fins.iter().any(|f| f == "foregroundDeletion") {
            let deps: Vec<_> = st.dependents.get(&uid).map(|d| d.iter().cloned().collect()).unwrap_or_default();
            for (s, dk) in &deps {
                let opts = DeleteOpts { propagation: Some("Foreground".into()), ..Default::default() };
                let _ = self.delete_in(st, s, dk, None, &opts);
            }
            let remaining = st.dependents.get(&uid).is_some_and(|d| !d.is_empty());
            if !remaining {
                self.system_update(st, store, k, |v| {
                    let f: Vec<String> = finalizers(v).into_iter().filter(|f| f != "foregroundDeletion").collect();
                    set_finalizers(v, &f);
                });
            }
            return;
        }
        if rt.strategy == Strategy::Namespace {
            let ns = k.to_string();
            let mut remaining = 0usize;
            let stores: Vec<Arc<str>> =
                st.stores.iter().filter(|(_, s)| s.rt.namespaced).map(|(id, _)| id.clone()).collect();
            for s in stores {
                let keys: Vec<String> =
                    st.stores[&s].objects.range(format!("{ns}/")..format!("{ns}0")).map(|(k, _)| k.clone()).collect();
                for dk in keys {
                    let _ = self.delete_in(st, &s, &dk, None, &DeleteOpts::default());
                    if st.get(&s, &dk).is_some() {
                        remaining += 1;
                    }
                }
            }
            if remaining == 0 {
                self.system_update(st, store, k, |v| {
                    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.remove("finalizers");
                    }
                });
            }
        }
    }
}

/// Whether `new` (a full object) equals the stored `old` (value plus serialized managedFields).
fn same_object(new: &mut Value, old: &Obj) -> bool {
    let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) else { return false };
    let mf = meta.remove("managedFields");
    let same = *new == old.value
        && mf.as_ref().map(|m| serde_json::to_string(m).unwrap_or_default()).as_deref() == old.managed.as_deref();
    if let (Some(mf), Some(meta)) = (mf, new.get_mut("metadata").and_then(Value::as_object_mut)) {
        meta.insert("managedFields".into(), mf);
    }
    same
}

fn remove_owner_refs(v: &mut Value, uids: &[String]) {
    if let Some(refs) = v.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
        refs.retain(|r| !r.get("uid").and_then(Value::as_str).is_some_and(|u| uids.iter().any(|x| x == u)));
        if refs.is_empty()
            && let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut)
        {
            m.remove("ownerReferences");
        }
    }
}

fn encode_continue(rv: u64, last_key: &str) -> String {
    hex_encode(format!("{rv}\u{0}{last_key}").as_bytes())
}

fn decode_continue(tok: &str) -> Result<(u64, Option<String>), ApiError> {
    let bad = || ApiError::bad_request(format!("invalid continue token: {tok}"));
    let raw = hex_decode(tok).ok_or_else(bad)?;
    let s = String::from_utf8(raw).map_err(|_| bad())?;
    let (rv, k) = s.split_once('\u{0}').ok_or_else(bad)?;
    Ok((rv.parse().map_err(|_| bad())?, Some(k.to_string())))
}

/// Names of the objects in `set`, for debugging output.
#[allow(dead_code)]
pub(crate) fn names(set: &BTreeSet<(Arc<str>, String)>) -> Vec<String> {
    set.iter().map(|(s, k)| format!("{s}:{k}")).collect()
}

impl Core {
    pub(crate) fn log_request(&self, mut record: RequestRecord) {
        let cap = self.opts.request_log_capacity;
        let mut data = self.log.lock().unwrap_or_else(|e| e.into_inner());
        record.seq = data.next_seq;
        data.next_seq += 1;
        data.records.push_back(record);
        while data.records.len() > cap {
            data.records.pop_front();
        }
    }
}

impl LogSource for Core {
    fn with_data(&self, f: &mut dyn FnMut(&mut LogData)) {
        f(&mut self.log.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

impl Core {
    /// Ends every open watch.
    pub(crate) fn close_watches(&self) {
        self.watch_close.send_modify(|g| *g += 1);
    }
}

impl FaultTarget for Core {
    fn config(&self) -> &Mutex<FaultConfig> {
        &self.faults
    }

    fn close_watches(&self) {
        Core::close_watches(self);
    }

    fn open_watches(&self) -> usize {
        self.open_watches.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn close_every(&self) -> &Mutex<Option<tokio::task::JoinHandle<()>>> {
        &self.close_every
    }

    fn runtime(&self) -> tokio::runtime::Handle {
        self.runtime.clone()
    }

    fn compact_history(&self) -> bool {
        self.lock().compact();
        true
    }
}
