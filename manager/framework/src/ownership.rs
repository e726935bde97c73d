//! Node ownership (KEP-5778, provisional): which Nodes this manager may initialize, delete,
//! taint and route when several cloud-controller-managers share a cluster (pure).
//!
//! A Node's platform is the scheme of its `spec.providerID` (`aws` for `aws:///us-east-1a/i-1`)
//! or, while it has none, its [`PLATFORM_ANNOTATION`]. With `--cloud-provider-platforms`
//! empty (the default, upstream's behaviour) this manager owns every Node. Otherwise it owns
//! the Nodes whose platform it lists; a Node of another platform is foreign and left alone;
//! a Node with neither a providerID nor the annotation is unclaimed: the node controller may
//! look it up and initialize it (the KEP's default), but nothing deletes or taints it.

use k8s_openapi::api::core::v1::Node;

/// The annotation naming a Node's platform before it has a providerID (the KEP's name).
pub const PLATFORM_ANNOTATION: &str = "cloudprovider.kubernetes.io/platform";

/// Whose a Node is, for one manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// This manager's: every controller acts on it.
    Mine,
    /// Another platform's: no controller touches it.
    Foreign,
    /// No platform yet (no providerID, no annotation), and this manager owns only some: it may
    /// be initialized when the cloud knows it, never deleted or tainted.
    Unclaimed,
}

/// `--cloud-provider-platforms`, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOwnership {
    platforms: Vec<String>,
}

/// The platform of a providerID: its scheme (`aws` of `aws:///zone/i-1`); `None` without one.
pub fn platform_of_provider_id(provider_id: &str) -> Option<&str> {
    match provider_id.split_once("://") {
        Some((scheme, _)) if !scheme.is_empty() => Some(scheme),
        _ => None,
    }
}

/// The Node's platform: its providerID's scheme (a providerID without one, such as a bare
/// instance ID, is its own platform, so it never matches a listed scheme by accident), else the
/// annotation, else `None`.
pub fn platform_of(node: &Node) -> Option<&str> {
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.trim().is_empty());
    match provider_id {
        Some(id) => platform_of_provider_id(id.trim()).or(Some(id.trim())),
        None => node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PLATFORM_ANNOTATION))
            .map(|p| p.trim())
            .filter(|p| !p.is_empty()),
    }
}

/// Whether `name` can be a platform: a URI scheme (a letter, then letters, digits, `+`, `-`,
/// `.`), at most 63 characters; the CRD's `spec.nodePlatforms` rule.
pub use crds::validation::is_platform_name;

impl NodeOwnership {
    /// Owns every Node (upstream).
    pub fn all() -> Self {
        Self::default()
    }

    /// Owns the Nodes of `platforms` (empty entries dropped; none left: every Node). A name
    /// that cannot be a providerID scheme is refused, quoted.
    pub fn of<S: AsRef<str>>(platforms: &[S]) -> Result<Self, String> {
        let mut out: Vec<String> = Vec::new();
        for p in platforms.iter().map(|p| p.as_ref().trim()).filter(|p| !p.is_empty()) {
            if !is_platform_name(p) {
                let shown: String = p.chars().take(64).collect();
                return Err(format!(
                    "{shown:?} is not a platform: give the scheme of the providerIDs (\"aws\" for aws:///zone/i-1)"
                ));
            }
            if !out.iter().any(|o| o == p) {
                out.push(p.to_string());
            }
        }
        Ok(Self { platforms: out })
    }

    /// The platforms owned; empty: every Node.
    pub fn platforms(&self) -> &[String] {
        &self.platforms
    }

    /// Whether this manager owns only some Nodes.
    pub fn is_restricted(&self) -> bool {
        !self.platforms.is_empty()
    }

    /// Whose `node` is.
    pub fn owner(&self, node: &Node) -> Owner {
        if !self.is_restricted() {
            return Owner::Mine;
        }
        match platform_of(node) {
            Some(p) if self.platforms.iter().any(|o| o == p) => Owner::Mine,
            Some(_) => Owner::Foreign,
            None => Owner::Unclaimed,
        }
    }

    /// Whether a controller that creates nothing may act on `node` (deletion, taints, routes).
    pub fn owns(&self, node: &Node) -> bool {
        self.owner(node) == Owner::Mine
    }
}

/// Whether two managers owning `a` and `b` (each empty: every Node) can never act on the same
/// Node: both restricted and no platform in common.
pub fn disjoint<S: AsRef<str>>(a: &[S], b: &[S]) -> bool {
    let named = |v: &[S]| v.iter().any(|p| !p.as_ref().trim().is_empty());
    named(a) && named(b) && !a.iter().any(|x| b.iter().any(|y| x.as_ref().trim() == y.as_ref().trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn node(provider_id: Option<&str>, annotation: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                annotations: annotation.map(|a| [(PLATFORM_ANNOTATION.to_string(), a.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec { provider_id: provider_id.map(String::from), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn without_platforms_every_node_is_mine_as_upstream() {
        let all = NodeOwnership::all();
        for n in [node(Some("aws:///z/i-1"), None), node(None, None), node(None, Some("gce"))] {
            assert_eq!(all.owner(&n), Owner::Mine);
        }
        assert_eq!(NodeOwnership::of(&["", " "]).unwrap(), NodeOwnership::all());
    }

    #[test]
    fn the_provider_id_scheme_decides_then_the_annotation_then_nothing() {
        let o = NodeOwnership::of(&["baremetal", "fake"]).unwrap();
        assert_eq!(o.owner(&node(Some("baremetal://rack1/n1"), None)), Owner::Mine);
        assert_eq!(o.owner(&node(Some("aws:///us-east-1a/i-1"), Some("baremetal"))), Owner::Foreign, "providerID wins");
        assert_eq!(o.owner(&node(None, Some("fake"))), Owner::Mine);
        assert_eq!(o.owner(&node(Some(""), Some("gce"))), Owner::Foreign);
        assert_eq!(o.owner(&node(None, None)), Owner::Unclaimed);
        assert_eq!(o.owner(&node(Some("i-0123"), None)), Owner::Foreign, "a bare ID is its own platform");
        assert!(!o.owns(&node(None, None)));
        assert_eq!(platform_of_provider_id("kind://docker/kind/n"), Some("kind"));
        assert_eq!(platform_of_provider_id("://x"), None);
    }

    #[test]
    fn platform_names_are_checked_and_deduplicated() {
        assert_eq!(NodeOwnership::of(&["aws", "aws", "hcloud"]).unwrap().platforms(), ["aws", "hcloud"]);
        for bad in ["aws://", "1cloud", "a b", "x/y"] {
            let e = NodeOwnership::of(&[bad]).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn owners_are_disjoint_only_when_both_name_platforms_and_share_none() {
        assert!(disjoint(&["aws"], &["baremetal"]));
        assert!(!disjoint(&["aws", "gce"], &["gce"]));
        let none: [&str; 0] = [];
        assert!(!disjoint(&none, &["aws"]), "an unrestricted manager owns every Node");
        assert!(!disjoint(&[""], &["aws"]));
    }
}
