//! Custom resources checked against their CRD's `openAPIV3Schema` as a genuine API server does:
//! defaults applied, unknown fields pruned, structural limits (type, enum, required, lengths,
//! item counts, bounds) and then the CEL rules (`x-kubernetes-validations`, including
//! transition rules), with the API server's cause reasons and messages.

use serde_json::{Map, Value, json};

use crate::error::Cause;

/// Applies the schema's defaults (recursively, as the API server does on create and update).
pub(crate) fn default(schema: &Value, obj: &mut Value) {
    *obj = kube_cel::apply_defaults(schema, obj);
}

/// Drops fields the schema does not declare (unless it preserves unknown fields).
pub(crate) fn prune(schema: &Value, obj: &mut Value) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true)) {
        return;
    }
    match obj {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                map.retain(|k, _| props.contains_key(k) || is_root_meta(k));
                for (k, v) in map.iter_mut() {
                    if let Some(s) = props.get(k) {
                        prune(s, v);
                    }
                }
            } else if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                map.values_mut().for_each(|v| prune(extra, v));
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                items.iter_mut().for_each(|v| prune(s, v));
            }
        }
        _ => {}
    }
}

fn is_root_meta(k: &str) -> bool {
    matches!(k, "apiVersion" | "kind" | "metadata")
}

/// Structural and CEL validation; empty when the object is valid.
pub(crate) fn validate(schema: &Value, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = vec![];
    structural(schema, obj, "", &mut causes);
    // Ratcheting (GA since 1.33): on update, a value left as it was is not re-validated, so a
    // status write is not refused for a spec the schema would refuse today.
    if let Some(old) = old {
        causes.retain(|c| changed(obj, old, &c.field));
    }
    if !has_rules(schema) {
        return causes;
    }
    // As the API server: type, enum, required, length and count violations block the CEL rules
    // (and it says so); bounds and patterns do not.
    let blocking = [
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    ];
    if causes.iter().any(|c| blocking.contains(&c.reason)) {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: "<nil>".into(),
            message: "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
        });
    } else if let Err(errors) = kube_cel::Validator::new().validate(schema, obj, old) {
        for e in errors.into_vec() {
            let field = e.field_path.trim_start_matches('.').to_string();
            let field = if field.is_empty() { "<nil>".to_string() } else { field };
            if old.is_none_or(|old| changed(obj, old, &field)) {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field,
                    message: format!("Invalid value: {}", e.message),
                });
            }
        }
    }
    causes
}

/// Whether the value at a cause's field path (`spec.ports[0].port`) differs between versions.
fn changed(new: &Value, old: &Value, field: &str) -> bool {
    if field.is_empty() || field == "<nil>" {
        return new != old;
    }
    let pointer: String = field
        .split('.')
        .flat_map(|part| {
            let mut segments = vec![];
            let mut rest = part;
            if let Some(i) = rest.find('[') {
                segments.push(rest[..i].to_string());
                rest = &rest[i..];
                while let Some(end) = rest.find(']') {
                    segments.push(rest[1..end].to_string());
                    rest = &rest[end + 1..];
                }
            } else {
                segments.push(rest.to_string());
            }
            segments
        })
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect();
    new.pointer(&pointer) != old.pointer(&pointer)
}

fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m.contains_key("x-kubernetes-validations") || m.values().any(has_rules),
        Value::Array(a) => a.iter().any(has_rules),
        _ => false,
    }
}

/// A bound as the API server prints it (`10`, not `10.0`).
fn bound(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{}", x as i64),
        _ => v.to_string(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match (want, v) {
        ("number", Value::Number(_)) => true,
        (w, v) => w == type_name(v),
    }
}

fn structural(schema: &Value, v: &Value, path: &str, out: &mut Vec<Cause>) {
    let Some(s) = schema.as_object() else { return };
    if v.is_null() && s.get("nullable") == Some(&json!(true)) {
        return;
    }
    if let Some(want) = s.get("type").and_then(Value::as_str)
        && !(s.get("x-kubernetes-int-or-string") == Some(&json!(true)) && (v.is_string() || v.is_i64()))
        && !type_matches(want, v)
    {
        let got = type_name(v);
        out.push(Cause {
            reason: "FieldValueTypeInvalid",
            field: path.into(),
            message: format!("Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""),
        });
        return;
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(Cause {
            reason: "FieldValueNotSupported",
            field: path.into(),
            message: format!("Unsupported value: {v}: supported values: {}", list.join(", ")),
        });
    }
    match v {
        Value::String(text) => {
            let chars = text.chars().count() as u64;
            if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                out.push(Cause {
                    reason: "FieldValueTooLong",
                    field: path.into(),
                    message: format!("Too long: may not be more than {max} bytes"),
                });
            }
            if let Some(min) = s.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                out.push(Cause {
                    reason: "FieldValueInvalid",
                    field: path.into(),
                    message: format!("Invalid value: {v}: {path} in body should be at least {min} chars long"),
                });
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_default();
            if let Some(max) = s.get("maximum").and_then(Value::as_f64)
                && x > max
            {
                out.push(Cause {
                    reason: "FieldValueInvalid",
                    field: path.into(),
                    message: format!(
                        "Invalid value: {n}: {path} in body should be less than or equal to {}",
                        bound(&s["maximum"])
                    ),
                });
            }
            if let Some(min) = s.get("minimum").and_then(Value::as_f64)
                && x < min
            {
                out.push(Cause {
                    reason: "FieldValueInvalid",
                    field: path.into(),
                    message: format!(
                        "Invalid value: {n}: {path} in body should be greater than or equal to {}",
                        bound(&s["minimum"])
                    ),
                });
            }
        }
        Value::Array(items) => {
            if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                out.push(Cause {
                    reason: "FieldValueTooMany",
                    field: path.into(),
                    message: format!("Too many: {}: must have at most {max} items", items.len()),
                });
            }
            if let Some(item) = s.get("items") {
                for (i, x) in items.iter().enumerate() {
                    structural(item, x, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(map) => object(s, map, path, out),
        _ => {}
    }
}

fn object(s: &Map<String, Value>, map: &Map<String, Value>, path: &str, out: &mut Vec<Cause>) {
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                out.push(Cause {
                    reason: "FieldValueRequired",
                    field: join(path, r),
                    message: "Required value".into(),
                });
            }
        }
    }
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        out.push(Cause {
            reason: "FieldValueTooMany",
            field: path.into(),
            message: format!("Too many: {}: must have at most {max} items", map.len()),
        });
    }
    let props = s.get("properties").and_then(Value::as_object);
    let extra = s.get("additionalProperties").filter(|a| a.is_object());
    for (k, x) in map {
        if path.is_empty() && is_root_meta(k) {
            continue;
        }
        let child = join(path, k);
        match (props.and_then(|p| p.get(k)), extra) {
            (Some(cs), _) => structural(cs, x, &child, out),
            (None, Some(cs)) => structural(cs, x, &child, out),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [{"rule": "self.replicas <= 5 || self.size == 'large'", "message": "too many"}],
            "properties": {
                "size": {"type": "string", "enum": ["small", "large"]},
                "label": {"type": "string", "maxLength": 3, "default": "x"},
                "replicas": {"type": "integer", "maximum": 10, "default": 1},
                "ports": {"type": "array", "maxItems": 1, "items": {"type": "integer"}}
            }
        }}})
    }

    fn fields(causes: &[Cause]) -> Vec<(&str, &str)> {
        causes.iter().map(|c| (c.reason, c.field.as_str())).collect()
    }

    #[test]
    fn defaults_fill_missing_fields_and_unknown_fields_are_pruned() {
        let mut obj = json!({"apiVersion": "a/v1", "kind": "W", "metadata": {"name": "w"}, "spec": {"size": "small", "extra": 1}});
        default(&schema(), &mut obj);
        prune(&schema(), &mut obj);
        assert_eq!(obj["spec"], json!({"size": "small", "label": "x", "replicas": 1}));
        assert_eq!(obj["metadata"]["name"], "w");
    }

    #[test]
    fn schema_violations_are_reported_with_the_api_servers_reasons_and_skip_cel() {
        let obj = json!({"spec": {"label": "long", "replicas": 11, "ports": [1, 2], "size": "huge"}});
        let causes = validate(&schema(), &obj, None);
        assert_eq!(causes.len(), 5, "{:?}", fields(&causes));
        assert!(causes.iter().any(|c| c.field == "spec.size" && c.reason == "FieldValueNotSupported"));
        assert!(
            causes.iter().any(|c| c.field == "spec.label" && c.message == "Too long: may not be more than 3 bytes")
        );
        assert!(causes.iter().any(|c| c.field == "spec.ports" && c.reason == "FieldValueTooMany"));
        assert!(causes.iter().any(|c| c.message.ends_with("should be less than or equal to 10")));
        assert_eq!(causes.last().map(|c| c.field.as_str()), Some("<nil>"));
        assert_eq!(
            fields(&validate(&schema(), &json!({"spec": {}}), None)),
            vec![("FieldValueRequired", "spec.size"), ("FieldValueInvalid", "<nil>")]
        );
    }

    #[test]
    fn unchanged_invalid_values_are_ratcheted_on_update() {
        let stored = json!({"spec": {"size": "huge", "label": "toolong"}, "status": {}});
        let mut status_write = stored.clone();
        status_write["status"] = json!({"ready": true});
        assert!(validate(&schema(), &status_write, Some(&stored)).is_empty());
        let mut spec_write = stored.clone();
        spec_write["spec"]["label"] = json!("stilltoolong");
        assert_eq!(
            fields(&validate(&schema(), &spec_write, Some(&stored))),
            vec![("FieldValueTooLong", "spec.label"), ("FieldValueInvalid", "<nil>")]
        );
    }

    #[test]
    fn bound_violations_do_not_block_cel_rules() {
        let causes = validate(&schema(), &json!({"spec": {"size": "small", "replicas": 11}}), None);
        assert_eq!(fields(&causes), vec![("FieldValueInvalid", "spec.replicas"), ("FieldValueInvalid", "spec")]);
    }

    #[test]
    fn cel_rules_run_on_schema_valid_objects() {
        let bad = json!({"spec": {"size": "small", "replicas": 6}});
        let causes = validate(&schema(), &bad, None);
        assert_eq!(fields(&causes), vec![("FieldValueInvalid", "spec")]);
        assert_eq!(causes[0].message, "Invalid value: too many");
        assert!(validate(&schema(), &json!({"spec": {"size": "large", "replicas": 6}}), None).is_empty());
    }
}
