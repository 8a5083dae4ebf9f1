//! The OpenAPI document `/openapi.json` serves: what utoipa collects from the handlers (routes,
//! methods, parameters, which are required), completed here with what the handlers' attributes
//! cannot say once for all routes — every parameter's exact constraints (the SPEC §1 name
//! rules, the 1–10,000 `limit`, RFC 3339 timestamps, durations), the request bodies' shapes,
//! and the error answers every route can give, each as the `Error` schema.
//!
//! The constraints are the server's own rules written as JSON Schema, so a client (or
//! schemathesis) that follows the document is refused only for what a schema cannot express:
//! a range whose `from` is after its `to`, a time zone that does not exist, a range with too
//! many points, a dimension outside a namespace's allow-list.

use serde_json::{Map, Value, json};
use tally_core::ingest::Limits;
use tally_core::model::{
    AMOUNT_LIMIT, MAX_DIM_VALUE_BYTES, MAX_DIMS_PER_EVENT, MAX_KEY_BYTES, MAX_NAME_BYTES, MAX_TS,
    MIN_TS,
};
use tally_core::query::MAX_LIMIT;

/// `[a-z0-9][a-z0-9_.-]{0,63}` (SPEC §1).
const NAMESPACE: &str = "^[a-z0-9][a-z0-9_.-]{0,63}$";
/// No control character (Unicode category Cc), at least one character.
const NO_CONTROL: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$";
/// Unix seconds, or RFC 3339 exactly as the server reads it.
const TIMESTAMP: &str = "^(-?[0-9]{1,19}|[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2}))$";
/// `<integer><unit>`, unit one of `s m h d w`.
const DURATION: &str = "^[0-9]{1,19}[smhdw]$";
/// A tier: `<resolution>:<retention>` or `<resolution>:forever`.
const TIER: &str = "^[0-9]{1,19}[smhdw]:([0-9]{1,19}[smhdw]|forever)$";
/// A dimension name, or a compound `a+b` (a `+` in a query string may arrive as a space).
const DIMENSION: &str = "^[a-z0-9_]{1,64}([+ ][a-z0-9_]{1,64}){0,15}$";
/// The same in a JSON body, where a `+` is a `+` (found by a review: the query string's
/// pattern, space and all, was given for a schema's `dimensions`).
const DIMENSION_IN_BODY: &str = "^[a-z0-9_]{1,64}(\\+[a-z0-9_]{1,64}){0,15}$";
/// An Idempotency-Key: 1–256 visible ASCII characters, spaces and tabs inside allowed.
/// HTTP drops spaces and tabs around a header's value before the server sees it, so the
/// pattern allows them there too.
const IDEMPOTENCY_KEY: &str = "^[\\t ]*[!-~]([\\t -~]{0,254}[!-~])?[\\t ]*$";

const UNITS: [&str; 9] = [
    "second", "minute", "hour", "day", "week", "mweek", "month", "quarter", "year",
];

/// The schema of one parameter, by its name (the same name means the same rule everywhere).
fn parameter(name: &str) -> Option<Value> {
    let amount = AMOUNT_LIMIT - 1;
    Some(match name {
        "ns" => json!({"type": "string", "pattern": NAMESPACE}),
        "key" => {
            json!({"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES, "pattern": NO_CONTROL})
        }
        "from" | "to" | "ts" => json!({"type": "string", "pattern": TIMESTAMP}),
        "unit" => json!({"type": "string", "enum": UNITS}),
        "every" => json!({"type": "integer", "minimum": 1, "maximum": u32::MAX}),
        "tz" => {
            json!({"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9_+/-]+$"})
        }
        "limit" => json!({"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),
        "dim" => json!({"type": "string", "pattern": DIMENSION}),
        "value" => {
            json!({"type": "string", "minLength": 1, "maxLength": MAX_DIM_VALUE_BYTES, "pattern": NO_CONTROL})
        }
        "last" | "window" | "resolution" => json!({"type": "string", "pattern": DURATION}),
        "n" => json!({"type": "integer", "minimum": -amount, "maximum": amount}),
        "max" => json!({"type": "integer", "minimum": 0, "maximum": amount}),
        // Any text: a prefix no key has matches nothing.
        "prefix" | "after" => json!({"type": "string"}),
        "Idempotency-Key" => json!({"type": "string", "pattern": IDEMPOTENCY_KEY}),
        _ => return None,
    })
}

/// Shapes the document names under `components/schemas`.
fn schemas(limits: &Limits) -> Value {
    let amount = AMOUNT_LIMIT - 1;
    json!({
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "description": "a stable code of SPEC §3, e.g. invalid_timestamp"},
                    "message": {"type": "string"},
                    "field": {"type": "string"},
                    "index": {"type": "integer", "minimum": 0}
                }
            }}
        },
        "Event": {
            "type": "object",
            "required": ["ns", "key"],
            "additionalProperties": false,
            "properties": {
                "ns": {"type": "string", "pattern": NAMESPACE},
                "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES, "pattern": NO_CONTROL},
                "ts": {"oneOf": [
                    {"type": "integer", "minimum": MIN_TS, "maximum": MAX_TS - 1},
                    {"type": "string", "pattern": TIMESTAMP},
                    {"type": "null"}
                ], "description": "unix seconds or RFC 3339; absent or null = now"},
                "n": {"type": ["integer", "null"], "minimum": -amount, "maximum": amount,
                      "description": "absent or null = 1"},
                "dims": {
                    "type": ["object", "null"],
                    "maxProperties": MAX_DIMS_PER_EVENT,
                    "propertyNames": {"pattern": format!("^[a-z0-9_]{{1,{MAX_NAME_BYTES}}}$")},
                    "additionalProperties": {"type": "string", "minLength": 1,
                        "maxLength": MAX_DIM_VALUE_BYTES, "pattern": NO_CONTROL}
                }
            }
        },
        "Events": {
            "type": "array",
            "maxItems": limits.max_batch_events,
            "items": {"$ref": "#/components/schemas/Event"}
        },
        "QueryBatch": {
            "type": "object",
            "required": ["queries"],
            "additionalProperties": false,
            "properties": {"queries": {
                "type": "array",
                "maxItems": 1000,
                "items": {
                    "description": "{\"kind\": series|breakdown|window|dashboard|top|keys, \"ns\", \"key\" (but for top and keys), and the GET route's parameters}. Each entry is checked on its own: a bad one answers {\"error\": ...} in its place and the others still run."
                }
            }}
        },
        "Schema": {
            "type": "object",
            "required": ["tiers"],
            "additionalProperties": false,
            "properties": {
                "tiers": {"type": "array", "minItems": 1, "maxItems": tally_core::model::MAX_TIERS, "items": {"type": "string", "pattern": TIER}},
                "breakdown_tiers": {"type": ["array", "null"], "items": {"type": "string", "pattern": DURATION}},
                "dimensions": {"type": ["array", "null"], "maxItems": tally_core::model::MAX_SCHEMA_DIMENSIONS, "items": {"type": "string", "pattern": DIMENSION_IN_BODY}}
            }
        }
    })
}

/// The errors any route may answer, by status, with the codes of SPEC §3 behind each.
fn errors(path: &str, method: &str) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        ("414", "uri_too_long"),
        ("431", "headers_too_large"),
        ("503", "backend_unavailable, query_timeout"),
    ];
    if path.starts_with("/v1/") {
        out.extend([
            ("400", "malformed_body, malformed_request, missing_parameter, invalid_parameter, invalid_name, invalid_key, invalid_dimension, unknown_dimension, too_many_dimensions, invalid_timestamp, timestamp_in_future, invalid_amount, invalid_timezone, invalid_unit, invalid_range, invalid_duration, invalid_limit, invalid_schema"),
            ("401", "unauthorized"),
            ("403", "forbidden"),
            ("404", "unknown_namespace, not_found"),
            ("422", "no_tier_for_range, too_many_points, idempotency_key_reused, too_many_namespaces"),
            ("500", "corrupt_data, internal"),
        ]);
    } else {
        // A request whose head is not HTTP/1.1, whatever it was meant for.
        out.push(("400", "malformed_request"));
    }
    if path.ends_with("/incr") {
        out.push(("429", "limit_exceeded"));
    }
    if method != "get" {
        out.extend([
            ("408", "request_timeout"),
            ("409", "idempotency_in_progress"),
            ("413", "body_too_large, batch_too_large"),
        ]);
    } else if path.starts_with("/v1/") {
        // Admission reads a /v1 request's body whatever its method: a GET that sends one
        // is held to the same size and time.
        out.extend([("408", "request_timeout"), ("413", "body_too_large")]);
    }
    out
}

/// Completes the generated document: see the module's documentation.
pub(crate) fn complete(api: &utoipa::openapi::OpenApi, limits: &Limits) -> Value {
    let mut doc = serde_json::to_value(api).unwrap_or_else(|_| json!({}));
    let components = doc
        .as_object_mut()
        .map(|d| d.entry("components").or_insert_with(|| json!({})));
    if let Some(Value::Object(c)) = components {
        let slot = c.entry("schemas").or_insert_with(|| json!({}));
        if let (Value::Object(slot), Value::Object(ours)) = (slot, schemas(limits)) {
            slot.extend(ours);
        }
    }
    let Some(Value::Object(paths)) = doc.get_mut("paths") else {
        return doc;
    };
    for (path, ops) in paths.iter_mut() {
        let Value::Object(ops) = ops else { continue };
        for (method, op) in ops.iter_mut() {
            let Value::Object(op) = op else { continue };
            constrain_parameters(op);
            document_body(path, method, op);
            document_errors(path, method, op);
        }
    }
    doc
}

fn constrain_parameters(op: &mut Map<String, Value>) {
    let Some(Value::Array(params)) = op.get_mut("parameters") else {
        return;
    };
    for p in params.iter_mut() {
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        if let Some(schema) = parameter(name) {
            p["schema"] = schema;
        }
    }
}

fn document_body(path: &str, method: &str, op: &mut Map<String, Value>) {
    let body = match (method, path) {
        ("post", "/v1/events" | "/v1/ns/{ns}/rebuild") => json!({"required": true, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Events"}},
            "application/x-ndjson": {"schema": {"type": "string",
                "description": "one Event object per line; blank lines are ignored"}}
        }}),
        ("post", "/v1/query") => json!({"required": true, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/QueryBatch"}}
        }}),
        ("put", "/v1/ns/{ns}") => json!({"required": true, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Schema"}}
        }}),
        _ => return,
    };
    op.insert("requestBody".into(), body);
}

fn document_errors(path: &str, method: &str, op: &mut Map<String, Value>) {
    let responses = op
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut();
    let Some(responses) = responses else { return };
    for (status, codes) in errors(path, method) {
        let entry = responses
            .entry(status)
            .or_insert_with(|| json!({"description": codes}));
        entry["content"] =
            json!({"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}});
        if status == "503" {
            // Every backend_unavailable says when to try again (admission's and the store's).
            entry["headers"] = json!({"Retry-After": {
                "description": "seconds to wait before trying again (1); sent with backend_unavailable",
                "schema": {"type": "integer"}
            }});
        }
    }
}
