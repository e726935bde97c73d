//! Conversion between the stored form of an object and the version a request uses.

use serde_json::{Map, Value};

use crate::resources::{ResourceType, View};

/// core/v1 Event field <-> events.k8s.io/v1 Event field.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reason", "reason"),
    ("type", "type"),
    ("related", "related"),
    ("reportingComponent", "reportingController"),
    ("reportingInstance", "reportingInstance"),
    ("action", "action"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// Whether a stored object must be converted before it is shown through `rt`.
pub(crate) fn needs_conversion(rt: &ResourceType, stored_api_version: &str) -> bool {
    rt.view != View::Stored || stored_api_version != rt.api_version()
}

/// The object as seen through `rt`.
pub(crate) fn to_view(rt: &ResourceType, stored: &Value) -> Value {
    match rt.view {
        View::Stored => {
            let mut v = stored.clone();
            v["apiVersion"] = Value::String(rt.api_version().to_string());
            v
        }
        View::EventsV1 => rename_fields(stored, rt.api_version().to_string(), false),
    }
}

/// The object written through `rt`, in stored form. `stored_api_version` is the storage's.
pub(crate) fn from_view(rt: &ResourceType, view: Value, stored_api_version: &str) -> Value {
    match rt.view {
        View::Stored => view,
        View::EventsV1 => rename_fields(&view, stored_api_version.to_string(), true),
    }
}

fn rename_fields(v: &Value, api_version: String, to_core: bool) -> Value {
    let Some(obj) = v.as_object() else { return v.clone() };
    let mut out = Map::new();
    for (k, val) in obj {
        let renamed = EVENT_FIELDS
            .iter()
            .find(|(core, v1)| if to_core { v1 == k } else { core == k })
            .map(|(core, v1)| if to_core { *core } else { *v1 });
        match renamed {
            Some(n) => {
                out.insert(n.to_string(), val.clone());
            }
            None => {
                out.insert(k.clone(), val.clone());
            }
        }
    }
    out.insert("apiVersion".into(), Value::String(api_version));
    Value::Object(out)
}
