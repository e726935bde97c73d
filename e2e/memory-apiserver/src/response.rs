//! HTTP responses: the body type every handler answers with, JSON bodies and API errors as
//! `metav1.Status`.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::Full;
use http_body_util::combinators::BoxBody;
use serde_json::Value;

use crate::error::ApiError;

/// Response body: whole buffers or a watch stream.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    BoxBody::new(Full::new(b.into()))
}

pub(crate) fn respond(code: u16, content_type: &str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    respond(code, "application/json", full(serde_json::to_vec(v).unwrap_or_default()))
}

pub(crate) fn bytes_response(code: u16, b: Bytes) -> Response<Body> {
    respond(code, "application/json", full(b))
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = s.to_string().parse()
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}
