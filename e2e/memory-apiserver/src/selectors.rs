//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and field selectors.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::{ResourceType, Strategy};

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            reqs.push(parse_label_req(part).ok_or_else(|| {
                ApiError::bad_request(format!("unable to parse requirement: invalid label selector: \"{part}\""))
            })?);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Matches an object's labels.
    #[cfg(test)]
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Matches labels given by a lookup function.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = vec![];
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str) -> Option<Vec<String>> {
    let rest = rest.trim();
    let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
    let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if vals.iter().all(|v| valid_value(v)) { Some(vals) } else { None }
}

fn parse_label_req(part: &str) -> Option<LabelReq> {
    if let Some(k) = part.strip_prefix('!') {
        let k = k.trim();
        return valid_key(k).then(|| LabelReq::NotExists(k.to_string()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        let (k, v) = (k.trim(), v.trim());
        return (valid_key(k) && valid_value(v)).then(|| LabelReq::NotEq(k.into(), v.into()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        let (k, v) = (k.trim(), v.trim());
        return (valid_key(k) && valid_value(v)).then(|| LabelReq::Eq(k.into(), v.into()));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    let rest = words.next().map(str::trim).unwrap_or("");
    if rest.is_empty() {
        return valid_key(key).then(|| LabelReq::Exists(key.into()));
    }
    if !valid_key(key) {
        return None;
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return Some(LabelReq::NotIn(key.into(), parse_set(set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Some(LabelReq::In(key.into(), parse_set(set)?));
    }
    None
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma separated.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str, rt: &ResourceType) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{s}'; can't understand '{part}'")));
            };
            let field = field.trim();
            if !supported_field(rt, field) {
                return Err(ApiError::bad_request(format!("field label not supported: {field}")));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name this selector pins with `metadata.name=`, if any (lets lists skip a scan).
    pub fn pinned_name(&self) -> Option<&str> {
        self.0.iter().find(|(f, eq, _)| f == "metadata.name" && *eq).map(|(_, _, v)| v.as_str())
    }

    /// Matches against the stored (core) form of the object.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let actual = field_value(obj, field);
            (actual == *value) == *eq
        })
    }
}

/// The string value of a selectable field ("" when absent, as the real server does).
fn field_value(obj: &Value, field: &str) -> String {
    // events.k8s.io names map onto the stored core/v1 fields.
    let field = field.replacen("regarding.", "involvedObject.", 1);
    let field = match field.as_str() {
        "reportingController" => "reportingComponent".to_string(),
        _ => field,
    };
    let mut cur = obj;
    for part in field.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn supported_field(rt: &ResourceType, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    if rt.selectable_fields.iter().any(|f| f == field) {
        return true;
    }
    match rt.strategy {
        Strategy::Event => {
            field.starts_with("involvedObject.")
                || field.starts_with("regarding.")
                || matches!(field, "reason" | "reportingComponent" | "reportingController" | "source" | "type")
        }
        Strategy::Pod => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        Strategy::Node => field == "spec.unschedulable",
        Strategy::Namespace => field == "status.phase",
        Strategy::Service => matches!(field, "spec.clusterIP" | "spec.type"),
        Strategy::Workload => field == "status.replicas",
        Strategy::Generic if rt.plural == "secrets" => field == "type",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn label_selector_supports_all_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web, db)",
            "tier notin (back)",
            "app",
            "!missing",
            "app=web,tier",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s} should match");
        }
        let no = ["app=db", "app!=web", "app in (db)", "tier notin (front,back)", "missing", "!app"];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s} should not match");
        }
    }

    #[test]
    fn label_selector_rejects_garbage() {
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
    }
}
