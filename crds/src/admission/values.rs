//! The OpenAPI checks of a value against its schema node (types, bounds, lengths, patterns,
//! enums, formats, required fields, list sets and maps), with the field paths and wording of
//! `k8s.io/kube-openapi`'s validator as the API server reports them.

use super::error::{BadValue, ErrorType, FieldError, go_float};
use super::schema::Node;
use serde_json::{Map, Value};

/// The JSON type name of a value, as kube-openapi infers it from the decoded Go value.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The Go format kube-openapi infers from a decoded value (`schemaInfoForType`).
fn json_format(value: &Value) -> &'static str {
    match value {
        Value::Number(n) if n.is_i64() => "int64",
        Value::Number(_) => "double",
        _ => "",
    }
}

fn as_f64(value: &Value) -> f64 {
    value.as_f64().unwrap_or_default()
}

/// The OpenAPI checks of one value and its children (`SchemaValidator.Validate`), appending the
/// API server's field errors to `errs`. `path` is kube-openapi's (`spec.a[0].b`, map keys as
/// `.key`), which the API server also uses as the field path of these errors.
pub(super) fn check(value: &Value, node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    let field = path.to_string();
    let invalid = |bad: BadValue, detail: String| FieldError {
        kind: ErrorType::Invalid,
        field: field.clone(),
        bad_value: bad,
        detail,
    };
    if value.is_null() {
        check_type(value, node, path, errs);
        check_enum(value, node, path, errs);
        return;
    }
    check_type(value, node, path, errs);
    if let Value::String(s) = value {
        let chars = s.chars().count() as i64;
        if let Some(max) = node.max_length.filter(|&m| chars > m) {
            let _ = max;
            errs.push(FieldError {
                kind: ErrorType::TooLong,
                field: field.clone(),
                bad_value: BadValue::Omitted,
                detail: too_long(node.max_length.unwrap_or_default()),
            });
        } else if let Some(min) = node.min_length.filter(|&m| chars < m) {
            errs.push(invalid(
                BadValue::String(s.clone()),
                format!("{path} in body should be at least {min} chars long"),
            ));
        } else if let Some((pattern, re)) = &node.pattern
            && !re.is_match(s)
        {
            errs.push(invalid(
                BadValue::String(s.clone()),
                format!("{path} in body should match '{pattern}'"),
            ));
        }
        if !node.format.is_empty() && !format_ok(&node.format, s) {
            errs.push(FieldError {
                kind: ErrorType::TypeInvalid,
                field: field.clone(),
                bad_value: BadValue::String(s.clone()),
                detail: format!(
                    "{path} in body must be of type {}: {}",
                    node.format,
                    super::url::go_quote(s)
                ),
            });
        }
    }
    if let Value::Number(n) = value {
        check_number(value, n, node, path, errs);
    }
    if let Value::Array(items) = value {
        if let Some(item) = &node.items {
            for (i, v) in items.iter().enumerate() {
                check(v, item, &format!("{path}[{i}]"), errs);
            }
        }
        let size = items.len() as i64;
        if let Some(min) = node.min_items.filter(|&m| size < m) {
            errs.push(invalid(
                BadValue::Int(size),
                format!("{path} in body should have at least {min} items"),
            ));
        }
        if let Some(max) = node.max_items.filter(|&m| size > m) {
            errs.push(FieldError {
                kind: ErrorType::TooMany,
                field: field.clone(),
                bad_value: BadValue::Int(size),
                detail: format!("must have at most {max} {}", if max == 1 { "item" } else { "items" }),
            });
        }
    }
    check_enum(value, node, path, errs);
    if let Value::Object(map) = value {
        check_object(map, node, path, errs);
    }
}

fn too_long(max: i64) -> String {
    format!("may not be more than {max} {}", if max == 1 { "byte" } else { "bytes" })
}

fn check_type(value: &Value, node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if node.types.is_empty() && node.format.is_empty() {
        return;
    }
    let type_error = |expected: &str, got: &str| FieldError {
        kind: ErrorType::TypeInvalid,
        field: path.to_string(),
        bad_value: BadValue::String(got.to_string()),
        detail: format!("{path} in body must be of type {expected}: {}", super::url::go_quote(got)),
    };
    if value.is_null() {
        if !node.types.is_empty() && !node.types.iter().any(|t| t == "null") && !node.nullable {
            errs.push(type_error(&node.types.join(","), "null"));
        }
        return;
    }
    let has = |t: &str| node.types.iter().any(|x| x == t);
    let sch_type = json_type(value);
    let format = json_format(value);
    let is_float_int = sch_type == "number" && as_f64(value).fract() == 0.0 && has("integer");
    let is_int_float = sch_type == "integer" && has("number");
    let is_string_or_slice = matches!(value, Value::String(_) | Value::Array(_));
    let matches_type = has(sch_type) || is_float_int || is_int_float;
    if !is_string_or_slice && !node.format.is_empty() && !matches_type && format != node.format {
        errs.push(type_error(&node.format, format));
        return;
    }
    let numeric = has("number") || has("integer");
    if !numeric && !node.format.is_empty() && is_string_or_slice {
        return;
    }
    if !matches_type {
        errs.push(type_error(&node.types.join(","), sch_type));
    }
}

fn check_number(value: &Value, n: &serde_json::Number, node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    let bad = match n.as_i64() {
        Some(i) => BadValue::Int(i),
        None => BadValue::Float(as_f64(value)),
    };
    let data = as_f64(value);
    // `IsValueValidAgainstRange`: the value must fit the declared integer type and format; Go
    // reports this one without a field path.
    if node.single_type() == "integer" {
        let text = match n.as_i64() {
            Some(i) => i.to_string(),
            None => format!("{}", data),
        };
        let fits = match node.format.as_str() {
            "int32" => text.parse::<i32>().is_ok(),
            _ => text.parse::<i64>().is_ok(),
        };
        if !fits {
            let detail = if node.format.is_empty() {
                format!("Checked value must be of type integer (default format) in {path}")
            } else {
                format!("Checked value must be of type integer with format {} in {path}", node.format)
            };
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: "<nil>".into(),
                bad_value: BadValue::String(String::new()),
                detail,
            });
        }
    }
    // `*NativeType`: an integer is compared with the bound truncated to an integer, and the
    // bound printed as one, when the bound is itself a valid integer; otherwise as floats.
    let bound = |b: f64| -> (f64, String) {
        match n.as_i64() {
            Some(_) if b.fract() == 0.0 && b.abs() < 9.2e18 => (b, format!("{}", b as i64)),
            _ => (b, go_float(b)),
        }
    };
    if let Some(m) = node.multiple_of
        && m > 0.0
        && (data / m).fract() != 0.0
    {
        errs.push(FieldError {
            kind: ErrorType::Invalid,
            field: path.to_string(),
            bad_value: bad.clone(),
            detail: format!("{path} in body should be a multiple of {}", bound(m).1),
        });
    }
    if let Some((min, shown)) = node.minimum.map(bound) {
        let fails = if node.exclusive_minimum { data <= min } else { data < min };
        if fails {
            let op = if node.exclusive_minimum { "greater than" } else { "greater than or equal to" };
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: path.to_string(),
                bad_value: bad.clone(),
                detail: format!("{path} in body should be {op} {shown}"),
            });
        }
    }
    if let Some((max, shown)) = node.maximum.map(bound) {
        let fails = if node.exclusive_maximum { data >= max } else { data > max };
        if fails {
            let op = if node.exclusive_maximum { "less than" } else { "less than or equal to" };
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: path.to_string(),
                bad_value: bad,
                detail: format!("{path} in body should be {op} {shown}"),
            });
        }
    }
}

fn check_enum(value: &Value, node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if node.enum_values.is_empty() {
        return;
    }
    let equal = |allowed: &Value| match (allowed, value) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    };
    if node.enum_values.iter().any(equal) {
        return;
    }
    let supported: Vec<String> = node
        .enum_values
        .iter()
        .map(|v| match v {
            Value::String(s) => super::url::go_quote(s),
            other => super::url::go_quote(&other.to_string()),
        })
        .collect();
    errs.push(FieldError {
        kind: ErrorType::NotSupported,
        field: path.to_string(),
        bad_value: BadValue::from_json(value),
        detail: if supported.is_empty() {
            String::new()
        } else {
            format!("supported values: {}", supported.join(", "))
        },
    });
}

fn check_object(map: &Map<String, Value>, node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    let count = map.len() as i64;
    let child_path = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    if let Some(min) = node.min_properties.filter(|&m| count < m) {
        errs.push(FieldError {
            kind: ErrorType::Invalid,
            field: path.to_string(),
            bad_value: BadValue::Int(count),
            detail: format!("{path} in body should have at least {min} properties"),
        });
    }
    if let Some(max) = node.max_properties.filter(|&m| count > m) {
        errs.push(FieldError {
            kind: ErrorType::TooMany,
            field: path.to_string(),
            bad_value: BadValue::Int(count),
            detail: format!("must have at most {max} {}", if max == 1 { "item" } else { "items" }),
        });
    }
    for (k, v) in map {
        if node.properties.contains_key(k) {
            continue;
        }
        if let Some(extra) = &node.additional {
            check(v, extra, &format!("{path}.{k}"), errs);
        }
    }
    for (k, prop) in &node.properties {
        if let Some(v) = map.get(k) {
            check(v, prop, &child_path(k), errs);
        }
    }
    for k in &node.required {
        if !map.contains_key(k) {
            errs.push(FieldError {
                kind: ErrorType::Required,
                field: format!("{path}.{k}").trim_start_matches('.').to_string(),
                bad_value: BadValue::String(String::new()),
                detail: String::new(),
            });
        }
    }
}

/// Whether `s` has the string format `format` (the formats of kube-openapi's registry that can
/// be told apart cheaply; the others are accepted as written).
fn format_ok(format: &str, s: &str) -> bool {
    use std::sync::OnceLock;
    static DATE_TIME: OnceLock<Option<regex::Regex>> = OnceLock::new();
    static DATE: OnceLock<Option<regex::Regex>> = OnceLock::new();
    let re = |cell: &'static OnceLock<Option<regex::Regex>>, pattern: &str| {
        cell.get_or_init(|| regex::Regex::new(pattern).ok()).as_ref().is_none_or(|r| r.is_match(s))
    };
    match format.replace('-', "").as_str() {
        "datetime" => re(
            &DATE_TIME,
            r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?([Zz]|[+-][0-9]{2}:?[0-9]{2})?)?$",
        ),
        "date" => re(&DATE, r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
        "uri" => super::url::Url::parse(s).is_ok(),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::IpAddr>().is_ok(),
        _ => true,
    }
}

/// The `x-kubernetes-list-type` checks (`ValidateListSetsAndMaps`): no duplicate items in a set,
/// no duplicate keys in a map.
pub(super) fn check_lists(value: &Value, node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let Some(child) = node.properties.get(k) {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    check_lists(v, child, &p, errs);
                } else if let Some(extra) = &node.additional {
                    check_lists(v, extra, &format!("{path}[{k}]"), errs);
                }
            }
        }
        Value::Array(items) => {
            let key_of = |v: &Value| -> Value {
                match node.list_type.as_deref() {
                    Some("map") => Value::Array(
                        node.list_map_keys.iter().map(|k| v.get(k).cloned().unwrap_or(Value::Null)).collect(),
                    ),
                    _ => v.clone(),
                }
            };
            if matches!(node.list_type.as_deref(), Some("set") | Some("map")) {
                let mut seen: Vec<Value> = Vec::new();
                for (i, v) in items.iter().enumerate() {
                    let key = key_of(v);
                    if seen.contains(&key) {
                        let bad = if node.list_type.as_deref() == Some("map") {
                            let obj: Map<String, Value> = node
                                .list_map_keys
                                .iter()
                                .filter_map(|k| v.get(k).map(|x| (k.clone(), x.clone())))
                                .collect();
                            BadValue::Json(Value::Object(obj))
                        } else {
                            BadValue::from_json(v)
                        };
                        errs.push(FieldError {
                            kind: ErrorType::Duplicate,
                            field: format!("{path}[{i}]"),
                            bad_value: bad,
                            detail: String::new(),
                        });
                    } else {
                        seen.push(key);
                    }
                }
            }
            if let Some(item) = &node.items {
                for (i, v) in items.iter().enumerate() {
                    check_lists(v, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}
