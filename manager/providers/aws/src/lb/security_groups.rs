//! Security groups of load balancers, through EC2: reading groups and their rules, applying the
//! changes [`rules`](super::rules) computes, the Nodes' groups that serve a load balancer, and
//! the groups made for load balancers (an NLB's managed group, a Classic ELB's `k8s-elb-*`
//! group), found by name in the VPC and tagged at creation as upstream does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, Ipv6Range, PrefixListId, SecurityGroup, UserIdGroupPair};

use super::rules::{NlbTraffic, Op, Perm, Source, group_for_instance, nlb_group_ops};
use super::tags::{NLB_CLIENT_RULE, NLB_HEALTH_RULE, NLB_MTU_RULE};
use crate::AwsProvider;
use crate::cluster::{ClusterIdentity, TAG_CLUSTER_LEGACY};
use crate::errors::code;
use crate::instances::InstanceInfo;
use ccm_framework::provider::{CloudError, CloudResult};

/// A group's tags as pairs.
fn tags(g: &SecurityGroup) -> impl Iterator<Item = (&str, &str)> {
    g.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
}

/// A group's ingress rules, one source each.
pub(super) fn perms_of(g: &SecurityGroup) -> Vec<Perm> {
    let mut out = Vec::new();
    for p in g.ip_permissions() {
        let base = |source: Source, description: Option<&str>| Perm {
            protocol: p.ip_protocol().unwrap_or_default().to_string(),
            from: p.from_port(),
            to: p.to_port(),
            source,
            description: description.unwrap_or_default().to_string(),
        };
        out.extend(
            p.ip_ranges().iter().map(|r| base(Source::V4(r.cidr_ip().unwrap_or_default().into()), r.description())),
        );
        out.extend(
            p.ipv6_ranges().iter().map(|r| base(Source::V6(r.cidr_ipv6().unwrap_or_default().into()), r.description())),
        );
        out.extend(
            p.user_id_group_pairs()
                .iter()
                .map(|r| base(Source::Group(r.group_id().unwrap_or_default().into()), r.description())),
        );
        out.extend(
            p.prefix_list_ids()
                .iter()
                .map(|r| base(Source::PrefixList(r.prefix_list_id().unwrap_or_default().into()), r.description())),
        );
    }
    out
}

/// Rules as EC2 takes them, one permission each (descriptions only where set).
fn to_permissions(perms: &[Perm]) -> Vec<IpPermission> {
    perms
        .iter()
        .map(|p| {
            let desc = (!p.description.is_empty()).then(|| p.description.clone());
            let b = IpPermission::builder().ip_protocol(&p.protocol).set_from_port(p.from).set_to_port(p.to);
            match &p.source {
                Source::V4(c) => b.ip_ranges(IpRange::builder().cidr_ip(c).set_description(desc).build()),
                Source::V6(c) => b.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(c).set_description(desc).build()),
                Source::Group(g) => {
                    b.user_id_group_pairs(UserIdGroupPair::builder().group_id(g).set_description(desc).build())
                }
                Source::PrefixList(l) => {
                    b.prefix_list_ids(PrefixListId::builder().prefix_list_id(l).set_description(desc).build())
                }
            }
            .build()
        })
        .collect()
}

impl AwsProvider {
    /// Security groups matching `filters` (or the given `ids`), every page.
    pub(super) async fn describe_groups(
        &self,
        filters: Vec<Filter>,
        ids: Option<Vec<String>>,
    ) -> CloudResult<Vec<SecurityGroup>> {
        let ec2 = &self.clients().await?.ec2;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = ec2
                .describe_security_groups()
                .set_next_token(token.take())
                .set_filters((!filters.is_empty()).then(|| filters.clone()));
            match &ids {
                Some(ids) => req = req.set_group_ids(Some(ids.clone())),
                None => req = req.max_results(1000),
            }
            let page = req.send().await.map_err(self.elb_err("DescribeSecurityGroups"))?;
            out.extend(page.security_groups().iter().cloned());
            match page.next_token().filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        Ok(out)
    }

    /// Every security group tagged with the cluster (its key, or the legacy tag), as upstream's
    /// `getTaggedSecurityGroups` (filtered by EC2 here instead of listing all groups).
    pub(super) async fn cluster_groups(
        &self,
        cluster: &ClusterIdentity,
    ) -> CloudResult<BTreeMap<String, SecurityGroup>> {
        let mut out = BTreeMap::new();
        let by_key = vec![Filter::builder().name("tag-key").values(cluster.tag_key()).build()];
        let by_legacy = vec![Filter::builder().name(format!("tag:{TAG_CLUSTER_LEGACY}")).values(&cluster.id).build()];
        for filters in [by_key, by_legacy] {
            for g in self.describe_groups(filters, None).await? {
                if let Some(id) = g.group_id().filter(|_| cluster.tagged(tags(&g))) {
                    out.insert(id.to_string(), g);
                }
            }
        }
        Ok(out)
    }

    /// Apply `ops` to `group` in order (a rule already there, or already gone, counts as done).
    pub(super) async fn apply_ops(&self, group: &str, ops: &[Op]) -> CloudResult<()> {
        for op in ops {
            let (perms, grant) = match op {
                Op::Revoke(perms) => (perms, false),
                Op::Grant(perms) => (perms, true),
            };
            if !self.change_rules(group, perms, grant).await? && perms.len() > 1 {
                // EC2 refuses a whole request for one rule already there (or already gone), and
                // moto stops at it: one at a time, the others still land.
                for perm in perms {
                    self.change_rules(group, std::slice::from_ref(perm), grant).await?;
                }
            }
        }
        Ok(())
    }

    /// One authorize (`grant`) or revoke call for `perms`; `false` when EC2 answered that a
    /// rule was already there (or already gone), which leaves the others unknown.
    async fn change_rules(&self, group: &str, perms: &[Perm], grant: bool) -> CloudResult<bool> {
        let ec2 = &self.clients().await?.ec2;
        let permissions = Some(to_permissions(perms));
        if grant {
            match ec2.authorize_security_group_ingress().group_id(group).set_ip_permissions(permissions).send().await {
                Ok(_) => Ok(true),
                Err(e) if code(&e) == Some("InvalidPermission.Duplicate") => Ok(false),
                Err(e) => Err(self.classify("AuthorizeSecurityGroupIngress", e)),
            }
        } else {
            match ec2.revoke_security_group_ingress().group_id(group).set_ip_permissions(permissions).send().await {
                Ok(_) => Ok(true),
                // The group itself gone: nothing of it is left to revoke.
                Err(e) if code(&e) == Some("InvalidGroup.NotFound") => Ok(true),
                Err(e) if code(&e).is_some_and(|c| c.starts_with("InvalidPermission.NotFound")) => Ok(false),
                Err(e) => Err(self.classify("RevokeSecurityGroupIngress", e)),
            }
        }
    }

    /// The Node groups that serve a load balancer's targets, one per instance as upstream picks
    /// it (an error when an instance has several candidates), with every group read.
    pub(super) async fn serving_groups(
        &self,
        instances: &[Arc<InstanceInfo>],
        tagged: &mut BTreeMap<String, SecurityGroup>,
    ) -> CloudResult<BTreeSet<String>> {
        let tagged_ids: BTreeSet<String> = tagged.keys().cloned().collect();
        let mut out = BTreeSet::new();
        for i in instances {
            if let Some(g) = group_for_instance(&i.id, &i.security_groups, &tagged_ids).map_err(CloudError::Other)? {
                out.insert(g);
            }
        }
        let untagged: Vec<String> = out.iter().filter(|g| !tagged.contains_key(*g)).cloned().collect();
        if !untagged.is_empty() {
            for g in self.describe_groups(Vec::new(), Some(untagged)).await? {
                if let Some(id) = g.group_id() {
                    tagged.insert(id.to_string(), g);
                }
            }
        }
        Ok(out)
    }

    /// Bring an NLB's rules on the Nodes' groups to `traffic` (upstream's
    /// `updateInstanceSecurityGroupsForNLB`): on the groups serving `instances`, the client,
    /// health and path-MTU rules; on the cluster's other groups, none for this load balancer.
    /// `ElbSecurityGroup` is never changed.
    pub(super) async fn sync_nlb_rules(
        &self,
        lb_name: &str,
        instances: &[Arc<InstanceInfo>],
        traffic: &NlbTraffic,
        cluster: &ClusterIdentity,
    ) -> CloudResult<()> {
        if self.config.disable_security_group_ingress {
            return Ok(());
        }
        let _held = self.node_group_rules().await;
        let mut groups = self.cluster_groups(cluster).await?;
        let serving = self.serving_groups(instances, &mut groups).await?;
        for (id, g) in &groups {
            if *id == self.config.elb_security_group {
                continue;
            }
            let ops = nlb_group_ops(&perms_of(g), lb_name, serving.contains(id).then_some(traffic));
            self.apply_ops(id, &ops).await?;
        }
        Ok(())
    }

    /// Remove an NLB's rules from every group that has them: the cluster's groups and, where the
    /// VPC is known, any group of the VPC (ours: a group that served the load balancer untagged
    /// is cleaned too). Runs even when the load balancer is already gone.
    pub(super) async fn revoke_nlb_rules(
        &self,
        lb_name: &str,
        cluster: &ClusterIdentity,
        vpc: Option<&str>,
    ) -> CloudResult<()> {
        if self.config.disable_security_group_ingress {
            return Ok(());
        }
        let _held = self.node_group_rules().await;
        let mut groups = self.cluster_groups(cluster).await?;
        if let Some(vpc) = vpc {
            for g in self.describe_groups(vec![Filter::builder().name("vpc-id").values(vpc).build()], None).await? {
                if let Some(id) = g.group_id() {
                    groups.entry(id.to_string()).or_insert(g);
                }
            }
        }
        let ours =
            [format!("{NLB_CLIENT_RULE}={lb_name}"), format!("{NLB_HEALTH_RULE}={lb_name}"), NLB_MTU_RULE.to_string()];
        for (id, g) in &groups {
            let perms = perms_of(g);
            if *id == self.config.elb_security_group || !perms.iter().any(|p| ours.contains(&p.description)) {
                continue;
            }
            self.apply_ops(id, &nlb_group_ops(&perms, lb_name, None)).await?;
        }
        Ok(())
    }

    /// The group named `name` in `vpc`, if any.
    pub(super) async fn group_named(&self, name: &str, vpc: &str) -> CloudResult<Option<SecurityGroup>> {
        let filters = vec![
            Filter::builder().name("group-name").values(name).build(),
            Filter::builder().name("vpc-id").values(vpc).build(),
        ];
        Ok(self.describe_groups(filters, None).await?.into_iter().next())
    }

    /// The IDs of the groups named `name` in any VPC (names made from a Service's UID are unique).
    pub(super) async fn groups_named(&self, name: &str) -> CloudResult<Vec<String>> {
        let filters = vec![Filter::builder().name("group-name").values(name).build()];
        Ok(self.describe_groups(filters, None).await?.iter().filter_map(|g| g.group_id().map(str::to_string)).collect())
    }

    /// The group named `name` in `vpc` (upstream's `ensureSecurityGroup`): an existing one, its
    /// missing cluster tags added (a group tagged for another cluster is an error), else a new
    /// one tagged at creation with `tags`.
    pub(super) async fn ensure_named_group(
        &self,
        name: &str,
        description: &str,
        vpc: &str,
        tags_wanted: &BTreeMap<String, String>,
        cluster: &ClusterIdentity,
    ) -> CloudResult<String> {
        let ec2 = &self.clients().await?.ec2;
        for _ in 0..3 {
            if let Some(g) = self.group_named(name, vpc).await? {
                let id = g.group_id().unwrap_or_default().to_string();
                let have: BTreeMap<&str, &str> = tags(&g).collect();
                let mut missing = Vec::new();
                for (k, v) in cluster.owned_tags() {
                    match have.get(k.as_str()) {
                        Some(h) if *h == v => {}
                        None | Some(&"") => missing.push(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build()),
                        Some(_) => {
                            return Err(CloudError::Other(format!(
                                "security group {id} ({name}) has a tag belonging to another cluster"
                            )));
                        }
                    }
                }
                if !missing.is_empty() {
                    ec2.create_tags()
                        .resources(&id)
                        .set_tags(Some(missing))
                        .send()
                        .await
                        .map_err(self.elb_err("CreateTags"))?;
                }
                return Ok(id);
            }
            let mut spec = aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup);
            for (k, v) in tags_wanted {
                spec = spec.tags(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build());
            }
            match ec2
                .create_security_group()
                .group_name(name)
                .description(description)
                .vpc_id(vpc)
                .tag_specifications(spec.build())
                .send()
                .await
            {
                Ok(r) => {
                    return r
                        .group_id()
                        .map(str::to_string)
                        .ok_or_else(|| CloudError::Other("CreateSecurityGroup returned nothing".into()));
                }
                // Made concurrently: read it again.
                Err(e) if code(&e) == Some("InvalidGroup.Duplicate") => continue,
                Err(e) => return Err(self.classify("CreateSecurityGroup", e)),
            }
        }
        Err(CloudError::Other(format!("security group {name} keeps being made and not found")))
    }

    /// Make a group's ingress exactly `want` (upstream's `setSecurityGroupIngress`).
    pub(super) async fn set_ingress(&self, group: &str, want: &[Perm]) -> CloudResult<()> {
        let found = self.describe_groups(Vec::new(), Some(vec![group.to_string()])).await?;
        let g = found.first().ok_or_else(|| CloudError::Other(format!("security group not found: {group}")))?;
        self.apply_ops(group, &super::rules::exact_ingress(want, &perms_of(g))).await
    }

    /// The groups with a rule admitting members of `group`, and whether each is cluster-tagged.
    pub(super) async fn referencing(
        &self,
        group: &str,
        cluster: &ClusterIdentity,
    ) -> CloudResult<BTreeMap<String, bool>> {
        let filters = vec![Filter::builder().name("ip-permission.group-id").values(group).build()];
        Ok(self
            .describe_groups(filters, None)
            .await?
            .iter()
            .filter_map(|g| Some((g.group_id()?.to_string(), cluster.tagged(tags(g)))))
            .collect())
    }

    /// Cluster-tagged (`tagged`) or owned (`owned`) among `ids`: (ID, tagged, owned).
    pub(super) async fn ownership(
        &self,
        ids: &[String],
        cluster: &ClusterIdentity,
    ) -> CloudResult<Vec<(String, bool, bool)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let filters = vec![Filter::builder().name("group-id").set_values(Some(ids.to_vec())).build()];
        Ok(self
            .describe_groups(filters, None)
            .await?
            .iter()
            .filter_map(|g| Some((g.group_id()?.to_string(), cluster.tagged(tags(g)), cluster.owns(tags(g)))))
            .collect())
    }

    /// Delete security groups; returns how many are still in use (retried later).
    pub(super) async fn delete_groups(&self, ids: &[String]) -> CloudResult<usize> {
        let ec2 = &self.clients().await?.ec2;
        let mut pending = 0;
        for id in ids {
            match ec2.delete_security_group().group_id(id).send().await {
                Ok(_) => {}
                Err(e) if code(&e) == Some("InvalidGroup.NotFound") => {}
                Err(e) if code(&e) == Some("DependencyViolation") => pending += 1,
                Err(e) => return Err(self.classify("DeleteSecurityGroup", e)),
            }
        }
        Ok(pending)
    }
}
