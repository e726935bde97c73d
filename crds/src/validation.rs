//! Plain-Rust validation of a spec.
//!
//! The CRD carries the same rules as CEL for the API server. This module is what the operator
//! calls, and what covers rules a client cannot evaluate, so both paths reject the same specs.

use std::fmt;

use ipnet::IpNet;

use crate::controllers::ControllerSelection;
use crate::v1alpha1::CloudControllerManagerSpec;

/// One invalid field: its JSON path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, such as `spec.concurrency.nodeSyncs`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid spec: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidSpec(pub Vec<FieldError>);

/// An invalid `--cluster-cidr` / `clusterCIDR` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The value is empty.
    #[error("no CIDR given")]
    Empty,
    /// An entry does not parse as a CIDR.
    #[error("{0:?} is not a CIDR such as 10.244.0.0/16")]
    Malformed(String),
    /// More than two entries.
    #[error("at most two CIDRs (one per IP family) are allowed, got {0}")]
    TooMany(usize),
    /// Two entries of the same IP family.
    #[error("two CIDRs must be of different IP families (one IPv4, one IPv6)")]
    SameFamily,
}

/// Parse a comma-separated CIDR list with upstream's rules: one or two entries, and two only
/// when they are of different IP families (dual-stack).
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, CidrError> {
    if value.trim().is_empty() {
        return Err(CidrError::Empty);
    }
    let parts: Vec<&str> = value.split(',').map(str::trim).collect();
    if parts.len() > 2 {
        return Err(CidrError::TooMany(parts.len()));
    }
    let nets = parts
        .iter()
        .map(|p| p.parse::<IpNet>().map_err(|_| CidrError::Malformed((*p).to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if let [a, b] = nets.as_slice()
        && matches!((a, b), (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_)))
    {
        return Err(CidrError::SameFamily);
    }
    Ok(nets)
}

/// Validate a spec: every rule the CRD states, evaluated in Rust.
pub fn validate_spec(spec: &CloudControllerManagerSpec) -> Result<(), InvalidSpec> {
    let mut errors = Vec::new();
    let mut err = |field: &str, message: String| errors.push(FieldError { field: field.to_string(), message });

    if spec.provider.trim().is_empty() {
        err("spec.provider", "must not be empty".into());
    }
    if let Err(e) = ControllerSelection::parse(&spec.controllers) {
        err("spec.controllers", e.to_string());
    }
    if spec.cluster_name.trim().is_empty() {
        err("spec.clusterName", "must not be empty".into());
    }
    if let Some(cidr) = &spec.cluster_cidr
        && let Err(e) = parse_cluster_cidrs(cidr)
    {
        err("spec.clusterCIDR", e.to_string());
    }
    let le = &spec.leader_election;
    if le.retry_period.is_negative() || std::time::Duration::from(le.retry_period).is_zero() {
        err("spec.leaderElection.retryPeriod", "must be positive".into());
    }
    if !(le.lease_duration > le.renew_deadline && le.renew_deadline > le.retry_period) {
        err(
            "spec.leaderElection",
            format!(
                "leaseDuration ({}) must be greater than renewDeadline ({}), which must be greater than retryPeriod ({})",
                le.lease_duration, le.renew_deadline, le.retry_period
            ),
        );
    }
    for (field, value) in [
        ("spec.concurrency.nodeSyncs", spec.concurrency.node_syncs),
        ("spec.concurrency.serviceSyncs", spec.concurrency.service_syncs),
        ("spec.concurrency.routeSyncs", spec.concurrency.route_syncs),
        ("spec.deployment.replicas", spec.deployment.replicas),
    ] {
        if value < 1 {
            err(field, format!("must be at least 1, got {value}"));
        }
    }
    if let Some(src) = &spec.cloud_config {
        if src.secret_ref.name.trim().is_empty() {
            err("spec.cloudConfig.secretRef.name", "must not be empty".into());
        }
        if src.secret_ref.key.trim().is_empty() {
            err("spec.cloudConfig.secretRef.key", "must not be empty".into());
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(InvalidSpec(errors)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_dual_stack_cidrs_parse() {
        assert_eq!(parse_cluster_cidrs("10.244.0.0/16").unwrap().len(), 1);
        assert_eq!(parse_cluster_cidrs("10.244.0.0/16, fd00:10:244::/56").unwrap().len(), 2);
        assert_eq!(parse_cluster_cidrs("fd00::/48").unwrap().len(), 1);
    }

    #[test]
    fn malformed_cidrs_are_rejected_naming_the_entry() {
        for bad in ["10.244.0.0", "10.244.0.0/33", "not-a-cidr", "10.244.0.0/16,", "300.1.1.1/8"] {
            let e = parse_cluster_cidrs(bad).unwrap_err();
            assert!(matches!(e, CidrError::Malformed(_)), "{bad}: {e:?}");
        }
        assert_eq!(parse_cluster_cidrs("").unwrap_err(), CidrError::Empty);
    }

    #[test]
    fn three_cidrs_are_rejected() {
        assert_eq!(parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16,fd00::/48").unwrap_err(), CidrError::TooMany(3));
    }

    #[test]
    fn two_cidrs_of_one_family_are_rejected() {
        assert_eq!(parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16").unwrap_err(), CidrError::SameFamily);
        assert_eq!(parse_cluster_cidrs("fd00::/48,fd01::/48").unwrap_err(), CidrError::SameFamily);
    }
}
