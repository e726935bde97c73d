//! The `aws` provider on the official AWS SDK: instances from EC2 (InstancesV2 semantics, batched
//! and cached), Network Load Balancers through ELBv2 and Classic ELBs through Elastic Load
//! Balancing, as cloud-provider-aws makes them, and pod routes in VPC route tables.
//!
//! The factory only parses the cloud-config; the SDK clients are built on first use, because
//! resolving credentials and the region may touch the network (metadata service, STS). The
//! cluster ID is the cloud-config's, else read from the tags of the manager's own instance
//! (upstream's way) when the provider is initialized, which fails, naming the setting to add,
//! when there is none. See docs/aws.md for the IAM policy, the annotations and the differences
//! from upstream.

pub mod annotations;
pub mod capabilities;
pub mod cluster;
pub mod config;
pub mod credentials;
pub mod errors;
pub mod instances;
pub mod lb;
pub mod ledger;
pub mod routes;
pub mod topology;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{Credentials, Region, SharedCredentialsProvider};
use aws_sdk_ec2::types::Filter;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::OnceCell;

use self::cluster::{ClusterIdentity, cluster_from_tags};
use self::config::{AwsConfig, Endpoint};
use self::errors::{ThrottleLog, classify, code};
use self::instances::{Absence, AbsenceTracker, InstanceCache, InstanceInfo, InstanceKey, KeyError, key_of};
use ccm_framework::events::EventSink;
use ccm_framework::metrics::Metrics;
use ccm_framework::provider::{
    CloudError, CloudProvider, CloudResult, Health, InitContext, InstanceMetadata, Instances, LoadBalancer, Routes,
    health_reasons,
};
use ccm_framework::registry::{FactoryInput, Registry, RegistryError};

/// The SDK crates, for callers (and tests) that talk to AWS directly.
pub mod sdk {
    pub use aws_sdk_ec2 as ec2;
    pub use aws_sdk_elasticloadbalancing as elb;
    pub use aws_sdk_elasticloadbalancingv2 as elbv2;
}

/// The registered provider name.
pub const NAME: &str = "aws";

/// Values per filter in one DescribeInstances call (EC2 accepts up to 200).
pub const FILTER_VALUES_PER_CALL: usize = 200;

/// Register the provider under [`NAME`].
pub fn register(registry: &mut Registry) -> Result<(), RegistryError> {
    registry.register(NAME, factory)
}

/// The factory: parse and validate the cloud-config (no I/O).
pub fn factory(input: FactoryInput<'_>) -> Result<Arc<dyn CloudProvider>, CloudError> {
    let config = match input.cloud_config {
        Some(bytes) => config::parse(bytes).map_err(|e| CloudError::InvalidConfig(e.to_string()))?,
        None => AwsConfig::default(),
    };
    Ok(Arc::new(AwsProvider::new(config, &input.cluster.cluster_name, AwsOptions::default())))
}

/// Tunables that are not part of upstream's cloud-config.
#[derive(Debug, Clone)]
pub struct AwsOptions {
    /// How long a described instance is reused by every controller.
    pub cache_ttl: Duration,
    /// Two lookups at least this far apart must both miss an instance before it is reported
    /// gone (EC2's eventual consistency right after launch).
    pub absence_confirm_after: Duration,
    /// How long throttling answers count towards the delay and `ProviderHealthy`.
    pub throttle_window: Duration,
    /// SDK attempts per call.
    pub max_attempts: u32,
    /// The SDK's adaptive retry mode (a client-side rate limiter that slows down after
    /// throttling, down to one request per two seconds); `false` is its standard mode.
    pub adaptive_retry: bool,
    /// Static credentials instead of the standard chain (tests, emulators).
    pub credentials: Option<Credentials>,
    /// An endpoint for every service (tests, emulators); `[ServiceOverride]` sections win.
    pub endpoint_url: Option<String>,
    /// The instance metadata service (tests); the `ec2imds` `[ServiceOverride]` wins.
    pub imds_endpoint: Option<String>,
}

impl Default for AwsOptions {
    fn default() -> Self {
        Self {
            cache_ttl: Duration::from_secs(10),
            absence_confirm_after: Duration::from_secs(20),
            throttle_window: Duration::from_secs(60),
            max_attempts: 3,
            adaptive_retry: true,
            credentials: None,
            endpoint_url: None,
            imds_endpoint: None,
        }
    }
}

/// The SDK clients, built once.
#[derive(Debug, Clone)]
pub struct Clients {
    /// EC2.
    pub ec2: aws_sdk_ec2::Client,
    /// ELBv2.
    pub elb: aws_sdk_elasticloadbalancingv2::Client,
    /// Classic Elastic Load Balancing.
    pub classic: aws_sdk_elasticloadbalancing::Client,
    /// The region in use.
    pub region: String,
}

/// The aws provider.
pub struct AwsProvider {
    config: AwsConfig,
    cluster_name: String,
    options: AwsOptions,
    clients: OnceCell<Clients>,
    /// The cluster's ID in tags, resolved once.
    cluster: OnceCell<ClusterIdentity>,
    /// Availability zones by name: (zone ID, zone type), read once.
    zones: OnceCell<BTreeMap<String, (String, String)>>,
    cache: InstanceCache,
    absence: AbsenceTracker,
    throttles: ThrottleLog,
    /// The manager's event sink, handed over by `initialize` each leadership term; events on
    /// Services (a replaced load balancer) go there.
    events: std::sync::Mutex<Option<EventSink>>,
    /// What is known not to answer `DescribeInstanceTopology`.
    topology: std::sync::Mutex<topology::TopologyMemory>,
    /// The cluster's ELBv2 objects by Service, so a sync need not scan them all.
    ledger: ledger::Ledger,
    /// Held by the one tag scan under way; concurrent syncs wait for it.
    ledger_scan: tokio::sync::Mutex<()>,
    /// Held while rules on the Nodes' groups are read, computed and written: load balancers
    /// share those groups (and the path-MTU rules), so two syncs interleaving there would act
    /// on each other's stale reads.
    node_group_rules: tokio::sync::Mutex<()>,
    /// Services already told (once per process) that a setting applies to new load balancers only.
    noted: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsProvider").field("cluster_name", &self.cluster_name).finish_non_exhaustive()
    }
}

impl AwsProvider {
    /// A provider for `config` in the cluster `cluster_name` (`--cluster-name`: used, as
    /// upstream, only in the names of NLBs' managed security groups, never as the cluster ID).
    pub fn new(config: AwsConfig, cluster_name: &str, options: AwsOptions) -> Self {
        let topology = topology::TopologyMemory::new(config.topology_types.clone());
        Self {
            cache: InstanceCache::new(options.cache_ttl),
            absence: AbsenceTracker::new(options.absence_confirm_after),
            throttles: ThrottleLog::new(options.throttle_window),
            config,
            cluster_name: cluster_name.to_string(),
            options,
            clients: OnceCell::new(),
            cluster: OnceCell::new(),
            zones: OnceCell::new(),
            events: std::sync::Mutex::new(None),
            topology: std::sync::Mutex::new(topology),
            ledger: ledger::Ledger::default(),
            ledger_scan: tokio::sync::Mutex::new(()),
            node_group_rules: tokio::sync::Mutex::new(()),
            noted: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// Hold while reading and changing rules on the Nodes' groups (see `node_group_rules`).
    pub(crate) async fn node_group_rules(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.node_group_rules.lock().await
    }

    /// Whether `key` is noted for the first time in this process.
    pub(crate) fn note_once(&self, key: &str) -> bool {
        self.noted.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string())
    }

    /// The event sink of the current leadership term, if `initialize` handed one over.
    pub(crate) fn event_sink(&self) -> Option<EventSink> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The parsed cloud-config.
    pub fn config(&self) -> &AwsConfig {
        &self.config
    }

    /// The cluster ID that tags mark ownership with: the cloud-config's, else read once from
    /// the tags of the manager's own instance (metadata service, then EC2), as upstream. Without
    /// either the error names the setting to add; no ID is ever made up.
    pub async fn cluster(&self) -> CloudResult<&ClusterIdentity> {
        self.cluster.get_or_try_init(|| self.resolve_cluster()).await
    }

    async fn resolve_cluster(&self) -> CloudResult<ClusterIdentity> {
        if let Some(c) = self.config.configured_cluster() {
            return Ok(c);
        }
        let none = |why: String| {
            CloudError::InvalidConfig(format!(
                "no cluster ID: the cloud-config sets neither [Global] KubernetesClusterID nor KubernetesClusterTag, and {why}; add [Global] KubernetesClusterID"
            ))
        };
        let region = self.config.effective_region();
        let mut imds = aws_config::imds::Client::builder()
            .configure(&aws_config::provider_config::ProviderConfig::without_region().with_http_client(http_client()))
            .max_attempts(2);
        let url =
            self.config.endpoint(Endpoint::Imds, &region).map(|o| o.url.clone()).or(self.options.imds_endpoint.clone());
        if let Some(url) = url {
            imds = imds.endpoint(url).map_err(|e| none(format!("the metadata endpoint is not a URL ({e})")))?;
        }
        let id = imds
            .build()
            .get("/latest/meta-data/instance-id")
            .await
            .map_err(|e| none(format!("the instance metadata service did not say which instance this is ({e})")))?;
        let id = id.as_ref().to_string();
        let ec2 = &self.clients().await?.ec2;
        let r = ec2
            .describe_instances()
            .instance_ids(&id)
            .send()
            .await
            .map_err(|e| self.classify("DescribeInstances", e))?;
        let instance = r
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .next()
            .ok_or_else(|| none(format!("the manager's instance {id} was not found")))?;
        let tags = instance.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()));
        let found = cluster_from_tags(tags).map_err(|e| CloudError::InvalidConfig(e.to_string()))?;
        tracing::info!(cluster = %found.id, legacy = found.legacy, "cluster ID read from the tags of the manager's instance");
        Ok(found)
    }

    /// The instance cache (its counters are the hit/miss metrics).
    pub fn cache(&self) -> &InstanceCache {
        &self.cache
    }

    /// Throttling answers in the recent window.
    pub fn recent_throttles(&self) -> usize {
        self.throttles.recent()
    }

    /// Register the provider's own metrics (cache hits and misses, DescribeInstances calls).
    pub fn register_metrics(&self, metrics: &Metrics) {
        let c = &self.cache.counters;
        metrics.get_or_register("aws_instance_cache_hits", "Instance lookups answered by the shared snapshot", || {
            c.hits.clone()
        });
        metrics.get_or_register(
            "aws_instance_cache_misses",
            "Instance lookups that needed a DescribeInstances call",
            || c.misses.clone(),
        );
        metrics.get_or_register("aws_describe_instances_calls", "DescribeInstances calls (pages)", || {
            c.describe_calls.clone()
        });
    }

    /// The SDK clients, built on first use.
    pub async fn clients(&self) -> CloudResult<&Clients> {
        self.clients.get_or_try_init(|| self.build_clients()).await
    }

    async fn build_clients(&self) -> CloudResult<Clients> {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .operation_attempt_timeout(Duration::from_secs(20))
            .operation_timeout(Duration::from_secs(60))
            .build();
        let retry = if self.options.adaptive_retry { RetryConfig::adaptive() } else { RetryConfig::standard() };
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http_client())
            .retry_config(retry.with_max_attempts(self.options.max_attempts.max(1)))
            .timeout_config(timeouts);
        let region = self.config.effective_region();
        if !region.is_empty() {
            loader = loader.region(Region::new(region));
        }
        if let Some(credentials) = &self.options.credentials {
            loader = loader.credentials_provider(credentials.clone());
        }
        let mut sdk = loader.load().await;
        let region = sdk.region().map(|r| r.to_string()).ok_or_else(|| {
            CloudError::InvalidConfig(
                "no AWS region: set [Global] Zone or Region in the cloud-config, or AWS_REGION in the environment"
                    .into(),
            )
        })?;
        if !self.config.role_arn.is_empty() {
            let account = config::role_account(&self.config.role_arn).unwrap_or_default();
            let mut sts = aws_sdk_sts::config::Builder::from(&sdk);
            if let Some(o) = self.config.endpoint(Endpoint::Sts, &region) {
                sts = sts.endpoint_url(o.url.clone());
            } else if let Some(url) = &self.options.endpoint_url {
                sts = sts.endpoint_url(url.clone());
            }
            let role = credentials::AssumedRole::new(
                aws_sdk_sts::Client::from_conf(sts.build()),
                &self.config.role_arn,
                "ccm-operator",
                credentials::assume_role_headers(account, &self.config.source_arn),
            );
            sdk = sdk.into_builder().credentials_provider(SharedCredentialsProvider::new(role)).build();
        }
        // Each client with its override: the URL, the region and the name to sign for.
        let ovr = |e: Endpoint| self.config.endpoint(e, &region).cloned();
        let default_url = self.options.endpoint_url.clone();
        let mut ec2 = aws_sdk_ec2::config::Builder::from(&sdk);
        match ovr(Endpoint::Ec2) {
            Some(o) => {
                ec2 = ec2.endpoint_url(o.url.clone());
                if !o.signing_region.is_empty() {
                    ec2 = ec2.region(Region::new(o.signing_region.clone()));
                }
                if !o.signing_name.is_empty() {
                    ec2 = ec2.interceptor(credentials::SigningNameOverride(o.signing_name.clone()));
                }
            }
            None => {
                ec2.set_endpoint_url(default_url.clone());
            }
        }
        let mut elb = aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk);
        match ovr(Endpoint::Elbv2) {
            Some(o) => {
                elb = elb.endpoint_url(o.url.clone());
                if !o.signing_region.is_empty() {
                    elb = elb.region(Region::new(o.signing_region.clone()));
                }
                if !o.signing_name.is_empty() {
                    elb = elb.interceptor(credentials::SigningNameOverride(o.signing_name.clone()));
                }
            }
            None => {
                elb.set_endpoint_url(default_url.clone());
            }
        }
        let mut classic = aws_sdk_elasticloadbalancing::config::Builder::from(&sdk);
        match ovr(Endpoint::Elb) {
            Some(o) => {
                classic = classic.endpoint_url(o.url.clone());
                if !o.signing_region.is_empty() {
                    classic = classic.region(Region::new(o.signing_region.clone()));
                }
                if !o.signing_name.is_empty() {
                    classic = classic.interceptor(credentials::SigningNameOverride(o.signing_name.clone()));
                }
            }
            None => {
                classic.set_endpoint_url(default_url.clone());
            }
        }
        tracing::info!(region = %region, "AWS clients ready");
        Ok(Clients {
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
            elb: aws_sdk_elasticloadbalancingv2::Client::from_conf(elb.build()),
            classic: aws_sdk_elasticloadbalancing::Client::from_conf(classic.build()),
            region,
        })
    }

    fn classify<E>(
        &self,
        op: &str,
        err: aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>,
    ) -> CloudError
    where
        E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        classify(op, err, &self.throttles)
    }

    /// Describe instances matching one filter whose values are `values` (paginated).
    async fn describe_by(&self, filter: &str, values: &[String]) -> CloudResult<Vec<Arc<InstanceInfo>>> {
        let ec2 = &self.clients().await?.ec2;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            self.cache.counters.describe_calls.inc();
            let page = ec2
                .describe_instances()
                .filters(Filter::builder().name(filter).set_values(Some(values.to_vec())).build())
                .set_next_token(token.take())
                .max_results(1000)
                .send()
                .await
                .map_err(|e| self.classify("DescribeInstances", e))?;
            for reservation in page.reservations() {
                out.extend(reservation.instances().iter().filter_map(InstanceInfo::from_sdk).map(Arc::new));
            }
            match page.next_token().filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        Ok(out)
    }

    /// Look up many instances: fresh cache entries first, then one filtered DescribeInstances
    /// per kind of key (instance ID, private DNS name) and per [`FILTER_VALUES_PER_CALL`].
    /// Results are in input order; `None` where no instance matched.
    pub async fn lookup(&self, keys: &[InstanceKey]) -> CloudResult<Vec<Option<Arc<InstanceInfo>>>> {
        let mut results: Vec<Option<Arc<InstanceInfo>>> = keys.iter().map(|k| self.cache.get(k)).collect();
        let mut ids: Vec<String> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (key, result) in keys.iter().zip(&results) {
            if result.is_some() {
                continue;
            }
            match key {
                InstanceKey::Id(id) if !ids.contains(id) => ids.push(id.clone()),
                InstanceKey::PrivateDns(name) if !name.is_empty() && !names.contains(name) => names.push(name.clone()),
                _ => {}
            }
        }
        let mut found: Vec<Arc<InstanceInfo>> = Vec::new();
        for chunk in ids.chunks(FILTER_VALUES_PER_CALL) {
            found.extend(self.describe_by("instance-id", chunk).await?);
        }
        for chunk in names.chunks(FILTER_VALUES_PER_CALL) {
            found.extend(self.describe_by("private-dns-name", chunk).await?);
        }
        self.cache.put(&found);
        for (key, result) in keys.iter().zip(results.iter_mut()) {
            if result.is_none() {
                *result = found
                    .iter()
                    .find(|i| match key {
                        InstanceKey::Id(id) => &i.id == id,
                        // A name may be reused by a terminated instance: prefer one that is not.
                        InstanceKey::PrivateDns(name) => &i.private_dns == name && !i.is_terminated(),
                    })
                    .or_else(|| found.iter().find(|i| matches!(key, InstanceKey::PrivateDns(n) if &i.private_dns == n)))
                    .cloned();
            }
        }
        Ok(results)
    }

    /// Look up the instances of `nodes`; per-Node errors for Nodes that cannot name one.
    async fn lookup_nodes(&self, nodes: &[&Node]) -> Vec<CloudResult<(InstanceKey, Option<Arc<InstanceInfo>>)>> {
        let keys: Vec<Result<InstanceKey, KeyError>> = nodes.iter().map(|n| key_of(n)).collect();
        let valid: Vec<InstanceKey> = keys.iter().filter_map(|k| k.as_ref().ok().cloned()).collect();
        let looked = self.lookup(&valid).await;
        let mut looked = match looked {
            Ok(v) => v.into_iter(),
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        keys.into_iter()
            .zip(nodes)
            .map(|(key, node)| match key {
                Ok(key) => Ok((key, looked.next().flatten())),
                Err(KeyError::ForeignProviderId) => Err(CloudError::Other(format!(
                    "Node {} has a providerID of another provider",
                    node.metadata.name.as_deref().unwrap_or_default()
                ))),
                Err(KeyError::MalformedProviderId) => Err(CloudError::Other(format!(
                    "Node {} has an aws providerID without an instance ID",
                    node.metadata.name.as_deref().unwrap_or_default()
                ))),
            })
            .collect()
    }

    fn exists_outcome(&self, key: &InstanceKey, info: Option<&InstanceInfo>) -> CloudResult<bool> {
        match info {
            Some(i) if !i.is_terminated() => {
                self.absence.found(key);
                Ok(true)
            }
            // Terminated is final: no need to wait for a second look.
            Some(_) => Ok(false),
            None => match self.absence.missed(key) {
                Absence::Confirmed => Ok(false),
                Absence::Unconfirmed(after) => Err(CloudError::retry_after(
                    after,
                    "instance not found; confirming with a second lookup before reporting it gone",
                )),
            },
        }
    }

    fn metadata_of(
        &self,
        info: &InstanceInfo,
        region: &str,
        zone_ids: &BTreeMap<String, String>,
        network_nodes: Option<&Vec<String>>,
    ) -> InstanceMetadata {
        let mut labels = zone_id_labels(&info.zone, zone_ids);
        if let Some(nodes) = network_nodes {
            labels.extend(topology::layer_labels(nodes));
        }
        InstanceMetadata {
            provider_id: info.provider_id(),
            instance_type: info.instance_type.clone(),
            node_addresses: instances::node_addresses(&info.addresses, &info.ipv6, &self.config.node_ip_families),
            zone: node_zone(&info.zone, zone_ids, self.config.zone_id_as_zone),
            region: region.to_string(),
            additional_labels: labels,
        }
    }

    fn topology_memory(&self) -> std::sync::MutexGuard<'_, topology::TopologyMemory> {
        self.topology.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The network nodes of `instances` ((ID, type) pairs) that the API reports, by instance
    /// ID. Instances known not to answer are not asked; a region without the API or a manager
    /// without the permission gives an empty answer (remembered for a day). Any other failure
    /// is the error, which only instance types that must have a topology pass on.
    async fn network_nodes(&self, instances: &[(String, String)]) -> CloudResult<BTreeMap<String, Vec<String>>> {
        use aws_sdk_ec2::config::retry::RetryConfig as Ec2Retry;
        let ask = self.topology_memory().to_ask(instances, std::time::Instant::now());
        let mut out = BTreeMap::new();
        if ask.is_empty() {
            return Ok(out);
        }
        let ec2 = &self.clients().await?.ec2;
        for chunk in ask.chunks(topology::IDS_PER_CALL) {
            let mut token: Option<String> = None;
            loop {
                // One attempt: the labels are best-effort for most types, and a missing API
                // (an emulator answers 500) must not cost the SDK's retries on every lookup.
                let answer = ec2
                    .describe_instance_topology()
                    .set_instance_ids(Some(chunk.to_vec()))
                    .set_next_token(token.take())
                    .customize()
                    .config_override(
                        aws_sdk_ec2::config::Builder::default().retry_config(Ec2Retry::standard().with_max_attempts(1)),
                    )
                    .send()
                    .await;
                let page = match answer {
                    Ok(page) => page,
                    Err(e) => {
                        let failure = topology::failure_of(code(&e));
                        self.topology_memory().failed(failure, std::time::Instant::now());
                        let err = self.classify("DescribeInstanceTopology", e);
                        return match failure {
                            topology::Failure::Unsupported => {
                                tracing::info!(error = %err, "DescribeInstanceTopology does not answer here (region or IAM permission); the network-node-layer labels are left out for a day");
                                Ok(BTreeMap::new())
                            }
                            topology::Failure::Transient => {
                                tracing::warn!(error = %err, "cannot read the instance topology; the network-node-layer labels wait");
                                Err(err)
                            }
                        };
                    }
                };
                for i in page.instances() {
                    if let Some(id) = i.instance_id() {
                        out.insert(id.to_string(), i.network_nodes().to_vec());
                    }
                }
                match page.next_token().filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t.to_string()),
                    None => break,
                }
            }
        }
        let asked: Vec<(String, String)> = instances.iter().filter(|(id, _)| ask.contains(id)).cloned().collect();
        self.topology_memory().answered(&asked, &out, std::time::Instant::now());
        Ok(out)
    }

    /// The region's zones by name: (zone ID, zone type), from one `DescribeAvailabilityZones`
    /// per provider; a failure is retried on the next lookup (the answer is then empty).
    pub(crate) async fn zones(&self) -> BTreeMap<String, (String, String)> {
        let read = self
            .zones
            .get_or_try_init(|| async {
                let ec2 = &self.clients().await?.ec2;
                let r = ec2
                    .describe_availability_zones()
                    .send()
                    .await
                    .map_err(|e| self.classify("DescribeAvailabilityZones", e))?;
                Ok::<_, CloudError>(
                    r.availability_zones()
                        .iter()
                        .filter_map(|z| {
                            let kind = z.zone_type().unwrap_or_default().to_string();
                            Some((z.zone_name()?.to_string(), (z.zone_id()?.to_string(), kind)))
                        })
                        .collect(),
                )
            })
            .await;
        match read {
            Ok(m) => m.clone(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the availability zones; the topology.k8s.aws/zone-id label waits");
                BTreeMap::new()
            }
        }
    }

    /// The region's zone IDs by zone name.
    async fn zone_ids(&self) -> BTreeMap<String, String> {
        self.zones().await.into_iter().map(|(name, (id, _))| (name, id)).collect()
    }

    /// A cheap call that proves credentials, endpoint and region work.
    async fn probe(&self) -> CloudResult<()> {
        let clients = self.clients().await?;
        clients
            .ec2
            .describe_instances()
            .max_results(5)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.classify("DescribeInstances", e))
    }
}

/// The SDK's HTTP client: rustls with ring.
fn http_client() -> aws_sdk_ec2::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https()
}

/// Upstream's zone-ID label.
pub const LABEL_ZONE_ID: &str = "topology.k8s.aws/zone-id";

/// The Node's `topology.kubernetes.io/zone`: the zone name, or with `ZoneIDAsZone` its ID
/// (the name while the ID is unknown, so a Node never lacks the label).
pub fn node_zone(zone: &str, zone_ids: &BTreeMap<String, String>, zone_id_as_zone: bool) -> String {
    match zone_ids.get(zone) {
        Some(id) if zone_id_as_zone => id.clone(),
        _ => zone.to_string(),
    }
}

/// The labels for an instance's zone: its zone ID, when known.
pub fn zone_id_labels(zone: &str, zone_ids: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    zone_ids.get(zone).map(|id| BTreeMap::from([(LABEL_ZONE_ID.to_string(), id.clone())])).unwrap_or_default()
}

#[async_trait]
impl CloudProvider for AwsProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> ccm_framework::capabilities::Capabilities {
        capabilities::capabilities(
            NAME,
            self.instances().is_some(),
            self.routes().is_some(),
            self.load_balancer().is_some(),
        )
    }

    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    fn has_cluster_id(&self) -> bool {
        // An ID is configured or read in `initialize`, which fails without one: never shared.
        true
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        // What upstream ignores silently is ignored here too, but said, once, by the manager that
        // uses the file (not by a factory called only to validate it, as the operator does).
        if self.note_once("cloud-config warnings") {
            for w in &self.config.warnings {
                tracing::warn!(warning = %w, "cloud-config");
            }
        }
        self.register_metrics(&ctx.metrics);
        *self.events.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.events);
        // Without a configured ID this reads the manager's instance: no controller runs until
        // the cluster is known, as upstream refuses to start.
        self.cluster().await.map(|_| ())
    }

    async fn health(&self) -> Health {
        if let Err(e) = self.cluster().await {
            return match e {
                CloudError::InvalidConfig(m) => Health::unhealthy(health_reasons::INVALID_CLOUD_CONFIG, m),
                other => Health::unhealthy(health_reasons::PROBE_ERROR, other.to_string()),
            };
        }
        let recent = self.throttles.recent();
        let outcome = self.probe().await;
        match outcome {
            Err(CloudError::Throttled { .. }) => Health::unhealthy(
                health_reasons::THROTTLED,
                format!("the AWS API is rate-limiting calls ({} throttled answers recently)", self.throttles.recent()),
            ),
            Err(CloudError::Unauthorized(m)) => Health::unhealthy(health_reasons::CREDENTIALS_REJECTED, m),
            Err(CloudError::InvalidConfig(m)) => Health::unhealthy(health_reasons::INVALID_CLOUD_CONFIG, m),
            Err(CloudError::Unavailable(m)) => Health::unhealthy(health_reasons::ENDPOINT_UNREACHABLE, m),
            Err(other) => Health::unhealthy(health_reasons::PROBE_ERROR, other.to_string()),
            Ok(()) if recent > 0 => Health::unhealthy(
                health_reasons::THROTTLED,
                format!("{recent} calls were throttled by the AWS API in the last minute; retrying with backoff"),
            ),
            Ok(()) => {
                let region = self.clients().await.map(|c| c.region.clone()).unwrap_or_default();
                Health::healthy(format!("AWS API reachable in {region}"))
            }
        }
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

#[async_trait]
impl Instances for AwsProvider {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.instances_exist(&[node]).await.pop().unwrap_or(Err(CloudError::Other("no result".into())))
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.instances_shutdown(&[node]).await.pop().unwrap_or(Err(CloudError::Other("no result".into())))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.instances_metadata(&[node]).await.pop().unwrap_or(Err(CloudError::Other("no result".into())))
    }

    fn batch_size(&self) -> usize {
        // Two filters (IDs, names) of FILTER_VALUES_PER_CALL values each; larger batches are
        // split inside `lookup`, still one call per 200 Nodes.
        1000
    }

    async fn instances_metadata(&self, nodes: &[&Node]) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let region = match self.clients().await {
            Ok(c) => c.region.clone(),
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        let zone_ids = self.zone_ids().await;
        let looked = self.lookup_nodes(nodes).await;
        // Only needed (and resolved once) for Nodes named by private DNS name.
        let by_name = looked.iter().any(|r| matches!(r, Ok((InstanceKey::PrivateDns(_), Some(_)))));
        let cluster = if by_name { Some(self.cluster().await.cloned()) } else { None };
        let running: Vec<(String, String)> = looked
            .iter()
            .filter_map(|r| r.as_ref().ok().and_then(|(_, i)| i.as_ref()))
            .filter(|i| !i.is_terminated())
            .map(|i| (i.id.clone(), i.instance_type.clone()))
            .collect();
        let (network_nodes, topology_error) = match self.network_nodes(&running).await {
            Ok(found) => (found, None),
            Err(e) => (BTreeMap::new(), Some(e)),
        };
        looked
            .into_iter()
            .zip(nodes)
            .map(|(r, node)| {
                let (key, info) = r?;
                match info {
                    Some(i) if !i.is_terminated() => {
                        // As upstream, an instance found by the Node's name is the Node's only
                        // when it carries the cluster tag (private DNS names repeat across VPCs).
                        if let (InstanceKey::PrivateDns(_), Some(cluster)) = (&key, &cluster) {
                            let cluster = cluster.as_ref().map_err(Clone::clone)?;
                            if !cluster.tagged(i.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
                                tracing::debug!(node = %node_name(node), instance = %i.id, "the instance of this Node's name has no cluster tag; not initializing it, as upstream");
                                return Ok(None);
                            }
                        }
                        // The pattern's types must have their topology: they wait for it.
                        if let Some(e) =
                            topology_error.as_ref().filter(|_| self.config.topology_types.requires(&i.instance_type))
                        {
                            return Err(e.clone());
                        }
                        Ok(Some(self.metadata_of(&i, &region, &zone_ids, network_nodes.get(&i.id))))
                    }
                    _ => {
                        tracing::debug!(node = %node_name(node), "no EC2 instance for this Node yet");
                        Ok(None)
                    }
                }
            })
            .collect()
    }

    async fn instances_exist(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        self.lookup_nodes(nodes)
            .await
            .into_iter()
            .map(|r| {
                let (key, info) = r?;
                self.exists_outcome(&key, info.as_deref())
            })
            .collect()
    }

    async fn instances_shutdown(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        self.lookup_nodes(nodes)
            .await
            .into_iter()
            .map(|r| {
                let (_, info) = r?;
                Ok(info.is_some_and(|i| i.is_shut_down()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_framework::registry::ClusterSettings;

    #[test]
    fn zone_id_label_is_set_only_for_a_known_zone() {
        let ids: BTreeMap<String, String> = [("us-east-1a".to_string(), "use1-az6".to_string())].into();
        assert_eq!(zone_id_labels("us-east-1a", &ids).get(LABEL_ZONE_ID).map(String::as_str), Some("use1-az6"));
        assert!(zone_id_labels("us-east-1b", &ids).is_empty());
        assert_eq!(node_zone("us-east-1a", &ids, false), "us-east-1a");
        assert_eq!(node_zone("us-east-1a", &ids, true), "use1-az6");
        assert_eq!(node_zone("us-east-1b", &ids, true), "us-east-1b");
    }

    #[test]
    fn factory_accepts_a_valid_config_without_io_and_rejects_a_bad_one_by_key() {
        let cluster = ClusterSettings { cluster_name: "c".into(), ..Default::default() };
        let ok = factory(FactoryInput { cloud_config: Some(b"[Global]\nZone = us-east-1a\n"), cluster: &cluster });
        assert_eq!(ok.unwrap().name(), "aws");
        let bad = factory(FactoryInput { cloud_config: Some(b"[Global]\nVPC = hunter2\n"), cluster: &cluster });
        let Err(CloudError::InvalidConfig(m)) = bad else { panic!("expected InvalidConfig") };
        assert!(m.contains("VPC") && !m.contains("hunter2"), "{m}");
    }

    #[test]
    fn registered_under_aws() {
        let mut r = Registry::new();
        register(&mut r).unwrap();
        assert!(r.contains("aws"));
    }
}
