//! A provider decorator that counts and times every cloud call for `/metrics`.
//!
//! Metrics: `cloudprovider_api_requests_total{provider,method,result}` (result is `success` or
//! the [`CloudError::kind`]) and `cloudprovider_api_request_duration_seconds{provider,method}`.
//! A batch call is one request under its batch method name, as it is one call to the cloud.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::metrics::Metrics;
use crate::provider::{
    CloudError, CloudProvider, CloudResult, Clusters, Health, InitContext, InstanceMetadata, Instances, LoadBalancer,
    Route, Routes, Zone, Zones,
};

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The provider's name.
    pub provider: String,
    /// The trait method, for example `instance_metadata`.
    pub method: String,
    /// `success` or the error kind.
    pub result: String,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// The provider's name.
    pub provider: String,
    /// The trait method.
    pub method: String,
}

type Latencies = Family<MethodLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1ms .. ~65s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The cloud API metric families, registered once per [`Metrics`].
#[derive(Clone, Debug)]
pub struct CloudMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Latencies,
}

impl CloudMetrics {
    /// Register (or find) the families in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let requests = metrics.get_or_register(
            "cloudprovider_api_requests",
            "Cloud provider calls by provider, method and result (success or error kind).",
            Family::<RequestLabels, Counter>::default,
        );
        let latency = metrics.get_or_register(
            "cloudprovider_api_request_duration_seconds",
            "Latency of cloud provider calls by provider and method.",
            || Latencies::new_with_constructor(latency_histogram as fn() -> Histogram),
        );
        Self { requests, latency }
    }

    fn observe(&self, provider: &str, method: &str, seconds: f64, result: &str) {
        self.latency.get_or_create(&MethodLabels { provider: provider.into(), method: method.into() }).observe(seconds);
        self.requests
            .get_or_create(&RequestLabels { provider: provider.into(), method: method.into(), result: result.into() })
            .inc();
    }
}

/// Wraps a provider; every capability it offers is offered through the wrapper.
pub struct InstrumentedProvider {
    inner: Arc<dyn CloudProvider>,
    metrics: CloudMetrics,
}

impl InstrumentedProvider {
    /// Wrap `inner`, recording into `metrics`.
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: &Metrics) -> Self {
        Self { inner, metrics: CloudMetrics::new(metrics) }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    async fn timed<T>(&self, method: &str, call: impl Future<Output = CloudResult<T>>) -> CloudResult<T> {
        let start = Instant::now();
        let result = call.await;
        let outcome = match &result {
            Ok(_) => "success",
            Err(e) => e.kind(),
        };
        self.metrics.observe(self.inner.name(), method, start.elapsed().as_secs_f64(), outcome);
        result
    }

    /// Time a batch call: counted once, failed if every entry failed.
    async fn timed_batch<T>(
        &self,
        method: &str,
        call: impl Future<Output = Vec<CloudResult<T>>>,
    ) -> Vec<CloudResult<T>> {
        let start = Instant::now();
        let results = call.await;
        let outcome = match results.iter().find_map(|r| r.as_ref().err()) {
            Some(e) if results.iter().all(Result::is_err) => e.kind(),
            _ => "success",
        };
        self.metrics.observe(self.inner.name(), method, start.elapsed().as_secs_f64(), outcome);
        results
    }

    fn instances_inner(&self) -> CloudResult<&dyn Instances> {
        self.inner.instances().ok_or(CloudError::NotImplemented)
    }

    fn lb_inner(&self) -> CloudResult<&dyn LoadBalancer> {
        self.inner.load_balancer().ok_or(CloudError::NotImplemented)
    }

    fn routes_inner(&self) -> CloudResult<&dyn Routes> {
        self.inner.routes().ok_or(CloudError::NotImplemented)
    }

    fn zones_inner(&self) -> CloudResult<&dyn Zones> {
        self.inner.zones().ok_or(CloudError::NotImplemented)
    }

    fn clusters_inner(&self) -> CloudResult<&dyn Clusters> {
        self.inner.clusters().ok_or(CloudError::NotImplemented)
    }
}

#[async_trait]
impl CloudProvider for InstrumentedProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.timed("initialize", self.inner.initialize(ctx)).await
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.instances().map(|_| self as &dyn Instances)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner.load_balancer().map(|_| self as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner.routes().map(|_| self as &dyn Routes)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones().map(|_| self as &dyn Zones)
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner.clusters().map(|_| self as &dyn Clusters)
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }

    fn capabilities(&self) -> crate::capabilities::Capabilities {
        self.inner.capabilities()
    }

    fn call_kind(&self, call: crate::provider::Call) -> crate::provider::CallKind {
        self.inner.call_kind(call)
    }

    async fn health(&self) -> Health {
        let start = Instant::now();
        let health = self.inner.health().await;
        let outcome = if health.is_healthy() { "success" } else { "unhealthy" };
        self.metrics.observe(self.inner.name(), "health", start.elapsed().as_secs_f64(), outcome);
        health
    }
}

#[async_trait]
impl Instances for InstrumentedProvider {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.timed("instance_exists", async { self.instances_inner()?.instance_exists(node).await }).await
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.timed("instance_shutdown", async { self.instances_inner()?.instance_shutdown(node).await }).await
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.timed("instance_metadata", async { self.instances_inner()?.instance_metadata(node).await }).await
    }

    fn batch_size(&self) -> usize {
        self.inner.instances().map_or(1, |i| i.batch_size())
    }

    fn batch_concurrency(&self) -> usize {
        self.inner.instances().map_or(1, |i| i.batch_concurrency())
    }

    async fn instances_metadata(&self, nodes: &[&Node]) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        match self.instances_inner() {
            Ok(i) => self.timed_batch("instances_metadata", i.instances_metadata(nodes)).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn instances_exist(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        match self.instances_inner() {
            Ok(i) => self.timed_batch("instances_exist", i.instances_exist(nodes)).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn instances_shutdown(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        match self.instances_inner() {
            Ok(i) => self.timed_batch("instances_shutdown", i.instances_shutdown(nodes)).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

#[async_trait]
impl LoadBalancer for InstrumentedProvider {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.timed("get_load_balancer", async { self.lb_inner()?.get_load_balancer(cluster_name, service).await }).await
    }

    fn load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        match self.inner.load_balancer() {
            Some(lb) => lb.load_balancer_name(cluster_name, service),
            None => crate::provider::default_load_balancer_name(service),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
    ) -> CloudResult<LoadBalancerStatus> {
        self.timed("ensure_load_balancer", async {
            self.lb_inner()?.ensure_load_balancer(cluster_name, service, nodes).await
        })
        .await
    }

    async fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()> {
        self.timed("update_load_balancer", async {
            self.lb_inner()?.update_load_balancer(cluster_name, service, nodes).await
        })
        .await
    }

    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        self.timed("ensure_load_balancer_deleted", async {
            self.lb_inner()?.ensure_load_balancer_deleted(cluster_name, service).await
        })
        .await
    }

    async fn list_owned(&self, cluster_name: &str) -> CloudResult<Vec<crate::provider::OwnedObject>> {
        self.timed("list_owned", async { self.lb_inner()?.list_owned(cluster_name).await }).await
    }

    async fn delete_owned(&self, cluster_name: &str, objects: &[crate::provider::OwnedObject]) -> Vec<CloudResult<()>> {
        match self.lb_inner() {
            Ok(lb) => self.timed_batch("delete_owned", lb.delete_owned(cluster_name, objects)).await,
            Err(e) => objects.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

#[async_trait]
impl Routes for InstrumentedProvider {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        self.timed("list_routes", async { self.routes_inner()?.list_routes(cluster_name).await }).await
    }

    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        self.timed("create_route", async { self.routes_inner()?.create_route(cluster_name, name_hint, route).await })
            .await
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        self.timed("delete_route", async { self.routes_inner()?.delete_route(cluster_name, route).await }).await
    }
}

#[async_trait]
impl Zones for InstrumentedProvider {
    async fn zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Option<Zone>> {
        self.timed("zone_by_provider_id", async { self.zones_inner()?.zone_by_provider_id(provider_id).await }).await
    }

    async fn zone_by_node_name(&self, node_name: &str) -> CloudResult<Option<Zone>> {
        self.timed("zone_by_node_name", async { self.zones_inner()?.zone_by_node_name(node_name).await }).await
    }
}

#[async_trait]
impl Clusters for InstrumentedProvider {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        self.timed("list_clusters", async { self.clusters_inner()?.list_clusters().await }).await
    }

    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        self.timed("master", async { self.clusters_inner()?.master(cluster_name).await }).await
    }
}
