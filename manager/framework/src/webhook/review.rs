//! The `admission.k8s.io/v1` AdmissionReview a webhook receives and answers, and the pure
//! decisions around it: parsing a bounded body, the answer's JSON. No I/O here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API version of the reviews served (what a ValidatingWebhookConfiguration lists in
/// `admissionReviewVersions`).
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// Group, version and kind of the object under review.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct GroupVersionKind {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// Group, version and resource of the object under review.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct GroupVersionResource {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Resource (plural).
    #[serde(default)]
    pub resource: String,
}

/// What the API server asks about: the fields a webhook decides on.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Identifies this request; echoed in the answer.
    pub uid: String,
    /// The object's kind.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// The object's resource.
    #[serde(default)]
    pub resource: GroupVersionResource,
    /// A subresource (`status`), if the request is for one.
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// The object's name (empty for a create with `generateName`).
    #[serde(default)]
    pub name: Option<String>,
    /// The object's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    #[serde(default)]
    pub operation: String,
    /// The object as it would be stored (none for `DELETE`).
    #[serde(default)]
    pub object: Option<Value>,
    /// The object before an `UPDATE` or `DELETE`.
    #[serde(default)]
    pub old_object: Option<Value>,
    /// Whether nothing will be persisted.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl AdmissionRequest {
    /// [`Self::object`] as a `T`; `None` when absent.
    pub fn object_as<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, String> {
        decode(self.object.as_ref(), "object")
    }

    /// [`Self::old_object`] as a `T`; `None` when absent.
    pub fn old_object_as<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, String> {
        decode(self.old_object.as_ref(), "oldObject")
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: Option<&Value>, field: &str) -> Result<Option<T>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v).map(Some).map_err(|e| format!("request.{field} does not decode: {e}")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<AdmissionRequest>,
}

/// Why a body is not an AdmissionReview a webhook can answer (the server answers 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// `Content-Type` is not `application/json` (upstream's check).
    #[error("Content-Type: {0:?} should be \"application/json\"")]
    ContentType(String),
    /// The body is empty.
    #[error("admission request HTTP body is empty")]
    Empty,
    /// The body is not JSON of the expected shape.
    #[error("could not deserialize incoming admission review: {0}")]
    Malformed(String),
    /// Not an `admission.k8s.io/v1` AdmissionReview.
    #[error("expected an AdmissionReview of {API_VERSION}, got {kind:?} of {api_version:?}")]
    WrongType {
        /// The body's `apiVersion`.
        api_version: String,
        /// The body's `kind`.
        kind: String,
    },
    /// `request` is missing.
    #[error("admission review can't be used: Request field is nil")]
    NoRequest,
}

/// Parse an AdmissionReview body sent with `content_type`.
pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
    let media = content_type.unwrap_or_default().split(';').next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(ReviewError::ContentType(content_type.unwrap_or_default().chars().take(64).collect()));
    }
    if body.is_empty() {
        return Err(ReviewError::Empty);
    }
    let review: Review = serde_json::from_slice(body).map_err(|e| ReviewError::Malformed(e.to_string()))?;
    if review.api_version != API_VERSION || review.kind != "AdmissionReview" {
        return Err(ReviewError::WrongType { api_version: review.api_version, kind: review.kind });
    }
    review.request.ok_or(ReviewError::NoRequest)
}

/// A webhook's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Let the request through, with warnings shown to the client (`kubectl` prints them).
    Allowed {
        /// Warning lines (each at most [`MAX_WARNING_BYTES`]).
        warnings: Vec<String>,
    },
    /// Refuse it: the API server answers the client with `code` and `message`.
    Denied {
        /// HTTP status the client gets (403 unless the webhook says otherwise).
        code: u16,
        /// Why, in words the user can act on (at most [`MAX_MESSAGE_BYTES`]).
        message: String,
    },
}

/// The longest denial message kept.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// The longest warning kept (the API server's own limit is 120 characters per warning when
/// many are given; it truncates longer ones).
pub const MAX_WARNING_BYTES: usize = 256;

impl Admission {
    /// Allow, without warnings.
    pub fn allowed() -> Self {
        Admission::Allowed { warnings: Vec::new() }
    }

    /// Refuse with 403 Forbidden and `message`.
    pub fn denied(message: impl Into<String>) -> Self {
        Admission::Denied { code: 403, message: message.into() }
    }

    /// Whether it allows the request.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Admission::Allowed { .. })
    }
}

fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The AdmissionReview answering request `uid` with `admission`.
pub fn answer(uid: &str, admission: &Admission) -> Value {
    let response = match admission {
        Admission::Allowed { warnings } => {
            let warnings: Vec<String> = warnings.iter().map(|w| cut(w, MAX_WARNING_BYTES)).collect();
            let mut r = serde_json::json!({ "uid": uid, "allowed": true });
            if !warnings.is_empty() {
                r["warnings"] = serde_json::json!(warnings);
            }
            r
        }
        Admission::Denied { code, message } => serde_json::json!({
            "uid": uid,
            "allowed": false,
            "status": {
                "code": code,
                "message": cut(message, MAX_MESSAGE_BYTES),
                "reason": if *code == 403 { "Forbidden" } else { "BadRequest" },
            },
        }),
    };
    serde_json::json!({ "apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(request: Value) -> Vec<u8> {
        serde_json::to_vec(
            &serde_json::json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": request}),
        )
        .unwrap()
    }

    #[test]
    fn a_review_is_parsed_and_its_object_decoded() {
        let body = review(serde_json::json!({
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Service"},
            "resource": {"group": "", "version": "v1", "resource": "services"},
            "namespace": "default", "name": "web", "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"type": "LoadBalancer"}},
            "userInfo": {"username": "alice"},
        }));
        let r = parse(Some("application/json; charset=utf-8"), &body).unwrap();
        assert_eq!((r.uid.as_str(), r.operation.as_str(), r.kind.kind.as_str()), ("u-1", "CREATE", "Service"));
        let svc: k8s_openapi::api::core::v1::Service = r.object_as().unwrap().unwrap();
        assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(r.old_object_as::<k8s_openapi::api::core::v1::Service>().unwrap(), None);
    }

    #[test]
    fn bodies_that_are_not_a_v1_review_are_refused_with_upstreams_messages() {
        assert_eq!(parse(Some("text/plain"), b"{}"), Err(ReviewError::ContentType("text/plain".into())));
        assert_eq!(parse(None, b"{}"), Err(ReviewError::ContentType(String::new())));
        assert_eq!(parse(Some("application/json"), b""), Err(ReviewError::Empty));
        assert!(matches!(parse(Some("application/json"), b"[1"), Err(ReviewError::Malformed(_))));
        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}"#;
        assert!(matches!(parse(Some("application/json"), v1beta1), Err(ReviewError::WrongType { .. })));
        let none = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert_eq!(parse(Some("application/json"), none), Err(ReviewError::NoRequest));
        assert!(ReviewError::NoRequest.to_string().contains("Request field is nil"));
    }

    #[test]
    fn answers_echo_the_uid_and_carry_the_reason_bounded() {
        let a = answer("u-2", &Admission::allowed());
        assert_eq!(a["response"], serde_json::json!({"uid": "u-2", "allowed": true}));
        assert_eq!(a["apiVersion"], API_VERSION);
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let d = answer("u-3", &Admission::denied(long));
        assert_eq!(d["response"]["allowed"], false);
        assert_eq!(d["response"]["status"]["code"], 403);
        assert_eq!(d["response"]["status"]["reason"], "Forbidden");
        assert!(d["response"]["status"]["message"].as_str().unwrap().len() <= MAX_MESSAGE_BYTES);
        let w = answer("u-4", &Admission::Allowed { warnings: vec!["careful".into()] });
        assert_eq!(w["response"]["warnings"], serde_json::json!(["careful"]));
    }
}
