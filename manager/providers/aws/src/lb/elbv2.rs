//! Changing a Service's ELBv2 objects: making and deleting the load balancer and its target
//! groups, and bringing attributes, targets and listeners to what is wanted by the differences
//! [`plan`](super::plan) and [`desired`](super::desired) compute. Every object is tagged at
//! creation as upstream tags it, and remembered in the ledger, so a create whose answer was lost
//! is found and adopted by the next sync. Nothing is written where nothing differs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerTypeEnum, ProtocolEnum, Tag, TargetDescription, TargetGroupAttribute, TargetHealthReasonEnum,
    TargetTypeEnum,
};

use super::desired::{Desired, DesiredPort, attribute_changes, lb_attributes, tg_attribute_changes};
use super::plan::{
    LbInfo, ListenerChange, ListenerInfo, Target, TgInfo, health_check_differs, listener_changes, target_changes,
    target_group_for,
};
use super::subnets::SubnetMapping;
use super::tags::TAG_SERVICE;
use crate::AwsProvider;
use crate::cluster::TAG_CLUSTER_PREFIX;
use crate::errors::code;
use crate::instances::InstanceInfo;
use crate::ledger::{Kind, Owner};
use ccm_framework::provider::{CloudError, CloudResult};

/// A TLS listener's certificate, as ELBv2 takes it.
fn listener_certificates(p: &DesiredPort) -> Option<Vec<Certificate>> {
    p.tls.as_ref().map(|t| vec![Certificate::builder().certificate_arn(&t.certificate_arn).build()])
}

/// Tags as ELBv2 takes them.
pub(super) fn to_tags(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect()
}

/// A listener as the sync compares it.
fn listener_info(l: &aws_sdk_elasticloadbalancingv2::types::Listener) -> ListenerInfo {
    ListenerInfo {
        arn: l.listener_arn().unwrap_or_default().to_string(),
        port: l.port().unwrap_or_default(),
        protocol: l.protocol().map(|p| p.as_str().to_string()).unwrap_or_default(),
        target_group: l.default_actions().first().and_then(|a| a.target_group_arn()).unwrap_or_default().to_string(),
        certificate: l.certificates().first().and_then(|c| c.certificate_arn()).unwrap_or_default().to_string(),
        policy: l.ssl_policy().unwrap_or_default().to_string(),
        actions: l.default_actions().len(),
    }
}

impl AwsProvider {
    /// Make the network load balancer `desired` describes, in `subnets`, with `groups`, as
    /// upstream makes it (the scheme only when internal, the address type only when dual-stack).
    pub(super) async fn create_lb(
        &self,
        desired: &Desired,
        subnets: Vec<SubnetMapping>,
        groups: Vec<String>,
    ) -> CloudResult<LbInfo> {
        let elb = &self.clients().await?.elb;
        let mappings = subnets
            .iter()
            .map(|m| {
                aws_sdk_elasticloadbalancingv2::types::SubnetMapping::builder()
                    .subnet_id(&m.subnet)
                    .set_allocation_id(m.allocation_id.clone())
                    .set_private_ipv4_address(m.private_ipv4.map(|ip| ip.to_string()))
                    .build()
            })
            .collect();
        let r = elb
            .create_load_balancer()
            .name(&desired.name)
            .r#type(LoadBalancerTypeEnum::Network)
            .set_scheme(desired.internal.then_some(LoadBalancerSchemeEnum::Internal))
            .set_subnet_mappings(Some(mappings))
            .set_ip_address_type(
                (desired.ip_address_type != "ipv4").then(|| IpAddressType::from(desired.ip_address_type)),
            )
            .set_security_groups(Some(groups.clone()))
            .set_tags(Some(to_tags(&desired.tags)))
            .send()
            .await
            .map_err(self.elb_err("CreateLoadBalancer"))?;
        let lb = r
            .load_balancers()
            .first()
            .ok_or_else(|| CloudError::Other("CreateLoadBalancer returned nothing".into()))?;
        tracing::info!(name = %desired.name, "created network load balancer");
        let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
        self.remember(Kind::LoadBalancer, desired, &arn);
        Ok(LbInfo {
            arn,
            dns: lb.dns_name().unwrap_or_default().to_string(),
            internal: desired.internal,
            ip_address_type: desired.ip_address_type.to_string(),
            subnets: subnets.iter().map(|m| m.subnet.clone()).collect(),
            security_groups: groups,
            vpc: lb.vpc_id().unwrap_or_default().to_string(),
            ..Default::default()
        })
    }

    /// Delete a load balancer (gone already is done).
    pub(super) async fn delete_lb(&self, arn: &str) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        match elb.delete_load_balancer().load_balancer_arn(arn).send().await {
            Ok(_) => {}
            Err(e) if code(&e) == Some("LoadBalancerNotFound") => {}
            Err(e) => return Err(self.classify("DeleteLoadBalancer", e)),
        }
        self.ledger.forget(Kind::LoadBalancer, arn);
        Ok(())
    }

    /// Remember an object just made for `desired`'s Service.
    fn remember(&self, kind: Kind, desired: &Desired, arn: &str) {
        for owner in Owner::from_tags(&desired.tags, TAG_CLUSTER_PREFIX, TAG_SERVICE) {
            self.ledger.add(kind, &owner, arn);
        }
    }

    /// Delete a target group; `Ok(false)` while ELBv2 still has it in use.
    pub(super) async fn delete_tg(&self, arn: &str) -> CloudResult<bool> {
        let elb = &self.clients().await?.elb;
        match elb.delete_target_group().target_group_arn(arn).send().await {
            Ok(_) => {
                self.ledger.forget(Kind::TargetGroup, arn);
                Ok(true)
            }
            Err(e) if code(&e) == Some("TargetGroupNotFound") => {
                self.ledger.forget(Kind::TargetGroup, arn);
                Ok(true)
            }
            Err(e) if code(&e) == Some("ResourceInUse") => Ok(false),
            Err(e) => Err(self.classify("DeleteTargetGroup", e)),
        }
    }

    /// The ARN of the target group for `port`: the existing one (its health check set where it
    /// differs), else a new one named and made as upstream makes it.
    pub(super) async fn ensure_tg(
        &self,
        desired: &Desired,
        port: &DesiredPort,
        vpc: &str,
        existing: &[TgInfo],
        listeners: &[ListenerInfo],
    ) -> CloudResult<String> {
        let elb = &self.clients().await?.elb;
        let h = &desired.health;
        let health_port = h.port_string();
        let listener_kept = listeners.iter().any(|l| l.port == port.port && l.protocol == port.listener_protocol());
        if let Some(tg) = target_group_for(existing, port, h, listener_kept) {
            if health_check_differs(tg, h) {
                elb.modify_target_group()
                    .target_group_arn(&tg.arn)
                    .health_check_port(&health_port)
                    .set_health_check_path(h.api_path())
                    .set_health_check_timeout_seconds(h.timeout)
                    .healthy_threshold_count(h.healthy_threshold)
                    .unhealthy_threshold_count(h.unhealthy_threshold)
                    .send()
                    .await
                    .map_err(self.elb_err("ModifyTargetGroup"))?;
            }
            return Ok(tg.arn.clone());
        }
        let name = &port.target_group;
        let r = elb
            .create_target_group()
            .name(name)
            .protocol(ProtocolEnum::from(port.protocol.as_str()))
            .port(port.node_port)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Instance)
            .health_check_interval_seconds(h.interval)
            .health_check_port(&health_port)
            .health_check_protocol(ProtocolEnum::from(h.protocol.as_str()))
            .healthy_threshold_count(h.healthy_threshold)
            .unhealthy_threshold_count(h.unhealthy_threshold)
            .set_health_check_path(h.api_path())
            .set_health_check_timeout_seconds(h.timeout)
            .set_tags(Some(to_tags(&desired.tags)))
            .send()
            .await;
        let arn = match r {
            Ok(r) => r
                .target_groups()
                .first()
                .and_then(|t| t.target_group_arn())
                .map(str::to_string)
                .ok_or_else(|| CloudError::Other("CreateTargetGroup returned nothing".into()))?,
            // Made by an earlier try whose answer was lost: adopt it if its tags say it is ours.
            Err(e) if code(&e) == Some("DuplicateTargetGroupName") => self.adopt_tg(desired, name).await?,
            Err(e) => return Err(self.classify("CreateTargetGroup", e)),
        };
        self.remember(Kind::TargetGroup, desired, &arn);
        Ok(arn)
    }

    /// The ARN of the target group named `name` if its tags name `desired`'s Service.
    async fn adopt_tg(&self, desired: &Desired, name: &str) -> CloudResult<String> {
        let elb = &self.clients().await?.elb;
        let r = elb.describe_target_groups().names(name).send().await.map_err(self.elb_err("DescribeTargetGroups"))?;
        let arn = r.target_groups().first().and_then(|t| t.target_group_arn()).unwrap_or_default().to_string();
        let tags = self.elb_tags(std::slice::from_ref(&arn)).await?;
        let ours = tags.get(&arn).is_some_and(|t| {
            desired
                .tags
                .iter()
                .filter(|(k, _)| k.starts_with(TAG_CLUSTER_PREFIX) || *k == TAG_SERVICE)
                .all(|(k, v)| t.get(k) == Some(v))
        });
        if !ours {
            return Err(CloudError::Other(format!(
                "target group name {name} is taken by a target group of another Service or cluster"
            )));
        }
        tracing::info!(%name, "adopted a target group made by an earlier try");
        Ok(arn)
    }

    /// Set the attributes the `target-group-attributes` annotation names, where the target
    /// group lists them with another value (nothing without the annotation, as upstream).
    pub(super) async fn sync_tg_attributes(&self, tg_arn: &str, desired: &Desired) -> CloudResult<()> {
        let Some(want) = &desired.annotations().target_group_attributes else { return Ok(()) };
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_target_group_attributes()
            .target_group_arn(tg_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeTargetGroupAttributes"))?;
        let have: BTreeMap<String, String> = r
            .attributes()
            .iter()
            .map(|a| (a.key().unwrap_or_default().to_string(), a.value().unwrap_or_default().to_string()))
            .collect();
        let changes = tg_attribute_changes(want, &have);
        if changes.is_empty() {
            return Ok(());
        }
        let attrs = changes.iter().map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build()).collect();
        elb.modify_target_group_attributes()
            .target_group_arn(tg_arn)
            .set_attributes(Some(attrs))
            .send()
            .await
            .map_err(self.elb_err("ModifyTargetGroupAttributes"))?;
        Ok(())
    }

    /// Set the load balancer's cross-zone and access-log attributes where they differ.
    pub(super) async fn sync_lb_attributes(&self, lb_arn: &str, desired: &Desired) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_load_balancer_attributes()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeLoadBalancerAttributes"))?;
        let have: BTreeMap<String, String> = r
            .attributes()
            .iter()
            .map(|a| (a.key().unwrap_or_default().to_string(), a.value().unwrap_or_default().to_string()))
            .collect();
        let changes = attribute_changes(&lb_attributes(desired.annotations()), &have);
        if changes.is_empty() {
            return Ok(());
        }
        let attrs = changes.iter().map(|(k, v)| LoadBalancerAttribute::builder().key(k).value(v).build()).collect();
        elb.modify_load_balancer_attributes()
            .load_balancer_arn(lb_arn)
            .set_attributes(Some(attrs))
            .send()
            .await
            .map_err(self.elb_err("ModifyLoadBalancerAttributes"))?;
        Ok(())
    }

    /// Deregister the targets no longer wanted, then register the missing ones, 100 a call (as
    /// upstream: deregistering first lets an instance be replaced at the target limit).
    /// Targets still draining count as gone.
    pub(super) async fn sync_targets(
        &self,
        tg_arn: &str,
        node_port: i32,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_target_health()
            .target_group_arn(tg_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeTargetHealth"))?;
        let have: BTreeSet<Target> = r
            .target_health_descriptions()
            .iter()
            .filter(|d| {
                d.target_health().and_then(|h| h.reason()) != Some(&TargetHealthReasonEnum::DeregistrationInProgress)
            })
            .filter_map(|d| d.target())
            .map(|t| (t.id().unwrap_or_default().to_string(), t.port().unwrap_or(node_port)))
            .collect();
        let want: BTreeSet<Target> = instances.iter().map(|i| (i.id.clone(), node_port)).collect();
        let (add, remove) = target_changes(&want, &have);
        let description = |(id, port): &Target| TargetDescription::builder().id(id).port(*port).build();
        for chunk in remove.chunks(100) {
            elb.deregister_targets()
                .target_group_arn(tg_arn)
                .set_targets(Some(chunk.iter().map(description).collect()))
                .send()
                .await
                .map_err(self.elb_err("DeregisterTargets"))?;
        }
        for chunk in add.chunks(100) {
            elb.register_targets()
                .target_group_arn(tg_arn)
                .set_targets(Some(chunk.iter().map(description).collect()))
                .send()
                .await
                .map_err(self.elb_err("RegisterTargets"))?;
        }
        Ok(())
    }

    /// The load balancer's listeners.
    pub(super) async fn listeners_of(&self, lb_arn: &str) -> CloudResult<Vec<ListenerInfo>> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_listeners()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeListeners"))?;
        Ok(r.listeners().iter().map(listener_info).collect())
    }

    /// Bring the load balancer's listeners (`existing`) to `wanted` (each port with its target
    /// group's ARN); new listeners carry the load balancer's tags, as upstream's.
    pub(super) async fn sync_listeners(
        &self,
        lb_arn: &str,
        existing: &[ListenerInfo],
        wanted: &[(DesiredPort, String)],
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let forward = |tg: &str| Action::builder().r#type(ActionTypeEnum::Forward).target_group_arn(tg).build();
        for change in listener_changes(existing, wanted) {
            match change {
                ListenerChange::Modify { arn, port: p, target_group } => {
                    elb.modify_listener()
                        .listener_arn(arn)
                        .protocol(ProtocolEnum::from(p.listener_protocol()))
                        .port(p.port)
                        .set_certificates(listener_certificates(p))
                        .set_ssl_policy(p.tls.as_ref().and_then(|t| t.policy.clone()))
                        .default_actions(forward(target_group))
                        .send()
                        .await
                        .map_err(self.elb_err("ModifyListener"))?;
                }
                ListenerChange::Delete { arn } => match elb.delete_listener().listener_arn(arn).send().await {
                    Ok(_) => {}
                    Err(e) if code(&e) == Some("ListenerNotFound") => {}
                    Err(e) => return Err(self.classify("DeleteListener", e)),
                },
                ListenerChange::Create { port: p, target_group } => {
                    elb.create_listener()
                        .load_balancer_arn(lb_arn)
                        .protocol(ProtocolEnum::from(p.listener_protocol()))
                        .port(p.port)
                        .set_certificates(listener_certificates(p))
                        .set_ssl_policy(p.tls.as_ref().and_then(|t| t.policy.clone()))
                        .default_actions(forward(target_group))
                        .set_tags(Some(to_tags(tags)))
                        .send()
                        .await
                        .map_err(self.elb_err("CreateListener"))?;
                }
            }
        }
        Ok(())
    }
}
