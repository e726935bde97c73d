//! The I/O of `loadBalancer.importPools`: MetalLB's and Cilium's pools listed, and
//! kube-vip-cloud-provider's ConfigMap read by name, when the leader starts (before the
//! allocator is rebuilt from the Services), then watched and read again after each change, and
//! what became of each pool reported as a log line and an event on the source object.
//! Conversions and precedence are in [`crate::pool_import`] and [`crate::pool_import_kubevip`].

use std::collections::BTreeMap;

use ccm_framework::events::EventSink;
use ccm_framework::events::components::SERVICE_CONTROLLER;
use crds::reasons::pool_import as reasons;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::runtime::events::EventType;
use kube::runtime::watcher;

use crate::pool_import::{
    self, ImportError, ImportSource, Imported, MAX_IMPORTED_POOLS, Outcome, Source, SourceObject,
};

/// The longest event note; an event names at most this much of the notes.
const MAX_NOTE: usize = 1024;

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The API server refused or failed the listing (403 without the chart's RBAC).
    #[error("listing {kind}s ({group}) for loadBalancer.importPools failed: {source}")]
    List {
        /// The kind listed.
        kind: &'static str,
        /// Its API group.
        group: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The API server refused or failed reading kube-vip's ConfigMap (403 without the chart's
    /// Role in its namespace).
    #[error("reading the ConfigMap {namespace}/{name} for loadBalancer.importPools (kubevip) failed: {source}")]
    Get {
        /// The ConfigMap's namespace.
        namespace: String,
        /// The ConfigMap's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// One source object read and what its conversion gave.
#[derive(Debug)]
pub struct Read {
    /// The object, for events.
    pub reference: ObjectReference,
    /// The pool name it becomes ([`Source::pool_name`]).
    pub pool_name: String,
    /// The converted pool, or why there is none.
    pub result: Result<Imported, ImportError>,
}

/// Everything read from the sources.
#[derive(Debug, Default)]
pub struct ReadAll {
    /// Every object read.
    pub objects: Vec<Read>,
    /// Per source, a fact worth a warning: its CRD is not installed, or too many pools.
    pub source_notes: Vec<String>,
    /// The sources served, with the version read (kube-vip's always, so that a ConfigMap
    /// created later is seen).
    pub served: Vec<(ImportSource, &'static str)>,
}

impl ReadAll {
    /// The pools converted.
    pub fn imported(&self) -> Vec<Imported> {
        self.objects.iter().filter_map(|r| r.result.as_ref().ok().cloned()).collect()
    }

    /// What was read, to tell whether a later read differs.
    pub fn fingerprint(&self) -> String {
        let objects: Vec<String> = self.objects.iter().map(|r| format!("{}={:?}", r.pool_name, r.result)).collect();
        format!("{objects:?}{:?}", self.source_notes)
    }
}

/// Whether the resource is not served: kube-apiserver answers an unknown API path with a plain
/// `404 page not found`, which carries the code but not the `NotFound` reason.
fn not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.is_not_found() || s.code == 404)
}

/// The API of `import`'s pools in `version`: MetalLB's in its namespace only, Cilium's
/// cluster-wide.
fn api(client: &kube::Client, import: &ImportSource, version: &str) -> Api<DynamicObject> {
    let source = import.source;
    let gvk = GroupVersionKind::gvk(source.group(), version, source.kind());
    let resource = ApiResource::from_gvk_with_plural(&gvk, source.plural());
    match import.namespace() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// List one source's pools: the newest version served; `None` when no version is (its CRD is
/// not installed).
async fn list(
    client: &kube::Client,
    import: &ImportSource,
) -> Result<Option<(&'static str, Vec<DynamicObject>)>, ReadError> {
    let source = import.source;
    for &version in source.versions() {
        let api = api(client, import, version);
        // One page: more than the bound is refused below rather than paged through.
        let params = ListParams::default().limit(MAX_IMPORTED_POOLS as u32 + 1);
        match api.list(&params).await {
            Ok(list) => return Ok(Some((version, list.items))),
            Err(e) if not_found(&e) => continue,
            Err(source_error) => {
                return Err(ReadError::List { kind: source.kind(), group: source.group(), source: source_error });
            }
        }
    }
    Ok(None)
}

/// Read and convert every source's pools (MetalLB's from its namespace only). A source whose
/// CRD is missing is a note, not an error; a refused listing is an error, since going on would
/// hand its Services new addresses.
pub async fn read_all(client: &kube::Client, sources: &[ImportSource]) -> Result<ReadAll, ReadError> {
    let mut all = ReadAll::default();
    for import in sources {
        let source = import.source;
        if source == Source::Kubevip {
            read_kubevip(client, import, &mut all).await?;
            continue;
        }
        let Some((version, mut items)) = list(client, import).await? else {
            all.source_notes.push(format!(
                "loadBalancer.importPools names {source} but no {} resource is served ({} CRD not installed); nothing imported from it",
                source.kind(),
                source.group()
            ));
            continue;
        };
        all.served.push((import.clone(), version));
        let api_version = format!("{}/{version}", source.group());
        if items.len() > MAX_IMPORTED_POOLS {
            items.truncate(MAX_IMPORTED_POOLS);
            all.source_notes.push(format!(
                "more than {MAX_IMPORTED_POOLS} {}s: only the first {MAX_IMPORTED_POOLS} are imported",
                source.kind()
            ));
        }
        for item in items {
            let spec = item.data.get("spec").cloned().unwrap_or_default();
            let object = SourceObject { metadata: item.metadata.clone(), spec };
            let result = match source {
                Source::Metallb => pool_import::from_metallb(&object),
                Source::Cilium => pool_import::from_cilium(&object),
                // Read by name above, never listed.
                Source::Kubevip => continue,
            };
            let name = item.metadata.name.clone().unwrap_or_default();
            all.objects.push(Read {
                reference: ObjectReference {
                    api_version: Some(api_version.clone()),
                    kind: Some(source.kind().to_string()),
                    namespace: item.metadata.namespace.clone(),
                    name: Some(name.clone()),
                    uid: item.metadata.uid.clone(),
                    ..Default::default()
                },
                pool_name: source.pool_name(item.metadata.namespace.as_deref(), &name),
                result,
            });
        }
    }
    Ok(all)
}

/// The most ConfigMap-level warnings named in one note (the rest are counted).
const MAX_NAMED_WARNINGS: usize = 8;

/// Read kube-vip-cloud-provider's ConfigMap by name: one [`Read`] per address key; the keys no
/// pool can express become a note. A missing ConfigMap is a note, not an error.
async fn read_kubevip(client: &kube::Client, import: &ImportSource, all: &mut ReadAll) -> Result<(), ReadError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let namespace = import.namespace().unwrap_or(crate::pool_import_kubevip::DEFAULT_NAMESPACE).to_string();
    let name = import.object_name().unwrap_or(crate::pool_import_kubevip::DEFAULT_NAME).to_string();
    // Watched even while missing, so that creating it later is taken in.
    all.served.push((import.clone(), "v1"));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let found = api.get_opt(&name).await.map_err(|source| ReadError::Get {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    })?;
    let Some(map) = found else {
        all.source_notes.push(format!(
            "loadBalancer.importPools names kubevip but there is no ConfigMap {namespace}/{name}; nothing imported from it"
        ));
        return Ok(());
    };
    let reference = ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("ConfigMap".to_string()),
        namespace: Some(namespace.clone()),
        name: Some(name.clone()),
        uid: map.metadata.uid.clone(),
        ..Default::default()
    };
    let data = map.data.clone().unwrap_or_default();
    match crate::pool_import_kubevip::from_configmap(&map.metadata, &data) {
        Err(error) => all.objects.push(Read {
            reference,
            pool_name: Source::Kubevip.pool_name(Some(&namespace), &name),
            result: Err(error),
        }),
        Ok(converted) => {
            if !converted.warnings.is_empty() {
                let named: Vec<String> =
                    converted.warnings.iter().take(MAX_NAMED_WARNINGS).map(|w| w.to_string()).collect();
                let more = converted.warnings.len().saturating_sub(MAX_NAMED_WARNINGS);
                let tail = if more > 0 { format!("; and {more} more") } else { String::new() };
                all.source_notes.push(format!("ConfigMap {namespace}/{name}: {}{tail}", named.join("; ")));
            }
            for pool in converted.pools {
                all.objects.push(Read { reference: reference.clone(), pool_name: pool.pool_name, result: pool.result });
            }
        }
    }
    Ok(())
}

fn bounded(text: String) -> String {
    if text.len() <= MAX_NOTE {
        return text;
    }
    let mut end = MAX_NOTE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Log and publish (as events on the source objects) what became of each; returns a one-line
/// summary for the provider's health message.
pub fn report(all: &ReadAll, outcomes: &BTreeMap<String, Outcome>, events: Option<&EventSink>) -> String {
    let (mut used, mut warned, mut refused) = (0usize, 0usize, 0usize);
    for note in &all.source_notes {
        tracing::warn!(note = %note, "importing load-balancer pools");
    }
    for read in &all.objects {
        let (type_, reason, note) = match (&read.result, outcomes.get(&read.pool_name)) {
            (Err(error), _) => {
                refused += 1;
                (EventType::Warning, reasons::NOT_IMPORTED, format!("not imported: {error}"))
            }
            (Ok(_), Some(outcome)) if !outcome.used => {
                refused += 1;
                (EventType::Warning, reasons::NOT_IMPORTED, outcome.notes.join("; "))
            }
            (Ok(_), Some(outcome)) if !outcome.notes.is_empty() => {
                used += 1;
                warned += 1;
                let note = format!("imported as {} with warnings: {}", read.pool_name, outcome.notes.join("; "));
                (EventType::Warning, reasons::IMPORT_WARNING, note)
            }
            (Ok(_), _) => {
                used += 1;
                (EventType::Normal, reasons::IMPORTED, format!("imported as {}", read.pool_name))
            }
        };
        let note = bounded(note);
        match type_ {
            EventType::Warning => {
                tracing::warn!(pool = %read.pool_name, note = %note, "importing a load-balancer pool")
            }
            EventType::Normal => tracing::info!(pool = %read.pool_name, "imported a load-balancer pool"),
        }
        if let Some(events) = events {
            events.publish(SERVICE_CONTROLLER, read.reference.clone(), type_, reason, note, "ImportPool");
        }
    }
    let mut summary = format!("{used} pools imported ({warned} with warnings, {refused} not imported");
    if !all.source_notes.is_empty() {
        summary.push_str(&format!("; {}", all.source_notes.join("; ")));
    }
    summary.push(')');
    summary
}

/// How long a burst of changes to the sources is gathered before they are read again.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Keep the imported pools current until `shutdown`: watch every source served at start
/// (`first.served`) and, after each change, read all sources again as at start, hand what
/// differs to `pools` and call `on_change` (the manager applies it to its allocator, as an
/// edit of a pool resource is applied; addresses already assigned stay with their Services
/// whatever happens to their pool).
pub fn spawn(
    client: kube::Client,
    sources: Vec<ImportSource>,
    first: &ReadAll,
    pools: std::sync::Arc<crate::pool_watch::PoolSources>,
    on_change: impl Fn() + Send + 'static,
    events: Option<EventSink>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let changed = std::sync::Arc::new(tokio::sync::Notify::new());
    for (import, version) in &first.served {
        let api = api(&client, import, version);
        // kube-vip's ConfigMap is watched by name: its RBAC names that one ConfigMap.
        let config = match import.object_name() {
            Some(name) => watcher::Config::default().fields(&format!("metadata.name={name}")),
            None => watcher::Config::default(),
        };
        tokio::spawn(watch_source(api, import.source, config, changed.clone(), shutdown.clone()));
    }
    let order: Vec<Source> = sources.iter().map(|s| s.source).collect();
    let last = first.fingerprint();
    tokio::spawn(async move {
        let mut last = last;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changed.notified() => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(SETTLE) => {}
            }
            let read = match read_all(&client, &sources).await {
                Ok(read) => read,
                Err(error) => {
                    // The pools in use stay; the next change (or the watch's relist) tries again.
                    tracing::warn!(%error, "reading the imported pools again failed; keeping the ones in use");
                    continue;
                }
            };
            let fingerprint = read.fingerprint();
            if fingerprint == last {
                continue;
            }
            let outcomes = pools.set_imported(read.imported(), &order);
            let summary = report(&read, &outcomes, events.as_ref());
            pools.set_import_summary(summary);
            on_change();
            last = fingerprint;
        }
    });
}

/// Notify `changed` on every change of the objects `api` reads (and on each relist).
async fn watch_source(
    api: Api<DynamicObject>,
    source: Source,
    config: watcher::Config,
    changed: std::sync::Arc<tokio::sync::Notify>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = stream.next() => e,
        };
        match event {
            None => return,
            Some(Err(error)) => {
                tracing::warn!(%error, kind = source.kind(), "watching imported pools failed; retrying")
            }
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Ok(_)) => changed.notify_one(),
        }
    }
}
