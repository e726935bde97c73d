//! Load balancers for `type: LoadBalancer` Services, as cloud-provider-aws makes them: a
//! Network Load Balancer through ELBv2 for `aws-load-balancer-type: nlb`, a Classic ELB through
//! Elastic Load Balancing for every other Service (upstream's default), none for `external` and
//! `nlb-ip` (the AWS Load Balancer Controller's).
//!
//! Objects are named, tagged and described as upstream names, tags and describes them, so a
//! load balancer upstream made is found and kept, and a sync of an unchanged Service changes
//! nothing. A change AWS cannot make in place (the scheme, an NLB's subnets or fixed addresses)
//! never replaces a load balancer by itself: it is refused, naming the annotation, and the load
//! balancer kept, unless the Service sets [`spec::REPLACE`]. NLB objects are also found by the
//! [`ledger`](crate::ledger) of what a tag scan and this process's calls have seen, so an ensure
//! that died half-way leaves objects the next process adopts or removes.
//!
//! The pure part says what a Service asks for and what differs: `spec.rs` (upstream's checks
//! and the Service's shape), `desired.rs` and `plan.rs` (NLB), `classic.rs` (Classic ELB),
//! `subnets.rs` (placement), `rules.rs` (security-group rules), `names.rs` and `tags.rs`. The
//! I/O reads AWS and applies the differences: `nlb.rs` and `elb.rs` walk a sync, `find.rs`,
//! `elbv2.rs`, `vpc.rs` and `security_groups.rs` do the calls. The orphan scan (S34, S35):
//! `owned.rs` decides from tags what the cluster owns, `inventory.rs` lists and deletes it.

mod classic;
mod desired;
mod elb;
mod elbv2;
mod find;
#[cfg(test)]
mod fixtures;
mod inventory;
mod names;
mod nlb;
mod owned;
mod plan;
mod rules;
mod security_groups;
mod spec;
mod subnets;
mod tags;
mod vpc;

pub use self::classic::{Attributes, HealthCheck as ClassicHealthCheck, Listener as ClassicListener, listeners};
pub use self::desired::{
    Desired, DesiredPort, HealthSpec, ListenerTls, desired, health_rule_ports, health_spec, node_selected,
};
pub use self::names::{
    MANAGED_GROUP_DESCRIPTION, PROXY_PROTOCOL_POLICY, TargetGroupKey, classic_group_description, classic_group_name,
    managed_group_name, ssl_policy_name, target_group_name,
};
pub use self::owned::{
    KIND_CLASSIC_LOAD_BALANCER, KIND_LOAD_BALANCER, KIND_SECURITY_GROUP, KIND_TARGET_GROUP, NotOwned,
};
pub use self::plan::{FixedField, REASON_LOAD_BALANCER_REPLACED, fixed_field_message, replacement_note};
pub use self::rules::{NlbTraffic, Op, Perm, Source, nlb_group_ops};
pub use self::spec::{REPLACE, ServiceShape, check, status};
pub use self::subnets::{RouteTableInfo, SubnetCandidate, SubnetMapping, pick_subnets, subnet_role_tag};
pub use self::tags::{
    NLB_CLIENT_RULE, NLB_HEALTH_RULE, NLB_MTU_RULE, TAG_SERVICE, health_rule_description, lb_tags, owned_by,
    rule_description, service_key,
};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::AwsProvider;
use crate::annotations::{self as ann, LbKind};
use ccm_framework::provider::{CloudError, CloudResult, LoadBalancer, OwnedObject, default_load_balancer_name};

impl AwsProvider {
    /// An SDK error of the call `op` as a [`CloudError`], for `map_err`.
    fn elb_err<E>(
        &self,
        op: &str,
    ) -> impl Fn(aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>) -> CloudError + '_
    where
        E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let op = op.to_string();
        move |e| self.classify(&op, e)
    }

    async fn ensure(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
        create: bool,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        match ann::kind(service) {
            LbKind::Elsewhere => Err(CloudError::ImplementedElsewhere),
            LbKind::Nlb => self.ensure_nlb(cluster_name, service, nodes, create).await,
            LbKind::Classic => self.ensure_classic(service, nodes, create).await,
        }
    }
}

#[async_trait]
impl LoadBalancer for AwsProvider {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let cluster = self.cluster().await?.clone();
        let kind = ann::kind(service);
        if kind == LbKind::Elsewhere {
            return Ok(None);
        }
        // The kind the type annotation names first, then the other: after a type change (which
        // is refused) the Service is still served by the load balancer it has, and deletion
        // removes both kinds.
        let nlb = || async {
            Ok::<_, CloudError>(self.owned_lbs(&cluster, service).await?.first().map(|lb| status(&lb.dns)))
        };
        let classic = || async {
            let name = default_load_balancer_name(service);
            Ok::<_, CloudError>(self.classic_lb(&name, &cluster).await?.map(|lb| status(&lb.dns)))
        };
        if kind == LbKind::Nlb {
            match nlb().await? {
                Some(found) => Ok(Some(found)),
                None => classic().await,
            }
        } else {
            match classic().await? {
                Some(found) => Ok(Some(found)),
                None => nlb().await,
            }
        }
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
    ) -> CloudResult<LoadBalancerStatus> {
        self.ensure(cluster_name, service, nodes, true)
            .await?
            .ok_or_else(|| CloudError::Other("the load balancer was not created".into()))
    }

    async fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()> {
        // The same diff as ensure, without creating a load balancer that is not there.
        self.ensure(cluster_name, service, nodes, false).await.map(|_| ())
    }

    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        if ann::kind(service) == LbKind::Elsewhere {
            return Ok(());
        }
        // Both kinds: a Service whose type annotation changed still has the other one.
        let classic = self.delete_classic(service).await;
        self.delete_nlb(cluster_name, service).await?;
        classic
    }

    /// Ownership is the cluster ID's tags (the cloud-config's or the instance's), not
    /// `--cluster-name`, as for every other object of this provider.
    async fn list_owned(&self, _cluster_name: &str) -> CloudResult<Vec<OwnedObject>> {
        self.scan_owned().await
    }

    /// Load balancers, then target groups, then security groups; each object's tags are read
    /// again first, and one no longer owned by the cluster (or now naming another Service) is
    /// refused with [`CloudError::NotOwned`] and kept.
    async fn delete_owned(&self, _cluster_name: &str, objects: &[OwnedObject]) -> Vec<CloudResult<()>> {
        self.sweep_owned(objects).await
    }
}
