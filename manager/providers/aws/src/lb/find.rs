//! Finding a Service's ELBv2 objects: by the load balancer's name, by attachment to it, and by
//! the [`ledger`] that a tag scan (at start, then every [`ledger::RESCAN`]) and this process's
//! own calls fill; each kept only where its tags name this cluster and Service.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::{LoadBalancerSchemeEnum, LoadBalancerTypeEnum};
use k8s_openapi::api::core::v1::Service;

use super::plan::{LbInfo, TgInfo};
use super::tags::{TAG_SERVICE, owned_by, owner};
use crate::AwsProvider;
use crate::cluster::{ClusterIdentity, TAG_CLUSTER_PREFIX};
use crate::errors::code;
use crate::ledger::{self, Kind, Owner};
use ccm_framework::provider::{CloudResult, default_load_balancer_name};

/// A network load balancer as the sync compares it; `None` for other types.
fn lb_info(lb: &aws_sdk_elasticloadbalancingv2::types::LoadBalancer) -> Option<LbInfo> {
    if lb.r#type().is_some_and(|t| *t != LoadBalancerTypeEnum::Network) {
        return None;
    }
    let zones = lb.availability_zones();
    let addresses: Vec<_> = zones.iter().flat_map(|z| z.load_balancer_addresses()).collect();
    // Only where ELBv2 reports addresses can they be compared.
    let reported = !addresses.is_empty();
    let allocations =
        reported.then(|| addresses.iter().filter_map(|a| a.allocation_id()).map(str::to_string).collect());
    let private_ipv4 =
        reported.then(|| addresses.iter().filter_map(|a| a.private_ipv4_address()).map(str::to_string).collect());
    Some(LbInfo {
        arn: lb.load_balancer_arn().unwrap_or_default().to_string(),
        dns: lb.dns_name().unwrap_or_default().to_string(),
        internal: lb.scheme().is_some_and(|s| *s == LoadBalancerSchemeEnum::Internal),
        created: lb.created_time().map(|t| t.as_secs_f64()),
        ip_address_type: lb.ip_address_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
        subnets: zones.iter().filter_map(|z| z.subnet_id()).map(str::to_string).collect(),
        allocations,
        private_ipv4,
        security_groups: lb.security_groups().to_vec(),
        vpc: lb.vpc_id().unwrap_or_default().to_string(),
    })
}

/// A target group as the sync compares it.
fn tg_info(tg: &aws_sdk_elasticloadbalancingv2::types::TargetGroup) -> TgInfo {
    TgInfo {
        arn: tg.target_group_arn().unwrap_or_default().to_string(),
        name: tg.target_group_name().unwrap_or_default().to_string(),
        protocol: tg.protocol().map(|p| p.as_str().to_string()).unwrap_or_default(),
        port: tg.port().unwrap_or_default(),
        health_port: tg.health_check_port().unwrap_or_default().to_string(),
        health_path: tg.health_check_path().unwrap_or_default().to_string(),
        health_protocol: tg.health_check_protocol().map(|p| p.as_str().to_string()).unwrap_or_default(),
        health_timing: (
            tg.health_check_interval_seconds().unwrap_or_default(),
            tg.health_check_timeout_seconds().unwrap_or_default(),
            tg.healthy_threshold_count().unwrap_or_default(),
            tg.unhealthy_threshold_count().unwrap_or_default(),
        ),
        lb_arns: tg.load_balancer_arns().to_vec(),
    }
}

impl AwsProvider {
    /// Tags of ELBv2 resources, 20 ARNs per call.
    pub(super) async fn elb_tags(&self, arns: &[String]) -> CloudResult<BTreeMap<String, BTreeMap<String, String>>> {
        let elb = &self.clients().await?.elb;
        let mut out = BTreeMap::new();
        for chunk in arns.chunks(20) {
            let r = elb
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(self.elb_err("DescribeTags"))?;
            for d in r.tag_descriptions() {
                let tags = d
                    .tags()
                    .iter()
                    .map(|t| (t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string()))
                    .collect();
                out.insert(d.resource_arn().unwrap_or_default().to_string(), tags);
            }
        }
        Ok(out)
    }

    /// Whether an NLB named as the Service's load balancer exists (a type-change check).
    pub(super) async fn nlb_named(&self, name: &str) -> CloudResult<bool> {
        let elb = &self.clients().await?.elb;
        match elb.describe_load_balancers().names(name).send().await {
            Ok(r) => Ok(r.load_balancers().iter().filter_map(lb_info).next().is_some()),
            Err(e) if code(&e) == Some("LoadBalancerNotFound") => Ok(false),
            Err(e) => Err(self.classify("DescribeLoadBalancers", e)),
        }
    }

    /// Every network load balancer of the account, one page of 400 per call.
    async fn all_lbs(&self) -> CloudResult<Vec<LbInfo>> {
        let elb = &self.clients().await?.elb;
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = elb
                .describe_load_balancers()
                .set_marker(marker.take())
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeLoadBalancers"))?;
            all.extend(page.load_balancers().iter().filter_map(lb_info));
            match page.next_marker().filter(|m| !m.is_empty()) {
                Some(m) => marker = Some(m.to_string()),
                None => break,
            }
        }
        Ok(all)
    }

    /// Every target group of the account, one page of 400 per call.
    async fn all_tgs(&self) -> CloudResult<Vec<TgInfo>> {
        let elb = &self.clients().await?.elb;
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = elb
                .describe_target_groups()
                .set_marker(marker.take())
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeTargetGroups"))?;
            all.extend(page.target_groups().iter().map(tg_info));
            match page.next_marker().filter(|m| !m.is_empty()) {
                Some(m) => marker = Some(m.to_string()),
                None => break,
            }
        }
        Ok(all)
    }

    /// Learn every owned load balancer and target group by their tags, when a scan is due
    /// (first use, then every [`ledger::RESCAN`]); concurrent syncs share one scan.
    async fn learn(&self) -> CloudResult<()> {
        if !self.ledger.scan_due(std::time::Instant::now(), ledger::RESCAN) {
            return Ok(());
        }
        let _one = self.ledger_scan.lock().await;
        let started = std::time::Instant::now();
        if !self.ledger.scan_due(started, ledger::RESCAN) {
            return Ok(());
        }
        let lbs: Vec<String> = self.all_lbs().await?.into_iter().map(|l| l.arn).collect();
        let tgs: Vec<String> = self.all_tgs().await?.into_iter().map(|t| t.arn).collect();
        for (kind, arns) in [(Kind::LoadBalancer, lbs), (Kind::TargetGroup, tgs)] {
            for (arn, tags) in self.elb_tags(&arns).await? {
                for owner in Owner::from_tags(&tags, TAG_CLUSTER_PREFIX, TAG_SERVICE) {
                    self.ledger.add(kind, &owner, &arn);
                }
            }
        }
        self.ledger.scanned(started);
        tracing::debug!(objects = self.ledger.len(), "learnt the cluster's ELBv2 objects from their tags");
        Ok(())
    }

    /// Load balancers of the Service, oldest first: the one with its name and any other the
    /// ledger knows, kept only where their tags name this cluster and Service.
    pub(super) async fn owned_lbs(&self, cluster: &ClusterIdentity, service: &Service) -> CloudResult<Vec<LbInfo>> {
        self.learn().await?;
        let owner = owner(cluster, service);
        let elb = &self.clients().await?.elb;
        let mut found: Vec<LbInfo> =
            match elb.describe_load_balancers().names(default_load_balancer_name(service)).send().await {
                Ok(r) => r.load_balancers().iter().filter_map(lb_info).collect(),
                Err(e) if code(&e) == Some("LoadBalancerNotFound") => Vec::new(),
                Err(e) => return Err(self.classify("DescribeLoadBalancers", e)),
            };
        // Known by the ledger under another name (an older UID's, or one made by hand): each
        // on its own, as one missing ARN fails a call for several.
        for arn in self.ledger.get(Kind::LoadBalancer, &owner) {
            if found.iter().any(|l| l.arn == arn) {
                continue;
            }
            match elb.describe_load_balancers().load_balancer_arns(&arn).send().await {
                Ok(r) => found.extend(r.load_balancers().iter().filter_map(lb_info)),
                Err(e) if code(&e) == Some("LoadBalancerNotFound") => {
                    self.ledger.remove(Kind::LoadBalancer, &owner, &arn);
                }
                Err(e) => return Err(self.classify("DescribeLoadBalancers", e)),
            }
        }
        let arns: Vec<String> = found.iter().map(|l| l.arn.clone()).collect();
        let tags = self.elb_tags(&arns).await?;
        let mut mine = Vec::new();
        for l in found {
            if tags.get(&l.arn).is_some_and(|t| owned_by(t, cluster, service)) {
                self.ledger.add(Kind::LoadBalancer, &owner, &l.arn);
                mine.push(l);
            } else {
                self.ledger.remove(Kind::LoadBalancer, &owner, &l.arn);
            }
        }
        mine.sort_by(|a, b| {
            a.created.partial_cmp(&b.created).unwrap_or(std::cmp::Ordering::Equal).then(a.arn.cmp(&b.arn))
        });
        Ok(mine)
    }

    /// Target groups of the Service: those attached to its load balancers `lbs` and any other
    /// the ledger knows (made before a crash, or detached from a replaced load balancer).
    pub(super) async fn owned_tgs(
        &self,
        cluster: &ClusterIdentity,
        service: &Service,
        lbs: &[&str],
    ) -> CloudResult<Vec<TgInfo>> {
        self.learn().await?;
        let owner = owner(cluster, service);
        let elb = &self.clients().await?.elb;
        let mut found: Vec<TgInfo> = Vec::new();
        for lb in lbs {
            match elb.describe_target_groups().load_balancer_arn(*lb).send().await {
                Ok(r) => found.extend(r.target_groups().iter().map(tg_info)),
                Err(e) if matches!(code(&e), Some("TargetGroupNotFound" | "LoadBalancerNotFound")) => {}
                Err(e) => return Err(self.classify("DescribeTargetGroups", e)),
            }
        }
        let known: Vec<String> = self
            .ledger
            .get(Kind::TargetGroup, &owner)
            .into_iter()
            .filter(|a| !found.iter().any(|t| t.arn == *a))
            .collect();
        for chunk in known.chunks(20) {
            match elb.describe_target_groups().set_target_group_arns(Some(chunk.to_vec())).send().await {
                Ok(r) => found.extend(r.target_groups().iter().map(tg_info)),
                // One is gone: ask for each to learn which.
                Err(e) if code(&e) == Some("TargetGroupNotFound") => {
                    for arn in chunk {
                        match elb.describe_target_groups().target_group_arns(arn).send().await {
                            Ok(r) => found.extend(r.target_groups().iter().map(tg_info)),
                            Err(e) if code(&e) == Some("TargetGroupNotFound") => {
                                self.ledger.remove(Kind::TargetGroup, &owner, arn);
                            }
                            Err(e) => return Err(self.classify("DescribeTargetGroups", e)),
                        }
                    }
                }
                Err(e) => return Err(self.classify("DescribeTargetGroups", e)),
            }
        }
        found.sort_by(|a, b| a.arn.cmp(&b.arn));
        found.dedup_by(|a, b| a.arn == b.arn);
        for t in &found {
            self.ledger.add(Kind::TargetGroup, &owner, &t.arn);
        }
        Ok(found)
    }
}
