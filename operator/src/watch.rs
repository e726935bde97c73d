//! Watching a kind in several namespaces into one reflector store.
//!
//! A kube-runtime store is fed by one watcher: its `Init`/`InitDone` events replace the whole
//! store. With one watcher per namespace, one namespace's relist would wipe the others. The
//! [`Merger`] turns the per-namespace event streams into one consistent stream: a single
//! initial list once every namespace has listed, then plain applies and deletes, with a
//! namespace's relist turned into applies plus deletes of what vanished from it.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

use futures::stream::{self, BoxStream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Which namespaces the operator serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (cluster-wide watches).
    All,
    /// Only these namespaces (one watch per namespace and kind).
    Namespaces(Vec<String>),
}

impl Scope {
    /// One `Api` per watched namespace (or one cluster-wide `Api`).
    pub fn apis<K>(&self, client: &kube::Client) -> Vec<Api<K>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::All => vec![Api::all(client.clone())],
            Scope::Namespaces(list) => list.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect(),
        }
    }

    /// The namespaces of `allowed` that are also served, sorted: where Secrets, Leases and the
    /// manager workloads are watched (one watcher per namespace).
    pub fn within(&self, allowed: &[String]) -> Vec<String> {
        let mut out: Vec<String> = allowed.iter().filter(|n| self.contains(n)).cloned().collect();
        out.sort();
        out.dedup();
        out
    }

    /// Whether `namespace` is served.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }
}

/// The state machine merging per-source watcher events (pure; see the module docs).
pub struct Merger<K: Resource> {
    sources: usize,
    /// Before the first global `InitDone`: what each source listed (and changed) so far.
    initial: Option<Vec<Option<Vec<K>>>>,
    /// Keys each source currently contributes.
    known: Vec<HashSet<ObjectRef<K>>>,
    /// During a source's relist: the keys it listed so far.
    relisting: Vec<Option<HashSet<ObjectRef<K>>>>,
}

impl<K> Merger<K>
where
    K: Resource + Clone,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    /// A merger of `sources` streams.
    pub fn new(sources: usize) -> Self {
        Self {
            sources,
            initial: Some(vec![None; sources]),
            known: vec![HashSet::new(); sources],
            relisting: vec![None; sources],
        }
    }

    /// Handle one event of source `i`; `lookup` returns the stored object for a key (needed to
    /// emit deletes of objects that vanished during a relist).
    pub fn on(
        &mut self,
        i: usize,
        event: watcher::Event<K>,
        lookup: impl Fn(&ObjectRef<K>) -> Option<K>,
    ) -> Vec<watcher::Event<K>> {
        use watcher::Event;
        if i >= self.sources {
            return Vec::new();
        }
        if let Some(initial) = &mut self.initial {
            match event {
                Event::Init => initial[i] = Some(Vec::new()),
                Event::InitApply(o) | Event::Apply(o) => {
                    let list = initial[i].get_or_insert_with(Vec::new);
                    let key = ObjectRef::from_obj(&o);
                    list.retain(|x| ObjectRef::from_obj(x) != key);
                    list.push(o);
                }
                Event::Delete(o) => {
                    let key = ObjectRef::from_obj(&o);
                    if let Some(list) = &mut initial[i] {
                        list.retain(|x| ObjectRef::from_obj(x) != key);
                    }
                }
                Event::InitDone => {
                    initial[i].get_or_insert_with(Vec::new);
                    self.relisting[i] = Some(HashSet::new());
                }
            }
            // Ready once every source finished its first list.
            if self.relisting.iter().all(Option::is_some) {
                let lists = self.initial.take().unwrap_or_default();
                self.relisting = vec![None; self.sources];
                let mut out = vec![Event::Init];
                for (source, list) in lists.into_iter().enumerate() {
                    for o in list.unwrap_or_default() {
                        self.known[source].insert(ObjectRef::from_obj(&o));
                        out.push(Event::InitApply(o));
                    }
                }
                out.push(Event::InitDone);
                return out;
            }
            return Vec::new();
        }
        match event {
            Event::Apply(o) => {
                self.known[i].insert(ObjectRef::from_obj(&o));
                vec![Event::Apply(o)]
            }
            Event::Delete(o) => {
                self.known[i].remove(&ObjectRef::from_obj(&o));
                vec![Event::Delete(o)]
            }
            Event::Init => {
                self.relisting[i] = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(o) => {
                let key = ObjectRef::from_obj(&o);
                self.relisting[i].get_or_insert_with(HashSet::new).insert(key.clone());
                self.known[i].insert(key);
                vec![Event::Apply(o)]
            }
            Event::InitDone => {
                let listed = self.relisting[i].take().unwrap_or_default();
                let gone: Vec<ObjectRef<K>> = self.known[i].difference(&listed).cloned().collect();
                self.known[i] = listed;
                gone.iter().filter_map(&lookup).map(Event::Delete).collect()
            }
        }
    }
}

/// A watch over every `Api` in `apis`, merged for one store (`store` is that store's reader,
/// used to find vanished objects). A single `Api` is passed through unchanged.
pub fn merged<K>(
    apis: Vec<Api<K>>,
    config: watcher::Config,
    store: Store<K>,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    if apis.is_empty() {
        // Nothing to watch: an empty store that is ready at once, and a stream that never ends.
        let empty = vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)];
        return stream::iter(empty).chain(stream::pending()).boxed();
    }
    if apis.len() == 1 {
        let api = apis.into_iter().next().into_iter();
        return stream::iter(api).flat_map(move |api| watcher(api, config.clone()).default_backoff()).boxed();
    }
    let sources = apis.len();
    let tagged = stream::select_all(
        apis.into_iter()
            .enumerate()
            .map(|(i, api)| watcher(api, config.clone()).default_backoff().map(move |e| (i, e)).boxed()),
    );
    let mut merger = Merger::<K>::new(sources);
    tagged
        .flat_map(move |(i, item)| {
            let out: Vec<Result<watcher::Event<K>, watcher::Error>> = match item {
                Err(e) => vec![Err(e)],
                Ok(event) => {
                    merger.on(i, event, |key| store.get(key).map(|o| (*o).clone())).into_iter().map(Ok).collect()
                }
            };
            stream::iter(out)
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;
    use watcher::Event;

    fn cm(ns: &str, name: &str, v: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
            data: Some([("v".to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    /// Feed events through a merger into a real reflector store.
    struct Harness {
        merger: Merger<ConfigMap>,
        reader: Store<ConfigMap>,
        writer: reflector::store::Writer<ConfigMap>,
    }

    impl Harness {
        fn new(n: usize) -> Self {
            let (reader, writer) = reflector::store();
            Self { merger: Merger::new(n), reader, writer }
        }

        fn feed(&mut self, i: usize, e: Event<ConfigMap>) {
            let reader = self.reader.clone();
            for out in self.merger.on(i, e, |k| reader.get(k).map(|o| (*o).clone())) {
                self.writer.apply_watcher_event(&out);
            }
        }

        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = self
                .reader
                .state()
                .iter()
                .map(|o| format!("{}/{}", o.metadata.namespace.clone().unwrap(), o.metadata.name.clone().unwrap()))
                .collect();
            v.sort();
            v
        }
    }

    #[test]
    fn store_becomes_ready_only_after_every_namespace_listed() {
        let mut h = Harness::new(2);
        h.feed(0, Event::Init);
        h.feed(0, Event::InitApply(cm("a", "x", "1")));
        h.feed(0, Event::InitDone);
        assert!(h.names().is_empty());
        h.feed(1, Event::Init);
        h.feed(1, Event::InitApply(cm("b", "y", "1")));
        // A live change of namespace a while b still lists.
        h.feed(0, Event::Apply(cm("a", "z", "1")));
        h.feed(1, Event::InitDone);
        assert_eq!(h.names(), ["a/x", "a/z", "b/y"]);
    }

    #[test]
    fn one_namespace_relisting_keeps_the_others() {
        let mut h = Harness::new(2);
        for (i, ns) in [(0, "a"), (1, "b")] {
            h.feed(i, Event::Init);
            h.feed(i, Event::InitApply(cm(ns, "x", "1")));
            h.feed(i, Event::InitApply(cm(ns, "y", "1")));
            h.feed(i, Event::InitDone);
        }
        // Namespace a relists after a desync; a/y vanished meanwhile.
        h.feed(0, Event::Init);
        h.feed(0, Event::InitApply(cm("a", "x", "2")));
        h.feed(0, Event::InitDone);
        assert_eq!(h.names(), ["a/x", "b/x", "b/y"]);
        let ax = h.reader.get(&ObjectRef::new("x").within("a")).unwrap();
        assert_eq!(ax.data.as_ref().unwrap()["v"], "2");
    }

    #[test]
    fn live_applies_and_deletes_pass_through() {
        let mut h = Harness::new(2);
        for i in 0..2 {
            h.feed(i, Event::Init);
            h.feed(i, Event::InitDone);
        }
        h.feed(1, Event::Apply(cm("b", "x", "1")));
        assert_eq!(h.names(), ["b/x"]);
        h.feed(1, Event::Delete(cm("b", "x", "1")));
        assert!(h.names().is_empty());
    }

    #[test]
    fn scope_lists_namespaces() {
        assert!(Scope::All.contains("x"));
        let s = Scope::Namespaces(vec!["a".into()]);
        assert!(s.contains("a") && !s.contains("b"));
    }

    #[test]
    fn secrets_are_watched_only_in_allowed_namespaces_that_are_served() {
        let allowed = vec!["kube-system".to_string(), "cloud".to_string()];
        assert_eq!(Scope::All.within(&allowed), ["cloud", "kube-system"]);
        let s = Scope::Namespaces(vec!["cloud".into(), "tenant".into()]);
        assert_eq!(s.within(&allowed), ["cloud"]);
        assert!(Scope::Namespaces(vec!["tenant".into()]).within(&allowed).is_empty());
    }

    #[tokio::test]
    async fn no_namespace_to_watch_is_an_empty_ready_store() {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let stream = merged::<ConfigMap>(Vec::new(), watcher::Config::default(), reader.clone()).reflect(writer);
        futures::pin_mut!(stream);
        // Init and InitDone come through; the stream then stays open.
        for _ in 0..2 {
            stream.next().await.unwrap().unwrap();
        }
        reader.wait_until_ready().await.unwrap();
        assert!(reader.state().is_empty());
        let next = tokio::time::timeout(std::time::Duration::from_millis(50), stream.next()).await;
        assert!(next.is_err(), "the stream must not end");
    }
}
