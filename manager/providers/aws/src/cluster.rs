//! The cluster's identity in AWS tags (pure): which ID marks the cluster's resources, how a
//! resource's tags say it belongs to the cluster (or is owned by it), and how the ID is read from
//! the manager's own instance when the cloud-config names none, all as upstream.

use std::collections::BTreeMap;

/// Tag key prefix marking cluster membership (`kubernetes.io/cluster/<id>`).
pub const TAG_CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";
/// The legacy cluster tag (`KubernetesCluster=<id>`).
pub const TAG_CLUSTER_LEGACY: &str = "KubernetesCluster";

/// The cluster ID and whether it came from the legacy `KubernetesClusterTag` (then resources
/// are also tagged `KubernetesCluster=<id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterIdentity {
    /// The ID.
    pub id: String,
    /// Legacy tags in use.
    pub legacy: bool,
}

/// Why no cluster ID could be read from an instance's tags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterIdError {
    /// Neither tag is on the instance.
    #[error(
        "the manager's instance has neither a kubernetes.io/cluster/<id> nor a KubernetesCluster tag; set [Global] KubernetesClusterID in the cloud-config"
    )]
    Untagged,
    /// Two different `kubernetes.io/cluster/` keys.
    #[error(
        "the manager's instance has several kubernetes.io/cluster/<id> tags; set [Global] KubernetesClusterID in the cloud-config"
    )]
    SeveralIds,
    /// Two `KubernetesCluster` tags (only possible in a tag list read elsewhere).
    #[error(
        "the manager's instance has several KubernetesCluster tags; set [Global] KubernetesClusterID in the cloud-config"
    )]
    SeveralLegacy,
    /// The two tags name different clusters.
    #[error(
        "the manager's instance's kubernetes.io/cluster/<id> and KubernetesCluster tags name different clusters; set [Global] KubernetesClusterID in the cloud-config"
    )]
    Mismatch,
}

/// The cluster ID from an instance's tags (upstream's `initFromTags`): the `<id>` of a
/// `kubernetes.io/cluster/<id>` key (any value), or the value of `KubernetesCluster` (then
/// legacy tags are in use); both present must agree.
pub fn cluster_from_tags<'a>(
    tags: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ClusterIdentity, ClusterIdError> {
    let mut new_id: Option<&str> = None;
    let mut legacy: Option<&str> = None;
    for (k, v) in tags {
        if let Some(id) = k.strip_prefix(TAG_CLUSTER_PREFIX) {
            if new_id.is_some() {
                return Err(ClusterIdError::SeveralIds);
            }
            new_id = Some(id);
        }
        if k == TAG_CLUSTER_LEGACY {
            if legacy.is_some() {
                return Err(ClusterIdError::SeveralLegacy);
            }
            legacy = Some(v);
        }
    }
    match (legacy.filter(|l| !l.is_empty()), new_id.filter(|n| !n.is_empty())) {
        (Some(l), Some(n)) if l != n => Err(ClusterIdError::Mismatch),
        (Some(l), _) => Ok(ClusterIdentity { id: l.to_string(), legacy: true }),
        (None, Some(n)) => Ok(ClusterIdentity { id: n.to_string(), legacy: false }),
        (None, None) => Err(ClusterIdError::Untagged),
    }
}

impl ClusterIdentity {
    /// `kubernetes.io/cluster/<id>`.
    pub fn tag_key(&self) -> String {
        format!("{TAG_CLUSTER_PREFIX}{}", self.id)
    }

    /// The tags of a resource the cluster owns: `kubernetes.io/cluster/<id>=owned`, and
    /// `KubernetesCluster=<id>` with legacy tags (upstream's `buildTags`).
    pub fn owned_tags(&self) -> BTreeMap<String, String> {
        let mut t = BTreeMap::from([(self.tag_key(), "owned".to_string())]);
        if self.legacy {
            t.insert(TAG_CLUSTER_LEGACY.to_string(), self.id.clone());
        }
        t
    }

    /// Whether tags mark the cluster's resource: the cluster key with any value, or the
    /// legacy tag with this ID (upstream's `hasClusterTag`).
    pub fn tagged<'a>(&self, tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
        let key = self.tag_key();
        tags.into_iter().any(|(k, v)| k == key || (k == TAG_CLUSTER_LEGACY && v == self.id))
    }

    /// Whether tags mark a resource the cluster owns: the cluster key with `owned`, or the
    /// legacy tag with this ID (upstream's `hasClusterTagOwned`).
    pub fn owns<'a>(&self, tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
        let key = self.tag_key();
        tags.into_iter().any(|(k, v)| (k == key && v == "owned") || (k == TAG_CLUSTER_LEGACY && v == self.id))
    }
}

/// Whether tags carry no `kubernetes.io/cluster/` key at all (an untagged subnet, usable by
/// any cluster).
pub fn no_cluster_tag<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
    !tags.into_iter().any(|(k, _)| k.starts_with(TAG_CLUSTER_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        pairs.iter().copied()
    }

    #[test]
    fn the_id_comes_from_the_cluster_key_or_the_legacy_tag_and_they_must_agree() {
        let id = cluster_from_tags(t(&[("Name", "x"), ("kubernetes.io/cluster/prod", "owned")])).unwrap();
        assert_eq!(id, ClusterIdentity { id: "prod".into(), legacy: false });
        let id = cluster_from_tags(t(&[("KubernetesCluster", "old")])).unwrap();
        assert_eq!(id, ClusterIdentity { id: "old".into(), legacy: true });
        let id = cluster_from_tags(t(&[("KubernetesCluster", "c"), ("kubernetes.io/cluster/c", "shared")])).unwrap();
        assert!(id.legacy);
        assert_eq!(cluster_from_tags(t(&[("Name", "x")])), Err(ClusterIdError::Untagged));
        assert_eq!(
            cluster_from_tags(t(&[("kubernetes.io/cluster/a", "owned"), ("kubernetes.io/cluster/b", "owned")])),
            Err(ClusterIdError::SeveralIds)
        );
        assert_eq!(
            cluster_from_tags(t(&[("KubernetesCluster", "a"), ("kubernetes.io/cluster/b", "owned")])),
            Err(ClusterIdError::Mismatch)
        );
        assert!(ClusterIdError::Untagged.to_string().contains("KubernetesClusterID"));
    }

    #[test]
    fn membership_takes_the_key_with_any_value_or_the_legacy_tag_and_ownership_needs_owned() {
        let c = ClusterIdentity { id: "prod".into(), legacy: false };
        assert!(c.tagged(t(&[("kubernetes.io/cluster/prod", "shared")])));
        assert!(c.tagged(t(&[("KubernetesCluster", "prod")])));
        assert!(!c.tagged(t(&[("KubernetesCluster", "other"), ("kubernetes.io/cluster/other", "owned")])));
        assert!(c.owns(t(&[("kubernetes.io/cluster/prod", "owned")])));
        assert!(!c.owns(t(&[("kubernetes.io/cluster/prod", "shared")])));
        assert!(c.owns(t(&[("KubernetesCluster", "prod")])));
        assert!(no_cluster_tag(t(&[("Name", "x")])));
        assert!(!no_cluster_tag(t(&[("kubernetes.io/cluster/other", "owned")])));
    }

    #[test]
    fn legacy_clusters_write_both_tags() {
        let new = ClusterIdentity { id: "c".into(), legacy: false };
        assert_eq!(new.owned_tags().len(), 1);
        let old = ClusterIdentity { id: "c".into(), legacy: true };
        assert_eq!(old.owned_tags().get("KubernetesCluster").map(String::as_str), Some("c"));
        assert_eq!(old.owned_tags().get("kubernetes.io/cluster/c").map(String::as_str), Some("owned"));
    }
}
