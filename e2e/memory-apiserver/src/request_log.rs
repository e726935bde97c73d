//! The request log: every API request with verb, path, field manager and status.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One logged request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    /// Sequence number since the server started (survives `clear`).
    pub seq: u64,
    /// RFC 3339 time the request arrived.
    pub time: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`), or the lower-case HTTP method for non-resource paths.
    pub verb: String,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// `resource` or `resource.group` for resource requests.
    pub resource: Option<String>,
    /// Namespace in the path.
    pub namespace: Option<String>,
    /// Object name in the path.
    pub name: Option<String>,
    /// Subresource (`status`).
    pub subresource: Option<String>,
    /// Patch content type for `patch` (e.g. `application/apply-patch+yaml`).
    pub content_type: Option<String>,
    /// The `fieldManager` query parameter, or for writes the manager derived from the user agent.
    pub field_manager: Option<String>,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// The authenticated user (genuine backend only; the local server has no authentication).
    #[serde(default)]
    pub user: Option<String>,
    /// HTTP status code answered.
    pub status: u16,
    /// Time to the response head, in milliseconds.
    pub duration_ms: f64,
}

impl RequestRecord {
    /// Whether the request was a write (create, update, patch, delete, deletecollection).
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }
}

/// Log storage (bounded; the oldest records are dropped).
#[derive(Debug, Default)]
pub struct LogData {
    /// The records, oldest first.
    pub records: VecDeque<RequestRecord>,
    /// Sequence number the next record gets.
    pub next_seq: u64,
}

/// Where a [`RequestLog`]'s records live: this server's own log, or another server's log read
/// as the same records (the test kit reads a genuine kube-apiserver's audit log this way).
pub trait LogSource: Send + Sync {
    /// Runs `f` on the records as they stand now.
    fn with_data(&self, f: &mut dyn FnMut(&mut LogData));
}

/// Handle to a request log, on either backend.
#[derive(Clone)]
pub struct RequestLog {
    source: Arc<dyn LogSource>,
}

impl RequestLog {
    /// A request log over `source`.
    pub fn new(source: Arc<dyn LogSource>) -> RequestLog {
        RequestLog { source }
    }

    fn with<R>(&self, f: impl FnOnce(&mut LogData) -> R) -> R {
        let mut f = Some(f);
        let mut out = None;
        self.source.with_data(&mut |data| {
            if let Some(f) = f.take() {
                out = Some(f(data));
            }
        });
        match (out, f) {
            (Some(r), _) => r,
            // A source that never called back holds no records.
            (None, Some(f)) => f(&mut LogData::default()),
            (None, None) => unreachable!("f ran, so it gave a result"),
        }
    }

    /// All records, oldest first.
    pub fn entries(&self) -> Vec<RequestRecord> {
        self.with(|d| d.records.iter().cloned().collect())
    }

    /// Records matching a predicate.
    pub fn filter(&self, f: impl Fn(&RequestRecord) -> bool) -> Vec<RequestRecord> {
        self.with(|d| d.records.iter().filter(|r| f(r)).cloned().collect())
    }

    /// Number of records matching a predicate.
    pub fn count(&self, f: impl Fn(&RequestRecord) -> bool) -> usize {
        self.with(|d| d.records.iter().filter(|r| f(r)).count())
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.with(|d| d.records.len())
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Write requests (create, update, patch, delete, deletecollection).
    pub fn writes(&self) -> Vec<RequestRecord> {
        self.filter(RequestRecord::is_write)
    }

    /// Number of write requests.
    pub fn count_writes(&self) -> usize {
        self.count(RequestRecord::is_write)
    }

    /// Records whose field manager is `manager`.
    pub fn by_field_manager(&self, manager: &str) -> Vec<RequestRecord> {
        self.filter(|r| r.field_manager.as_deref() == Some(manager))
    }

    /// Records whose user agent starts with `prefix`.
    pub fn by_user_agent(&self, prefix: &str) -> Vec<RequestRecord> {
        self.filter(|r| r.user_agent.starts_with(prefix))
    }

    /// Forgets every record.
    pub fn clear(&self) {
        self.with(|d| d.records.clear());
    }

    /// Sequence number the next record will get (to look at "everything after this point").
    pub fn mark(&self) -> u64 {
        self.with(|d| d.next_seq)
    }

    /// Records logged since a [`mark`](Self::mark).
    pub fn since(&self, mark: u64) -> Vec<RequestRecord> {
        self.filter(|r| r.seq >= mark)
    }
}
