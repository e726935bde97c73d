//! The orphan scan's calls (S34, S35): listing the ELBv2 load balancers, target groups, Classic
//! ELBs and load-balancer security groups that carry this cluster's ownership, and deleting
//! listed ones in dependency order after reading their tags again. What counts as owned is
//! decided in [`owned`](super::owned).

use std::collections::BTreeMap;

use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{Filter, SecurityGroup};
use ccm_framework::provider::{CloudError, CloudResult, OwnedObject};

use super::names::classic_group_name;
use super::nlb::IN_USE_RETRY;
use super::owned::{
    self, GroupSeen, KIND_CLASSIC_LOAD_BALANCER, KIND_LOAD_BALANCER, KIND_SECURITY_GROUP, KIND_TARGET_GROUP, MAX_PAGES,
    NotOwned,
};
use crate::AwsProvider;
use crate::cluster::{ClusterIdentity, TAG_CLUSTER_LEGACY};
use crate::errors::code;

/// Error codes meaning an ELB object is gone (a deletion in between is not a failure).
const GONE: &[&str] = &["LoadBalancerNotFound", "TargetGroupNotFound", "AccessPointNotFound"];

/// An ELBv2 load balancer as the scan needs it.
struct Elbv2Lb {
    arn: String,
    security_groups: Vec<String>,
}

/// A Classic ELB as the scan needs it.
struct ClassicLb {
    name: String,
    security_groups: Vec<String>,
}

/// A listing and whether it is complete (not cut at [`MAX_PAGES`]).
struct Listing<T> {
    items: Vec<T>,
    complete: bool,
}

/// Follows a listing's markers (or tokens) through at most [`MAX_PAGES`] pages: `page` answers
/// one page's items and the next marker, empty or absent at the end.
async fn paginate<T, F, Fut>(mut page: F) -> CloudResult<Listing<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = CloudResult<(Vec<T>, Option<String>)>>,
{
    let mut items = Vec::new();
    let mut marker = None;
    for _ in 0..MAX_PAGES {
        let (mut got, next) = page(marker.take()).await?;
        items.append(&mut got);
        match next.filter(|m| !m.is_empty()) {
            Some(m) => marker = Some(m),
            None => return Ok(Listing { items, complete: true }),
        }
    }
    Ok(Listing { items, complete: false })
}

fn tag_map<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> BTreeMap<String, String> {
    pairs.map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn group_tags(g: &SecurityGroup) -> BTreeMap<String, String> {
    tag_map(g.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())))
}

/// The refusal of an object whose tags changed since the scan: [`CloudError::NotOwned`].
fn refuse(why: NotOwned) -> CloudError {
    CloudError::NotOwned(why.to_string())
}

impl AwsProvider {
    /// Every ELBv2 load balancer of the account, at most [`MAX_PAGES`] pages.
    async fn scan_elbv2_lbs(&self) -> CloudResult<Listing<Elbv2Lb>> {
        let elb = &self.clients().await?.elb;
        paginate(|marker| async move {
            let page = elb
                .describe_load_balancers()
                .set_marker(marker)
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeLoadBalancers"))?;
            let items = page.load_balancers().iter().filter_map(|l| {
                Some(Elbv2Lb { arn: l.load_balancer_arn()?.to_string(), security_groups: l.security_groups().to_vec() })
            });
            Ok((items.collect(), page.next_marker().map(str::to_string)))
        })
        .await
    }

    /// Every ELBv2 target group's ARN, at most [`MAX_PAGES`] pages.
    async fn scan_target_groups(&self) -> CloudResult<Listing<String>> {
        let elb = &self.clients().await?.elb;
        paginate(|marker| async move {
            let page = elb
                .describe_target_groups()
                .set_marker(marker)
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeTargetGroups"))?;
            let items = page.target_groups().iter().filter_map(|t| t.target_group_arn()).map(str::to_string);
            Ok((items.collect(), page.next_marker().map(str::to_string)))
        })
        .await
    }

    /// Every Classic ELB of the account, at most [`MAX_PAGES`] pages.
    async fn scan_classic_lbs(&self) -> CloudResult<Listing<ClassicLb>> {
        let elb = &self.clients().await?.classic;
        paginate(|marker| async move {
            let page = elb
                .describe_load_balancers()
                .set_marker(marker)
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeLoadBalancers"))?;
            let items = page.load_balancer_descriptions().iter().filter_map(|d| {
                Some(ClassicLb {
                    name: d.load_balancer_name()?.to_string(),
                    security_groups: d.security_groups().to_vec(),
                })
            });
            Ok((items.collect(), page.next_marker().map(str::to_string)))
        })
        .await
    }

    /// The security groups tagged with the cluster (its key, or the legacy tag), at most
    /// [`MAX_PAGES`] pages per filter.
    async fn scan_cluster_groups(&self, cluster: &ClusterIdentity) -> CloudResult<Listing<SecurityGroup>> {
        let ec2 = &self.clients().await?.ec2;
        let mut by_id: BTreeMap<String, SecurityGroup> = BTreeMap::new();
        let mut complete = true;
        let by_key = Filter::builder().name("tag-key").values(cluster.tag_key()).build();
        let by_legacy = Filter::builder().name(format!("tag:{TAG_CLUSTER_LEGACY}")).values(&cluster.id).build();
        for filter in [by_key, by_legacy] {
            let filter = &filter;
            let listing = paginate(|token| async move {
                let page = ec2
                    .describe_security_groups()
                    .filters(filter.clone())
                    .set_next_token(token)
                    .max_results(1000)
                    .send()
                    .await
                    .map_err(self.elb_err("DescribeSecurityGroups"))?;
                Ok((page.security_groups().to_vec(), page.next_token().map(str::to_string)))
            })
            .await?;
            for g in listing.items {
                if let Some(id) = g.group_id() {
                    by_id.insert(id.to_string(), g.clone());
                }
            }
            complete &= listing.complete;
        }
        Ok(Listing { items: by_id.into_values().collect(), complete })
    }

    /// Reads `keys` 20 per call with `read`; a chunk naming an object deleted in between (a
    /// [`GONE`] code) is read again one by one, leaving the gone ones out.
    async fn read_in_chunks<R, E, F, Fut>(&self, keys: &[String], mut read: F) -> CloudResult<Vec<R>>
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: std::future::Future<Output = Result<R, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let mut answers = Vec::new();
        for chunk in keys.chunks(20) {
            match read(chunk.to_vec()).await {
                Ok(r) => answers.push(r),
                Err(e) if code(&e).is_some_and(|c| GONE.contains(&c)) => {
                    for key in chunk {
                        match read(vec![key.clone()]).await {
                            Ok(r) => answers.push(r),
                            Err(e) if code(&e).is_some_and(|c| GONE.contains(&c)) => {}
                            Err(e) => return Err(self.classify("DescribeTags", e)),
                        }
                    }
                }
                Err(e) => return Err(self.classify("DescribeTags", e)),
            }
        }
        Ok(answers)
    }

    /// Tags of ELBv2 resources by ARN; a resource deleted in between is left out.
    async fn scan_elbv2_tags(&self, arns: &[String]) -> CloudResult<BTreeMap<String, BTreeMap<String, String>>> {
        let elb = &self.clients().await?.elb;
        let answers =
            self.read_in_chunks(arns, |chunk| elb.describe_tags().set_resource_arns(Some(chunk)).send()).await?;
        let mut out = BTreeMap::new();
        for d in answers.iter().flat_map(|r| r.tag_descriptions()) {
            let tags = tag_map(d.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())));
            out.insert(d.resource_arn().unwrap_or_default().to_string(), tags);
        }
        Ok(out)
    }

    /// Tags of Classic ELBs by name; one deleted in between is left out.
    async fn scan_classic_tags(&self, names: &[String]) -> CloudResult<BTreeMap<String, BTreeMap<String, String>>> {
        let elb = &self.clients().await?.classic;
        let answers =
            self.read_in_chunks(names, |chunk| elb.describe_tags().set_load_balancer_names(Some(chunk)).send()).await?;
        let mut out = BTreeMap::new();
        for d in answers.iter().flat_map(|r| r.tag_descriptions()) {
            let tags = tag_map(d.tags().iter().map(|t| (t.key(), t.value().unwrap_or_default())));
            out.insert(d.load_balancer_name().unwrap_or_default().to_string(), tags);
        }
        Ok(out)
    }

    /// The objects this provider made for the cluster's Services (S34): ELBv2 load balancers
    /// and target groups and Classic ELBs with the cluster's owned tag and a Service tag, and
    /// the security groups made for load balancers with the owned tag.
    pub(super) async fn scan_owned(&self) -> CloudResult<Vec<OwnedObject>> {
        let cluster = self.cluster().await?.clone();
        let lbs = self.scan_elbv2_lbs().await?;
        let tgs = self.scan_target_groups().await?;
        let classics = self.scan_classic_lbs().await?;
        let groups = self.scan_cluster_groups(&cluster).await?;
        for (what, complete) in [
            ("ELBv2 load balancers", lbs.complete),
            ("target groups", tgs.complete),
            ("Classic ELBs", classics.complete),
            ("security groups", groups.complete),
        ] {
            if !complete {
                tracing::warn!(
                    what,
                    pages = MAX_PAGES,
                    "the orphan scan read only the first pages; the report is partial"
                );
            }
        }
        let lb_arns: Vec<String> = lbs.items.iter().map(|l| l.arn.clone()).collect();
        let lb_tags = self.scan_elbv2_tags(&lb_arns).await?;
        let tg_tags = self.scan_elbv2_tags(&tgs.items).await?;
        let classic_names: Vec<String> = classics.items.iter().map(|l| l.name.clone()).collect();
        let classic_tags = self.scan_classic_tags(&classic_names).await?;
        let none = BTreeMap::new();

        let mut out = Vec::new();
        // Which load balancer uses each group, with the Service its tag names.
        let mut used_by: BTreeMap<&str, Option<String>> = BTreeMap::new();
        for lb in &lbs.items {
            let tags = lb_tags.get(&lb.arn).unwrap_or(&none);
            out.extend(owned::elbv2_owned(KIND_LOAD_BALANCER, &lb.arn, tags, &cluster));
            let service = tags.get(super::tags::TAG_SERVICE).cloned();
            for g in &lb.security_groups {
                used_by.entry(g.as_str()).or_insert_with(|| service.clone());
            }
        }
        for arn in &tgs.items {
            out.extend(owned::elbv2_owned(KIND_TARGET_GROUP, arn, tg_tags.get(arn).unwrap_or(&none), &cluster));
        }
        for lb in &classics.items {
            let tags = classic_tags.get(&lb.name).unwrap_or(&none);
            out.extend(owned::classic_owned(&lb.name, tags, &cluster));
            let service = tags.get(super::tags::TAG_SERVICE).cloned();
            for g in &lb.security_groups {
                used_by.entry(g.as_str()).or_insert_with(|| service.clone());
            }
        }
        let uses_known = lbs.complete && classics.complete;
        for g in &groups.items {
            // `ElbSecurityGroup` is the operator's, shared by every Classic ELB.
            let Some(id) = g.group_id().filter(|id| *id != self.config.elb_security_group) else { continue };
            let tags = group_tags(g);
            let seen = GroupSeen {
                id,
                name: g.group_name().unwrap_or_default(),
                description: g.description().unwrap_or_default(),
                tags: &tags,
                used_by: used_by.get(id).map(|s| s.as_deref()),
            };
            out.extend(owned::group_owned(&seen, &cluster, uses_known));
        }
        out.sort();
        Ok(out)
    }

    /// Delete listed objects in dependency order (S35), each after reading its tags again; one
    /// result per object, in input order.
    pub(super) async fn sweep_owned(&self, objects: &[OwnedObject]) -> Vec<CloudResult<()>> {
        let cluster = match self.cluster().await {
            Ok(c) => c.clone(),
            Err(e) => return objects.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut out: Vec<CloudResult<()>> =
            objects.iter().map(|_| Err(CloudError::Other("not attempted".into()))).collect();
        for i in owned::deletion_order(objects) {
            let object = &objects[i];
            let result = match object.kind.as_str() {
                KIND_LOAD_BALANCER => self.sweep_elbv2_lb(object, &cluster).await,
                KIND_TARGET_GROUP => self.sweep_target_group(object, &cluster).await,
                KIND_CLASSIC_LOAD_BALANCER => self.sweep_classic(object, &cluster).await,
                KIND_SECURITY_GROUP => self.sweep_group(object, &cluster).await,
                _ => Err(refuse(NotOwned::UnknownKind { kind: object.kind.clone(), id: object.id.clone() })),
            };
            if result.is_ok() {
                tracing::info!(kind = %object.kind, id = %object.id, service = ?object.service, "deleted an orphaned object of the cluster");
            }
            if let Some(slot) = out.get_mut(i) {
                *slot = result;
            }
        }
        out
    }

    /// The current tags of one ELBv2 resource; `None` when it is gone.
    async fn elbv2_tags_now(&self, arn: &str) -> CloudResult<Option<BTreeMap<String, String>>> {
        Ok(self.scan_elbv2_tags(&[arn.to_string()]).await?.remove(arn))
    }

    async fn sweep_elbv2_lb(&self, object: &OwnedObject, cluster: &ClusterIdentity) -> CloudResult<()> {
        let Some(tags) = self.elbv2_tags_now(&object.id).await? else { return Ok(()) };
        owned::still_owned(object, &tags, cluster).map_err(refuse)?;
        let elb = &self.clients().await?.elb;
        // Its name and VPC, to remove its rules from the Nodes' groups afterwards.
        let lb = match elb.describe_load_balancers().load_balancer_arns(&object.id).send().await {
            Ok(r) => r.load_balancers().first().cloned(),
            Err(e) if code(&e).is_some_and(|c| GONE.contains(&c)) => None,
            Err(e) => return Err(self.classify("DescribeLoadBalancers", e)),
        };
        let Some(lb) = lb else { return Ok(()) };
        self.delete_lb(&object.id).await?;
        if let Some(name) = lb.load_balancer_name() {
            self.revoke_nlb_rules(name, cluster, lb.vpc_id().filter(|v| !v.is_empty())).await?;
        }
        Ok(())
    }

    async fn sweep_target_group(&self, object: &OwnedObject, cluster: &ClusterIdentity) -> CloudResult<()> {
        let Some(tags) = self.elbv2_tags_now(&object.id).await? else { return Ok(()) };
        owned::still_owned(object, &tags, cluster).map_err(refuse)?;
        if self.delete_tg(&object.id).await? {
            Ok(())
        } else {
            Err(CloudError::retry_after(IN_USE_RETRY, format!("target group {} is still in use", object.id)))
        }
    }

    async fn sweep_classic(&self, object: &OwnedObject, cluster: &ClusterIdentity) -> CloudResult<()> {
        let Some(tags) = self.scan_classic_tags(std::slice::from_ref(&object.id)).await?.remove(&object.id) else {
            return Ok(());
        };
        owned::still_owned(object, &tags, cluster).map_err(refuse)?;
        self.delete_classic_lb(&object.id).await
    }

    async fn sweep_group(&self, object: &OwnedObject, cluster: &ClusterIdentity) -> CloudResult<()> {
        if object.id == self.config.elb_security_group {
            return Err(CloudError::Other(format!("{} is ElbSecurityGroup; never deleted", object.id)));
        }
        let ec2 = &self.clients().await?.ec2;
        // By filter: a group already gone is an empty answer, not an error.
        let found = ec2
            .describe_security_groups()
            .filters(Filter::builder().name("group-id").values(&object.id).build())
            .send()
            .await
            .map_err(self.elb_err("DescribeSecurityGroups"))?;
        let Some(g) = found.security_groups().first() else { return Ok(()) };
        owned::still_owned(object, &group_tags(g), cluster).map_err(refuse)?;
        // The Nodes' rules admitting a Classic ELB's group keep it in use: removed first.
        if g.group_name().is_some_and(|n| n.starts_with(classic_group_name("").as_str())) {
            self.revoke_references(&object.id, cluster).await?;
        }
        if self.delete_groups(std::slice::from_ref(&object.id)).await? > 0 {
            return Err(CloudError::retry_after(IN_USE_RETRY, format!("security group {} is still in use", object.id)));
        }
        Ok(())
    }
}
