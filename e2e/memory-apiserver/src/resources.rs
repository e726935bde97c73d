//! Resource types the server serves: the built-in table, CRD-defined types, and list typing
//! (which lists merge by key, which are sets) for strategic merge and server-side apply.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::Value;

use crate::error::{ApiError, Cause, Target};

/// Per-type behaviour hooks (defaults, status handling, validation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    Generic,
    Namespace,
    Node,
    Service,
    Pod,
    Event,
    Crd,
    Custom,
    Workload,
    Rbac,
}

/// How stored objects are shown through this type's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    /// As stored (apiVersion rewritten when a CRD serves several versions).
    Stored,
    /// `events.k8s.io/v1` view of core/v1 Events.
    EventsV1,
}

/// One served group/version/resource.
#[derive(Debug)]
pub(crate) struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status: bool,
    /// Storage identity shared by all versions/views of the same resource.
    pub store: Arc<str>,
    pub view: View,
    pub strategy: Strategy,
    /// The CRD version's `openAPIV3Schema` (list types for apply).
    pub schema: Option<Arc<Value>>,
    /// The CRD's `additionalPrinterColumns` for this version.
    pub printer_columns: Vec<Value>,
    /// The CRD's `selectableFields` json paths (without the leading dot).
    pub selectable_fields: Vec<String>,
    /// `v1` or `group/version`, computed once.
    pub gv: String,
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() { version.to_string() } else { format!("{group}/{version}") }
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> &str {
        &self.gv
    }

    pub fn target(&self) -> Target<'_> {
        Target { group: &self.group, plural: &self.plural }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn is_custom(&self) -> bool {
        self.strategy == Strategy::Custom
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    }
}

/// Which kind of list a field holds, for merging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKind {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// One step in a path through an object: a field or "an item of this list".
#[derive(Debug, Clone)]
pub(crate) enum Seg {
    Field(String),
    Item,
}

fn map(keys: &[&str]) -> ListKind {
    ListKind::Map(keys.iter().map(|k| k.to_string()).collect())
}

/// List typing for a path in an object of type `rt`.
pub(crate) fn list_kind(rt: &ResourceType, path: &[Seg]) -> ListKind {
    let fields: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Seg::Field(f) => Some(f.as_str()),
            Seg::Item => None,
        })
        .collect();
    if fields.first() == Some(&"metadata") || rt.schema.is_none() {
        return builtin_list_kind(rt, &fields);
    }
    let mut schema = rt.schema.as_deref();
    for seg in path {
        let Some(s) = schema else { break };
        schema = match seg {
            Seg::Field(f) => s.get("properties").and_then(|p| p.get(f)).or_else(|| s.get("additionalProperties")),
            Seg::Item => s.get("items"),
        };
    }
    let Some(s) = schema else { return ListKind::Atomic };
    match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListKind::Set,
        Some("map") => {
            let keys = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|k| k.as_str().map(String::from)).collect())
                .unwrap_or_default();
            ListKind::Map(keys)
        }
        _ => ListKind::Atomic,
    }
}

fn builtin_list_kind(rt: &ResourceType, fields: &[&str]) -> ListKind {
    let Some(last) = fields.last() else { return ListKind::Atomic };
    let parent = if fields.len() >= 2 { fields[fields.len() - 2] } else { "" };
    match *last {
        "finalizers" | "podCIDRs" => ListKind::Set,
        "ownerReferences" => map(&["uid"]),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => map(&["name"]),
        "volumeMounts" => map(&["mountPath"]),
        "volumeDevices" => map(&["devicePath"]),
        "conditions" => map(&["type"]),
        "taints" => map(&["key", "effect"]),
        "hostAliases" => map(&["ip"]),
        "topologySpreadConstraints" => map(&["topologyKey", "whenUnsatisfiable"]),
        "ports" if matches!(parent, "containers" | "initContainers" | "ephemeralContainers") => {
            map(&["containerPort", "protocol"])
        }
        "ports" if rt.strategy == Strategy::Service && fields.len() == 2 => map(&["port", "protocol"]),
        "addresses" if rt.strategy == Strategy::Node => map(&["type"]),
        _ => ListKind::Atomic,
    }
}

/// Default values assumed for list-map key fields that a client may omit.
pub(crate) fn key_default(key: &str) -> Option<Value> {
    match key {
        "protocol" => Some(Value::String("TCP".into())),
        _ => None,
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    short: &'static [&'static str],
    strategy: Strategy,
}

#[allow(clippy::too_many_arguments)]
const fn b(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    short: &'static [&'static str],
    strategy: Strategy,
) -> Builtin {
    Builtin { group, version, plural, singular, kind, namespaced, status, short, strategy }
}

const BUILTINS: &[Builtin] = &[
    b("", "v1", "namespaces", "namespace", "Namespace", false, true, &["ns"], Strategy::Namespace),
    b("", "v1", "nodes", "node", "Node", false, true, &["no"], Strategy::Node),
    b("", "v1", "services", "service", "Service", true, true, &["svc"], Strategy::Service),
    b("", "v1", "endpoints", "endpoints", "Endpoints", true, false, &["ep"], Strategy::Generic),
    b("", "v1", "secrets", "secret", "Secret", true, false, &[], Strategy::Generic),
    b("", "v1", "configmaps", "configmap", "ConfigMap", true, false, &["cm"], Strategy::Generic),
    b("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, false, &["sa"], Strategy::Generic),
    b("", "v1", "pods", "pod", "Pod", true, true, &["po"], Strategy::Pod),
    b("", "v1", "events", "event", "Event", true, false, &["ev"], Strategy::Event),
    b("events.k8s.io", "v1", "events", "event", "Event", true, false, &["ev"], Strategy::Event),
    b("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, false, &[], Strategy::Generic),
    b("apps", "v1", "deployments", "deployment", "Deployment", true, true, &["deploy"], Strategy::Workload),
    b("apps", "v1", "daemonsets", "daemonset", "DaemonSet", true, true, &["ds"], Strategy::Workload),
    b("apps", "v1", "replicasets", "replicaset", "ReplicaSet", true, true, &["rs"], Strategy::Workload),
    b("apps", "v1", "statefulsets", "statefulset", "StatefulSet", true, true, &["sts"], Strategy::Workload),
    b(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
        false,
        &[],
        Strategy::Generic,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        false,
        &[],
        Strategy::Rbac,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        false,
        &[],
        Strategy::Rbac,
    ),
    b("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", true, false, &[], Strategy::Rbac),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        false,
        &[],
        Strategy::Rbac,
    ),
    b(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        true,
        &["pdb"],
        Strategy::Generic,
    ),
    // Stored, not enforced: the local server runs no admission (the genuine one does).
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        false,
        true,
        &[],
        Strategy::Generic,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        "ValidatingAdmissionPolicyBinding",
        false,
        false,
        &[],
        Strategy::Generic,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        true,
        &["crd", "crds"],
        Strategy::Crd,
    ),
];

/// Information about one API group for discovery.
pub(crate) struct GroupInfo {
    pub name: String,
    pub versions: Vec<String>,
}

/// All served types, keyed by (group, version, plural).
#[derive(Default)]
pub(crate) struct Registry {
    types: HashMap<(String, String, String), Arc<ResourceType>>,
    /// Groups in discovery order with their versions (preferred first).
    groups: Vec<(String, Vec<String>)>,
    /// CRD name -> the (group, version, plural) keys it serves.
    crds: BTreeMap<String, Vec<(String, String, String)>>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        for bt in BUILTINS {
            let store: Arc<str> = if bt.plural == "events" {
                Arc::from("/events")
            } else {
                Arc::from(format!("{}/{}", bt.group, bt.plural))
            };
            let categories = if matches!(
                bt.plural,
                "pods" | "services" | "deployments" | "daemonsets" | "replicasets" | "statefulsets"
            ) {
                vec!["all".to_string()]
            } else {
                vec![]
            };
            let rt = ResourceType {
                group: bt.group.into(),
                version: bt.version.into(),
                plural: bt.plural.into(),
                singular: bt.singular.into(),
                kind: bt.kind.into(),
                namespaced: bt.namespaced,
                short_names: bt.short.iter().map(|s| s.to_string()).collect(),
                categories,
                status: bt.status,
                store,
                view: if bt.group == "events.k8s.io" { View::EventsV1 } else { View::Stored },
                strategy: bt.strategy,
                schema: None,
                printer_columns: vec![],
                selectable_fields: vec![],
                gv: group_version(bt.group, bt.version),
            };
            r.insert(Arc::new(rt));
        }
        r
    }

    fn insert(&mut self, rt: Arc<ResourceType>) {
        match self.groups.iter_mut().find(|(g, _)| *g == rt.group) {
            Some((_, versions)) => {
                if !versions.contains(&rt.version) {
                    versions.push(rt.version.clone());
                }
            }
            None => self.groups.push((rt.group.clone(), vec![rt.version.clone()])),
        }
        self.types.insert((rt.group.clone(), rt.version.clone(), rt.plural.clone()), rt);
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types.get(&(group.to_string(), version.to_string(), plural.to_string())).cloned()
    }

    /// The type that owns a store (its storage view).
    pub fn storage_type(&self, store: &str) -> Option<Arc<ResourceType>> {
        let mut found: Option<Arc<ResourceType>> = None;
        for rt in self.types.values().filter(|rt| &*rt.store == store && rt.view == View::Stored) {
            // Prefer the core group for events, and any deterministic choice otherwise.
            if found
                .as_ref()
                .is_none_or(|f| (rt.group.as_str(), rt.version.as_str()) < (f.group.as_str(), f.version.as_str()))
            {
                found = Some(rt.clone());
            }
        }
        found
    }

    pub fn groups(&self) -> Vec<GroupInfo> {
        self.groups
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(name, versions)| GroupInfo { name: name.clone(), versions: versions.clone() })
            .collect()
    }

    pub fn resources(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        let mut v: Vec<Arc<ResourceType>> =
            self.types.values().filter(|rt| rt.group == group && rt.version == version).cloned().collect();
        v.sort_by(|a, b| a.plural.cmp(&b.plural));
        v
    }

    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.groups.iter().any(|(g, v)| g == group && v.iter().any(|x| x == version))
    }

    /// Registers the types a CRD defines (replacing any it defined before).
    pub fn add_crd(&mut self, crd: &Value) -> Result<(), ApiError> {
        let parsed = parse_crd(crd)?;
        let name = crd_name(crd);
        self.remove_crd(&name);
        let mut keys = vec![];
        for rt in parsed {
            keys.push((rt.group.clone(), rt.version.clone(), rt.plural.clone()));
            self.insert(Arc::new(rt));
        }
        self.crds.insert(name, keys);
        Ok(())
    }

    /// Stops serving a CRD's types. Returns their store id, if it served any.
    pub fn remove_crd(&mut self, name: &str) -> Option<Arc<str>> {
        let keys = self.crds.remove(name)?;
        let mut store = None;
        for key in keys {
            if let Some(rt) = self.types.remove(&key) {
                store = Some(rt.store.clone());
                if let Some((_, versions)) = self.groups.iter_mut().find(|(g, _)| *g == key.0) {
                    let still = self.types.keys().any(|(g, v, _)| *g == key.0 && *v == key.1);
                    if !still {
                        versions.retain(|v| *v != key.1);
                    }
                }
            }
        }
        self.groups.retain(|(_, v)| !v.is_empty());
        store
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }
}

pub(crate) fn crd_name(crd: &Value) -> String {
    crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string()
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// Validates a CRD and builds one `ResourceType` per served version.
pub(crate) fn parse_crd(crd: &Value) -> Result<Vec<ResourceType>, ApiError> {
    let name = crd_name(crd);
    let invalid =
        |causes: Vec<Cause>| ApiError::invalid("apiextensions.k8s.io", "CustomResourceDefinition", &name, causes);
    let group = str_at(crd, "/spec/group");
    let plural = str_at(crd, "/spec/names/plural");
    let kind = str_at(crd, "/spec/names/kind");
    let mut causes = vec![];
    if group.is_empty() || !group.contains('.') {
        causes.push(Cause::invalid(
            "spec.group",
            &Value::String(group.into()),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    if name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &Value::String(name.clone()),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = str_at(crd, "/spec/scope");
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::invalid("spec.scope", &Value::String(scope.into()), "must be Namespaced or Cluster"));
    }
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::required("spec.versions", "must have exactly one version marked as storage version"));
    }
    if versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count() != 1 {
        causes.push(Cause::invalid(
            "spec.versions",
            &Value::Null,
            "must have exactly one version marked as storage version",
        ));
    }
    if !causes.is_empty() {
        return Err(invalid(causes));
    }
    let singular = match str_at(crd, "/spec/names/singular") {
        "" => kind.to_lowercase(),
        s => s.to_string(),
    };
    let strings = |ptr: &str| -> Vec<String> {
        crd.pointer(ptr)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let short_names = strings("/spec/names/shortNames");
    let categories = strings("/spec/names/categories");
    let store: Arc<str> = Arc::from(format!("{group}/{plural}"));
    let mut out = vec![];
    for v in versions.iter().filter(|v| v.get("served").and_then(Value::as_bool) == Some(true)) {
        let version = str_at(v, "/name").to_string();
        let schema = v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new);
        let selectable_fields = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect()
            })
            .unwrap_or_default();
        out.push(ResourceType {
            gv: group_version(group, &version),
            group: group.into(),
            version,
            plural: plural.into(),
            singular: singular.clone(),
            kind: kind.into(),
            namespaced: scope == "Namespaced",
            short_names: short_names.clone(),
            categories: categories.clone(),
            status: v.pointer("/subresources/status").is_some(),
            store: store.clone(),
            view: View::Stored,
            strategy: Strategy::Custom,
            schema,
            printer_columns: v.get("additionalPrinterColumns").and_then(Value::as_array).cloned().unwrap_or_default(),
            selectable_fields,
        });
    }
    Ok(out)
}
