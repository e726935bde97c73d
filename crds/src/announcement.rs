//! `ServiceAnnouncement`, API group `ccm.rs`, version `v1alpha1`: which node answers ARP or NDP
//! for a Service's addresses, and since when. The `baremetal` provider's L2 announcers write one
//! per Service and answering node in their own namespace (docs/l2-announcement.md, "Which node
//! answers"); like an EndpointSlice it is a record written by a controller, not a request.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The most addresses a record lists (an announcer announces at most 16 per Service).
pub const MAX_ANNOUNCED_ADDRESSES: usize = 16;
/// The most interfaces a record lists (`loadBalancer.announcement.l2.interfaces` has at most 16).
pub const MAX_ANNOUNCED_INTERFACES: usize = 16;
/// The label every record carries, with value [`ANNOUNCEMENT_LABEL_VALUE`].
pub const ANNOUNCEMENT_LABEL: &str = "ccm.rs/announcer";
/// The value of [`ANNOUNCEMENT_LABEL`] on records of L2 announcers.
pub const ANNOUNCEMENT_LABEL_VALUE: &str = "l2";

/// Which node answers for a Service's load-balancer addresses, written by that node's announcer.
// Clippy reads printcolumns of the same `type_` as one attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ccm.rs",
    version = "v1alpha1",
    kind = "ServiceAnnouncement",
    plural = "serviceannouncements",
    shortname = "svcann",
    category = "cloud",
    namespaced,
    derive = "PartialEq",
    doc = "Which node answers ARP or NDP for a LoadBalancer Service's addresses, and since when; written by the baremetal provider's L2 announcer on that node.",
    printcolumn(name = "Service Namespace", type_ = "string", json_path = ".spec.service.namespace"),
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.service.name"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.addresses[0].address"),
    printcolumn(name = "Since", type_ = "date", json_path = ".spec.since")
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAnnouncementSpec {
    /// The node whose announcer answers for these addresses.
    #[schemars(length(max = 253))]
    pub node: String,
    /// The Service the addresses belong to.
    pub service: AnnouncedService,
    /// When this node started answering for the first of these addresses (microseconds: a
    /// failover takes well under a second).
    pub since: MicroTime,
    /// The addresses this node answers for, each with its protocol and since when.
    #[schemars(length(max = 16))]
    pub addresses: Vec<AnnouncedAddress>,
    /// The interfaces the node answers on (`loadBalancer.announcement.l2.interfaces`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 15)))]
    pub interfaces: Vec<String>,
}

/// A Service, by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema)]
pub struct AnnouncedService {
    /// The Service's namespace.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// The Service's name.
    #[schemars(length(max = 63))]
    pub name: String,
}

/// One address a node answers for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
pub struct AnnouncedAddress {
    /// The address, as in the Service's `status.loadBalancer.ingress`.
    #[schemars(length(max = 45))]
    pub address: String,
    /// `ARP` for IPv4, `NDP` for IPv6.
    pub protocol: AnnouncementProtocol,
    /// When this node started answering for it.
    pub since: MicroTime,
}

/// How a node answers for an address.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum AnnouncementProtocol {
    /// Address Resolution Protocol (IPv4).
    #[serde(rename = "ARP")]
    Arp,
    /// Neighbor Discovery (IPv6).
    #[serde(rename = "NDP")]
    Ndp,
}
