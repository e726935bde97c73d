//! Pure decisions of the cloud-node controller: what a Node should look like after
//! initialization or an address refresh, and the patches that get it there. No I/O here.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use serde_json::{Value, json};

use crate::provider::InstanceMetadata;

/// Taint kubelet adds at registration with `--cloud-provider=external`; removed once initialized.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint the lifecycle controller puts on Nodes whose instance is shut down.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Annotation kubelet sets from `--node-ip`.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// GA instance-type label.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Legacy (beta) instance-type label.
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// GA zone label.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Legacy (beta) zone label.
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// GA region label.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Legacy (beta) region label.
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";

/// Address type whose entries kubelet owns when the cloud reports none (N15).
const HOSTNAME: &str = "Hostname";

/// (beta, GA) label pairs reconciled on initialized Nodes (N12).
const BETA_TO_GA: [(&str, &str); 3] =
    [(LABEL_ZONE_BETA, LABEL_ZONE), (LABEL_REGION_BETA, LABEL_REGION), (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE)];

/// Why a Node cannot be initialized from the metadata the cloud returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitError {
    /// Neither the Node nor the cloud has a providerID (N2): never untaint without one.
    MissingProviderId,
    /// The `alpha.kubernetes.io/provided-node-ip` annotation is unusable (N5).
    InvalidNodeIp(NodeIpError),
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::MissingProviderId => {
                f.write_str("the cloud returned no providerID and the Node has none; it stays tainted")
            }
            InitError::InvalidNodeIp(e) => write!(f, "provided node ip is not valid: {e}"),
        }
    }
}

/// Why a node-IP annotation was rejected (N5, N16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeIpError {
    /// An entry does not parse as an IP address.
    Unparsable(String),
    /// More than two IPs, or two of the same family.
    NotSingleOrDualStack,
    /// A dual-stack pair contains `0.0.0.0` or `::`.
    UnspecifiedInDualStack,
    /// An annotated IP is not among the cloud's addresses.
    NotACloudAddress(IpAddr),
}

impl fmt::Display for NodeIpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeIpError::Unparsable(s) => write!(f, "could not parse {s:?} as an IP address"),
            NodeIpError::NotSingleOrDualStack => {
                f.write_str("must contain either a single IP or a dual-stack pair of IPs")
            }
            NodeIpError::UnspecifiedInDualStack => f.write_str("dual-stack node IP cannot include '0.0.0.0' or '::'"),
            NodeIpError::NotACloudAddress(ip) => write!(f, "{ip} is not among the addresses the cloud reports"),
        }
    }
}

/// Whether the Node carries a taint with `key`, whatever its effect or value.
pub fn has_taint_key(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

/// Whether the Node still waits for cloud initialization.
pub fn is_uninitialized(node: &Node) -> bool {
    has_taint_key(node, TAINT_UNINITIALIZED)
}

fn taints(node: &Node) -> &[Taint] {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default()
}

fn provider_id(node: &Node) -> &str {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default()
}

fn addresses(node: &Node) -> &[NodeAddress] {
    node.status.as_ref().and_then(|s| s.addresses.as_deref()).unwrap_or_default()
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str)
}

/// The node-IP annotation value, if set.
pub fn provided_node_ip(node: &Node) -> Option<&str> {
    node.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP)).map(String::as_str)
}

/// Parse an IP like Go's `ParseIPSloppy`: IPv4 octets may carry leading zeros.
fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let octets: Vec<&str> = s.split('.').collect();
    if octets.len() != 4 {
        return None;
    }
    let mut out = [0u8; 4];
    for (slot, part) in out.iter_mut().zip(octets) {
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = part.parse().ok()?;
    }
    Some(IpAddr::from(out))
}

/// Compare IPs the way Go's `net.IP.Equal` does (an IPv4-mapped IPv6 equals its IPv4).
fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// Parse the `alpha.kubernetes.io/provided-node-ip` value: one IP, or one IPv4 and one IPv6
/// separated by a comma, neither unspecified in the pair case (N5).
pub fn parse_node_ip_annotation(value: &str) -> Result<Vec<IpAddr>, NodeIpError> {
    let mut ips = Vec::new();
    for part in value.split(',') {
        let part = part.trim();
        ips.push(parse_ip_sloppy(part).ok_or_else(|| NodeIpError::Unparsable(part.to_string()))?);
    }
    match ips.as_slice() {
        [_] => Ok(ips),
        [a, b] if a.is_ipv6() != b.is_ipv6() => {
            if a.is_unspecified() || b.is_unspecified() {
                Err(NodeIpError::UnspecifiedInDualStack)
            } else {
                Ok(ips)
            }
        }
        _ => Err(NodeIpError::NotSingleOrDualStack),
    }
}

/// Keep the cloud addresses that match the node IPs first and, for each address type that
/// matched, only those; then every address of other types in cloud order (N16).
pub fn filter_addresses_by_node_ips(
    cloud: &[NodeAddress],
    node_ips: &[IpAddr],
) -> Result<Vec<NodeAddress>, NodeIpError> {
    let mut out = Vec::with_capacity(cloud.len());
    let mut matched_types: Vec<&str> = Vec::new();
    for ip in node_ips {
        let mut matched = false;
        for addr in cloud {
            if parse_ip_sloppy(&addr.address).is_some_and(|a| same_ip(a, *ip)) {
                out.push(addr.clone());
                matched_types.push(&addr.type_);
                matched = true;
            }
        }
        if !matched {
            return Err(NodeIpError::NotACloudAddress(*ip));
        }
    }
    out.extend(cloud.iter().filter(|a| !matched_types.contains(&a.type_.as_str())).cloned());
    Ok(out)
}

/// Validate the node-IP annotation against the cloud's addresses before untainting (N5).
pub fn validate_node_ip(node: &Node, cloud: &[NodeAddress]) -> Result<(), NodeIpError> {
    let Some(value) = provided_node_ip(node) else { return Ok(()) };
    let ips = parse_node_ip_annotation(value)?;
    filter_addresses_by_node_ips(cloud, &ips).map(|_| ())
}

/// Address lists differ. Order is meaningful (the first InternalIP is the Node's primary), so
/// this is a sequence comparison: it sees several addresses of one type and any reordering,
/// and reports nothing for an identical list (fixes upstream's map-based check, §6 item 2).
pub fn addresses_changed(current: &[NodeAddress], desired: &[NodeAddress]) -> bool {
    current.len() != desired.len()
        || current.iter().zip(desired).any(|(a, b)| a.type_ != b.type_ || a.address != b.address)
}

/// What the address reconciliation decides for one Node.
#[derive(Debug, Clone, PartialEq)]
pub enum AddressDecision {
    /// The cloud returned no addresses: leave the Node alone (N14).
    NoCloudAddresses,
    /// The node-IP annotation does not fit the cloud's addresses: log, change nothing (N16).
    Invalid(NodeIpError),
    /// The Node already has exactly these addresses.
    Unchanged,
    /// Write these addresses.
    Changed(Vec<NodeAddress>),
}

/// The addresses the Node should have given the cloud's list (N14–N17).
pub fn desired_addresses(node: &Node, cloud: &[NodeAddress]) -> AddressDecision {
    if cloud.is_empty() {
        return AddressDecision::NoCloudAddresses;
    }
    let mut wanted = cloud.to_vec();
    if !wanted.iter().any(|a| a.type_ == HOSTNAME) {
        wanted.extend(addresses(node).iter().filter(|a| a.type_ == HOSTNAME).cloned());
    }
    if let Some(value) = provided_node_ip(node) {
        match parse_node_ip_annotation(value).and_then(|ips| filter_addresses_by_node_ips(&wanted, &ips)) {
            Ok(filtered) => wanted = filtered,
            Err(e) => return AddressDecision::Invalid(e),
        }
    }
    if addresses_changed(addresses(node), &wanted) {
        AddressDecision::Changed(wanted)
    } else {
        AddressDecision::Unchanged
    }
}

/// Whether a label key is in the reserved `kubernetes.io` / `k8s.io` namespaces, matched like
/// upstream's `(^|\.)(kubernetes|k8s)\.io/` (N10).
pub fn is_reserved_label_key(key: &str) -> bool {
    ["kubernetes.io/", "k8s.io/"]
        .iter()
        .any(|suffix| key.match_indices(suffix).any(|(at, _)| at == 0 || key.as_bytes()[at - 1] == b'.'))
}

/// A label the controller declined to set, for a warning log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelWarning {
    /// An additional label in a reserved namespace was discarded.
    Reserved(String),
    /// An additional label already on the Node with another value was kept as is.
    Conflicting(String),
}

/// Labels the Node should gain from the cloud's metadata, only those that differ (N6–N8, N10).
pub fn init_labels(node: &Node, meta: &InstanceMetadata) -> (BTreeMap<String, String>, Vec<LabelWarning>) {
    let mut wanted = BTreeMap::new();
    for (value, keys) in [
        (&meta.instance_type, [LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA]),
        (&meta.zone, [LABEL_ZONE, LABEL_ZONE_BETA]),
        (&meta.region, [LABEL_REGION, LABEL_REGION_BETA]),
    ] {
        if !value.is_empty() {
            for key in keys {
                wanted.insert(key.to_string(), value.clone());
            }
        }
    }
    let mut warnings = Vec::new();
    for (key, value) in &meta.additional_labels {
        if is_reserved_label_key(key) {
            warnings.push(LabelWarning::Reserved(key.clone()));
            continue;
        }
        match label(node, key) {
            Some(existing) if existing != value => warnings.push(LabelWarning::Conflicting(key.clone())),
            Some(_) => {}
            None => {
                wanted.insert(key.clone(), value.clone());
            }
        }
    }
    wanted.retain(|k, v| label(node, k) != Some(v.as_str()));
    (wanted, warnings)
}

/// GA labels to copy from their beta counterparts on an initialized Node (N12). The beta label
/// is the source of truth; a missing beta label changes nothing.
pub fn reconcile_labels(node: &Node) -> BTreeMap<String, String> {
    BETA_TO_GA
        .iter()
        .filter_map(|(beta, ga)| {
            let value = label(node, beta)?;
            (label(node, ga) != Some(value)).then(|| (ga.to_string(), value.to_string()))
        })
        .collect()
}

/// Everything one initialization writes.
#[derive(Debug, Clone, PartialEq)]
pub struct InitPlan {
    /// `spec.providerID` to set, when the Node has none (N4).
    pub provider_id: Option<String>,
    /// Labels to add or overwrite.
    pub labels: BTreeMap<String, String>,
    /// Labels declined, for warnings.
    pub label_warnings: Vec<LabelWarning>,
    /// New `status.addresses`, when they differ from the Node's.
    pub addresses: Option<Vec<NodeAddress>>,
    /// The JSON patch (RFC 6902) for metadata, spec and taint.
    pub patch: Value,
}

/// Decide how to initialize a tainted Node from its metadata (N2, N4–N11, N14–N17).
pub fn plan_initialization(node: &Node, meta: &InstanceMetadata) -> Result<InitPlan, InitError> {
    let provider_id = match (provider_id(node).is_empty(), meta.provider_id.is_empty()) {
        (false, _) => None,
        (true, false) => Some(meta.provider_id.clone()),
        (true, true) => return Err(InitError::MissingProviderId),
    };
    validate_node_ip(node, &meta.node_addresses).map_err(InitError::InvalidNodeIp)?;
    let (labels, label_warnings) = init_labels(node, meta);
    let addresses = match desired_addresses(node, &meta.node_addresses) {
        AddressDecision::Changed(list) => Some(list),
        // Invalid cannot happen after validate_node_ip; either way there is nothing to write.
        _ => None,
    };
    let mut ops = remove_taint_ops(node, |t| t.key == TAINT_UNINITIALIZED);
    ops.extend(label_ops(node, &labels));
    if let Some(id) = &provider_id {
        ops.push(json!({"op": "add", "path": "/spec/providerID", "value": id}));
    }
    Ok(InitPlan { provider_id, labels, label_warnings, addresses, patch: Value::Array(ops) })
}

/// Escape a JSON-pointer reference token (RFC 6901).
pub fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// JSON-patch operations that add or overwrite labels, touching no other key.
pub fn label_ops(node: &Node, labels: &BTreeMap<String, String>) -> Vec<Value> {
    if labels.is_empty() {
        return Vec::new();
    }
    if node.metadata.labels.is_none() {
        return vec![json!({"op": "add", "path": "/metadata/labels", "value": labels})];
    }
    labels
        .iter()
        .map(|(k, v)| json!({"op": "add", "path": format!("/metadata/labels/{}", pointer_token(k)), "value": v}))
        .collect()
}

/// JSON-patch operations removing the taints that match `pred`. Each removal is guarded by a
/// `test` of the taint's key and effect at that index, so a concurrent change to the taint list
/// makes the server reject the patch instead of removing the wrong taint; a concurrent change
/// anywhere else in the Node (status, labels, other taints further down) is kept.
pub fn remove_taint_ops(node: &Node, pred: impl Fn(&Taint) -> bool) -> Vec<Value> {
    let mut ops = Vec::new();
    // Highest index first so earlier removals do not shift later ones.
    for (i, t) in taints(node).iter().enumerate().rev() {
        if pred(t) {
            ops.push(json!({"op": "test", "path": format!("/spec/taints/{i}/key"), "value": t.key}));
            ops.push(json!({"op": "test", "path": format!("/spec/taints/{i}/effect"), "value": t.effect}));
            ops.push(json!({"op": "remove", "path": format!("/spec/taints/{i}")}));
        }
    }
    ops
}

/// JSON-patch operations appending `taint`, guarded by a `test` of the list length so a
/// concurrent change is rejected rather than producing a duplicate.
pub fn add_taint_ops(node: &Node, taint: &Taint) -> Vec<Value> {
    match node.spec.as_ref().and_then(|s| s.taints.as_ref()) {
        Some(list) if !list.is_empty() => vec![
            json!({"op": "test", "path": format!("/spec/taints/{}/key", list.len() - 1), "value": list[list.len() - 1].key}),
            json!({"op": "add", "path": "/spec/taints/-", "value": taint}),
        ],
        _ => vec![json!({"op": "add", "path": "/spec/taints", "value": [taint]})],
    }
}

/// A JSON merge patch (RFC 7386) of `status.addresses` for the status subresource. The whole
/// list is replaced; conditions and everything else kubelet writes are left alone.
pub fn addresses_patch(addresses: &[NodeAddress]) -> Value {
    json!({"status": {"addresses": addresses}})
}

/// A JSON merge patch adding or overwriting `labels` only.
pub fn labels_patch(labels: &BTreeMap<String, String>) -> Value {
    json!({"metadata": {"labels": labels}})
}

/// Whether an update touched only what kubelet heartbeats touch (status, resourceVersion,
/// managed fields): such updates do not warrant a new cloud lookup.
pub fn is_status_only_change(old: &Node, new: &Node) -> bool {
    old.spec == new.spec
        && old.metadata.labels == new.metadata.labels
        && old.metadata.annotations == new.metadata.annotations
        && old.metadata.uid == new.metadata.uid
}

/// How long the oldest queued Node may wait for others to share its lookup: the window while
/// `in_flight` lookups run (Nodes then arrive in bursts worth sharing a call), none when the
/// controller is idle (one new Node, say a kubelet registering, is not kept waiting for others
/// that may never come).
pub fn batch_wait(window: Duration, in_flight: usize) -> Duration {
    if in_flight == 0 { Duration::ZERO } else { window }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_controller_looks_a_new_node_up_at_once_and_a_busy_one_waits_the_window_to_share() {
        let window = Duration::from_millis(100);
        assert_eq!(batch_wait(window, 0), Duration::ZERO);
        assert_eq!(batch_wait(window, 1), window);
        assert_eq!(batch_wait(window, 5), window);
    }
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress { type_: t.into(), address: a.into() }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint { key: key.into(), effect: effect.into(), ..Default::default() }
    }

    fn node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(BTreeMap::from([("kubernetes.io/hostname".into(), "n1".into())])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![
                    taint("other", "NoExecute"),
                    Taint { value: Some("true".into()), ..taint(TAINT_UNINITIALIZED, "NoSchedule") },
                ]),
                ..Default::default()
            }),
            status: Some(NodeStatus { addresses: Some(vec![addr("Hostname", "n1")]), ..Default::default() }),
        }
    }

    fn with_node_ip(mut n: Node, ip: &str) -> Node {
        n.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_PROVIDED_NODE_IP.into(), ip.into())]));
        n
    }

    fn meta() -> InstanceMetadata {
        InstanceMetadata {
            provider_id: "fake://n1".into(),
            instance_type: "m5.large".into(),
            zone: "z1".into(),
            region: "r1".into(),
            node_addresses: vec![addr("InternalIP", "10.0.0.1")],
            ..Default::default()
        }
    }

    /// Apply a JSON patch locally the way the API server would.
    fn apply(node: &Node, patch: &Value) -> Result<Node, String> {
        let mut doc = serde_json::to_value(node).unwrap();
        apply_ops(&mut doc, patch)?;
        Ok(serde_json::from_value(doc).unwrap())
    }

    /// A tiny RFC 6902 interpreter (add/remove/test) so these tests need no server.
    fn apply_ops(doc: &mut Value, patch: &Value) -> Result<(), String> {
        for op in patch.as_array().unwrap() {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            match op["op"].as_str().unwrap() {
                "test" => {
                    if doc.pointer(path) != Some(&op["value"]) {
                        return Err(format!("test failed at {path}"));
                    }
                }
                "remove" => {
                    let p = doc.pointer_mut(parent).ok_or("no parent")?;
                    match p {
                        Value::Array(a) => {
                            a.remove(last.parse::<usize>().unwrap());
                        }
                        Value::Object(o) => {
                            o.remove(&last).ok_or("missing")?;
                        }
                        _ => return Err("bad parent".into()),
                    }
                }
                "add" => {
                    let p = doc.pointer_mut(parent).ok_or(format!("no parent {parent}"))?;
                    match p {
                        Value::Array(a) if last == "-" => a.push(op["value"].clone()),
                        Value::Object(o) => {
                            o.insert(last, op["value"].clone());
                        }
                        _ => return Err("bad parent".into()),
                    }
                }
                other => return Err(format!("unsupported {other}")),
            }
        }
        Ok(())
    }

    #[test]
    fn n2_no_provider_id_anywhere_is_an_error() {
        let m = InstanceMetadata { provider_id: String::new(), ..meta() };
        assert_eq!(plan_initialization(&node(), &m), Err(InitError::MissingProviderId));
    }

    #[test]
    fn n2_n4_node_provider_id_is_kept_and_cloud_one_used_only_when_missing() {
        let mut n = node();
        n.spec.as_mut().unwrap().provider_id = Some("fake://existing".into());
        let m = InstanceMetadata { provider_id: String::new(), ..meta() };
        let plan = plan_initialization(&n, &m).unwrap();
        assert_eq!(plan.provider_id, None);
        let plan = plan_initialization(&n, &meta()).unwrap();
        assert_eq!(plan.provider_id, None, "an existing providerID is never overwritten");
        let plan = plan_initialization(&node(), &meta()).unwrap();
        assert_eq!(plan.provider_id.as_deref(), Some("fake://n1"));
        let after = apply(&node(), &plan.patch).unwrap();
        assert_eq!(after.spec.unwrap().provider_id.as_deref(), Some("fake://n1"));
    }

    #[test]
    fn n6_n7_n8_labels_set_ga_and_beta_copies() {
        let plan = plan_initialization(&node(), &meta()).unwrap();
        let after = apply(&node(), &plan.patch).unwrap();
        let labels = after.metadata.labels.unwrap();
        for (k, v) in [
            (LABEL_INSTANCE_TYPE, "m5.large"),
            (LABEL_INSTANCE_TYPE_BETA, "m5.large"),
            (LABEL_ZONE, "z1"),
            (LABEL_ZONE_BETA, "z1"),
            (LABEL_REGION, "r1"),
            (LABEL_REGION_BETA, "r1"),
            ("kubernetes.io/hostname", "n1"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    #[test]
    fn n6_existing_instance_type_is_overwritten_and_empty_values_are_skipped() {
        let mut n = node();
        n.metadata.labels.as_mut().unwrap().insert(LABEL_INSTANCE_TYPE.into(), "old".into());
        let m = InstanceMetadata { zone: String::new(), region: String::new(), ..meta() };
        let (labels, _) = init_labels(&n, &m);
        assert_eq!(labels.get(LABEL_INSTANCE_TYPE).map(String::as_str), Some("m5.large"));
        assert!(!labels.contains_key(LABEL_ZONE) && !labels.contains_key(LABEL_REGION_BETA));
    }

    #[test]
    fn n9_uninitialized_taint_is_removed_by_key_and_other_taints_stay() {
        let plan = plan_initialization(&node(), &meta()).unwrap();
        let after = apply(&node(), &plan.patch).unwrap();
        assert_eq!(after.spec.unwrap().taints.unwrap(), vec![taint("other", "NoExecute")]);
    }

    #[test]
    fn n9_taint_removal_is_rejected_when_the_taint_list_moved() {
        let plan = plan_initialization(&node(), &meta()).unwrap();
        let mut moved = node();
        moved.spec.as_mut().unwrap().taints.as_mut().unwrap().insert(0, taint("new", "NoSchedule"));
        assert!(apply(&moved, &plan.patch).is_err());
        // A taint appended after ours does not shift it: still applies and is kept.
        let mut appended = node();
        appended.spec.as_mut().unwrap().taints.as_mut().unwrap().push(taint("late", "NoSchedule"));
        let after = apply(&appended, &plan.patch).unwrap();
        assert_eq!(after.spec.unwrap().taints.unwrap().len(), 2);
    }

    #[test]
    fn n10_additional_labels_are_filtered() {
        let mut n = node();
        n.metadata.labels.as_mut().unwrap().insert("team".into(), "a".into());
        n.metadata.labels.as_mut().unwrap().insert("same".into(), "v".into());
        let m = InstanceMetadata {
            additional_labels: BTreeMap::from([
                ("kubernetes.io/x".into(), "1".into()),
                ("node.kubernetes.io/y".into(), "1".into()),
                ("k8s.io/z".into(), "1".into()),
                ("sub.k8s.io/z".into(), "1".into()),
                ("mykubernetes.io/ok".into(), "1".into()),
                ("example.com/ok".into(), "1".into()),
                ("team".into(), "b".into()),
                ("same".into(), "v".into()),
            ]),
            ..meta()
        };
        let (labels, warnings) = init_labels(&n, &m);
        assert_eq!(labels.get("mykubernetes.io/ok").map(String::as_str), Some("1"));
        assert_eq!(labels.get("example.com/ok").map(String::as_str), Some("1"));
        for gone in ["kubernetes.io/x", "node.kubernetes.io/y", "k8s.io/z", "sub.k8s.io/z", "team", "same"] {
            assert!(!labels.contains_key(gone), "{gone}");
        }
        assert!(warnings.contains(&LabelWarning::Conflicting("team".into())));
        assert!(warnings.contains(&LabelWarning::Reserved("sub.k8s.io/z".into())));
        assert_eq!(warnings.len(), 5, "four reserved keys and one conflict: {warnings:?}");
    }

    #[test]
    fn n10_reserved_key_matching_follows_the_upstream_pattern() {
        for (key, reserved) in [
            ("kubernetes.io/a", true),
            ("k8s.io/a", true),
            ("x.kubernetes.io/a", true),
            ("a.b.k8s.io/a", true),
            ("xkubernetes.io/a", false),
            ("example.com/kubernetes.io", false),
            ("kubernetes.io", false),
            ("plain", false),
        ] {
            assert_eq!(is_reserved_label_key(key), reserved, "{key}");
        }
    }

    #[test]
    fn n12_ga_labels_follow_beta_labels_and_missing_beta_changes_nothing() {
        let mut n = node();
        let labels = n.metadata.labels.as_mut().unwrap();
        labels.insert(LABEL_ZONE_BETA.into(), "z1".into());
        labels.insert(LABEL_REGION_BETA.into(), "r1".into());
        labels.insert(LABEL_REGION.into(), "stale".into());
        labels.insert(LABEL_INSTANCE_TYPE.into(), "ga-only".into());
        let want = reconcile_labels(&n);
        assert_eq!(
            want,
            BTreeMap::from([(LABEL_ZONE.to_string(), "z1".to_string()), (LABEL_REGION.to_string(), "r1".to_string())])
        );
        n.metadata.labels.as_mut().unwrap().extend(want);
        assert!(reconcile_labels(&n).is_empty(), "a reconciled Node needs nothing more");
    }

    #[test]
    fn n5_node_ip_annotation_parsing() {
        let ok = |s: &str| parse_node_ip_annotation(s).unwrap();
        assert_eq!(ok("10.0.0.1"), vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(ok("010.000.000.001"), vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(ok("10.0.0.1,fd00::1").len(), 2);
        assert_eq!(ok("fd00::1, 10.0.0.1").len(), 2);
        assert_eq!(ok("0.0.0.0").len(), 1, "a single unspecified IP parses");
        use NodeIpError::*;
        let err = |s: &str| parse_node_ip_annotation(s).unwrap_err();
        assert_eq!(err("10.0.0.1,10.0.0.2"), NotSingleOrDualStack);
        assert_eq!(err("fd00::1,fd00::2"), NotSingleOrDualStack);
        assert_eq!(err("10.0.0.1,fd00::1,10.0.0.2"), NotSingleOrDualStack);
        assert_eq!(err("0.0.0.0,fd00::1"), UnspecifiedInDualStack);
        assert_eq!(err("10.0.0.1,::"), UnspecifiedInDualStack);
        assert_eq!(err("nope"), Unparsable("nope".into()));
        assert_eq!(err(""), Unparsable("".into()));
        assert_eq!(err("10.0.0.256"), Unparsable("10.0.0.256".into()));
    }

    #[test]
    fn n5_node_ip_must_be_a_cloud_address_before_untainting() {
        let n = with_node_ip(node(), "10.0.0.9");
        let err = plan_initialization(&n, &meta()).unwrap_err();
        assert_eq!(err, InitError::InvalidNodeIp(NodeIpError::NotACloudAddress("10.0.0.9".parse().unwrap())));
        assert!(err.to_string().contains("provided node ip"));
        let n = with_node_ip(node(), "10.0.0.1");
        assert!(plan_initialization(&n, &meta()).is_ok());
        let n = with_node_ip(node(), "bad,ip");
        assert!(matches!(plan_initialization(&n, &meta()), Err(InitError::InvalidNodeIp(NodeIpError::Unparsable(_)))));
    }

    #[test]
    fn n16_worked_example_from_the_reference() {
        let cloud = [addr("InternalIP", "10.0.0.1"), addr("InternalIP", "10.0.0.2"), addr("ExternalIP", "1.2.3.4")];
        let got = filter_addresses_by_node_ips(&cloud, &["10.0.0.2".parse().unwrap()]).unwrap();
        assert_eq!(got, vec![addr("InternalIP", "10.0.0.2"), addr("ExternalIP", "1.2.3.4")]);
    }

    #[test]
    fn n16_dual_stack_node_ip_table() {
        let cloud = [
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "10.0.0.2"),
            addr("InternalIP", "fd00::1"),
            addr("InternalIP", "fd00::2"),
            addr("ExternalIP", "1.2.3.4"),
            addr("ExternalIP", "2001:db8::1"),
            addr("Hostname", "n1"),
        ];
        let ips = |s: &str| parse_node_ip_annotation(s).unwrap();
        let cases: [(&str, Result<Vec<NodeAddress>, NodeIpError>); 5] = [
            (
                "10.0.0.2,fd00::2",
                Ok(vec![
                    addr("InternalIP", "10.0.0.2"),
                    addr("InternalIP", "fd00::2"),
                    addr("ExternalIP", "1.2.3.4"),
                    addr("ExternalIP", "2001:db8::1"),
                    addr("Hostname", "n1"),
                ]),
            ),
            (
                "fd00::1,10.0.0.1",
                Ok(vec![
                    addr("InternalIP", "fd00::1"),
                    addr("InternalIP", "10.0.0.1"),
                    addr("ExternalIP", "1.2.3.4"),
                    addr("ExternalIP", "2001:db8::1"),
                    addr("Hostname", "n1"),
                ]),
            ),
            (
                // One internal and one external IP: each type keeps only its match.
                "10.0.0.1,2001:db8::1",
                Ok(vec![addr("InternalIP", "10.0.0.1"), addr("ExternalIP", "2001:db8::1"), addr("Hostname", "n1")]),
            ),
            ("10.0.0.1,fd00::9", Err(NodeIpError::NotACloudAddress("fd00::9".parse().unwrap()))),
            (
                "fd00:0:0:0:0:0:0:2",
                Ok(vec![
                    addr("InternalIP", "fd00::2"),
                    addr("ExternalIP", "1.2.3.4"),
                    addr("ExternalIP", "2001:db8::1"),
                    addr("Hostname", "n1"),
                ]),
            ),
        ];
        for (annotation, want) in cases {
            assert_eq!(filter_addresses_by_node_ips(&cloud, &ips(annotation)), want, "{annotation}");
        }
    }

    #[test]
    fn n14_no_cloud_addresses_means_no_change() {
        assert_eq!(desired_addresses(&node(), &[]), AddressDecision::NoCloudAddresses);
    }

    #[test]
    fn n15_node_hostname_is_kept_when_the_cloud_has_none() {
        let d = desired_addresses(&node(), &[addr("InternalIP", "10.0.0.1")]);
        assert_eq!(d, AddressDecision::Changed(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")]));
        let d = desired_addresses(&node(), &[addr("InternalIP", "10.0.0.1"), addr("Hostname", "cloud-name")]);
        assert_eq!(d, AddressDecision::Changed(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "cloud-name")]));
    }

    #[test]
    fn n16_unknown_node_ip_changes_nothing() {
        let n = with_node_ip(node(), "10.9.9.9");
        assert!(matches!(desired_addresses(&n, &[addr("InternalIP", "10.0.0.1")]), AddressDecision::Invalid(_)));
    }

    #[test]
    fn n17_change_detection_handles_same_type_addresses_and_reordering() {
        let dual = vec![addr("InternalIP", "10.0.0.1"), addr("InternalIP", "fd00::1")];
        assert!(!addresses_changed(&dual, &dual.clone()), "two InternalIPs unchanged is no change (§6 item 2)");
        let swapped = vec![dual[1].clone(), dual[0].clone()];
        assert!(addresses_changed(&dual, &swapped), "reordering within a type is a change");
        let a = vec![addr("InternalIP", "10.0.0.1"), addr("ExternalIP", "1.2.3.4")];
        let b = vec![addr("ExternalIP", "1.2.3.4"), addr("InternalIP", "10.0.0.1")];
        assert!(addresses_changed(&a, &b), "reordering across types is a change");
        let c = vec![addr("InternalIP", "10.0.0.1"), addr("InternalIP", "10.0.0.2")];
        assert!(addresses_changed(&dual, &c), "same types, one address differs");
        assert!(addresses_changed(&dual, &dual[..1]));

        let mut n = node();
        n.status.as_mut().unwrap().addresses = Some(vec![dual[0].clone(), dual[1].clone(), addr("Hostname", "n1")]);
        assert_eq!(desired_addresses(&n, &dual), AddressDecision::Unchanged);
    }

    #[test]
    fn address_patch_replaces_only_addresses() {
        let p = addresses_patch(&[addr("InternalIP", "10.0.0.1")]);
        assert_eq!(p, json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}));
    }

    #[test]
    fn label_ops_escape_keys_and_create_the_map_when_missing() {
        let labels = BTreeMap::from([("a/b~c".to_string(), "v".to_string())]);
        let ops = label_ops(&node(), &labels);
        assert_eq!(ops, vec![json!({"op": "add", "path": "/metadata/labels/a~1b~0c", "value": "v"})]);
        let after = apply(&node(), &Value::Array(ops)).unwrap();
        assert_eq!(after.metadata.labels.unwrap().get("a/b~c").map(String::as_str), Some("v"));
        let mut bare = node();
        bare.metadata.labels = None;
        let after = apply(&bare, &Value::Array(label_ops(&bare, &labels))).unwrap();
        assert_eq!(after.metadata.labels.unwrap().len(), 1);
    }

    #[test]
    fn shutdown_taint_ops_add_and_remove() {
        let shutdown = taint(TAINT_SHUTDOWN, "NoSchedule");
        let added = apply(&node(), &Value::Array(add_taint_ops(&node(), &shutdown))).unwrap();
        assert_eq!(added.spec.as_ref().unwrap().taints.as_ref().unwrap().last(), Some(&shutdown));
        let mut bare = node();
        bare.spec.as_mut().unwrap().taints = None;
        let added_bare = apply(&bare, &Value::Array(add_taint_ops(&bare, &shutdown))).unwrap();
        assert_eq!(added_bare.spec.unwrap().taints.unwrap(), vec![shutdown.clone()]);
        let removed = apply(
            &added,
            &Value::Array(remove_taint_ops(&added, |t| t.key == TAINT_SHUTDOWN && t.effect == "NoSchedule")),
        )
        .unwrap();
        assert!(!has_taint_key(&removed, TAINT_SHUTDOWN));
        assert!(is_uninitialized(&removed));
    }

    #[test]
    fn status_only_changes_are_recognised() {
        let a = node();
        let mut b = node();
        b.status.as_mut().unwrap().addresses = None;
        b.metadata.resource_version = Some("9".into());
        assert!(is_status_only_change(&a, &b));
        b.metadata.labels.as_mut().unwrap().insert("x".into(), "y".into());
        assert!(!is_status_only_change(&a, &b));
    }
}
