//! HTTP serving: connection handling, routing, content negotiation, request logging.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::core::{Core, DeleteOpts, ListOpts, PatchKind, Shape, render};
use crate::error::ApiError;
use crate::managed::default_manager;
use crate::request_log::RequestRecord;
use crate::resources::ResourceType;
use crate::response::{Body, bytes_response, error_response, full, json_response, respond};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::util::{now_rfc3339, parse_query};
use crate::{control, discovery, table, watch as watches};

/// Accepts connections until `shutdown` flips; dropping the task drops every connection.
pub(crate) async fn serve(listener: TcpListener, core: Arc<Core>, mut shutdown: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let core = core.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req| handle(core.clone(), req));
                        if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                            debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// A parsed request path.
enum Route {
    Root,
    Version,
    Health,
    CoreVersions,
    CoreResources,
    Groups,
    Group(String),
    GroupResources(String, String),
    OpenApiRoot,
    OpenApi(String, String),
    Resource { rt: Arc<ResourceType>, ns: Option<String>, name: Option<String>, sub: Option<String> },
    NotFound,
}

fn decode_segment(s: &str) -> String {
    // Path segments use %XX escapes only ('+' is literal in paths).
    crate::util::percent_decode(&s.replace('+', "%2B"))
}

fn route(core: &Core, path: &str) -> Route {
    let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(decode_segment).collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest) = match segs.as_slice() {
        [] => return Route::Root,
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["openapi", "v3"] => return Route::OpenApiRoot,
        ["openapi", "v3", "api", v] => return Route::OpenApi(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => return Route::OpenApi(g.to_string(), v.to_string()),
        ["api"] => return Route::CoreVersions,
        ["api", "v1"] => return Route::CoreResources,
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis"] => return Route::Groups,
        ["apis", g] => return Route::Group(g.to_string()),
        ["apis", g, v] => return Route::GroupResources(g.to_string(), v.to_string()),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    let (plural, ns, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if !(tail.is_empty() && matches!(*plural, "status" | "finalize")) => {
            (*plural, Some(ns.to_string()), tail)
        }
        [plural, tail @ ..] => (*plural, None, tail),
        [] => return Route::NotFound,
    };
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
        _ => return Route::NotFound,
    };
    let Some(rt) = core.lock().registry.get(group, version, plural) else { return Route::NotFound };
    if (!rt.namespaced && ns.is_some())
        || (rt.namespaced && ns.is_none() && name.is_some())
        || (sub.is_some() && !(rt.status && sub.as_deref() == Some("status")))
    {
        return Route::NotFound;
    }
    Route::Resource { rt, ns, name, sub }
}

pub(crate) fn kube_verb(method: &Method, name: bool, watch: bool) -> &'static str {
    match (method.as_str(), name) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

fn is_true(q: &HashMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

async fn handle(core: Arc<Core>, req: hyper::Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let start = Instant::now();
    let time = now_rfc3339();
    let path = req.uri().path().to_string();
    if path == "/_test" || path.starts_with("/_test/") {
        return Ok(control::handle(&core, req).await);
    }
    let method = req.method().clone();
    let query_str = req.uri().query().unwrap_or("").to_string();
    let query = parse_query(Some(&query_str));
    let headers = req.headers().clone();
    let user_agent = header_str(&headers, header::USER_AGENT);
    let route = route(&core, &path);
    let (verb, resource, namespace, name, subresource) = match &route {
        Route::Resource { rt, ns, name, sub } => (
            kube_verb(&method, name.is_some(), is_true(&query, "watch")).to_string(),
            Some(if rt.group.is_empty() { rt.plural.clone() } else { format!("{}.{}", rt.plural, rt.group) }),
            ns.clone(),
            name.clone(),
            sub.clone(),
        ),
        _ => (method.as_str().to_lowercase(), None, None, None, None),
    };
    let field_manager = query
        .get("fieldManager")
        .cloned()
        .or_else(|| matches!(verb.as_str(), "create" | "update" | "patch").then(|| default_manager(&user_agent)));
    let content_type = (verb == "patch").then(|| media_type(&headers));

    let (latency, fault) = core.faults.lock().unwrap_or_else(|e| e.into_inner()).decide(&path, &verb);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let response = match fault {
        Some(e) => error_response(&e),
        None => match dispatch(&core, route, req, &query, &headers, &user_agent).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        },
    };
    let status = response.status().as_u16();
    debug!(%method, %path, status, "request");
    core.log_request(RequestRecord {
        seq: 0,
        time,
        verb,
        method: method.to_string(),
        path,
        query: query_str,
        resource,
        namespace,
        name,
        subresource,
        content_type,
        field_manager,
        user_agent,
        user: None,
        status,
        duration_ms: start.elapsed().as_secs_f64() * 1000.0,
    });
    Ok(response)
}

fn media_type(h: &HeaderMap) -> String {
    header_str(h, header::CONTENT_TYPE).split(';').next().unwrap_or("").trim().to_lowercase()
}

/// What the client asked the response to look like.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wants {
    Json,
    Metadata,
    Table,
}

fn negotiate(h: &HeaderMap) -> Result<Wants, ApiError> {
    let accept = header_str(h, header::ACCEPT);
    if accept.is_empty() {
        return Ok(Wants::Json);
    }
    let mut json_ok = false;
    for part in accept.split(',') {
        let part = part.trim();
        let mt = part.split(';').next().unwrap_or("").trim();
        if !(mt == "application/json" || mt == "*/*" || mt == "application/*") {
            continue;
        }
        if part.contains("as=Table") {
            return Ok(Wants::Table);
        }
        if part.contains("as=PartialObjectMetadata") {
            return Ok(Wants::Metadata);
        }
        if !part.contains("as=") {
            json_ok = true;
        }
    }
    if json_ok {
        Ok(Wants::Json)
    } else {
        Err(ApiError::not_acceptable(format!(
            "only the following media types are accepted: application/json (got {accept})"
        )))
    }
}

async fn read_body(req: hyper::Request<Incoming>) -> Result<Bytes, ApiError> {
    req.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ApiError::bad_request(format!("reading the request body failed: {e}")))
}

fn parse_object(ct: &str, body: &[u8]) -> Result<Value, ApiError> {
    match ct {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}"))),
        "application/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}"))),
        other => Err(ApiError::unsupported_media_type(other, &["application/json", "application/yaml"])),
    }
}

fn dry_run(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!("unsupported dry run value: {other}"))),
    }
}

fn manager(q: &HashMap<String, String>, ua: &str) -> Result<String, ApiError> {
    let m = q.get("fieldManager").cloned().unwrap_or_else(|| default_manager(ua));
    if m.len() > 128 {
        return Err(ApiError::unprocessable("fieldManager: Too long: may not be longer than 128"));
    }
    Ok(m)
}

fn list_opts(rt: &ResourceType, q: &HashMap<String, String>) -> Result<ListOpts, ApiError> {
    Ok(ListOpts {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""), rt)?,
        limit: match q.get("limit").filter(|s| !s.is_empty()) {
            Some(l) => Some(l.parse().map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?),
            None => None,
        },
        continue_token: q.get("continue").cloned(),
        resource_version: q.get("resourceVersion").cloned(),
        version_match: q.get("resourceVersionMatch").cloned().filter(|s| !s.is_empty()),
    })
}

fn delete_opts(q: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let mut o = DeleteOpts { dry_run: dry_run(q)?, ..Default::default() };
    if let Some(g) = q.get("gracePeriodSeconds") {
        o.grace = Some(g.parse().map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?);
    }
    o.propagation = q.get("propagationPolicy").cloned();
    if q.get("orphanDependents").is_some_and(|v| v == "true") {
        o.propagation = Some("Orphan".into());
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value =
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            o.grace = Some(g);
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            o.propagation = Some(p.into());
        }
        if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            o.propagation = Some("Orphan".into());
        }
        o.uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(String::from);
        o.resource_version = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(String::from);
        if let Some(d) = v.get("dryRun").and_then(Value::as_array) {
            for x in d {
                match x.as_str() {
                    Some("All") => o.dry_run = true,
                    other => return Err(ApiError::bad_request(format!("unsupported dry run value: {other:?}"))),
                }
            }
        }
    }
    Ok(o)
}

async fn dispatch(
    core: &Arc<Core>,
    route: Route,
    req: hyper::Request<Incoming>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    ua: &str,
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    let (rt, ns, name, sub) = match route {
        Route::Resource { rt, ns, name, sub } => (rt, ns, name, sub),
        Route::NotFound => return Err(ApiError::not_found_path()),
        other => {
            if method != Method::GET && method != Method::HEAD {
                return Err(ApiError::method_not_allowed());
            }
            let reg_doc = |f: &dyn Fn(&crate::resources::Registry) -> Option<Value>| f(&core.lock().registry);
            let doc = match other {
                Route::Root => {
                    Some(json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]}))
                }
                Route::Version => Some(discovery::version()),
                Route::Health => return Ok(respond(200, "text/plain", full("ok"))),
                Route::CoreVersions => Some(discovery::core_versions(&core.addr)),
                Route::CoreResources => reg_doc(&|r| discovery::resource_list(r, "", "v1")),
                Route::Groups => reg_doc(&|r| Some(discovery::group_list(r))),
                Route::Group(g) => reg_doc(&|r| discovery::group(r, &g)),
                Route::GroupResources(g, v) => reg_doc(&|r| discovery::resource_list(r, &g, &v)),
                Route::OpenApiRoot => reg_doc(&|r| Some(discovery::openapi_v3_root(r))),
                Route::OpenApi(g, v) => reg_doc(&|r| discovery::openapi_v3_group_version(r, &g, &v)),
                _ => None,
            };
            return doc.map(|d| json_response(200, &d)).ok_or_else(ApiError::not_found_path);
        }
    };
    let ns = ns.as_deref();
    let sub = sub.as_deref();
    let wants = negotiate(headers)?;
    let shape = if wants == Wants::Metadata { Shape::Metadata } else { Shape::Full };
    match (method.as_str(), name) {
        ("GET", None) if is_true(q, "watch") => {
            let lo = list_opts(&rt, q)?;
            if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
                let mut causes = vec![];
                if !is_true(q, "allowWatchBookmarks") {
                    causes.push(crate::error::Cause::forbidden(
                        "allowWatchBookmarks",
                        "sendInitialEvents requires setting allowWatchBookmarks to true",
                    ));
                }
                if lo.version_match.as_deref() != Some("NotOlderThan") {
                    causes.push(crate::error::Cause::forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    ));
                }
                if !causes.is_empty() {
                    return Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", causes));
                }
            }
            let timeout = match q.get("timeoutSeconds").filter(|s| !s.is_empty()) {
                Some(t) => Some(std::time::Duration::from_secs(
                    t.parse().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
                )),
                None => None,
            };
            let body = watches::start(
                core,
                rt,
                watches::WatchOpts {
                    ns: ns.map(String::from),
                    resource_version: q.get("resourceVersion").cloned(),
                    send_initial_events: q.get("sendInitialEvents").map(|v| v == "true"),
                    bookmarks: is_true(q, "allowWatchBookmarks"),
                    timeout,
                    labels: lo.labels,
                    fields: lo.fields,
                    shape,
                },
            )?;
            Ok(respond(200, "application/json", body))
        }
        ("GET", None) => {
            let lo = list_opts(&rt, q)?;
            if wants == Wants::Table {
                let (items, rv, cont, _) = core.list_objects(&rt, ns, &lo)?;
                return Ok(json_response(200, &table::table(&rt, &items, Some(rv), cont)));
            }
            Ok(bytes_response(200, core.list(&rt, ns, &lo, shape)?))
        }
        ("GET", Some(name)) => {
            let obj = core.get(&rt, ns, &name)?;
            if wants == Wants::Table {
                return Ok(json_response(200, &table::table(&rt, &[obj], None, None)));
            }
            Ok(bytes_response(200, render(&rt, &obj, shape)))
        }
        ("POST", None) => {
            let ct = media_type(headers);
            let dry = dry_run(q)?;
            let m = manager(q, ua)?;
            let body = parse_object(&ct, &read_body(req).await?)?;
            Ok(bytes_response(201, core.create(&rt, ns, body, &m, dry)?))
        }
        ("PUT", Some(name)) => {
            let ct = media_type(headers);
            let dry = dry_run(q)?;
            let m = manager(q, ua)?;
            let body = parse_object(&ct, &read_body(req).await?)?;
            Ok(bytes_response(200, core.update(&rt, ns, &name, sub, body, &m, dry)?))
        }
        ("PATCH", Some(name)) => {
            let ct = media_type(headers);
            let kind = match ct.as_str() {
                "application/json-patch+json" => PatchKind::Json,
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/apply-patch+yaml" => PatchKind::Apply,
                other => {
                    return Err(ApiError::unsupported_media_type(
                        other,
                        &[
                            "application/json-patch+json",
                            "application/merge-patch+json",
                            "application/strategic-merge-patch+json",
                            "application/apply-patch+yaml",
                        ],
                    ));
                }
            };
            let dry = dry_run(q)?;
            let force = is_true(q, "force");
            if force && kind != PatchKind::Apply {
                return Err(ApiError::unprocessable("force: Forbidden: may not be specified for non-apply patch"));
            }
            if kind == PatchKind::Apply && q.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::invalid(
                    "meta.k8s.io",
                    "PatchOptions",
                    "",
                    vec![crate::error::Cause::required("fieldManager", "is required for apply patch")],
                ));
            }
            let m = manager(q, ua)?;
            let raw = read_body(req).await?;
            let patch: Value = match kind {
                PatchKind::Apply => serde_json::from_slice(&raw).or_else(|_| {
                    serde_yaml::from_slice(&raw).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
                })?,
                _ => serde_json::from_slice(&raw).map_err(|e| ApiError::bad_request(format!("invalid patch: {e}")))?,
            };
            let (v, created) = core.patch(&rt, ns, &name, sub, kind, patch, &m, force, dry)?;
            Ok(bytes_response(if created { 201 } else { 200 }, v))
        }
        ("DELETE", Some(name)) if sub.is_none() => {
            let opts = delete_opts(q, &read_body(req).await?)?;
            // 200 whether or not finalizers keep the object, as the genuine server answers (202 only
            // for `orphanDependents: false`, which no client here sends).
            let (v, _now) = core.delete(&rt, ns, &name, &opts)?;
            Ok(json_response(200, &v))
        }
        ("DELETE", None) => {
            let lo = list_opts(&rt, q)?;
            let opts = delete_opts(q, &read_body(req).await?)?;
            Ok(json_response(200, &core.delete_collection(&rt, ns, &lo, &opts)?))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}
