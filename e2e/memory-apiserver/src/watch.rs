//! Watch streams: initial events, resume by resourceVersion, bookmarks, timeouts, 410 Gone.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::body::Frame;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::core::{Core, Shape, render};
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Ev, EvType, Obj, meta_str};

/// Parameters of a watch request.
pub(crate) struct WatchOpts {
    pub ns: Option<String>,
    pub resource_version: Option<String>,
    pub send_initial_events: Option<bool>,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub shape: Shape,
}

/// Objects per chunk when streaming initial state.
const INITIAL_CHUNK: usize = 256;
/// Without `timeoutSeconds` the real server picks 30-60 minutes.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

struct Filter {
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, o: &Obj) -> bool {
        self.ns.as_deref().is_none_or(|ns| meta_str(&o.value, "namespace") == Some(ns))
            && self.labels.matches_with(|k| o.label(k))
            && self.fields.matches(&o.value)
    }

    /// The event a watcher with this filter sees, if any (objects entering or leaving the
    /// selection appear as ADDED or DELETED, as with the real server).
    fn classify<'a>(&self, ev: &'a Ev) -> Option<(EvType, &'a Obj)> {
        let now = self.matches(&ev.obj);
        match ev.ty {
            EvType::Added | EvType::Deleted => now.then_some((ev.ty, &ev.obj)),
            EvType::Modified => {
                let before = ev.prev.as_deref().is_some_and(|p| self.matches(p));
                match (before, now) {
                    (true, true) => Some((EvType::Modified, &ev.obj)),
                    (false, true) => Some((EvType::Added, &ev.obj)),
                    (true, false) => Some((EvType::Deleted, &ev.obj)),
                    (false, false) => None,
                }
            }
        }
    }
}

fn push_event(buf: &mut BytesMut, ty: &str, object: &[u8]) {
    buf.put_slice(b"{\"type\":\"");
    buf.put_slice(ty.as_bytes());
    buf.put_slice(b"\",\"object\":");
    buf.put_slice(object);
    buf.put_slice(b"}\n");
}

fn bookmark(rt: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta});
    let mut buf = BytesMut::new();
    push_event(&mut buf, "BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default());
    buf.freeze()
}

fn gone_event(rv: u64, compacted: u64) -> Bytes {
    let status = ApiError::gone(format!("too old resource version: {rv} ({compacted})")).to_status();
    let mut buf = BytesMut::new();
    push_event(&mut buf, "ERROR", &serde_json::to_vec(&status).unwrap_or_default());
    buf.freeze()
}

/// Starts a watch; returns the streaming response body.
pub(crate) fn start(
    core: &Arc<Core>,
    rt: Arc<ResourceType>,
    o: WatchOpts,
) -> Result<BoxBody<Bytes, Infallible>, ApiError> {
    let requested: Option<u64> = match o.resource_version.as_deref() {
        None | Some("") => None,
        Some(s) => Some(s.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?),
    };
    let filter = Filter { ns: if rt.namespaced { o.ns.clone() } else { None }, labels: o.labels, fields: o.fields };
    let (initial, start_rv, gone, notify) = {
        let st = core.lock();
        let store = st.stores.get(&rt.store).ok_or_else(ApiError::not_found_path)?;
        let with_state = match (o.send_initial_events, requested) {
            (Some(send), _) => send,
            (None, None | Some(0)) => true,
            (None, Some(_)) => false,
        };
        let start_rv = match requested {
            Some(rv) if rv != 0 && !with_state => rv,
            _ => st.rv,
        };
        let gone = (!with_state && start_rv < store.compacted).then_some(store.compacted);
        let initial: Vec<Arc<Obj>> = if with_state {
            let iter: Box<dyn Iterator<Item = &Arc<Obj>>> = match &filter.ns {
                Some(ns) => Box::new(store.objects.range(format!("{ns}/")..format!("{ns}0")).map(|(_, o)| o)),
                None => Box::new(store.objects.values()),
            };
            iter.filter(|o| filter.matches(o)).cloned().collect()
        } else {
            vec![]
        };
        (initial, start_rv, gone, store.notify.subscribe())
    };
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let closer = core.watch_close.subscribe();
    let task = WatchTask {
        core: core.clone(),
        rt,
        filter,
        shape: o.shape,
        bookmarks: o.bookmarks,
        initial_end_marker: o.send_initial_events == Some(true),
        timeout: o.timeout.unwrap_or(DEFAULT_TIMEOUT),
        tx,
    };
    core.open_watches.fetch_add(1, Ordering::Relaxed);
    core.runtime.spawn(async move {
        let core = task.core.clone();
        task.run(initial, start_rv, gone, notify, closer).await;
        core.open_watches.fetch_sub(1, Ordering::Relaxed);
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))));
    Ok(BoxBody::new(StreamBody::new(stream)))
}

struct WatchTask {
    core: Arc<Core>,
    rt: Arc<ResourceType>,
    filter: Filter,
    shape: Shape,
    bookmarks: bool,
    initial_end_marker: bool,
    timeout: Duration,
    tx: mpsc::Sender<Bytes>,
}

enum Drain {
    Continue,
    End,
}

impl WatchTask {
    async fn run(
        self,
        initial: Vec<Arc<Obj>>,
        start_rv: u64,
        gone: Option<u64>,
        mut notify: watch::Receiver<u64>,
        mut closer: watch::Receiver<u64>,
    ) {
        let deadline = Instant::now() + self.timeout;
        if let Some(compacted) = gone {
            let _ = self.tx.send(gone_event(start_rv, compacted)).await;
            return;
        }
        for chunk in initial.chunks(INITIAL_CHUNK) {
            let mut buf = BytesMut::new();
            for o in chunk {
                push_event(&mut buf, "ADDED", &render(&self.rt, o, self.shape));
            }
            if self.tx.send(buf.freeze()).await.is_err() {
                return;
            }
        }
        if self.initial_end_marker && self.tx.send(bookmark(&self.rt, start_rv, true)).await.is_err() {
            return;
        }
        let mut last = start_rv;
        if let Drain::End = self.drain(&mut last, false).await {
            return;
        }
        let mut ticker = tokio::time::interval_at(
            Instant::now() + self.core.opts.bookmark_interval,
            self.core.opts.bookmark_interval,
        );
        loop {
            tokio::select! {
                _ = self.tx.closed() => return,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = closer.changed() => return,
                changed = notify.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Let pending writes land first: under load one drain then carries several events.
                    tokio::task::yield_now().await;
                    if let Drain::End = self.drain(&mut last, false).await {
                        return;
                    }
                }
                _ = ticker.tick(), if self.bookmarks => {
                    if let Drain::End = self.drain(&mut last, true).await {
                        return;
                    }
                }
            }
        }
    }

    /// Sends the events after `last` (and a bookmark at the current version if asked).
    async fn drain(&self, last: &mut u64, with_bookmark: bool) -> Drain {
        let (events, current, compacted) = {
            let st = self.core.lock();
            let Some(store) = st.stores.get(&self.rt.store) else { return Drain::End };
            (store.events_after(*last, false), st.rv, store.compacted)
        };
        let Some(events) = events else {
            let _ = self.tx.send(gone_event(*last, compacted)).await;
            return Drain::End;
        };
        let mut picked = Vec::with_capacity(events.len());
        for ev in &events {
            if let Some((ty, obj)) = self.filter.classify(ev) {
                picked.push((ty, render(&self.rt, obj, self.shape)));
            }
            *last = ev.rv;
        }
        // Sized up front: these buffers are large when watchers fall behind.
        let mut buf = BytesMut::with_capacity(picked.iter().map(|(_, b)| b.len() + 40).sum::<usize>() + 200);
        for (ty, bytes) in &picked {
            push_event(&mut buf, ty.as_str(), bytes);
        }
        if with_bookmark {
            *last = current.max(*last);
            let bm = bookmark(&self.rt, *last, false);
            buf.put_slice(&bm);
        }
        if !buf.is_empty() && self.tx.send(buf.freeze()).await.is_err() {
            return Drain::End;
        }
        Drain::Continue
    }
}
