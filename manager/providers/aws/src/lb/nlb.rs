//! One sync of a Service's Network Load Balancer, in upstream's order: validate, read what
//! exists, keep the load balancer (refusing a change AWS cannot make in place unless the
//! Service asks for a replacement), then change only what differs: attributes, target groups,
//! targets, listeners, the load balancer's own group and the Nodes' rules. And its deletion.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use super::desired::{Desired, client_ports, desired, health_rule_ports, node_selected};
use super::names::{MANAGED_GROUP_DESCRIPTION, managed_group_name};
use super::plan::{
    ACTION_REPLACE, FixedField, LbInfo, REASON_LOAD_BALANCER_REPLACED, fixed_changes, fixed_field_message,
    replacement_note,
};
use super::rules::{NlbTraffic, own_group_rules};
use super::spec::{REPLACE, shows_ingress, status, type_change_refused};
use super::tags::{group_tags, service_key};
use crate::AwsProvider;
use crate::annotations::LbKind;
use crate::cluster::ClusterIdentity;
use ccm_framework::provider::{CloudError, CloudResult, Refusal, default_load_balancer_name};

/// Retry delay while AWS still considers a target or security group in use.
pub(super) const IN_USE_RETRY: Duration = Duration::from_secs(10);

impl AwsProvider {
    /// Publish an event on the Service.
    pub(super) fn service_event(
        &self,
        service: &Service,
        type_: kube::runtime::events::EventType,
        reason: &str,
        note: String,
        action: &str,
    ) {
        if let Some(events) = self.event_sink() {
            use kube::Resource;
            events.publish(
                ccm_framework::events::components::SERVICE_CONTROLLER,
                service.object_ref(&()),
                type_,
                reason,
                note,
                action,
            );
        }
    }

    /// The managed security group of a new NLB in `NLBSecurityGroupMode = Managed` (named and
    /// tagged as upstream; an existing one of that name is reused), else none.
    async fn new_nlb_groups(
        &self,
        cluster_name: &str,
        service: &Service,
        desired: &Desired,
        vpc: &str,
        cluster: &ClusterIdentity,
    ) -> CloudResult<Vec<String>> {
        let managed =
            self.config.managed_nlb_security_groups().map_err(|e| CloudError::InvalidConfig(e.to_string()))?;
        if !managed {
            return Ok(Vec::new());
        }
        let name = managed_group_name(
            cluster_name,
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default(),
            service.metadata.uid.as_deref().unwrap_or_default(),
        );
        let tags = group_tags(cluster, &desired.annotations().extra_tags);
        Ok(vec![self.ensure_named_group(&name, MANAGED_GROUP_DESCRIPTION, vpc, &tags, cluster).await?])
    }

    /// One sync of the Service's NLB; `create: false` changes an existing load balancer but
    /// makes none.
    pub(super) async fn ensure_nlb(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
        create: bool,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let cluster = self.cluster().await?.clone();
        // Every check is made before the first call that changes anything.
        let desired = desired(service, &cluster, &self.config.cluster_probe)?;
        if shows_ingress(service) && self.classic_lb(&desired.name, &cluster).await?.is_some() {
            return Err(type_change_refused(LbKind::Nlb));
        }
        let labels = &desired.annotations().target_node_labels;
        let selected: Vec<&Node> = nodes.iter().copied().filter(|n| node_selected(n, labels)).collect();
        let instances = self.node_instances(&selected).await?;
        let mut lbs = self.owned_lbs(&cluster, service).await?;
        // Looked up while attached: a duplicate or replaced load balancer's delete detaches them.
        let lb_arns: Vec<&str> = lbs.iter().map(|l| l.arn.as_str()).collect();
        let tgs = self.owned_tgs(&cluster, service, &lb_arns).await?;
        // Duplicates (a create whose answer was lost, or an emulator's same-name copy): keep the
        // oldest, remove the rest.
        for extra in lbs.iter().skip(1) {
            tracing::warn!(service = %service_key(service), "removing a duplicate load balancer");
            self.delete_lb(&extra.arn).await?;
        }
        lbs.truncate(1);
        let mut lb: Option<LbInfo> = lbs.pop();
        let vpc = match lb.as_ref().map(|l| l.vpc.clone()).filter(|v| !v.is_empty()).or_else(|| self.vpc_of(&instances))
        {
            Some(v) => v,
            None => {
                return Err(CloudError::Other(
                    "cannot tell the VPC: set [Global] VPC in the cloud-config or give the Service a Node".into(),
                ));
            }
        };
        let mut refusal: Option<Vec<FixedField>> = None;
        let mut plan = None;
        if let Some(existing) = &lb {
            let subnets = self
                .annotated_subnets(&desired.annotations().subnets, &vpc)
                .await?
                .map(|v| v.into_iter().collect::<BTreeSet<String>>());
            let fixed = fixed_changes(existing, &desired, subnets.as_ref());
            let managed = self.config.managed_nlb_security_groups().unwrap_or(false);
            let wants_group = managed && existing.security_groups.is_empty();
            if desired.shape.replace && (!fixed.is_empty() || wants_group) {
                // Planned (read-only) before the old one goes: a bad plan changes nothing.
                plan = Some(self.plan_subnets(&desired, &vpc, &cluster).await?);
                tracing::warn!(service = %service_key(service), "replacing the load balancer, as the Service asks");
                self.delete_lb(&existing.arn).await?;
                let mut what = fixed.clone();
                if what.is_empty() {
                    what.push(FixedField::SecurityGroups);
                }
                self.service_event(
                    service,
                    kube::runtime::events::EventType::Warning,
                    REASON_LOAD_BALANCER_REPLACED,
                    replacement_note(&what),
                    ACTION_REPLACE,
                );
                lb = None;
            } else if !fixed.is_empty() {
                refusal = Some(fixed);
            } else if wants_group && self.note_once(&format!("nlb-sg/{}", desired.name)) {
                tracing::info!(
                    service = %service_key(service),
                    "NLBSecurityGroupMode = Managed applies to new load balancers only, as upstream: this one keeps no security group; the annotation {REPLACE}: \"true\" remakes it with one (a new hostname)"
                );
            }
        }
        let lb = match lb {
            Some(lb) => lb,
            None if !create && plan.is_none() => return Ok(None),
            None => {
                let plan = match plan {
                    Some(p) => p,
                    None => self.plan_subnets(&desired, &vpc, &cluster).await?,
                };
                let groups = self.new_nlb_groups(cluster_name, service, &desired, &vpc, &cluster).await?;
                self.create_lb(&desired, plan, groups).await?
            }
        };
        // Dual stack (ours) follows the Service's families in place.
        if !lb.ip_address_type.is_empty() && lb.ip_address_type != desired.ip_address_type {
            let elb = &self.clients().await?.elb;
            elb.set_ip_address_type()
                .load_balancer_arn(&lb.arn)
                .ip_address_type(aws_sdk_elasticloadbalancingv2::types::IpAddressType::from(desired.ip_address_type))
                .send()
                .await
                .map_err(self.elb_err("SetIpAddressType"))?;
        }
        self.sync_lb_attributes(&lb.arn, &desired).await?;
        let listeners = self.listeners_of(&lb.arn).await?;
        let mut wanted = Vec::new();
        for port in &desired.ports {
            let arn = self.ensure_tg(&desired, port, &vpc, &tgs, &listeners).await?;
            self.sync_tg_attributes(&arn, &desired).await?;
            self.sync_targets(&arn, port.node_port, &instances).await?;
            wanted.push((port.clone(), arn));
        }
        self.sync_listeners(&lb.arn, &listeners, &wanted, &desired.tags).await?;
        let keep: BTreeSet<&str> = wanted.iter().map(|(_, a)| a.as_str()).collect();
        for tg in tgs.iter().filter(|t| !keep.contains(t.arn.as_str())) {
            if !self.delete_tg(&tg.arn).await? {
                tracing::debug!(lbs = tg.lb_arns.len(), "target group still in use; removed on a later sync");
            }
        }
        // The load balancer's own group (its first), whatever the mode, as upstream.
        if let Some(first) = lb.security_groups.first() {
            let ports: Vec<(String, i32)> = desired
                .ports
                .iter()
                .map(|p| (if p.protocol == "UDP" { "udp" } else { "tcp" }.to_string(), p.port))
                .collect();
            self.set_ingress(first, &own_group_rules(&ports, desired.source_ranges())).await?;
        }
        if !self.config.disable_security_group_ingress {
            let subnets: Vec<String> = lb.subnets.iter().cloned().collect();
            let (ports, protocol) = client_ports(&desired);
            let traffic = NlbTraffic {
                client_cidrs: desired.source_ranges().to_vec(),
                client_protocol: protocol.to_string(),
                client_ports: ports,
                health_ports: health_rule_ports(&desired),
                subnet_cidrs: self.subnet_cidrs(&subnets).await?,
            };
            self.sync_nlb_rules(&desired.name, &instances, &traffic, &cluster).await?;
        }
        if let Some(fixed) = refusal {
            return Err(CloudError::refused(Refusal::UnsupportedService, fixed_field_message(&fixed)));
        }
        Ok(Some(status(&lb.dns)))
    }

    /// Delete the Service's NLB and everything made for it: its rules on the Nodes' groups
    /// (even when the load balancer is already gone), the load balancer, its target groups, and
    /// its own security groups that the cluster owns.
    pub(super) async fn delete_nlb(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        let cluster = self.cluster().await?.clone();
        let lb_name = default_load_balancer_name(service);
        let lbs = self.owned_lbs(&cluster, service).await?;
        let vpc = lbs
            .first()
            .map(|l| l.vpc.clone())
            .filter(|v| !v.is_empty())
            .or_else(|| (!self.config.vpc.is_empty()).then(|| self.config.vpc.clone()));
        // Looked up while attached: deleting the load balancer detaches them.
        let tgs = self.owned_tgs(&cluster, service, &lbs.iter().map(|l| l.arn.as_str()).collect::<Vec<_>>()).await?;
        // The groups made for it: the load balancer's own that the cluster owns, and a managed
        // group by its name (left behind by a delete that stopped half-way).
        let mut groups: BTreeSet<String> = lbs.iter().flat_map(|l| l.security_groups.iter().cloned()).collect();
        let name = managed_group_name(
            cluster_name,
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default(),
            service.metadata.uid.as_deref().unwrap_or_default(),
        );
        groups.extend(self.groups_named(&name).await?);
        let groups: Vec<String> = groups.into_iter().collect();
        let owned: Vec<String> = self
            .ownership(&groups, &cluster)
            .await?
            .into_iter()
            .filter(|(id, _, owned)| *owned && *id != self.config.elb_security_group)
            .map(|(id, _, _)| id)
            .collect();
        for lb in &lbs {
            self.delete_lb(&lb.arn).await?;
        }
        let mut pending = 0;
        for tg in tgs {
            if !self.delete_tg(&tg.arn).await? {
                pending += 1;
            }
        }
        self.revoke_nlb_rules(&lb_name, &cluster, vpc.as_deref()).await?;
        pending += self.delete_groups(&owned).await?;
        if pending > 0 {
            return Err(CloudError::retry_after(
                IN_USE_RETRY,
                format!("{pending} target or security groups are still in use by the deleted load balancer"),
            ));
        }
        Ok(())
    }
}
