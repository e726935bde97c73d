//! Leader migration (upstream KEP-2436): the `LeaderMigrationConfiguration` file and which
//! controllers run under which Lease.
//!
//! With migration on, a manager holds its main Lease and runs the controllers the configuration
//! does not name; then it takes a second Lease, named by `leaderName`, and runs the controllers
//! the configuration assigns to this component (`cloud-controller-manager`) or to `*`.
//! Controllers assigned to another component do not run here. Two managers (upstream's and
//! ours, or two of ours) that share the migration Lease therefore never run a migrated
//! controller at the same time, and hand it over when the holder stops.
//!
//! Everything here is pure: parsing (bounded, strict, errors naming the field and never quoting
//! the file, through [`crate::safe_yaml`]), upstream's validation, upstream's default, and the
//! per-controller decision ([`LeaderMigrationConfiguration::placement`]).
//!
//! Versions, checked against the upstream v1.36 binary: `controllermanager.config.k8s.io/v1alpha1`,
//! `v1beta1` and `v1` are read. The older two require `resourceLock`; `v1` has no such field
//! (Leases only) and refuses it as an unknown field, as upstream does. Deliberate differences from upstream, all stricter:
//! `resourceLock: endpoints` is refused (only Leases exist here), two entries naming the same
//! controller (also by its alias) are refused instead of the last one winning silently, and
//! `leaderName` must be a valid Lease name.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::safe_yaml::{self, DocumentError, FieldPath, Limits, Problem, Schema};

/// The API group of the configuration file.
pub const GROUP: &str = "controllermanager.config.k8s.io";
/// The kind of the configuration file.
pub const KIND: &str = "LeaderMigrationConfiguration";
/// The `apiVersion`s read, oldest first (the ones upstream v1.36 accepts).
pub const API_VERSIONS: [&str; 3] = [
    "controllermanager.config.k8s.io/v1alpha1",
    "controllermanager.config.k8s.io/v1beta1",
    "controllermanager.config.k8s.io/v1",
];
/// The `apiVersion` this crate writes.
pub const WRITTEN_API_VERSION: &str = "controllermanager.config.k8s.io/v1";
/// The only lock kind supported.
pub const RESOURCE_LOCK_LEASES: &str = "leases";
/// Upstream's default migration Lease name.
pub const DEFAULT_LEADER_NAME: &str = "cloud-provider-extraction-migration";
/// This manager's component name, as upstream's cloud-controller-manager calls itself, so a
/// file written for the upstream manager applies unchanged.
pub const COMPONENT: &str = "cloud-controller-manager";
/// The component value that matches every component.
pub const ANY_COMPONENT: &str = "*";
/// The most `controllerLeaders` entries read.
pub const MAX_CONTROLLER_LEADERS: usize = 64;
/// The longest name or component accepted (a DNS subdomain's limit).
pub const MAX_NAME_LENGTH: usize = 253;
/// Size and nesting limits of the file: it is a few lines long.
pub const LIMITS: Limits = Limits { max_bytes: 64 << 10, max_depth: 16, max_expansion: 10 };

/// One `controllerLeaders` entry: which component runs a controller during the migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllerLeader {
    /// The controller's name (ours: canonical name or alias, e.g. `service` or
    /// `service-lb-controller`).
    #[serde(default)]
    pub name: String,
    /// The component that runs it: `cloud-controller-manager`, `kube-controller-manager`, or `*`.
    #[serde(default)]
    pub component: String,
}

impl ControllerLeader {
    /// An entry.
    pub fn new(name: impl Into<String>, component: impl Into<String>) -> Self {
        Self { name: name.into(), component: component.into() }
    }
}

/// A validated leader-migration configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderMigrationConfiguration {
    /// The migration Lease's name (in the main Lease's namespace).
    pub leader_name: String,
    /// The controllers under migration and who runs each.
    pub controller_leaders: Vec<ControllerLeader>,
}

/// Where a controller runs under leader migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Not named by the configuration: runs under the main Lease.
    Main,
    /// Named for this component (or `*`): runs under the migration Lease.
    Migrated,
    /// Named for another component: does not run here.
    OtherComponent {
        /// The component that runs it.
        component: String,
    },
}

/// The file as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    leader_name: String,
    resource_lock: Option<String>,
    #[serde(default)]
    controller_leaders: Vec<ControllerLeader>,
}

/// The file as written by [`LeaderMigrationConfiguration::to_yaml`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Written<'a> {
    api_version: &'static str,
    kind: &'static str,
    leader_name: &'a str,
    controller_leaders: &'a [ControllerLeader],
}

fn schema() -> &'static Schema {
    static SCHEMA: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| Schema::new().with::<Document>().with::<ControllerLeader>())
}

fn at(path: FieldPath, text: &'static str) -> DocumentError {
    DocumentError::invalid(path, text)
}

/// The key two entries clash on: the canonical name for our controllers (so `service` and
/// `service-lb-controller` are the same), the name itself otherwise.
fn controller_key(name: &str) -> &str {
    crds::controllers::Controller::from_name(name).map_or(name, |c| c.name())
}

impl LeaderMigrationConfiguration {
    /// Upstream's configuration when migration is on and no file is given: Lease
    /// `cloud-provider-extraction-migration`, and `route`, `service` and `cloud-node-lifecycle`
    /// for any component.
    pub fn upstream_default() -> Self {
        Self {
            leader_name: DEFAULT_LEADER_NAME.to_string(),
            controller_leaders: ["route", "service", "cloud-node-lifecycle"]
                .into_iter()
                .map(|name| ControllerLeader::new(name, ANY_COMPONENT))
                .collect(),
        }
    }

    /// Parse and validate a file's bytes. Errors name the field and never quote the file.
    pub fn parse(bytes: &[u8]) -> Result<Self, DocumentError> {
        let doc: Document = safe_yaml::from_slice(bytes, &LIMITS, schema())?;
        let root = FieldPath::root();
        let version = match doc.api_version.as_deref() {
            None | Some("") => return Err(at(root.field("apiVersion"), "is required")),
            Some(v) => API_VERSIONS.iter().position(|known| *known == v).ok_or_else(|| {
                DocumentError::at(root.field("apiVersion"), Problem::UnknownVariant { allowed: API_VERSIONS.to_vec() })
            })?,
        };
        match doc.kind.as_deref() {
            None | Some("") => return Err(at(root.field("kind"), "is required")),
            Some(KIND) => {}
            Some(_) => {
                return Err(DocumentError::at(root.field("kind"), Problem::UnknownVariant { allowed: vec![KIND] }));
            }
        }
        // v1 dropped the field (Leases only); the older versions require it (checked against
        // the upstream binary).
        let is_v1 = version == API_VERSIONS.len() - 1;
        match (is_v1, doc.resource_lock.as_deref()) {
            (true, None) | (false, Some(RESOURCE_LOCK_LEASES)) => {}
            (true, Some(_)) => {
                return Err(at(
                    root.field("resourceLock"),
                    "is not a field of controllermanager.config.k8s.io/v1, which uses Leases only; remove it",
                ));
            }
            (false, _) => {
                return Err(DocumentError::at(
                    root.field("resourceLock"),
                    Problem::UnknownVariant { allowed: vec![RESOURCE_LOCK_LEASES] },
                ));
            }
        }
        let config = Self { leader_name: doc.leader_name, controller_leaders: doc.controller_leaders };
        config.validate()?;
        Ok(config)
    }

    /// Upstream's checks (leaderName set, each entry's name and component set) plus ours
    /// (a valid Lease name, bounded lengths, no controller named twice).
    pub fn validate(&self) -> Result<(), DocumentError> {
        let root = FieldPath::root();
        if self.leader_name.is_empty() {
            return Err(at(root.field("leaderName"), "is required: the name of the migration Lease"));
        }
        if !crds::validation::is_dns_subdomain(&self.leader_name) {
            return Err(at(
                root.field("leaderName"),
                "must be a valid Lease name: lowercase letters, digits, '-' and '.', at most 253 characters",
            ));
        }
        let list = root.field("controllerLeaders");
        if self.controller_leaders.len() > MAX_CONTROLLER_LEADERS {
            return Err(at(list, "holds more than 64 entries"));
        }
        for (i, leader) in self.controller_leaders.iter().enumerate() {
            let item = list.index(i);
            if leader.name.is_empty() {
                return Err(at(item.field("name"), "is required"));
            }
            if leader.name.len() > MAX_NAME_LENGTH {
                return Err(at(item.field("name"), "is longer than 253 characters"));
            }
            if leader.component.is_empty() {
                return Err(at(item.field("component"), "is required: a component name or *"));
            }
            if leader.component.len() > MAX_NAME_LENGTH {
                return Err(at(item.field("component"), "is longer than 253 characters"));
            }
            let key = controller_key(&leader.name);
            if let Some(first) = self.controller_leaders[..i].iter().position(|l| controller_key(&l.name) == key) {
                return Err(DocumentError::at(
                    item.field("name"),
                    Problem::Clash { how: "names the same controller as", other: list.index(first) },
                ));
            }
        }
        Ok(())
    }

    /// Read, parse and validate the file at `path` (at most [`LIMITS`] bytes are read).
    pub fn read_file(path: &Path) -> Result<Self, String> {
        use std::io::Read;
        let file = std::fs::File::open(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let mut bytes = Vec::new();
        file.take(LIMITS.max_bytes as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The file this configuration is read back from (JSON, which is YAML), in
    /// [`WRITTEN_API_VERSION`].
    pub fn to_yaml(&self) -> String {
        let written = Written {
            api_version: WRITTEN_API_VERSION,
            kind: KIND,
            leader_name: &self.leader_name,
            controller_leaders: &self.controller_leaders,
        };
        // Serializing plain strings cannot fail.
        serde_json::to_string_pretty(&written).unwrap_or_default()
    }

    /// Where `controller` (a canonical name or alias of ours, or a vendor controller's name)
    /// runs. An entry matches by exact name, or by naming the same built-in controller.
    pub fn placement(&self, controller: &str) -> Placement {
        let key = controller_key(controller);
        match self.controller_leaders.iter().find(|l| controller_key(&l.name) == key) {
            None => Placement::Main,
            Some(l) if l.component == COMPONENT || l.component == ANY_COMPONENT => Placement::Migrated,
            Some(l) => Placement::OtherComponent { component: l.component.clone() },
        }
    }

    /// Entries that name none of `controllers` (they may be another component's controllers:
    /// the same file is often given to kube-controller-manager too).
    pub fn unmatched<'a>(&'a self, controllers: &[&str]) -> Vec<&'a str> {
        self.controller_leaders
            .iter()
            .filter(|l| !controllers.iter().any(|c| controller_key(c) == controller_key(&l.name)))
            .map(|l| l.name.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(version: &str, body: &str) -> Vec<u8> {
        format!("apiVersion: controllermanager.config.k8s.io/{version}\nkind: LeaderMigrationConfiguration\n{body}")
            .into_bytes()
    }

    fn refused(bytes: &[u8]) -> String {
        LeaderMigrationConfiguration::parse(bytes).expect_err("must be refused").to_string()
    }

    const BODY: &str = "leaderName: my-migration\ncontrollerLeaders:\n  - name: route\n    component: '*'\n  - name: service-lb-controller\n    component: cloud-controller-manager\n";

    /// `BODY` as `version` takes it: the older versions also name the lock.
    fn body(version: &str) -> String {
        if version == "v1" { BODY.to_string() } else { format!("resourceLock: leases\n{BODY}") }
    }

    #[test]
    fn m7_each_version_upstream_accepts_is_read() {
        for version in ["v1alpha1", "v1beta1", "v1"] {
            let c = LeaderMigrationConfiguration::parse(&doc(version, &body(version)))
                .unwrap_or_else(|e| panic!("{version}: {e}"));
            assert_eq!(c.leader_name, "my-migration");
            assert_eq!(
                c.controller_leaders,
                [ControllerLeader::new("route", "*"), ControllerLeader::new("service-lb-controller", COMPONENT)]
            );
        }
        let msg = refused(&doc("v2", &body("v1alpha1")));
        assert!(msg.starts_with("apiVersion:"), "{msg}");
        assert!(!msg.contains("v2"), "the value is not quoted: {msg}");
    }

    #[test]
    fn m7_the_older_versions_require_resource_lock_leases_and_v1_has_no_such_field() {
        let body = "leaderName: m\n";
        assert!(LeaderMigrationConfiguration::parse(&doc("v1", body)).is_ok());
        for version in ["v1alpha1", "v1beta1"] {
            assert!(refused(&doc(version, body)).starts_with("resourceLock:"), "{version}");
            let msg = refused(&doc(version, "leaderName: m\nresourceLock: endpoints\n"));
            assert!(msg.starts_with("resourceLock:") && msg.contains("leases"), "{msg}");
            assert!(!msg.contains("endpoints"), "{msg}");
        }
        let msg = refused(&doc("v1", "leaderName: m\nresourceLock: leases\n"));
        assert!(msg.starts_with("resourceLock: is not a field"), "{msg}");
    }

    #[test]
    fn m7_each_validation_error_names_its_field_and_never_quotes_the_file() {
        let cases: [(&str, &str); 9] = [
            ("resourceLock: leases\n", "leaderName:"),
            ("leaderName: Not_A-Lease-Name-SECRET\nresourceLock: leases\n", "leaderName:"),
            (
                "leaderName: m\nresourceLock: leases\ncontrollerLeaders: [{name: '', component: x}]\n",
                "controllerLeaders[0].name:",
            ),
            (
                "leaderName: m\nresourceLock: leases\ncontrollerLeaders: [{name: route, component: ''}]\n",
                "controllerLeaders[0].component:",
            ),
            (
                "leaderName: m\nresourceLock: leases\ncontrollerLeaders: [{name: route}]\n",
                "controllerLeaders[0].component:",
            ),
            (
                "leaderName: m\nresourceLock: leases\ncontrollerLeaders: [{name: route, component: a}, {name: node-route-controller, component: b}]\n",
                "controllerLeaders[1].name: names the same controller as controllerLeaders[0]",
            ),
            ("leaderName: m\nresourceLock: leases\nSECRET: 1\n", "document: has an unknown field"),
            (
                "leaderName: m\nresourceLock: leases\ncontrollerLeaders: [{name: a, component: b, SECRET: c}]\n",
                "controllerLeaders[0]: has an unknown field",
            ),
            ("leaderName: [SECRET]\n", "leaderName:"),
        ];
        for (body, expected) in cases {
            let msg = refused(&doc("v1alpha1", body));
            assert!(msg.starts_with(expected), "{body:?}: {msg}");
            assert!(!msg.contains("SECRET"), "{body:?}: {msg}");
        }
        assert!(refused(b"kind: LeaderMigrationConfiguration\nleaderName: m\n").starts_with("apiVersion:"));
        assert!(refused(b"apiVersion: controllermanager.config.k8s.io/v1\nleaderName: m\n").starts_with("kind:"));
        let msg = refused(b"apiVersion: controllermanager.config.k8s.io/v1\nkind: SECRET\nleaderName: m\n");
        assert!(msg.starts_with("kind:") && !msg.contains("SECRET"), "{msg}");
    }

    #[test]
    fn m7_the_file_is_bounded_in_size_and_entries() {
        let mut big = doc("v1", "leaderName: m\n");
        big.extend(std::iter::repeat_n(b'#', LIMITS.max_bytes));
        assert!(refused(&big).contains("larger than the limit"));
        let entries: String =
            (0..=MAX_CONTROLLER_LEADERS).map(|i| format!("  - {{name: c{i}, component: x}}\n")).collect();
        let msg = refused(&doc("v1", &format!("leaderName: m\ncontrollerLeaders:\n{entries}")));
        assert!(msg.starts_with("controllerLeaders: holds more than 64"), "{msg}");
        for (name, hostile, _) in safe_yaml::hostile::all() {
            assert!(LeaderMigrationConfiguration::parse(&hostile).is_err(), "{name}");
        }
    }

    #[test]
    fn m7_upstreams_default_migrates_route_service_and_lifecycle_for_any_component() {
        let d = LeaderMigrationConfiguration::upstream_default();
        assert_eq!(d.leader_name, "cloud-provider-extraction-migration");
        assert!(d.validate().is_ok());
        use crds::controllers::{CLOUD_NODE, CLOUD_NODE_LIFECYCLE, NODE_ROUTE, SERVICE_LB};
        assert_eq!(d.placement(CLOUD_NODE), Placement::Main);
        for c in [CLOUD_NODE_LIFECYCLE, NODE_ROUTE, SERVICE_LB] {
            assert_eq!(d.placement(c), Placement::Migrated, "{c}");
        }
    }

    #[test]
    fn m7_the_filter_matches_aliases_any_component_and_leaves_other_components_controllers_alone() {
        let c = LeaderMigrationConfiguration {
            leader_name: "m".into(),
            controller_leaders: vec![
                ControllerLeader::new("service", COMPONENT),
                ControllerLeader::new("cloud-node-lifecycle-controller", "*"),
                ControllerLeader::new("route", "kube-controller-manager"),
                ControllerLeader::new("tagging", COMPONENT),
                ControllerLeader::new("nodeipam", "kube-controller-manager"),
            ],
        };
        assert_eq!(c.placement("service-lb-controller"), Placement::Migrated);
        assert_eq!(c.placement("service"), Placement::Migrated);
        assert_eq!(c.placement("cloud-node-lifecycle"), Placement::Migrated);
        assert_eq!(
            c.placement("node-route-controller"),
            Placement::OtherComponent { component: "kube-controller-manager".into() }
        );
        assert_eq!(c.placement("cloud-node-controller"), Placement::Main);
        // A vendor controller matches by its exact name.
        assert_eq!(c.placement("tagging"), Placement::Migrated);
        assert_eq!(c.placement("other"), Placement::Main);
        assert_eq!(
            c.unmatched(&["cloud-node-controller", "service-lb-controller", "tagging"]),
            ["cloud-node-lifecycle-controller", "route", "nodeipam"]
        );
    }

    #[test]
    fn a_written_configuration_reads_back_equal() {
        let c = LeaderMigrationConfiguration {
            leader_name: "moving.example".into(),
            controller_leaders: vec![
                ControllerLeader::new("cloud-node", "*"),
                ControllerLeader::new("service", COMPONENT),
            ],
        };
        assert_eq!(LeaderMigrationConfiguration::parse(c.to_yaml().as_bytes()), Ok(c));
    }
}
