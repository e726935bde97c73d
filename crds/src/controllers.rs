//! Controller names and the upstream `--controllers` list semantics.
//!
//! Shared by the CRD (allowed entries), the operator (resolved status list) and the
//! manager (the `--controllers` flag), so all three agree on one reading of a list.

use std::fmt;

/// The cloud-node controller: initializes Nodes from cloud metadata.
pub const CLOUD_NODE: &str = "cloud-node-controller";
/// The cloud-node-lifecycle controller: taints shut-down Nodes and deletes vanished ones.
pub const CLOUD_NODE_LIFECYCLE: &str = "cloud-node-lifecycle-controller";
/// The service controller: provisions load balancers for `type: LoadBalancer` Services.
pub const SERVICE_LB: &str = "service-lb-controller";
/// The route controller: programs pod-network routes in the cloud.
pub const NODE_ROUTE: &str = "node-route-controller";

/// Every controller, as `(canonical name, alias)`, in the order the manager starts them.
pub const KNOWN: [(&str, &str); 4] = [
    (CLOUD_NODE, "cloud-node"),
    (CLOUD_NODE_LIFECYCLE, "cloud-node-lifecycle"),
    (SERVICE_LB, "service"),
    (NODE_ROUTE, "route"),
];

/// An entry of a `--controllers` list that names no known controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?} is not in the list of known controllers ({known})", known = known_names().join(", "))]
pub struct UnknownController {
    /// The offending entry, as given.
    pub entry: String,
}

/// Canonical names of every known controller.
pub fn known_names() -> Vec<&'static str> {
    KNOWN.iter().map(|(name, _)| *name).collect()
}

/// The canonical name for a controller name or alias, or `None` if unknown.
pub fn canonical(name: &str) -> Option<&'static str> {
    KNOWN.iter().find(|(canonical, alias)| name == *canonical || name == *alias).map(|(canonical, _)| *canonical)
}

/// Every string allowed as an entry: `*`, each name and alias, and each of those with `-`.
pub fn allowed_entries() -> Vec<String> {
    let mut out = vec!["*".to_string()];
    for (name, alias) in KNOWN {
        for n in [name, alias] {
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
            let canonical = canonical(name).ok_or_else(|| UnknownController { entry: entry.to_string() })?;
            resolved.push(format!("{prefix}{canonical}"));
        }
        Ok(Self { entries: resolved })
    }

    /// Whether `name` (canonical) is enabled: the first entry naming it wins; otherwise it
    /// runs only when `*` appears somewhere in the list.
    pub fn is_enabled(&self, name: &str) -> bool {
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

    /// Canonical names of the enabled controllers, in start order.
    pub fn enabled(&self) -> Vec<&'static str> {
        KNOWN.iter().map(|(name, _)| *name).filter(|name| self.is_enabled(name)).collect()
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
        ControllerSelection::parse(list).unwrap().enabled()
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
