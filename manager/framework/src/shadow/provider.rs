//! The provider as shadow mode sees it: reads pass through, mutating calls are refused.
//!
//! Which calls read is the provider's own word ([`CloudProvider::call_kind`]). A refused call
//! returns [`CloudError::RefusedInShadowMode`] without reaching the provider and is counted in
//! `ccm_shadow_refused_calls_total{method}`. `initialize` (mutating by default: it may spawn
//! tasks that act) is skipped without being counted, so the engine goes on to the controllers.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::metrics::Metrics;
use crate::provider::{
    Call, CallKind, CloudError, CloudProvider, CloudResult, Clusters, Health, InitContext, InstanceMetadata, Instances,
    LoadBalancer, Route, Routes, Zone, Zones,
};
use crate::shadow::ShadowMetrics;

/// Wraps a provider for shadow mode; every capability it offers is offered through the wrapper.
pub struct ShadowProvider {
    inner: Arc<dyn CloudProvider>,
    metrics: ShadowMetrics,
}

impl ShadowProvider {
    /// Wrap `inner`, counting refusals in `metrics`.
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: &Metrics) -> Self {
        Self { inner, metrics: ShadowMetrics::register(metrics) }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    /// `Ok` when `call` may go through; the refusal otherwise (counted).
    pub fn admit(&self, call: Call) -> CloudResult<()> {
        match self.inner.call_kind(call) {
            CallKind::Read => Ok(()),
            CallKind::Mutating => {
                self.metrics.refused(call.method());
                tracing::debug!(call = call.method(), "mutating cloud call refused in shadow mode");
                Err(CloudError::RefusedInShadowMode { call })
            }
        }
    }

    fn instances_inner(&self, call: Call) -> CloudResult<&dyn Instances> {
        self.admit(call)?;
        self.inner.instances().ok_or(CloudError::NotImplemented)
    }

    fn lb_inner(&self, call: Call) -> CloudResult<&dyn LoadBalancer> {
        self.admit(call)?;
        self.inner.load_balancer().ok_or(CloudError::NotImplemented)
    }

    fn routes_inner(&self, call: Call) -> CloudResult<&dyn Routes> {
        self.admit(call)?;
        self.inner.routes().ok_or(CloudError::NotImplemented)
    }

    fn zones_inner(&self, call: Call) -> CloudResult<&dyn Zones> {
        self.admit(call)?;
        self.inner.zones().ok_or(CloudError::NotImplemented)
    }

    fn clusters_inner(&self, call: Call) -> CloudResult<&dyn Clusters> {
        self.admit(call)?;
        self.inner.clusters().ok_or(CloudError::NotImplemented)
    }
}

#[async_trait]
impl CloudProvider for ShadowProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        // Skipped, not failed, unless declared a read: the controllers still compare. The engine
        // makes this call itself, so it is not counted as a refused call (a controller's bug).
        match self.inner.call_kind(Call::Initialize) {
            CallKind::Read => self.inner.initialize(ctx).await,
            CallKind::Mutating => {
                tracing::debug!("provider initialization skipped in shadow mode (not declared a read)");
                Ok(())
            }
        }
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

    fn call_kind(&self, call: Call) -> CallKind {
        self.inner.call_kind(call)
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }

    fn capabilities(&self) -> crate::capabilities::Capabilities {
        self.inner.capabilities()
    }

    async fn health(&self) -> Health {
        match self.admit(Call::Health) {
            Ok(()) => self.inner.health().await,
            Err(_) => Health::healthy("health probe skipped: the provider says it is not a read"),
        }
    }

    fn reload(&self, cloud_config: Option<&[u8]>) -> crate::provider::Reload {
        self.inner.reload(cloud_config)
    }

    fn restart_fingerprint(&self) -> Option<Vec<u8>> {
        self.inner.restart_fingerprint()
    }
}

#[async_trait]
impl Instances for ShadowProvider {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.instances_inner(Call::InstanceExists)?.instance_exists(node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.instances_inner(Call::InstanceShutdown)?.instance_shutdown(node).await
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.instances_inner(Call::InstanceMetadata)?.instance_metadata(node).await
    }

    fn batch_size(&self) -> usize {
        self.inner.instances().map_or(1, |i| i.batch_size())
    }

    fn batch_concurrency(&self) -> usize {
        self.inner.instances().map_or(1, |i| i.batch_concurrency())
    }

    async fn instances_metadata(&self, nodes: &[&Node]) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        match self.instances_inner(Call::InstanceMetadata) {
            Ok(i) => i.instances_metadata(nodes).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn instances_exist(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        match self.instances_inner(Call::InstanceExists) {
            Ok(i) => i.instances_exist(nodes).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn instances_shutdown(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        match self.instances_inner(Call::InstanceShutdown) {
            Ok(i) => i.instances_shutdown(nodes).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

#[async_trait]
impl LoadBalancer for ShadowProvider {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.lb_inner(Call::GetLoadBalancer)?.get_load_balancer(cluster_name, service).await
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
        self.lb_inner(Call::EnsureLoadBalancer)?.ensure_load_balancer(cluster_name, service, nodes).await
    }

    async fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()> {
        self.lb_inner(Call::UpdateLoadBalancer)?.update_load_balancer(cluster_name, service, nodes).await
    }

    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        self.lb_inner(Call::EnsureLoadBalancerDeleted)?.ensure_load_balancer_deleted(cluster_name, service).await
    }

    async fn list_owned(&self, cluster_name: &str) -> CloudResult<Vec<crate::provider::OwnedObject>> {
        self.lb_inner(Call::ListOwned)?.list_owned(cluster_name).await
    }

    async fn delete_owned(&self, cluster_name: &str, objects: &[crate::provider::OwnedObject]) -> Vec<CloudResult<()>> {
        match self.lb_inner(Call::DeleteOwned) {
            Ok(lb) => lb.delete_owned(cluster_name, objects).await,
            Err(e) => objects.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

#[async_trait]
impl Routes for ShadowProvider {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        self.routes_inner(Call::ListRoutes)?.list_routes(cluster_name).await
    }

    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        self.routes_inner(Call::CreateRoute)?.create_route(cluster_name, name_hint, route).await
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        self.routes_inner(Call::DeleteRoute)?.delete_route(cluster_name, route).await
    }
}

#[async_trait]
impl Zones for ShadowProvider {
    async fn zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Option<Zone>> {
        self.zones_inner(Call::ZoneByProviderId)?.zone_by_provider_id(provider_id).await
    }

    async fn zone_by_node_name(&self, node_name: &str) -> CloudResult<Option<Zone>> {
        self.zones_inner(Call::ZoneByNodeName)?.zone_by_node_name(node_name).await
    }
}

#[async_trait]
impl Clusters for ShadowProvider {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        self.clusters_inner(Call::ListClusters)?.list_clusters().await
    }

    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        self.clusters_inner(Call::Master)?.master(cluster_name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records every call that reaches it; its `get_load_balancer` says it is mutating.
    #[derive(Default)]
    struct Recording {
        calls: Mutex<Vec<&'static str>>,
    }

    impl Recording {
        fn log(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }
    }

    #[async_trait]
    impl CloudProvider for Recording {
        fn name(&self) -> &str {
            "recording"
        }
        async fn initialize(&self, _: InitContext) -> CloudResult<()> {
            self.log("initialize");
            Ok(())
        }
        fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
            Some(self)
        }
        fn routes(&self) -> Option<&dyn Routes> {
            Some(self)
        }
        fn call_kind(&self, call: Call) -> CallKind {
            if call == Call::GetLoadBalancer { CallKind::Mutating } else { call.default_kind() }
        }
    }

    #[async_trait]
    impl LoadBalancer for Recording {
        async fn get_load_balancer(&self, _: &str, _: &Service) -> CloudResult<Option<LoadBalancerStatus>> {
            self.log("get_load_balancer");
            Ok(None)
        }
        async fn ensure_load_balancer(&self, _: &str, _: &Service, _: &[&Node]) -> CloudResult<LoadBalancerStatus> {
            self.log("ensure_load_balancer");
            Ok(LoadBalancerStatus::default())
        }
        async fn update_load_balancer(&self, _: &str, _: &Service, _: &[&Node]) -> CloudResult<()> {
            self.log("update_load_balancer");
            Ok(())
        }
        async fn ensure_load_balancer_deleted(&self, _: &str, _: &Service) -> CloudResult<()> {
            self.log("ensure_load_balancer_deleted");
            Ok(())
        }
    }

    #[async_trait]
    impl Routes for Recording {
        async fn list_routes(&self, _: &str) -> CloudResult<Vec<Route>> {
            self.log("list_routes");
            Ok(Vec::new())
        }
        async fn create_route(&self, _: &str, _: &str, _: &Route) -> CloudResult<()> {
            self.log("create_route");
            Ok(())
        }
        async fn delete_route(&self, _: &str, _: &Route) -> CloudResult<()> {
            self.log("delete_route");
            Ok(())
        }
    }

    #[tokio::test]
    async fn mutating_calls_are_refused_with_a_matchable_error_and_counted_and_never_reach_the_provider() {
        let inner = Arc::new(Recording::default());
        let metrics = Metrics::new();
        let shadow = ShadowProvider::new(inner.clone(), &metrics);
        let svc = Service::default();
        let lb = shadow.load_balancer().unwrap();
        assert!(matches!(
            lb.ensure_load_balancer("c", &svc, &[]).await,
            Err(CloudError::RefusedInShadowMode { call: Call::EnsureLoadBalancer })
        ));
        assert!(lb.update_load_balancer("c", &svc, &[]).await.is_err());
        assert!(lb.ensure_load_balancer_deleted("c", &svc).await.is_err());
        let routes = shadow.routes().unwrap();
        assert!(routes.create_route("c", "h", &Route::default()).await.is_err());
        assert!(routes.delete_route("c", &Route::default()).await.is_err());
        // A read passes; a "read" the provider declares mutating does not.
        assert_eq!(routes.list_routes("c").await, Ok(Vec::new()));
        assert!(matches!(
            lb.get_load_balancer("c", &svc).await,
            Err(CloudError::RefusedInShadowMode { call: Call::GetLoadBalancer })
        ));
        assert_eq!(*inner.calls.lock().unwrap(), vec!["list_routes"]);
        let text = metrics.encode();
        assert!(text.contains(r#"ccm_shadow_refused_calls_total{method="ensure_load_balancer"} 1"#), "{text}");
        assert!(text.contains(r#"ccm_shadow_refused_calls_total{method="get_load_balancer"} 1"#), "{text}");
    }

    #[tokio::test]
    async fn an_initialize_not_declared_a_read_is_skipped_without_counting_as_a_refused_call() {
        let inner = Arc::new(Recording::default());
        let metrics = Metrics::new();
        let shadow = ShadowProvider::new(inner.clone(), &metrics);
        // A client that is never used: nothing here talks to an API server.
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let events = crate::events::EventSink::spawn(client.clone(), None, shutdown.clone());
        let ctx = InitContext { client, shutdown, metrics: Arc::new(Metrics::new()), events };
        assert_eq!(shadow.initialize(ctx).await, Ok(()));
        assert!(inner.calls.lock().unwrap().is_empty(), "the provider's initialize never ran");
        assert!(!metrics.encode().contains(r#"method="initialize""#), "{}", metrics.encode());
    }
}
