//! Pod-network routes in VPC route tables: `RouteTableID` from the cloud-config, or every
//! table tagged for the cluster (`kubernetes.io/cluster/<id>` with any value, or the legacy
//! `KubernetesCluster=<id>`), never another cluster's. A route points at the Node's instance, whose
//! source/destination check is turned off so it may forward pod traffic. Routes whose instance
//! is gone show as blackholes, which the route controller deletes.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState};

use super::AwsProvider;
use super::errors::code;
use super::instances::InstanceKey;
use ccm_framework::provider::{CloudError, CloudResult, Route, Routes};

#[derive(Debug, Clone)]
struct TableRoute {
    cidr: String,
    instance_id: Option<String>,
    blackhole: bool,
}

impl AwsProvider {
    /// The route tables this cluster manages, with their routes made by CreateRoute.
    async fn route_tables(&self) -> CloudResult<Vec<(String, Vec<TableRoute>)>> {
        let cluster = self.cluster().await?.clone();
        let ec2 = &self.clients().await?.ec2;
        let mut req = ec2.describe_route_tables();
        let configured = !self.config.route_table_id.is_empty();
        if configured {
            req = req.route_table_ids(&self.config.route_table_id);
        } else if !self.config.vpc.is_empty() {
            req = req.filters(Filter::builder().name("vpc-id").values(&self.config.vpc).build());
        }
        let r = req.send().await.map_err(|e| self.classify("DescribeRouteTables", e))?;
        let tables: Vec<(String, Vec<TableRoute>)> = r
            .route_tables()
            .iter()
            .filter(|t| {
                configured
                    || cluster
                        .tagged(t.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())))
            })
            .map(|t| {
                let routes = t
                    .routes()
                    .iter()
                    .filter(|r| r.origin().is_none_or(|o| o.as_str() == "CreateRoute"))
                    .filter_map(|r| {
                        let cidr = r.destination_cidr_block()?.to_string();
                        let instance_id = r.instance_id().map(str::to_string);
                        let blackhole = r.state() == Some(&RouteState::Blackhole);
                        // Only routes to instances (or that lost theirs) are ours to manage.
                        (instance_id.is_some() || blackhole).then_some(TableRoute { cidr, instance_id, blackhole })
                    })
                    .collect();
                (t.route_table_id().unwrap_or_default().to_string(), routes)
            })
            .collect();
        if tables.is_empty() {
            return Err(CloudError::Other(format!(
                "no route table: set [Global] RouteTableID or tag the cluster's route tables with {}",
                cluster.tag_key()
            )));
        }
        Ok(tables)
    }

    /// The instance of a Node named `node_name` (by private DNS name, the upstream Node name).
    async fn instance_of_node(&self, node_name: &str) -> CloudResult<Option<String>> {
        let found = self.lookup(&[InstanceKey::PrivateDns(node_name.to_string())]).await?;
        Ok(found.into_iter().flatten().find(|i| !i.is_terminated()).map(|i| i.id.clone()))
    }
}

#[async_trait]
impl Routes for AwsProvider {
    async fn list_routes(&self, _cluster_name: &str) -> CloudResult<Vec<Route>> {
        let tables = self.route_tables().await?;
        let ids: Vec<InstanceKey> = tables
            .iter()
            .flat_map(|(_, routes)| routes.iter().filter_map(|r| r.instance_id.clone()))
            .map(InstanceKey::Id)
            .collect();
        let found = self.lookup(&ids).await?;
        let names: BTreeMap<String, String> = found
            .into_iter()
            .flatten()
            .filter(|i| !i.is_terminated())
            .map(|i| (i.id.clone(), i.private_dns.clone()))
            .collect();
        let mut out = Vec::new();
        for (table, routes) in tables {
            for r in routes {
                let target = r.instance_id.as_ref().and_then(|id| names.get(id)).cloned();
                out.push(Route {
                    name: format!("{table}/{}", r.cidr),
                    blackhole: r.blackhole || target.is_none(),
                    target_node: target.unwrap_or_default(),
                    destination_cidr: r.cidr,
                    ..Default::default()
                });
            }
        }
        Ok(out)
    }

    async fn create_route(&self, _cluster_name: &str, _name_hint: &str, route: &Route) -> CloudResult<()> {
        let instance = self.instance_of_node(&route.target_node).await?.ok_or_else(|| {
            CloudError::Other(format!("no running EC2 instance has the private DNS name {}", route.target_node))
        })?;
        let ec2 = &self.clients().await?.ec2;
        let info = self.lookup(&[InstanceKey::Id(instance.clone())]).await?.into_iter().flatten().next();
        if info.as_ref().is_none_or(|i| i.source_dest_check != Some(false)) {
            ec2.modify_instance_attribute()
                .instance_id(&instance)
                .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                .send()
                .await
                .map_err(|e| self.classify("ModifyInstanceAttribute", e))?;
            self.cache.invalidate(&instance);
        }
        for (table, routes) in self.route_tables().await? {
            let existing = routes.iter().find(|r| r.cidr == route.destination_cidr);
            match existing {
                Some(r) if r.instance_id.as_deref() == Some(instance.as_str()) && !r.blackhole => continue,
                Some(_) => {
                    ec2.replace_route()
                        .route_table_id(&table)
                        .destination_cidr_block(&route.destination_cidr)
                        .instance_id(&instance)
                        .send()
                        .await
                        .map_err(|e| self.classify("ReplaceRoute", e))?;
                }
                None => match ec2
                    .create_route()
                    .route_table_id(&table)
                    .destination_cidr_block(&route.destination_cidr)
                    .instance_id(&instance)
                    .send()
                    .await
                {
                    Ok(_) => {}
                    Err(e) if code(&e) == Some("RouteAlreadyExists") => {}
                    Err(e) => return Err(self.classify("CreateRoute", e)),
                },
            }
        }
        Ok(())
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> CloudResult<()> {
        let ec2 = &self.clients().await?.ec2;
        for (table, routes) in self.route_tables().await? {
            if !routes.iter().any(|r| r.cidr == route.destination_cidr) {
                continue;
            }
            match ec2.delete_route().route_table_id(&table).destination_cidr_block(&route.destination_cidr).send().await
            {
                Ok(_) => {}
                Err(e) if code(&e) == Some("InvalidRoute.NotFound") => {}
                Err(e) => return Err(self.classify("DeleteRoute", e)),
            }
        }
        Ok(())
    }
}
