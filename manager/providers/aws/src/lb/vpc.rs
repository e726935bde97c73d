//! Where a new load balancer goes, read from EC2: the Nodes' instances and their VPC, and the
//! VPC's subnets with their tags, route tables, zones and CIDRs; the choice itself is
//! [`subnets`](super::subnets).

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_ec2::types::Filter;
use k8s_openapi::api::core::v1::Node;

use super::desired::Desired;
use super::spec::refused_annotation;
use super::subnets::{
    RouteTableInfo, SubnetCandidate, SubnetMapping, pick_subnets, resolve_subnets, subnet_mappings, subnet_role_tag,
};
use crate::AwsProvider;
use crate::annotations as ann;
use crate::cluster::{ClusterIdentity, no_cluster_tag};
use crate::instances::{InstanceInfo, InstanceKey, key_of};
use ccm_framework::provider::{CloudError, CloudResult};

impl AwsProvider {
    /// The instances behind `nodes` that can be targets (not terminated).
    pub(super) async fn node_instances(&self, nodes: &[&Node]) -> CloudResult<Vec<Arc<InstanceInfo>>> {
        let keys: Vec<InstanceKey> = nodes.iter().filter_map(|n| key_of(n).ok()).collect();
        let found = self.lookup(&keys).await?;
        let mut out: Vec<Arc<InstanceInfo>> = found.into_iter().flatten().filter(|i| !i.is_terminated()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.dedup_by(|a, b| a.id == b.id);
        Ok(out)
    }

    /// The VPC: the config's, or the Nodes' instances'.
    pub(super) fn vpc_of(&self, instances: &[Arc<InstanceInfo>]) -> Option<String> {
        if !self.config.vpc.is_empty() {
            return Some(self.config.vpc.clone());
        }
        instances.iter().map(|i| i.vpc_id.clone()).find(|v| !v.is_empty())
    }

    /// The subnets the `subnets` annotation names, as IDs (names resolved in the VPC); `None`
    /// without the annotation.
    pub(super) async fn annotated_subnets(&self, requested: &[String], vpc: &str) -> CloudResult<Option<Vec<String>>> {
        if requested.is_empty() {
            return Ok(None);
        }
        let names: Vec<String> = requested.iter().filter(|s| !s.starts_with("subnet-")).cloned().collect();
        let mut found = Vec::new();
        if !names.is_empty() {
            let ec2 = &self.clients().await?.ec2;
            let r = ec2
                .describe_subnets()
                .filters(Filter::builder().name("vpc-id").values(vpc).build())
                .filters(Filter::builder().name("tag:Name").set_values(Some(names)).build())
                .send()
                .await
                .map_err(self.elb_err("DescribeSubnets"))?;
            for sn in r.subnets() {
                let name = sn.tags().iter().find(|t| t.key() == Some("Name")).and_then(|t| t.value());
                if let (Some(id), Some(name)) = (sn.subnet_id(), name) {
                    found.push((id.to_string(), name.to_string()));
                }
            }
        }
        resolve_subnets(requested, &found).map(Some).map_err(refused_annotation)
    }

    /// Subnets for a new load balancer: the annotation's, else one per zone of the VPC chosen as
    /// upstream chooses them (route tables, zone types, cluster tags), with `SubnetID` as the
    /// fallback.
    pub(super) async fn subnets_for(
        &self,
        requested: &[String],
        internal: bool,
        vpc: &str,
        cluster: &ClusterIdentity,
    ) -> CloudResult<Vec<String>> {
        if let Some(ids) = self.annotated_subnets(requested, vpc).await? {
            return Ok(ids);
        }
        let ec2 = &self.clients().await?.ec2;
        let r = ec2
            .describe_subnets()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(self.elb_err("DescribeSubnets"))?;
        let role = subnet_role_tag(internal);
        let candidate = |s: &aws_sdk_ec2::types::Subnet| {
            let tags = || s.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()));
            SubnetCandidate {
                zone: s.availability_zone().unwrap_or_default().to_string(),
                id: s.subnet_id().unwrap_or_default().to_string(),
                cluster_tagged: cluster.tagged(tags()),
                untagged: no_cluster_tag(tags()),
                has_role: tags().any(|(k, _)| k == role),
            }
        };
        let candidates: Vec<SubnetCandidate> = r.subnets().iter().map(candidate).collect();
        let fallback = if self.config.subnet_id.is_empty() || candidates.iter().any(|c| c.cluster_tagged || c.untagged)
        {
            None
        } else {
            tracing::warn!(
                "no subnet of the VPC is tagged for the cluster or untagged; falling back to [Global] SubnetID"
            );
            let r = ec2
                .describe_subnets()
                .subnet_ids(&self.config.subnet_id)
                .send()
                .await
                .map_err(self.elb_err("DescribeSubnets"))?;
            r.subnets().first().map(candidate)
        };
        let tables = ec2
            .describe_route_tables()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(self.elb_err("DescribeRouteTables"))?;
        let tables: Vec<RouteTableInfo> = tables
            .route_tables()
            .iter()
            .map(|t| RouteTableInfo {
                main: t.associations().iter().any(|a| a.main() == Some(true)),
                subnets: t.associations().iter().filter_map(|a| a.subnet_id()).map(str::to_string).collect(),
                to_internet: t.routes().iter().any(|r| r.gateway_id().is_some_and(|g| g.starts_with("igw"))),
            })
            .collect();
        let zone_types: BTreeMap<String, String> = self
            .zones()
            .await
            .into_iter()
            .map(|(name, (_, kind))| (name, kind))
            .filter(|(_, k)| !k.is_empty())
            .collect();
        let ids = pick_subnets(candidates, fallback, &tables, &zone_types, internal).map_err(CloudError::Other)?;
        if ids.is_empty() {
            return Err(CloudError::Other(format!(
                "could not find any suitable subnets for creating the ELB in VPC {vpc}: tag subnets with {role} (public ones for an internet-facing load balancer) or set the {} annotation",
                ann::SUBNETS
            )));
        }
        Ok(ids)
    }

    /// The IPv4 CIDRs of subnets.
    pub(super) async fn subnet_cidrs(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ec2 = &self.clients().await?.ec2;
        let r = ec2
            .describe_subnets()
            .set_subnet_ids(Some(ids.to_vec()))
            .send()
            .await
            .map_err(self.elb_err("DescribeSubnets"))?;
        Ok(r.subnets().iter().filter_map(|s| s.cidr_block()).map(str::to_string).collect())
    }

    /// The subnets of a new load balancer with their fixed addresses; read-only, so a bad
    /// pairing is found before anything changes.
    pub(super) async fn plan_subnets(
        &self,
        desired: &Desired,
        vpc: &str,
        cluster: &ClusterIdentity,
    ) -> CloudResult<Vec<SubnetMapping>> {
        let ids = self.subnets_for(&desired.annotations().subnets, desired.internal, vpc, cluster).await?;
        let mut cidrs: BTreeMap<String, ipnet::Ipv4Net> = BTreeMap::new();
        if !desired.annotations().private_ipv4.is_empty() {
            let ec2 = &self.clients().await?.ec2;
            let r = ec2
                .describe_subnets()
                .set_subnet_ids(Some(ids.clone()))
                .send()
                .await
                .map_err(self.elb_err("DescribeSubnets"))?;
            for sn in r.subnets() {
                if let (Some(id), Some(Ok(c))) = (sn.subnet_id(), sn.cidr_block().map(|c| c.parse::<ipnet::Ipv4Net>()))
                {
                    cidrs.insert(id.to_string(), c);
                }
            }
        }
        let with_cidrs: Vec<(String, Option<ipnet::Ipv4Net>)> =
            ids.into_iter().map(|id| (id.clone(), cidrs.get(&id).copied())).collect();
        subnet_mappings(&with_cidrs, desired.annotations()).map_err(refused_annotation)
    }
}
