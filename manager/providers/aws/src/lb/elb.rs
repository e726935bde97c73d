//! One sync of a Service's Classic ELB through Elastic Load Balancing, in upstream's order:
//! subnets, the `k8s-elb-*` security group and its ingress, the load balancer (made, or changed
//! in place: subnets, groups, listeners, proxy protocol, tags), attributes, the SSL negotiation
//! policy, the health check, the Nodes' rules and the instances. Each step reads first and
//! writes only what differs. And its deletion, in upstream's order.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, HealthCheck as SdkHealthCheck, Instance,
    Listener as SdkListener, LoadBalancerAttributes, PolicyAttribute, Tag,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use super::classic::{
    Attributes, HealthCheck, Listener, attributes, attributes_differ, backend_policy_changes, has_proxy_protocol,
    health_check, listener_changes, listeners, ssl_policy_ports, tag_additions,
};
use super::desired::node_selected;
use super::names::{PROXY_PROTOCOL_POLICY, classic_group_description, classic_group_name, ssl_policy_name};
use super::nlb::IN_USE_RETRY;
use super::plan::{ACTION_REPLACE, FixedField, REASON_LOAD_BALANCER_REPLACED, fixed_field_message, replacement_note};
use super::rules::{Op, Perm, Source, classic_node_ops, classic_primary_group, own_group_rules};
use super::security_groups::perms_of;
use super::spec::{self, ServiceShape, shows_ingress, status, type_change_refused};
use super::tags::{group_tags, lb_tags, service_key};
use crate::AwsProvider;
use crate::annotations::LbKind;
use crate::cluster::ClusterIdentity;
use crate::errors::code;
use ccm_framework::provider::{CloudError, CloudResult, Refusal};

/// A Classic ELB as the sync compares it.
#[derive(Debug, Clone, Default)]
pub(super) struct ClassicInfo {
    /// Its DNS name.
    pub(super) dns: String,
    /// Whether its scheme is `internal`.
    pub(super) internal: bool,
    /// Its VPC.
    pub(super) vpc: String,
    /// Its subnets.
    pub(super) subnets: BTreeSet<String>,
    /// Its security groups, in order.
    pub(super) groups: Vec<String>,
    /// Its listeners with their policies.
    pub(super) listeners: Vec<(Listener, Vec<String>)>,
    /// Its backends (instance ports with policies): whether each has proxy protocol.
    pub(super) backends: BTreeMap<i32, bool>,
    /// The policies it has.
    pub(super) policies: BTreeSet<String>,
    /// Its health check (none on an emulator that does not set AWS's default).
    pub(super) health: Option<HealthCheck>,
    /// Its instances.
    pub(super) instances: BTreeSet<String>,
    /// Its tags.
    pub(super) tags: BTreeMap<String, String>,
}

fn classic_info(d: &aws_sdk_elasticloadbalancing::types::LoadBalancerDescription) -> ClassicInfo {
    ClassicInfo {
        dns: d.dns_name().unwrap_or_default().to_string(),
        internal: d.scheme() == Some("internal"),
        vpc: d.vpc_id().unwrap_or_default().to_string(),
        subnets: d.subnets().iter().cloned().collect(),
        groups: d.security_groups().to_vec(),
        listeners: d
            .listener_descriptions()
            .iter()
            .filter_map(|ld| {
                let l = ld.listener()?;
                Some((
                    Listener {
                        protocol: l.protocol().to_string(),
                        port: l.load_balancer_port(),
                        instance_protocol: l.instance_protocol().unwrap_or(l.protocol()).to_string(),
                        instance_port: l.instance_port(),
                        certificate: l.ssl_certificate_id().map(str::to_string),
                    },
                    ld.policy_names().to_vec(),
                ))
            })
            .collect(),
        backends: d
            .backend_server_descriptions()
            .iter()
            .filter_map(|b| Some((b.instance_port()?, has_proxy_protocol(b.policy_names()))))
            .collect(),
        policies: d.policies().map(|p| p.other_policies().iter().cloned().collect()).unwrap_or_default(),
        health: d.health_check().map(|h| HealthCheck {
            target: h.target().to_string(),
            interval: h.interval(),
            timeout: h.timeout(),
            healthy_threshold: h.healthy_threshold(),
            unhealthy_threshold: h.unhealthy_threshold(),
        }),
        instances: d.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect(),
        tags: BTreeMap::new(),
    }
}

fn sdk_listener(l: &Listener) -> CloudResult<SdkListener> {
    SdkListener::builder()
        .protocol(&l.protocol)
        .load_balancer_port(l.port)
        .instance_protocol(&l.instance_protocol)
        .instance_port(l.instance_port)
        .set_ssl_certificate_id(l.certificate.clone())
        .build()
        .map_err(|e| CloudError::Other(format!("listener: {e}")))
}

fn instances(ids: &[String]) -> Vec<Instance> {
    ids.iter().map(|id| Instance::builder().instance_id(id).build()).collect()
}

impl AwsProvider {
    /// The Classic ELB named `name` if the cluster's tags are on it.
    pub(super) async fn classic_lb(&self, name: &str, cluster: &ClusterIdentity) -> CloudResult<Option<ClassicInfo>> {
        let elb = &self.clients().await?.classic;
        let r = match elb.describe_load_balancers().load_balancer_names(name).send().await {
            Ok(r) => r,
            Err(e) if code(&e) == Some("LoadBalancerNotFound") => return Ok(None),
            Err(e) => return Err(self.classify("DescribeLoadBalancers", e)),
        };
        let Some(d) = r.load_balancer_descriptions().first() else { return Ok(None) };
        let mut info = classic_info(d);
        let t = elb.describe_tags().load_balancer_names(name).send().await.map_err(self.elb_err("DescribeTags"))?;
        info.tags = t
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
            .collect();
        if !cluster.tagged(info.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            tracing::warn!(%name, "a Classic ELB with this Service's name is not tagged for the cluster; left alone");
            return Ok(None);
        }
        Ok(Some(info))
    }

    /// The Classic ELB's security groups (upstream's `buildELBSecurityGroupList`): the
    /// `security-groups` annotation's, else `ElbSecurityGroup`, else its own `k8s-elb-*` group;
    /// then the `extra-security-groups`. Whether its own group is among them.
    async fn classic_groups(
        &self,
        service: &Service,
        shape: &ServiceShape,
        vpc: &str,
        cluster: &ClusterIdentity,
    ) -> CloudResult<(Vec<String>, bool)> {
        let a = &shape.annotations;
        let (mut groups, own) = if !a.security_groups.is_empty() {
            (a.security_groups.clone(), false)
        } else if !self.config.elb_security_group.is_empty() {
            (vec![self.config.elb_security_group.clone()], false)
        } else {
            let name = classic_group_name(&shape.name);
            let description = classic_group_description(&shape.name, &service_key(service));
            let tags = group_tags(cluster, &a.extra_tags);
            (vec![self.ensure_named_group(&name, &description, vpc, &tags, cluster).await?], true)
        };
        groups.extend(a.extra_security_groups.iter().filter(|g| !groups.contains(g)).cloned().collect::<Vec<_>>());
        Ok((groups, own))
    }

    /// One sync of the Service's Classic ELB; `create: false` changes an existing one only.
    pub(super) async fn ensure_classic(
        &self,
        service: &Service,
        nodes: &[&Node],
        create: bool,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let cluster = self.cluster().await?.clone();
        let shape = spec::check(service, LbKind::Classic)?;
        let want_listeners = listeners(&shape)?;
        let name = shape.name.clone();
        if shows_ingress(service) && self.nlb_named(&name).await? {
            return Err(type_change_refused(LbKind::Classic));
        }
        let a = &shape.annotations;
        let selected: Vec<&Node> = nodes.iter().copied().filter(|n| node_selected(n, &a.target_node_labels)).collect();
        let instances = self.node_instances(&selected).await?;
        let mut existing = self.classic_lb(&name, &cluster).await?;
        if existing.is_none() && !create {
            return Ok(None);
        }
        let vpc = match existing
            .as_ref()
            .map(|e| e.vpc.clone())
            .filter(|v| !v.is_empty())
            .or_else(|| self.vpc_of(&instances))
        {
            Some(v) => v,
            None => {
                return Err(CloudError::Other(
                    "cannot tell the VPC: set [Global] VPC in the cloud-config or give the Service a Node".into(),
                ));
            }
        };
        let subnets = self.subnets_for(&a.subnets, a.internal, &vpc, &cluster).await?;
        let mut refusal = None;
        if let Some(e) = &existing
            && e.internal != a.internal
        {
            if shape.replace {
                tracing::warn!(service = %service_key(service), "replacing the Classic ELB, as the Service asks");
                self.delete_classic_lb(&name).await?;
                self.service_event(
                    service,
                    kube::runtime::events::EventType::Warning,
                    REASON_LOAD_BALANCER_REPLACED,
                    replacement_note(&[FixedField::Scheme]),
                    ACTION_REPLACE,
                );
                existing = None;
            } else {
                refusal = Some(vec![FixedField::Scheme]);
            }
        }
        let (groups, own) = self.classic_groups(service, &shape, &vpc, &cluster).await?;
        if own && let Some(first) = groups.first() {
            let ports: Vec<(String, i32)> =
                shape.all_ports.iter().map(|p| (p.protocol.to_ascii_lowercase(), p.port)).collect();
            self.set_ingress(first, &own_group_rules(&ports, &shape.source_ranges)).await?;
        }
        let elb = &self.clients().await?.classic;
        let lb = match existing {
            None => {
                let tags = lb_tags(&cluster, service, &a.extra_tags);
                let r = elb
                    .create_load_balancer()
                    .load_balancer_name(&name)
                    .set_listeners(Some(want_listeners.iter().map(sdk_listener).collect::<CloudResult<Vec<_>>>()?))
                    .set_scheme(a.internal.then(|| "internal".to_string()))
                    .set_subnets(Some(subnets.clone()))
                    .set_security_groups(Some(groups.clone()))
                    .set_tags(Some(
                        tags.iter()
                            .map(|(k, v)| Tag::builder().key(k).value(v).build())
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| CloudError::Other(format!("tag: {e}")))?,
                    ))
                    .send()
                    .await
                    .map_err(self.elb_err("CreateLoadBalancer"))?;
                tracing::info!(%name, "created Classic ELB");
                if a.proxy_protocol {
                    self.create_proxy_policy(&name).await?;
                    for port in want_listeners.iter().map(|l| l.instance_port).collect::<BTreeSet<_>>() {
                        self.set_backend_policies(&name, port, true).await?;
                    }
                }
                ClassicInfo {
                    dns: r.dns_name().unwrap_or_default().to_string(),
                    internal: a.internal,
                    vpc: vpc.clone(),
                    subnets: subnets.iter().cloned().collect(),
                    groups: groups.clone(),
                    listeners: want_listeners.iter().map(|l| (l.clone(), Vec::new())).collect(),
                    policies: if a.proxy_protocol {
                        [PROXY_PROTOCOL_POLICY.to_string()].into()
                    } else {
                        BTreeSet::new()
                    },
                    ..Default::default()
                }
            }
            Some(e) => {
                self.update_classic(&name, &e, &subnets, &groups, &want_listeners, &shape, &cluster).await?;
                e
            }
        };
        self.sync_classic_attributes(&name, &attributes(&shape)).await?;
        if let Some(reference) = &a.ssl_policy {
            let policy = ssl_policy_name(reference);
            if !lb.policies.contains(&policy) {
                elb.create_load_balancer_policy()
                    .load_balancer_name(&name)
                    .policy_name(&policy)
                    .policy_type_name("SSLNegotiationPolicyType")
                    .policy_attributes(
                        PolicyAttribute::builder()
                            .attribute_name("Reference-Security-Policy")
                            .attribute_value(reference)
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(self.elb_err("CreateLoadBalancerPolicy"))?;
            }
            // The listeners as they are now: kept ones with their policies, new ones without.
            let current: Vec<(Listener, Vec<String>)> = want_listeners
                .iter()
                .map(|w| {
                    let kept = lb.listeners.iter().find(|(l, _)| l.same(w));
                    (w.clone(), kept.map(|(_, p)| p.clone()).unwrap_or_default())
                })
                .collect();
            for port in ssl_policy_ports(&current, reference) {
                elb.set_load_balancer_policies_of_listener()
                    .load_balancer_name(&name)
                    .load_balancer_port(port)
                    .policy_names(&policy)
                    .send()
                    .await
                    .map_err(self.elb_err("SetLoadBalancerPoliciesOfListener"))?;
            }
        }
        let hc = health_check(&shape, &want_listeners, &self.config.cluster_probe);
        if lb.health.as_ref() != Some(&hc) {
            let sdk = SdkHealthCheck::builder()
                .target(&hc.target)
                .interval(hc.interval)
                .timeout(hc.timeout)
                .healthy_threshold(hc.healthy_threshold)
                .unhealthy_threshold(hc.unhealthy_threshold)
                .build()
                .map_err(|e| CloudError::Other(format!("health check: {e}")))?;
            elb.configure_health_check()
                .load_balancer_name(&name)
                .health_check(sdk)
                .send()
                .await
                .map_err(self.elb_err("ConfigureHealthCheck"))?;
        }
        self.sync_classic_node_rules(&groups, &shape, &instances, &cluster, false).await?;
        let want: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
        let add: Vec<String> = want.difference(&lb.instances).cloned().collect();
        let remove: Vec<String> = lb.instances.difference(&want).cloned().collect();
        if !add.is_empty() {
            elb.register_instances_with_load_balancer()
                .load_balancer_name(&name)
                .set_instances(Some(self::instances(&add)))
                .send()
                .await
                .map_err(self.elb_err("RegisterInstancesWithLoadBalancer"))?;
        }
        if !remove.is_empty() {
            elb.deregister_instances_from_load_balancer()
                .load_balancer_name(&name)
                .set_instances(Some(self::instances(&remove)))
                .send()
                .await
                .map_err(self.elb_err("DeregisterInstancesFromLoadBalancer"))?;
        }
        if let Some(fixed) = refusal {
            return Err(CloudError::refused(Refusal::UnsupportedService, fixed_field_message(&fixed)));
        }
        Ok(Some(status(&lb.dns)))
    }

    /// Change an existing Classic ELB in place where it differs: subnets, security groups
    /// (removing its own ones no longer used), listeners, proxy protocol, additional tags.
    #[allow(clippy::too_many_arguments)]
    async fn update_classic(
        &self,
        name: &str,
        e: &ClassicInfo,
        subnets: &[String],
        groups: &[String],
        want_listeners: &[Listener],
        shape: &ServiceShape,
        cluster: &ClusterIdentity,
    ) -> CloudResult<()> {
        let elb = &self.clients().await?.classic;
        let want: BTreeSet<String> = subnets.iter().cloned().collect();
        let detach: Vec<String> = e.subnets.difference(&want).cloned().collect();
        let attach: Vec<String> = want.difference(&e.subnets).cloned().collect();
        if !detach.is_empty() {
            elb.detach_load_balancer_from_subnets()
                .load_balancer_name(name)
                .set_subnets(Some(detach))
                .send()
                .await
                .map_err(self.elb_err("DetachLoadBalancerFromSubnets"))?;
        }
        if !attach.is_empty() {
            elb.attach_load_balancer_to_subnets()
                .load_balancer_name(name)
                .set_subnets(Some(attach))
                .send()
                .await
                .map_err(self.elb_err("AttachLoadBalancerToSubnets"))?;
        }
        let have_groups: BTreeSet<&String> = e.groups.iter().collect();
        let want_groups: BTreeSet<&String> = groups.iter().collect();
        if have_groups != want_groups {
            elb.apply_security_groups_to_load_balancer()
                .load_balancer_name(name)
                .set_security_groups(Some(groups.to_vec()))
                .send()
                .await
                .map_err(self.elb_err("ApplySecurityGroupsToLoadBalancer"))?;
            let removed: Vec<String> = have_groups.difference(&want_groups).map(|g| (*g).clone()).collect();
            self.remove_owned_groups(&removed, cluster).await?;
        }
        let have: Vec<Listener> = e.listeners.iter().map(|(l, _)| l.clone()).collect();
        let (additions, removals) = listener_changes(&have, want_listeners);
        if !removals.is_empty() {
            elb.delete_load_balancer_listeners()
                .load_balancer_name(name)
                .set_load_balancer_ports(Some(removals))
                .send()
                .await
                .map_err(self.elb_err("DeleteLoadBalancerListeners"))?;
        }
        if !additions.is_empty() {
            elb.create_load_balancer_listeners()
                .load_balancer_name(name)
                .set_listeners(Some(additions.iter().map(sdk_listener).collect::<CloudResult<Vec<_>>>()?))
                .send()
                .await
                .map_err(self.elb_err("CreateLoadBalancerListeners"))?;
        }
        let a = &shape.annotations;
        if a.proxy_protocol && !e.policies.contains(PROXY_PROTOCOL_POLICY) {
            self.create_proxy_policy(name).await?;
        }
        for (port, on) in backend_policy_changes(want_listeners, &e.backends, a.proxy_protocol) {
            self.set_backend_policies(name, port, on).await?;
        }
        let add = tag_additions(&a.extra_tags, &e.tags);
        if !add.is_empty() {
            elb.add_tags()
                .load_balancer_names(name)
                .set_tags(Some(
                    add.iter()
                        .map(|(k, v)| Tag::builder().key(k).value(v).build())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| CloudError::Other(format!("tag: {e}")))?,
                ))
                .send()
                .await
                .map_err(self.elb_err("AddTags"))?;
        }
        Ok(())
    }

    async fn create_proxy_policy(&self, name: &str) -> CloudResult<()> {
        let elb = &self.clients().await?.classic;
        elb.create_load_balancer_policy()
            .load_balancer_name(name)
            .policy_name(PROXY_PROTOCOL_POLICY)
            .policy_type_name("ProxyProtocolPolicyType")
            .policy_attributes(
                PolicyAttribute::builder().attribute_name("ProxyProtocol").attribute_value("true").build(),
            )
            .send()
            .await
            .map_err(self.elb_err("CreateLoadBalancerPolicy"))?;
        Ok(())
    }

    async fn set_backend_policies(&self, name: &str, port: i32, proxy: bool) -> CloudResult<()> {
        let elb = &self.clients().await?.classic;
        let policies = if proxy { vec![PROXY_PROTOCOL_POLICY.to_string()] } else { Vec::new() };
        elb.set_load_balancer_policies_for_backend_server()
            .load_balancer_name(name)
            .instance_port(port)
            .set_policy_names(Some(policies))
            .send()
            .await
            .map_err(self.elb_err("SetLoadBalancerPoliciesForBackendServer"))?;
        Ok(())
    }

    /// Set the attributes where they differ (upstream writes them on every sync).
    async fn sync_classic_attributes(&self, name: &str, want: &Attributes) -> CloudResult<()> {
        let elb = &self.clients().await?.classic;
        let r = elb
            .describe_load_balancer_attributes()
            .load_balancer_name(name)
            .send()
            .await
            .map_err(self.elb_err("DescribeLoadBalancerAttributes"))?;
        let have = r.load_balancer_attributes().map(|h| Attributes {
            cross_zone: h.cross_zone_load_balancing().is_some_and(|c| c.enabled()),
            access_log: h.access_log().is_some_and(|l| l.enabled()),
            emit_interval: h.access_log().and_then(|l| l.emit_interval()),
            bucket: h.access_log().and_then(|l| l.s3_bucket_name()).map(str::to_string),
            prefix: h.access_log().and_then(|l| l.s3_bucket_prefix()).map(str::to_string),
            draining: h.connection_draining().is_some_and(|d| d.enabled()),
            draining_timeout: h.connection_draining().and_then(|d| d.timeout()),
            idle_timeout: h.connection_settings().map(|c| c.idle_timeout()).unwrap_or(0),
        });
        if have.as_ref().is_some_and(|h| !attributes_differ(h, want)) {
            return Ok(());
        }
        let mut log = AccessLog::builder().enabled(want.access_log).set_emit_interval(want.emit_interval);
        log = log.set_s3_bucket_name(want.bucket.clone()).set_s3_bucket_prefix(want.prefix.clone());
        let attrs = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(want.cross_zone).build())
            .access_log(log.build())
            .connection_draining(
                ConnectionDraining::builder().enabled(want.draining).set_timeout(want.draining_timeout).build(),
            )
            .connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(want.idle_timeout)
                    .build()
                    .map_err(|e| CloudError::Other(format!("connection settings: {e}")))?,
            )
            .build();
        elb.modify_load_balancer_attributes()
            .load_balancer_name(name)
            .load_balancer_attributes(attrs)
            .send()
            .await
            .map_err(self.elb_err("ModifyLoadBalancerAttributes"))?;
        Ok(())
    }

    /// The Classic ELB's rule on the Nodes' groups (all traffic from its primary group), on the
    /// groups serving `instances`, off the cluster's others (off all when `deleting` its group).
    async fn sync_classic_node_rules(
        &self,
        groups: &[String],
        shape: &ServiceShape,
        instances: &[std::sync::Arc<crate::instances::InstanceInfo>],
        cluster: &ClusterIdentity,
        deleting: bool,
    ) -> CloudResult<()> {
        if self.config.disable_security_group_ingress {
            return Ok(());
        }
        let a = &shape.annotations;
        let Some(primary) = classic_primary_group(groups, &a.security_groups, &a.extra_security_groups) else {
            return Ok(());
        };
        let _held = self.node_group_rules().await;
        let referencing = self.referencing(&primary, cluster).await?;
        let want = if instances.is_empty() {
            BTreeSet::new()
        } else {
            let mut tagged = self.cluster_groups(cluster).await?;
            self.serving_groups(instances, &mut tagged).await?
        };
        for (group, op) in classic_node_ops(&primary, &referencing, &want, deleting, &self.config.elb_security_group) {
            self.apply_ops(&group, &[op]).await?;
        }
        Ok(())
    }

    /// Upstream's `removeOwnedSecurityGroups`: a group no longer on the load balancer loses the
    /// cluster's groups' rules that admit it, and is deleted if the cluster owns it.
    async fn remove_owned_groups(&self, removed: &[String], cluster: &ClusterIdentity) -> CloudResult<()> {
        for (id, _, owned) in self.ownership(removed, cluster).await? {
            self.revoke_references(&id, cluster).await?;
            if owned && id != self.config.elb_security_group && self.delete_groups(std::slice::from_ref(&id)).await? > 0
            {
                tracing::info!(group = %id, "a replaced load-balancer security group is still in use; removed on the load balancer's deletion");
            }
        }
        Ok(())
    }

    /// Revoke, from the cluster's groups, the rules admitting members of `group`.
    pub(super) async fn revoke_references(&self, group: &str, cluster: &ClusterIdentity) -> CloudResult<()> {
        let filters = vec![aws_sdk_ec2::types::Filter::builder().name("ip-permission.group-id").values(group).build()];
        let _held = self.node_group_rules().await;
        for g in self.describe_groups(filters, None).await? {
            let Some(id) = g.group_id() else { continue };
            let tags = g.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()));
            if !cluster.tagged(tags) || id == self.config.elb_security_group {
                continue;
            }
            let perms: Vec<Perm> =
                perms_of(&g).into_iter().filter(|p| p.source == Source::Group(group.to_string())).collect();
            if !perms.is_empty() {
                self.apply_ops(id, &[Op::Revoke(perms)]).await?;
            }
        }
        Ok(())
    }

    /// Delete a Classic ELB (gone already is done).
    pub(super) async fn delete_classic_lb(&self, name: &str) -> CloudResult<()> {
        let elb = &self.clients().await?.classic;
        match elb.delete_load_balancer().load_balancer_name(name).send().await {
            Ok(_) => Ok(()),
            Err(e) if code(&e) == Some("LoadBalancerNotFound") => Ok(()),
            Err(e) => Err(self.classify("DeleteLoadBalancer", e)),
        }
    }

    /// Delete the Service's Classic ELB, in upstream's order: the Nodes' rules admitting its
    /// group, the load balancer, then its groups the cluster tags (not `ElbSecurityGroup`, not
    /// the annotations'). Its own group is also found by name when the load balancer is already
    /// gone (a delete that stopped half-way).
    pub(super) async fn delete_classic(&self, service: &Service) -> CloudResult<()> {
        let cluster = self.cluster().await?.clone();
        let name = ccm_framework::provider::default_load_balancer_name(service);
        let empty = BTreeMap::new();
        let raw = service.metadata.annotations.as_ref().unwrap_or(&empty);
        // A malformed annotation must not keep a load balancer alive: read leniently.
        let a = crate::annotations::parse(raw, LbKind::Classic).unwrap_or_default();
        let mut annotated: BTreeSet<String> =
            a.security_groups.iter().chain(&a.extra_security_groups).cloned().collect();
        annotated.insert(self.config.elb_security_group.clone());
        let (groups, lb) = match self.classic_lb(&name, &cluster).await? {
            Some(lb) => (lb.groups.clone(), true),
            None => (self.groups_named(&classic_group_name(&name)).await?, false),
        };
        let candidates: Vec<String> = groups.iter().filter(|g| !annotated.contains(*g)).cloned().collect();
        let delete: Vec<String> = self
            .ownership(&candidates, &cluster)
            .await?
            .into_iter()
            .filter(|(_, tagged, owned)| if lb { *tagged } else { *owned })
            .map(|(id, _, _)| id)
            .collect();
        if lb && !self.config.disable_security_group_ingress {
            let shape = ServiceShape {
                name: name.clone(),
                ports: Vec::new(),
                all_ports: Vec::new(),
                local: false,
                health_check_node_port: 0,
                source_ranges: Vec::new(),
                annotations: a.clone(),
                replace: false,
            };
            let primary = classic_primary_group(&groups, &a.security_groups, &a.extra_security_groups);
            let deleting = primary.as_ref().is_some_and(|p| delete.contains(p));
            self.sync_classic_node_rules(&groups, &shape, &[], &cluster, deleting).await?;
        }
        if lb {
            self.delete_classic_lb(&name).await?;
        }
        for g in &delete {
            self.revoke_references(g, &cluster).await?;
        }
        if self.delete_groups(&delete).await? > 0 {
            return Err(CloudError::retry_after(
                IN_USE_RETRY,
                "the Classic ELB's security group is still in use; removed on retry",
            ));
        }
        Ok(())
    }
}
