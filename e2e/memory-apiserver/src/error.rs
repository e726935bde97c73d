//! The crate's error type and the `metav1.Status` errors the server answers with.

use serde_json::{Value, json};

/// Errors from starting, driving or stopping the in-memory API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or serving the listening socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// Building the `kube::Client` for the server failed.
    #[error("kube client error: {0}")]
    Kube(#[from] kube::Error),
    /// The server URL did not parse (should not happen).
    #[error("invalid server url: {0}")]
    Url(String),
    /// (De)serializing JSON failed.
    #[error("json error: {0}")]
    Json(#[from] serde_json::Error),
    /// (De)serializing YAML failed.
    #[error("yaml error: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// The server answered a control request with an unexpected result.
    #[error("control request failed: {0}")]
    Control(String),
    /// A sandbox component failed.
    #[error("sandbox component {name} failed: {message}")]
    Component {
        /// The component's name.
        name: String,
        /// What went wrong.
        message: String,
    },
}

/// A `metav1.Status` failure: HTTP code, reason, message and details.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    pub retry_after: Option<u64>,
}

/// A `metav1.StatusCause`.
#[derive(Debug, Clone)]
pub(crate) struct Cause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

impl Cause {
    pub fn required(field: &str, message: &str) -> Self {
        Cause { reason: "FieldValueRequired", field: field.into(), message: format!("Required value: {message}") }
    }
    pub fn invalid(field: &str, value: &Value, message: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value}: {message}"),
        }
    }
    pub fn forbidden(field: &str, message: &str) -> Self {
        Cause { reason: "FieldValueForbidden", field: field.into(), message: format!("Forbidden: {message}") }
    }
    pub fn duplicate(field: &str, value: &Value) -> Self {
        Cause { reason: "FieldValueDuplicate", field: field.into(), message: format!("Duplicate value: {value}") }
    }
}

/// `details.group` is omitted for the core group, as the genuine server omits it.
fn with_group(mut details: Value, group: &str) -> Value {
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    details
}

/// Identifies the resource an error is about ("nodes", "deployments.apps").
#[derive(Debug, Clone)]
pub(crate) struct Target<'a> {
    pub group: &'a str,
    pub plural: &'a str,
}

impl Target<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.to_string() } else { format!("{}.{}", self.plural, self.group) }
    }
    fn details(&self, name: &str) -> Value {
        with_group(json!({"name": name, "kind": self.plural}), self.group)
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None, retry_after: None }
    }

    pub fn not_found(t: &Target, name: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("{} \"{}\" not found", t.qualified(), name));
        e.details = Some(t.details(name));
        e
    }

    pub fn not_found_path() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }

    pub fn already_exists(t: &Target, name: &str) -> Self {
        let mut e = Self::new(409, "AlreadyExists", format!("{} \"{}\" already exists", t.qualified(), name));
        e.details = Some(t.details(name));
        e
    }

    pub fn conflict(t: &Target, name: &str, why: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{}\": {}", t.qualified(), name, why),
        );
        e.details = Some(t.details(name));
        e
    }

    pub fn stale(t: &Target, name: &str) -> Self {
        Self::conflict(
            t,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn apply_conflict(t: &Target, name: &str, conflicts: &[(String, String)]) -> Self {
        let listed: Vec<String> =
            conflicts.iter().map(|(manager, field)| format!("conflict with \"{manager}\": {field}")).collect();
        let message = if conflicts.len() == 1 {
            format!("Apply failed with 1 conflict: {}", listed.join("\n"))
        } else {
            format!("Apply failed with {} conflicts: {}", conflicts.len(), listed.join("\n"))
        };
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, field)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": field})
            })
            .collect();
        let mut e = Self::new(409, "Conflict", message);
        // Apply conflicts carry only the causes on a genuine server.
        let _ = (t, name);
        let details = json!({"causes": causes});
        e.details = Some(details);
        e
    }

    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let listed: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        // The genuine server qualifies the kind with its group (`Widget.example.com "w"`).
        let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        let message = if listed.len() == 1 {
            format!("{qualified} \"{name}\" is invalid: {}", listed[0])
        } else {
            format!("{qualified} \"{name}\" is invalid: [{}]", listed.join(", "))
        };
        let causes: Vec<Value> =
            causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect();
        let mut e = Self::new(422, "Invalid", message);
        e.details = Some(with_group(json!({"name": name, "kind": kind, "causes": causes}), group));
        e
    }

    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(t: &Target, name: &str, why: &str) -> Self {
        let mut e = Self::new(403, "Forbidden", format!("{} \"{}\" is forbidden: {}", t.qualified(), name, why));
        e.details = Some(t.details(name));
        e
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type}) - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// A 403 as an authorizer would answer it (injected: this server has no RBAC).
    pub fn forbidden_fault() -> Self {
        Self::new(403, "Forbidden", "the request is forbidden (injected fault)")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later (injected fault)",
        );
        e.details = Some(json!({"retryAfterSeconds": retry_after}));
        e.retry_after = Some(retry_after);
        e
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}
