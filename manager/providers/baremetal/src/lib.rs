//! The `baremetal` provider: instances from an inventory in the cloud-config, TCP liveness
//! probes, and load-balancer IPs from address pools.
//!
//! By default it programs no network: it only decides which Service gets which address and
//! reports it (`ipMode: VIP`). An L2 or BGP announcer (kube-vip in services mode, MetalLB's
//! speaker with its own allocation off, or a router's static routes) must make the addresses
//! reachable; `loadBalancer.kubeVip: true` writes the annotation kube-vip reads. With
//! `loadBalancer.mode: proxy` the leader also carries the traffic itself (see [`proxy`]).

pub mod admission;
pub mod advertisement;
pub mod announce;
pub mod capabilities;
pub mod config;
#[cfg(feature = "datapath")]
pub mod datapath;
pub mod deploy;
pub mod duration;
pub mod inventory;
pub mod ipam;
pub mod name;
pub mod orphans;
pub mod pool_import;
pub mod pool_import_kubevip;
pub mod pool_import_watch;
pub mod pool_metrics;
pub mod pool_resources;
pub mod pool_watch;
pub mod port_check;
pub mod ports;
pub mod probe;
pub mod proxy;
pub mod reload;
pub mod selector;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube::api::{Api, ListParams};
use tokio_util::sync::CancellationToken;

use self::config::{CloudConfig, ConfigError, LifecycleConfig};
use self::inventory::Inventory;
use self::ipam::{AllocError, Allocator, RestoreReport, ServiceKey};
use self::probe::{ProbeStates, ProbeTarget};
use ccm_framework::provider::{
    CloudError, CloudProvider, CloudResult, Health, InitContext, InstanceMetadata, Instances, LoadBalancer,
    OwnedObject, Refusal, Reload, health_reasons,
};
use ccm_framework::registry::{Built, FactoryInput, Registry, RegistryError};
use ccm_framework::webhook::AdmissionWebhook;

pub use name::NAME;

/// `ipMode` of every reported ingress: traffic arrives addressed to the VIP itself.
pub const IP_MODE: &str = "VIP";

/// How long a Service waits when it asks before the allocator has been rebuilt.
const NOT_READY_RETRY: Duration = Duration::from_secs(2);

/// Services listed per page when rebuilding the allocator.
const LIST_PAGE: u32 = 500;

/// Register the provider under [`NAME`], with its admission webhook ([`admission`]).
pub fn register(registry: &mut Registry) -> Result<(), RegistryError> {
    registry.register_with_webhooks(NAME, build)
}

/// [`factory`] with the provider's admission webhook, which reads the provider's live pools.
pub fn build(input: FactoryInput<'_>) -> Result<Built, CloudError> {
    let provider = Arc::new(BaremetalProvider::from_cloud_config(input.cloud_config)?);
    let webhook: Arc<dyn AdmissionWebhook> = Arc::new(admission::AddressWebhook::new(provider.clone()));
    Ok(Built { provider, webhooks: vec![webhook] })
}

/// The factory: parse and validate the cloud-config, nothing else (no I/O, no tasks).
pub fn factory(input: FactoryInput<'_>) -> Result<Arc<dyn CloudProvider>, CloudError> {
    Ok(Arc::new(BaremetalProvider::from_cloud_config(input.cloud_config)?))
}

/// The health of a cloud-config alone: `InvalidCloudConfig` with the first culprit, or
/// `Healthy` with a summary. Cheap; for callers that validate a Secret without running it.
pub fn config_health(cloud_config: Option<&[u8]>) -> Health {
    match BaremetalProvider::from_cloud_config(cloud_config) {
        Ok(provider) => Health::healthy(provider.summary()),
        Err(CloudError::InvalidConfig(message)) => Health::unhealthy(health_reasons::INVALID_CLOUD_CONFIG, message),
        Err(other) => Health::unhealthy(health_reasons::INVALID_CLOUD_CONFIG, other.to_string()),
    }
}

/// The baremetal provider.
#[derive(Debug)]
pub struct BaremetalProvider {
    inventory: Inventory,
    lifecycle: LifecycleConfig,
    allocator: Arc<Allocator>,
    /// The pools' sources (cloud-config, pool resources) and Namespace labels.
    pools: Arc<pool_watch::PoolSources>,
    /// `loadBalancer.poolResources`: pools also come from `LoadBalancerIPPool` resources.
    pool_resources: bool,
    /// `loadBalancer.importPools`: MetalLB's or Cilium's pools read at start.
    import_pools: Vec<pool_import::ImportSource>,
    probe_targets: Vec<ProbeTarget>,
    probes: Arc<ProbeStates>,
    probe_task: Mutex<Option<CancellationToken>>,
    #[cfg(feature = "datapath")]
    proxy: Option<proxy::ProxyRuntime>,
    kube_vip: bool,
    /// The client of the current leadership term, for the kube-vip annotation.
    client: proxy::ClientSlot,
    pool_gauges: pool_metrics::PoolGauges,
    /// The config it was built from, for telling a pool edit from one that needs a restart.
    /// Only the pools change after start ([`CloudProvider::reload`]).
    config: ConfigCell,
}

/// The running config; its debug output leaves the content out.
struct ConfigCell(Mutex<CloudConfig>);

impl std::fmt::Debug for ConfigCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigCell(..)")
    }
}

impl ConfigCell {
    fn lock(&self) -> std::sync::MutexGuard<'_, CloudConfig> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Parse and validate cloud-config bytes; errors name a field path, never a value.
fn parse_config(cloud_config: Option<&[u8]>) -> Result<CloudConfig, CloudError> {
    let bytes = cloud_config.ok_or_else(|| {
        CloudError::InvalidConfig(
            "the baremetal provider needs a cloud-config (instances, loadBalancer, lifecycle)".to_string(),
        )
    })?;
    config::parse(bytes).map_err(|e| CloudError::InvalidConfig(e.to_string()))
}

impl BaremetalProvider {
    /// Build from cloud-config bytes; a missing or invalid config is
    /// [`CloudError::InvalidConfig`] naming the culprit.
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, CloudError> {
        Self::from_config(parse_config(cloud_config)?).map_err(|e| CloudError::InvalidConfig(e.to_string()))
    }

    /// Build from a parsed config (validated again here).
    pub fn from_config(config: CloudConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let pools = config::build_pools(&config.load_balancer)?;
        let probe_targets =
            config.lifecycle.probe.as_ref().map(|p| probe::targets(&config.instances, p)).unwrap_or_default();
        let names = config.instances.iter().map(|i| i.name.clone()).collect();
        let mode = config.load_balancer.mode;
        #[cfg(not(feature = "datapath"))]
        if mode == proxy::Mode::Proxy {
            tracing::error!(
                "loadBalancer.mode is proxy but this build has no data path (feature datapath); addresses are assigned only"
            );
        }
        Ok(Self {
            #[cfg(feature = "datapath")]
            proxy: (mode == proxy::Mode::Proxy).then(|| proxy::ProxyRuntime::new(&config.load_balancer.proxy)),
            kube_vip: config.load_balancer.kube_vip,
            client: proxy::ClientSlot::default(),
            pool_gauges: pool_metrics::PoolGauges::default(),
            inventory: Inventory::new(&config.instances),
            lifecycle: config.lifecycle.clone(),
            pool_resources: config.load_balancer.pool_resources,
            import_pools: config.load_balancer.import_pools.clone(),
            pools: Arc::new(pool_watch::PoolSources::new(
                pools.clone(),
                config::resource_pool_ports(&config.load_balancer)?,
            )),
            allocator: Arc::new(Allocator::new(pools)),
            probe_targets,
            probes: Arc::new(ProbeStates::new(names)),
            probe_task: Mutex::new(None),
            config: ConfigCell(Mutex::new(config)),
        })
    }

    /// Apply a new config: the pools are swapped in place (every assigned address stays with
    /// its Service); any other change is refused with the paths that need a restart.
    pub fn reload_config(&self, new: CloudConfig) -> Reload {
        let pools = match config::build_pools(&new.load_balancer) {
            Ok(pools) => pools,
            Err(e) => return Reload::Invalid(CloudError::InvalidConfig(e.to_string())),
        };
        let mut current = self.config.lock();
        let restart = reload::needs_restart(&current, &new);
        if !restart.is_empty() {
            return Reload::RestartNeeded(format!("changed: {}", restart.join(", ")));
        }
        let before = self.pools.config_pools();
        if before == pools {
            return Reload::Unchanged;
        }
        let count = pools.len();
        self.pools.set_config(pools);
        let report = self.pools.apply(&self.allocator).unwrap_or_default();
        current.load_balancer.pools = new.load_balancer.pools;
        drop(current);
        self.pool_gauges.update(&self.allocator);
        if !report.outside_pools.is_empty() {
            tracing::warn!(
                ips = ?report.outside_pools,
                "load-balancer addresses are in no pool after the edit; their Services keep them until they are deleted"
            );
        }
        Reload::Applied(format!(
            "loadBalancer.pools: {} pools before, {count} now; {} assigned addresses in the pools, {} kept outside them until their Services go",
            before.len(),
            report.in_pools,
            report.outside_pools.len()
        ))
    }

    /// The instance inventory.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The load-balancer allocator.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// The data path of the current leadership term (proxy mode only).
    #[cfg(feature = "datapath")]
    pub fn data_path(&self) -> Option<crate::datapath::DataPath> {
        self.proxy.as_ref().and_then(|p| p.data_path())
    }

    /// The probe states.
    pub fn probe_states(&self) -> &ProbeStates {
        &self.probes
    }

    /// Rebuild the allocator from the Services' reported ingress IPs (what `initialize` does
    /// after listing them).
    pub fn restore_services(&self, services: &[Service]) -> RestoreReport {
        let report = self.allocator.restore(services);
        tracing::info!(
            services = services.len(),
            restored = report.restored,
            outside_pools = report.outside_pools,
            conflicts = report.conflicts,
            "rebuilt the load-balancer allocator from existing Services"
        );
        report
    }

    /// Start the probe task (when probing is configured), replacing a previous one. It stops
    /// when `shutdown` fires.
    pub fn start_probes(&self, shutdown: CancellationToken) {
        let Some(probe) = self.lifecycle.probe.clone() else { return };
        if self.probe_targets.is_empty() {
            tracing::info!("no instance has an address of the probed types; nothing to probe");
            return;
        }
        let token = shutdown.child_token();
        let previous = self.probe_task.lock().unwrap_or_else(|e| e.into_inner()).replace(token.clone());
        if let Some(previous) = previous {
            previous.cancel();
        }
        self.probes.reset();
        tokio::spawn(probe::run(self.probe_targets.clone(), probe, self.probes.clone(), token));
    }

    fn summary(&self) -> String {
        let declared = (0..self.inventory.len()).filter(|i| self.inventory.declared_shutdown(*i)).count();
        let probes = self.probes.summary();
        let usage = self.allocator.usage();
        let (in_use, usable) =
            usage.iter().fold((0usize, 0u128), |(u, t), p| (u + p.in_use, t.saturating_add(p.usable)));
        let mut text = format!("{} instances ({declared} declared shut down", self.inventory.len());
        if self.lifecycle.probe.is_some() {
            text.push_str(&format!(", {} of {} probed failing", probes.down, self.probe_targets.len()));
        }
        let per_family = pool_metrics::describe(&pool_metrics::usage_by_family(&self.allocator));
        text.push_str(&format!("), {} pools ({in_use} of {usable} addresses in use{per_family})", usage.len()));
        if let Some(imported) = self.pools.import_summary() {
            text.push_str(&format!("; {imported}"));
        }
        let outside = self.allocator.outside_pools().len();
        if outside > 0 {
            text.push_str(&format!(
                ", {outside} assigned addresses outside the pools (kept until their Services are deleted)"
            ));
        }
        text
    }

    fn lookup(&self, node: &Node) -> Option<usize> {
        self.inventory.lookup(node).map(|(index, _)| index)
    }

    fn exists(&self, node: &Node) -> bool {
        if self.lookup(node).is_some() {
            return true;
        }
        if !self.lifecycle.delete_absent_nodes {
            tracing::debug!(node = %node_name(node), "Node is not in the inventory; reported as existing (deleteAbsentNodes is off)");
        }
        !self.lifecycle.delete_absent_nodes
    }

    fn shutdown(&self, node: &Node) -> bool {
        self.lookup(node).is_some_and(|i| self.inventory.declared_shutdown(i) || self.probes.is_down(i))
    }

    fn metadata(&self, node: &Node) -> Option<InstanceMetadata> {
        match self.lookup(node) {
            Some(index) => self.inventory.metadata(index).cloned(),
            None => {
                tracing::warn!(node = %node_name(node), "Node matches no instance of the inventory (by providerID, name or hostname); it stays uninitialized");
                None
            }
        }
    }

    /// Whether this manager's data path carries traffic (`loadBalancer.mode: proxy`).
    fn proxy_on(&self) -> bool {
        #[cfg(feature = "datapath")]
        return self.proxy.is_some();
        #[cfg(not(feature = "datapath"))]
        false
    }

    /// The `ipMode` of `service`; an invalid annotation is an `InvalidAnnotation` refusal.
    fn ip_mode_of(&self, service: &Service) -> CloudResult<proxy::IpMode> {
        proxy::ip_mode_of(service, self.proxy_on()).map_err(|m| CloudError::refused(Refusal::InvalidAnnotation, m))
    }

    /// Bring the kube-vip annotation to `ips` (none removes it), when the switch is on.
    async fn sync_kube_vip(&self, service: &Service, ips: Option<&[IpAddr]>) -> CloudResult<()> {
        if !self.kube_vip {
            return Ok(());
        }
        let Some(client) = self.client.get() else { return Ok(()) };
        let value = ips.map(proxy::kube_vip_value);
        proxy::sync_kube_vip(&client, service, value.as_deref()).await
    }

    fn status(&self, ips: &[IpAddr], ip_mode: proxy::IpMode) -> LoadBalancerStatus {
        let ip_mode = ip_mode.as_str();
        LoadBalancerStatus {
            ingress: Some(
                ips.iter()
                    .map(|ip| LoadBalancerIngress {
                        ip: Some(ip.to_string()),
                        ip_mode: Some(ip_mode.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    /// Refuse a Service whose ports a pool holding its addresses does not allow (see
    /// [`ports`]), naming each `spec.ports[i].port` and the pool. A refused Service lets go of
    /// its addresses, in both `ipMode`s: kube-proxy forwards whatever ingress a Service
    /// reports, so keeping the last good one would serve the refused port on it; the service
    /// controller clears the status once [`LoadBalancer::get_load_balancer`] finds nothing.
    async fn enforce_ports(&self, service: &Service, ips: &[IpAddr], nodes: &[&Node]) -> CloudResult<()> {
        let node_ips = port_check::node_addresses(self.inventory.instances(), nodes);
        let refused = port_check::refused_ports(service, ips, &self.allocator.pools(), &node_ips);
        if refused.is_empty() {
            return Ok(());
        }
        tracing::info!(service = %ServiceKey::of(service), refused = refused.len(), "Service ports refused by their pool; its addresses are released");
        self.withdraw(service).await;
        Err(CloudError::refused(Refusal::UnsupportedService, port_check::describe(&refused)))
    }

    /// Let go of a Service's listeners and addresses.
    fn release(&self, service: &Service) {
        #[cfg(feature = "datapath")]
        if let Some(proxy) = &self.proxy {
            proxy.remove(service);
        }
        self.allocator.release(&ServiceKey::of(service), &service.metadata.uid);
        self.pool_gauges.update(&self.allocator);
        self.pools.changed.notify_one();
    }

    /// [`Self::release`] and remove the kube-vip annotation (a failure is logged: the refusal
    /// that called this is the error to report).
    async fn withdraw(&self, service: &Service) {
        self.release(service);
        if let Err(error) = self.sync_kube_vip(service, None).await {
            tracing::warn!(service = %ServiceKey::of(service), %error, "could not remove the kube-vip annotation");
        }
    }

    fn cloud_error(&self, error: AllocError) -> CloudError {
        match error {
            AllocError::Invalid(message) => CloudError::refused(Refusal::InvalidAnnotation, message),
            AllocError::Unsatisfiable(refusal, message) => CloudError::refused(refusal, message),
            AllocError::NotReady => CloudError::retry_after(NOT_READY_RETRY, AllocError::NotReady.to_string()),
        }
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// Every Service in the cluster, page by page.
async fn list_services(client: kube::Client) -> Result<Vec<Service>, kube::Error> {
    let api: Api<Service> = Api::all(client);
    let mut services = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = api.list(&params).await?;
        services.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(services),
        }
    }
}

#[async_trait]
impl CloudProvider for BaremetalProvider {
    fn name(&self) -> &str {
        NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        // Pool resources first: the allocator is rebuilt against every pool.
        let mut imported_first = None;
        if self.pool_resources {
            let resources = pool_watch::list_pools(ctx.client.clone()).await.map_err(|e| {
                CloudError::Unavailable(format!(
                    "listing LoadBalancerIPPools (loadBalancer.poolResources is on; is their CRD installed?): {e}"
                ))
            })?;
            pool_watch::list_namespaces(ctx.client.clone(), &self.pools).await.map_err(|e| {
                CloudError::Unavailable(format!("listing Namespaces for the pools' namespaceSelector: {e}"))
            })?;
            self.pools.set_resources(resources);
            // Imported pools before the Services are read: the addresses MetalLB or Cilium
            // gave must be in a pool to stay with their Services.
            if !self.import_pools.is_empty() {
                let read = pool_import_watch::read_all(&ctx.client, &self.import_pools).await.map_err(|e| {
                    CloudError::Unavailable(format!("{e} (the chart grants it with manager.rbac.importPools=true)"))
                })?;
                let order: Vec<pool_import::Source> = self.import_pools.iter().map(|i| i.source).collect();
                let outcomes = self.pools.set_imported(read.imported(), &order);
                let summary = pool_import_watch::report(&read, &outcomes, Some(&ctx.events));
                self.pools.set_import_summary(summary);
                imported_first = Some(read);
            }
            self.pools.apply(&self.allocator);
        }
        let services = list_services(ctx.client.clone()).await.map_err(|e| {
            CloudError::Unavailable(format!("listing Services to rebuild the load-balancer allocator: {e}"))
        })?;
        self.restore_services(&services);
        self.pool_gauges.register(&ctx.metrics);
        self.pool_gauges.update(&self.allocator);
        self.client.set(ctx.client.clone());
        #[cfg(feature = "datapath")]
        if let Some(proxy) = &self.proxy {
            proxy.start(&ctx.metrics, Some(ctx.events.clone()), ctx.shutdown.clone());
        }
        self.start_probes(ctx.shutdown.clone());
        if self.pool_resources {
            pool_watch::spawn(ctx.client.clone(), self.pools.clone(), self.allocator.clone(), ctx.shutdown.clone());
        }
        if let Some(first) = imported_first {
            let (pools, allocator) = (self.pools.clone(), self.allocator.clone());
            pool_import_watch::spawn(
                ctx.client.clone(),
                self.import_pools.clone(),
                &first,
                self.pools.clone(),
                move || pools.apply_and_wake(&allocator, "imported load-balancer pools changed"),
                Some(ctx.events.clone()),
                ctx.shutdown.clone(),
            );
        }
        Ok(())
    }

    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        // Without pools the service controller stays off, leaving Services to another
        // implementation (for example MetalLB) instead of failing every one of them.
        if self.pool_resources || !self.allocator.pools().is_empty() { Some(self) } else { None }
    }

    async fn health(&self) -> Health {
        let probes = self.probes.summary();
        let targets = self.probe_targets.len();
        if targets > 0 && probes.down >= targets {
            let port = self.lifecycle.probe.as_ref().map(|p| p.port).unwrap_or_default();
            return Health::unhealthy(
                health_reasons::PROBE_FAILING,
                format!(
                    "all {targets} probed instances fail the TCP probe on port {port} ({}); check the manager's network path to them",
                    probes.down_names.join(", ")
                ),
            );
        }
        Health::healthy(self.summary())
    }

    fn reload(&self, cloud_config: Option<&[u8]>) -> Reload {
        match parse_config(cloud_config) {
            Ok(config) => self.reload_config(config),
            Err(e) => Reload::Invalid(e),
        }
    }

    fn restart_fingerprint(&self) -> Option<Vec<u8>> {
        Some(reload::restart_fingerprint(&self.config.lock()))
    }

    fn capabilities(&self) -> ccm_framework::capabilities::Capabilities {
        capabilities::capabilities(NAME, self.load_balancer().is_some(), self.proxy_on())
    }
}

#[async_trait]
impl Instances for BaremetalProvider {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.exists(node))
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.shutdown(node))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        Ok(self.metadata(node))
    }

    fn batch_size(&self) -> usize {
        // Lookups are in memory: any batch is one cheap call.
        usize::MAX
    }

    async fn instances_metadata(&self, nodes: &[&Node]) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        nodes.iter().map(|n| Ok(self.metadata(n))).collect()
    }

    async fn instances_exist(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        nodes.iter().map(|n| Ok(self.exists(n))).collect()
    }

    async fn instances_shutdown(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        nodes.iter().map(|n| Ok(self.shutdown(n))).collect()
    }
}

#[async_trait]
impl LoadBalancer for BaremetalProvider {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let key = ServiceKey::of(service);
        // An invalid annotation is reported by the ensure that follows; the default stands in.
        let mode =
            self.ip_mode_of(service).unwrap_or(if self.proxy_on() { proxy::IpMode::Proxy } else { proxy::IpMode::Vip });
        Ok(self.allocator.assigned(&key, &service.metadata.uid).map(|ips| self.status(&ips, mode)))
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
    ) -> CloudResult<LoadBalancerStatus> {
        // Before any address is taken: a Service refused for its annotation holds none.
        let mode = self.ip_mode_of(service)?;
        let mut request = ipam::request_for(service).map_err(|e| self.cloud_error(e))?;
        if self.pool_resources {
            request.namespace_labels = self.pools.namespace_labels(&request.key.namespace);
        }
        let ips = self.allocator.ensure(&request).map_err(|e| self.cloud_error(e))?;
        self.pool_gauges.update(&self.allocator);
        self.pools.changed.notify_one();
        self.enforce_ports(service, &ips, nodes).await?;
        #[cfg(feature = "datapath")]
        if let Some(proxy) = &self.proxy {
            match mode {
                proxy::IpMode::Proxy => proxy.ensure(service, nodes, &ips)?,
                // Switched to VIP (or always was): the data path lets go of its listeners.
                proxy::IpMode::Vip => proxy.remove(service),
            }
        }
        #[cfg(not(feature = "datapath"))]
        let _ = nodes;
        self.sync_kube_vip(service, Some(&ips)).await?;
        Ok(self.status(&ips, mode))
    }

    async fn update_load_balancer(&self, _cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()> {
        let Some(ips) = self.allocator.assigned(&ServiceKey::of(service), &service.metadata.uid) else {
            return Ok(());
        };
        // A Node change can make a pool one holding node addresses, in both ipModes.
        self.enforce_ports(service, &ips, nodes).await?;
        // Address mode: backends are whatever the announcer and kube-proxy route to.
        #[cfg(feature = "datapath")]
        if let Some(proxy) = &self.proxy
            && self.ip_mode_of(service)? == proxy::IpMode::Proxy
        {
            proxy.ensure(service, nodes, &ips)?;
        }
        Ok(())
    }

    async fn ensure_load_balancer_deleted(&self, _cluster_name: &str, service: &Service) -> CloudResult<()> {
        self.release(service);
        self.sync_kube_vip(service, None).await
    }

    async fn list_owned(&self, _cluster_name: &str) -> CloudResult<Vec<OwnedObject>> {
        Ok(orphans::owned(&self.allocator.assignments()))
    }

    async fn delete_owned(&self, _cluster_name: &str, objects: &[OwnedObject]) -> Vec<CloudResult<()>> {
        objects
            .iter()
            .map(|object| {
                // Re-checked against the allocator now: given back already is a success.
                if let Some((key, uid)) = orphans::holder_to_release(&self.allocator.assignments(), object) {
                    let gone = Service {
                        metadata: kube::api::ObjectMeta {
                            namespace: Some(key.namespace),
                            name: Some(key.name),
                            uid,
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    // Its addresses and the data path's listeners for it; the Service is gone,
                    // so there is no kube-vip annotation to remove.
                    self.release(&gone);
                }
                Ok(())
            })
            .collect()
    }
}

/// A registry holding this provider alone, for tests that go through the registry.
#[cfg(test)]
fn test_registry() -> Registry {
    let mut registry = Registry::new();
    register(&mut registry).unwrap();
    registry
}

#[cfg(test)]
mod tests;
