//! Controller names and the upstream `--controllers` list semantics.
//!
//! Shared by the CRD (allowed entries), the operator (resolved status list) and the
//! manager (the `--controllers` flag), so all three agree on one reading of a list.

use std::fmt;

/// A controller the manager runs: the one typing of controller names, used by the CRD (allowed
/// entries), the operator (resolved status list, conflicts) and the manager (the `--controllers`
/// flag and the controllers it starts), so a name cannot mean a controller in one and nothing in
/// another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    /// Initializes Nodes from cloud metadata.
    CloudNode,
    /// Taints shut-down Nodes and deletes vanished ones.
    CloudNodeLifecycle,
    /// Provisions load balancers for `type: LoadBalancer` Services.
    ServiceLb,
    /// Programs pod-network routes in the cloud.
    NodeRoute,
}

impl Controller {
    /// Every controller, in the order the manager starts them.
    pub const ALL: [Controller; 4] =
        [Controller::CloudNode, Controller::CloudNodeLifecycle, Controller::ServiceLb, Controller::NodeRoute];

    /// The canonical name (`--controllers`, `/healthz/<name>`, `status.controllers`).
    pub const fn name(self) -> &'static str {
        match self {
            Controller::CloudNode => "cloud-node-controller",
            Controller::CloudNodeLifecycle => "cloud-node-lifecycle-controller",
            Controller::ServiceLb => "service-lb-controller",
            Controller::NodeRoute => "node-route-controller",
        }
    }

    /// Upstream's short alias, also its legacy metric name.
    pub const fn alias(self) -> &'static str {
        match self {
            Controller::CloudNode => "cloud-node",
            Controller::CloudNodeLifecycle => "cloud-node-lifecycle",
            Controller::ServiceLb => "service",
            Controller::NodeRoute => "route",
        }
    }

    /// The controller a canonical name or alias names, or `None` if unknown.
    pub fn from_name(name: &str) -> Option<Controller> {
        Controller::ALL.into_iter().find(|c| name == c.name() || name == c.alias())
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The cloud-node controller's name.
pub const CLOUD_NODE: &str = Controller::CloudNode.name();
/// The cloud-node-lifecycle controller's name.
pub const CLOUD_NODE_LIFECYCLE: &str = Controller::CloudNodeLifecycle.name();
/// The service controller's name.
pub const SERVICE_LB: &str = Controller::ServiceLb.name();
/// The route controller's name.
pub const NODE_ROUTE: &str = Controller::NodeRoute.name();

/// Whether the route controller runs: the one place this is decided. It must be enabled,
/// `--configure-cloud-routes` (`spec.configureCloudRoutes`) on, and the provider must program
/// routes.
pub fn route_controller_runs(
    controllers: &ControllerSelection,
    configure_cloud_routes: bool,
    provider_has_routes: bool,
) -> bool {
    controllers.is_enabled(Controller::NodeRoute) && configure_cloud_routes && provider_has_routes
}

/// An entry of a `--controllers` list that names no known controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?} is not in the list of known controllers ({known})", known = known_names().join(", "))]
pub struct UnknownController {
    /// The offending entry, as given.
    pub entry: String,
}

/// Canonical names of every known controller.
pub fn known_names() -> Vec<&'static str> {
    Controller::ALL.iter().map(|c| c.name()).collect()
}

/// Every string allowed as an entry: `*`, each name and alias, and each of those with `-`.
pub fn allowed_entries() -> Vec<String> {
    let mut out = vec!["*".to_string()];
    for c in Controller::ALL {
        for n in [c.name(), c.alias()] {
            out.push(n.to_string());
            out.push(format!("-{n}"));
        }
    }
    out
}

/// A validated `--controllers` list, with aliases rewritten to canonical names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    entries: Vec<String>,
}

impl ControllerSelection {
    /// Validate a list the way upstream does: each entry except `*`, after dropping a
    /// leading `-` and resolving aliases, must be a known controller.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, UnknownController> {
        let mut resolved = Vec::with_capacity(entries.len());
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry == "*" {
                resolved.push(entry.to_string());
                continue;
            }
            let (prefix, name) = match entry.strip_prefix('-') {
                Some(rest) => ("-", rest),
                None => ("", entry),
            };
            let controller =
                Controller::from_name(name).ok_or_else(|| UnknownController { entry: entry.to_string() })?;
            resolved.push(format!("{prefix}{controller}"));
        }
        Ok(Self { entries: resolved })
    }

    /// Whether `controller` is enabled: the first entry naming it wins; otherwise it runs only
    /// when `*` appears somewhere in the list.
    pub fn is_enabled(&self, controller: Controller) -> bool {
        let name = controller.name();
        for entry in &self.entries {
            if entry == name {
                return true;
            }
            if entry.strip_prefix('-') == Some(name) {
                return false;
            }
        }
        self.entries.iter().any(|e| e == "*")
    }

    /// The enabled controllers, in start order.
    pub fn enabled(&self) -> Vec<Controller> {
        Controller::ALL.into_iter().filter(|c| self.is_enabled(*c)).collect()
    }

    /// Canonical names of the enabled controllers, in start order (`status.controllers`).
    pub fn enabled_names(&self) -> Vec<String> {
        self.enabled().iter().map(|c| c.name().to_string()).collect()
    }

    /// Every controller enabled (`*`), the default.
    pub fn all() -> Self {
        Self { entries: vec!["*".to_string()] }
    }

    /// The normalized entries (aliases rewritten), suitable for a `--controllers` flag.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }
}

impl fmt::Display for ControllerSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.entries.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled(list: &[&str]) -> Vec<&'static str> {
        ControllerSelection::parse(list).unwrap().enabled().iter().map(|c| c.name()).collect()
    }

    #[test]
    fn m2_star_enables_every_controller() {
        assert_eq!(enabled(&["*"]), known_names());
    }

    #[test]
    fn m2_without_star_only_named_controllers_run() {
        assert_eq!(enabled(&["cloud-node", "route"]), vec![CLOUD_NODE, NODE_ROUTE]);
        assert!(enabled(&[]).is_empty());
    }

    #[test]
    fn m2_minus_disables_even_with_star() {
        assert_eq!(enabled(&["*", "-service"]), vec![CLOUD_NODE, CLOUD_NODE_LIFECYCLE, NODE_ROUTE]);
        assert_eq!(enabled(&["-service-lb-controller", "*"]), vec![CLOUD_NODE, CLOUD_NODE_LIFECYCLE, NODE_ROUTE]);
    }

    #[test]
    fn m2_first_match_wins() {
        assert_eq!(enabled(&["service", "-service"]), vec![SERVICE_LB]);
        assert!(enabled(&["-service", "service", "*"]).iter().all(|c| *c != SERVICE_LB));
    }

    #[test]
    fn every_controller_is_found_by_its_name_and_alias_and_nothing_else() {
        for c in Controller::ALL {
            assert_eq!(Controller::from_name(c.name()), Some(c));
            assert_eq!(Controller::from_name(c.alias()), Some(c));
        }
        assert_eq!(Controller::from_name("nodeipam"), None);
    }

    #[test]
    fn the_route_controller_runs_only_when_enabled_configured_and_supported() {
        let all = ControllerSelection::all();
        assert!(route_controller_runs(&all, true, true));
        assert!(!route_controller_runs(&all, false, true));
        assert!(!route_controller_runs(&all, true, false));
        assert!(!route_controller_runs(&ControllerSelection::parse(&["*", "-route"]).unwrap(), true, true));
    }

    #[test]
    fn m2_aliases_are_rewritten_keeping_the_minus() {
        let sel = ControllerSelection::parse(&["-cloud-node-lifecycle", "route", "*"]).unwrap();
        assert_eq!(sel.entries(), &["-cloud-node-lifecycle-controller", "node-route-controller", "*"]);
        assert_eq!(sel.to_string(), "-cloud-node-lifecycle-controller,node-route-controller,*");
    }

    #[test]
    fn m2_unknown_names_are_rejected_with_the_known_list() {
        let err = ControllerSelection::parse(&["*", "-bogus"]).unwrap_err();
        assert_eq!(err.entry, "-bogus");
        assert!(err.to_string().contains("not in the list of known controllers"));
        assert!(err.to_string().contains(SERVICE_LB));
        assert!(ControllerSelection::parse(&["nodeipam"]).is_err());
        assert!(ControllerSelection::parse(&["--service"]).is_err());
    }

    #[test]
    fn allowed_entries_cover_names_aliases_and_negations() {
        let allowed = allowed_entries();
        assert_eq!(allowed.len(), 1 + 4 * 4);
        for e in ["*", "service", "-service", "node-route-controller", "-cloud-node"] {
            assert!(allowed.iter().any(|a| a == e), "{e} missing");
        }
    }
}
