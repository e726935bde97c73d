//! The kube-apiserver audit log read as [`RequestRecord`]s, so a test counts requests the same
//! way on both backends.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Mutex;

use serde::Deserialize;

use memory_apiserver::{LogData, LogSource, RequestRecord};

/// The audit policy: one `ResponseComplete` line per request, metadata only (no bodies, so no
/// Secret content ever reaches the file).
pub(crate) const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\", \"ResponseStarted\"]
rules:
- level: Metadata
";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    stage: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    user: User,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    request_received_timestamp: String,
    #[serde(default)]
    stage_timestamp: String,
}

#[derive(Deserialize, Default)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    api_group: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

/// Seconds since midnight of an RFC 3339 timestamp (`...THH:MM:SS.ffffffZ`); enough for
/// durations of requests shorter than a day.
fn seconds_of_day(ts: &str) -> Option<f64> {
    let time = ts.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

/// One audit line as a request record (`None` for other stages or lines that do not parse).
fn record(line: &str) -> Option<RequestRecord> {
    let event: Event = serde_json::from_str(line).ok()?;
    if event.stage != "ResponseComplete" {
        return None;
    }
    let (path, query) = match event.request_uri.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (event.request_uri.clone(), String::new()),
    };
    let object = event.object_ref;
    let resource = object.as_ref().and_then(|o| {
        let r = o.resource.clone()?;
        Some(match o.api_group.as_deref() {
            Some(g) if !g.is_empty() => format!("{r}.{g}"),
            _ => r,
        })
    });
    let method = match event.verb.as_str() {
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        _ => "GET",
    };
    // Same rule as the API server: the query's fieldManager, else the user agent's prefix.
    let field_manager = query_param(&query, "fieldManager").map(|m| m.to_string()).or_else(|| {
        matches!(event.verb.as_str(), "create" | "update" | "patch")
            .then(|| memory_apiserver::default_manager(&event.user_agent))
    });
    let duration_ms = match (seconds_of_day(&event.request_received_timestamp), seconds_of_day(&event.stage_timestamp))
    {
        (Some(a), Some(b)) if b >= a => (b - a) * 1000.0,
        _ => 0.0,
    };
    Some(RequestRecord {
        seq: 0,
        time: event.request_received_timestamp,
        verb: event.verb,
        method: method.to_string(),
        path,
        query,
        resource,
        namespace: object.as_ref().and_then(|o| o.namespace.clone()),
        name: object.as_ref().and_then(|o| o.name.clone()),
        subresource: object.as_ref().and_then(|o| o.subresource.clone()),
        content_type: None,
        field_manager,
        user_agent: event.user_agent,
        user: Some(event.user.username),
        status: event.response_status.map(|s| s.code).unwrap_or(0),
        duration_ms,
    })
}

/// An audit log file read incrementally: every query reads what was appended since.
pub(crate) struct AuditLog {
    path: PathBuf,
    state: Mutex<AuditState>,
}

#[derive(Default)]
struct AuditState {
    offset: u64,
    partial: Vec<u8>,
    data: LogData,
}

impl AuditLog {
    /// Reads `path` from its current end on: earlier requests (another test's) are not seen.
    pub fn from_end(path: PathBuf) -> AuditLog {
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        AuditLog { path, state: Mutex::new(AuditState { offset, ..Default::default() }) }
    }

    /// Runs `f` on the records after reading what the server appended.
    pub fn with<R>(&self, f: impl FnOnce(&mut LogData) -> R) -> R {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.refresh(&self.path);
        f(&mut state.data)
    }
}

impl LogSource for AuditLog {
    fn with_data(&self, f: &mut dyn FnMut(&mut LogData)) {
        self.with(f)
    }
}

impl AuditState {
    fn refresh(&mut self, path: &PathBuf) {
        let Ok(mut file) = File::open(path) else { return };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        let Ok(read) = file.read_to_end(&mut buf) else { return };
        self.offset += read as u64;
        self.partial.extend_from_slice(&buf);
        let Some(last_newline) = self.partial.iter().rposition(|b| *b == b'\n') else { return };
        let complete: Vec<u8> = self.partial.drain(..=last_newline).collect();
        for line in complete.split(|b| *b == b'\n') {
            let Ok(line) = std::str::from_utf8(line) else { continue };
            if let Some(mut r) = record(line) {
                r.seq = self.data.next_seq;
                self.data.next_seq += 1;
                self.data.records.push_back(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audit_line_becomes_a_request_record() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/nodes/n1/status?fieldManager=cloud-node-controller","verb":"patch","user":{"username":"system:serviceaccount:kube-system:ccm"},"sourceIPs":["127.0.0.1"],"userAgent":"cloud-controller-manager/v0.1.0","objectRef":{"resource":"nodes","name":"n1","apiVersion":"v1","subresource":"status"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-24T10:00:00.100000Z","stageTimestamp":"2026-11-24T10:00:00.125000Z"}"#;
        let r = record(line).expect("a record");
        assert_eq!(r.verb, "patch");
        assert_eq!(r.method, "PATCH");
        assert_eq!(r.path, "/api/v1/nodes/n1/status");
        assert_eq!(r.resource.as_deref(), Some("nodes"));
        assert_eq!(r.name.as_deref(), Some("n1"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert_eq!(r.field_manager.as_deref(), Some("cloud-node-controller"));
        assert_eq!(r.user.as_deref(), Some("system:serviceaccount:kube-system:ccm"));
        assert!(r.is_write());
        assert!((r.duration_ms - 25.0).abs() < 0.01, "{}", r.duration_ms);
    }

    #[test]
    fn grouped_resources_carry_their_group_and_writes_without_a_manager_use_the_agent() {
        let line = r#"{"stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/ns/deployments","verb":"create","user":{"username":"admin"},"userAgent":"ccm-operator/0.1 (linux)","objectRef":{"resource":"deployments","namespace":"ns","apiGroup":"apps"},"responseStatus":{"code":201}}"#;
        let r = record(line).expect("a record");
        assert_eq!(r.resource.as_deref(), Some("deployments.apps"));
        assert_eq!(r.namespace.as_deref(), Some("ns"));
        assert_eq!(r.field_manager.as_deref(), Some("ccm-operator"));
        assert_eq!(r.status, 201);
    }

    #[test]
    fn other_stages_and_garbage_are_skipped() {
        assert!(record(r#"{"stage":"RequestReceived","verb":"get"}"#).is_none());
        assert!(record("not json").is_none());
    }

    #[test]
    fn the_log_is_read_incrementally_from_where_it_was_opened() {
        let dir = std::env::temp_dir().join(format!("audit-test-{}", memory_apiserver::random_suffix()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("audit.log");
        let line = |verb: &str| {
            format!(
                r#"{{"stage":"ResponseComplete","requestURI":"/api/v1/nodes","verb":"{verb}","objectRef":{{"resource":"nodes"}},"responseStatus":{{"code":200}}}}"#
            )
        };
        std::fs::write(&path, format!("{}\n", line("list"))).expect("write");
        let log = AuditLog::from_end(path.clone());
        assert_eq!(log.with(|d| d.records.len()), 0, "lines before opening are not seen");
        let mut text = std::fs::read_to_string(&path).expect("read");
        text.push_str(&line("create"));
        text.push('\n');
        text.push_str(&line("delete")[..20]);
        std::fs::write(&path, &text).expect("write");
        assert_eq!(log.with(|d| d.records.iter().map(|r| r.verb.clone()).collect::<Vec<_>>()), vec!["create"]);
        text.push_str(&line("delete")[20..]);
        text.push('\n');
        std::fs::write(&path, &text).expect("write");
        assert_eq!(log.with(|d| d.records.len()), 2, "a line completed later is read once whole");
        let _ = std::fs::remove_dir_all(dir);
    }
}
