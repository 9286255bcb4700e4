//! The CRD's structural schema as a tree, and the steps the API server takes with it on create
//! before it validates: pruning unknown fields and non-nullable nulls, and filling defaults.
//! The OpenAPI checks of the result are in `values.rs`.

use super::cel::CompiledRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;
use std::collections::BTreeMap;

/// One node of the schema, with its CEL rules compiled.
#[derive(Debug)]
pub(super) struct Node {
    pub types: Vec<String>,
    pub format: String,
    pub nullable: bool,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub properties: BTreeMap<String, Node>,
    pub additional: Option<Box<Node>>,
    pub items: Option<Box<Node>>,
    pub required: Vec<String>,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub multiple_of: Option<f64>,
    pub min_length: Option<i64>,
    pub max_length: Option<i64>,
    pub min_items: Option<i64>,
    pub max_items: Option<i64>,
    pub min_properties: Option<i64>,
    pub max_properties: Option<i64>,
    pub pattern: Option<(String, regex::Regex)>,
    pub enum_values: Vec<Value>,
    pub default: Option<Value>,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub rules: Vec<CompiledRule>,
}

/// A schema this validator cannot use.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A `pattern` that does not compile.
    #[error("{path}: pattern {pattern:?}: {source}")]
    Pattern {
        /// Where in the schema.
        path: String,
        /// The pattern.
        pattern: String,
        /// Why it does not compile.
        #[source]
        source: regex::Error,
    },
    /// An `x-kubernetes-validations` rule that does not compile.
    #[error("{path}: rule {rule:?}: {message}")]
    Rule {
        /// Where in the schema.
        path: String,
        /// The rule.
        rule: String,
        /// Why it does not compile.
        message: String,
    },
}

impl Node {
    /// Builds the tree from a CRD version's `openAPIV3Schema`.
    pub fn build(props: &JSONSchemaProps, path: &str) -> Result<Node, SchemaError> {
        let child = |p: &JSONSchemaProps, name: &str| Node::build(p, &format!("{path}.{name}"));
        let properties = props
            .properties
            .iter()
            .flatten()
            .map(|(k, p)| Ok((k.clone(), child(p, k)?)))
            .collect::<Result<_, SchemaError>>()?;
        let additional = match &props.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(p)) => Some(Box::new(child(p, "*")?)),
            _ => None,
        };
        let items = match &props.items {
            Some(JSONSchemaPropsOrArray::Schema(p)) => Some(Box::new(child(p, "[*]")?)),
            _ => None,
        };
        let pattern = match &props.pattern {
            Some(p) => Some((
                p.clone(),
                regex::Regex::new(p).map_err(|source| SchemaError::Pattern {
                    path: path.to_string(),
                    pattern: p.clone(),
                    source,
                })?,
            )),
            None => None,
        };
        let int_or_string = props.x_kubernetes_int_or_string == Some(true);
        let mut types: Vec<String> = props.type_.iter().cloned().collect();
        if int_or_string {
            types = vec!["integer".into(), "string".into()];
        }
        let rules = props
            .x_kubernetes_validations
            .iter()
            .flatten()
            .map(|r| {
                CompiledRule::compile(r).map_err(|message| SchemaError::Rule {
                    path: path.to_string(),
                    rule: r.rule.clone(),
                    message,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Node {
            format: supported_format(&types, props.format.as_deref().unwrap_or_default()),
            types,
            nullable: props.nullable == Some(true),
            preserve_unknown: props.x_kubernetes_preserve_unknown_fields == Some(true),
            embedded: props.x_kubernetes_embedded_resource == Some(true),
            properties,
            additional,
            items,
            required: props.required.clone().unwrap_or_default(),
            minimum: props.minimum,
            exclusive_minimum: props.exclusive_minimum == Some(true),
            maximum: props.maximum,
            exclusive_maximum: props.exclusive_maximum == Some(true),
            multiple_of: props.multiple_of,
            min_length: props.min_length,
            max_length: props.max_length,
            min_items: props.min_items,
            max_items: props.max_items,
            min_properties: props.min_properties,
            max_properties: props.max_properties,
            pattern,
            enum_values: props.enum_.iter().flatten().map(|j| j.0.clone()).collect(),
            default: props.default.as_ref().map(|j| j.0.clone()),
            list_type: props.x_kubernetes_list_type.clone(),
            list_map_keys: props.x_kubernetes_list_map_keys.clone().unwrap_or_default(),
            rules,
        })
    }

    /// The one type, when there is exactly one (`Structural.Type`).
    pub fn single_type(&self) -> &str {
        if self.types.len() == 1 { &self.types[0] } else { "" }
    }

    /// The schema of the field `name` of an object.
    pub(super) fn field(&self, name: &str) -> Option<&Node> {
        self.properties.get(name).or(self.additional.as_deref())
    }
}

/// The formats the API server keeps (`StripUnsupportedFormatsPostProcessor`); others are dropped.
fn supported_format(types: &[String], format: &str) -> String {
    let single = if types.len() == 1 { types[0].as_str() } else { "" };
    let keep = match single {
        "" | "string" => matches!(
            format.replace('-', "").as_str(),
            "bsonobjectid"
                | "uri"
                | "email"
                | "hostname"
                | "ipv4"
                | "ipv6"
                | "cidr"
                | "mac"
                | "uuid"
                | "uuid3"
                | "uuid4"
                | "uuid5"
                | "isbn"
                | "isbn10"
                | "isbn13"
                | "creditcard"
                | "ssn"
                | "hexcolor"
                | "rgbcolor"
                | "byte"
                | "password"
                | "date"
                | "duration"
                | "datetime"
        ),
        "integer" => matches!(format, "int32" | "int64"),
        "number" => matches!(format, "float" | "double"),
        _ => false,
    };
    if keep { format.to_string() } else { String::new() }
}

/// Drops fields the schema does not know (`structuralpruning.Prune`), recording their paths as
/// the API server's warnings word them. At the root, `apiVersion`, `kind` and `metadata` stay.
pub(super) fn prune(value: &mut Value, node: &Node, path: &str, root: bool, unknown: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if node.preserve_unknown && node.properties.is_empty() && node.additional.is_none() {
                return;
            }
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if node.embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child_path = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match node.field(&k) {
                    Some(child) => {
                        if let Some(v) = map.get_mut(&k) {
                            prune(v, child, &child_path, false, unknown);
                        }
                    }
                    None if node.preserve_unknown => {}
                    None => {
                        map.remove(&k);
                        unknown.push(child_path);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = &node.items {
                for (i, v) in items.iter_mut().enumerate() {
                    prune(v, item, &format!("{path}[{i}]"), false, unknown);
                }
            }
        }
        _ => {}
    }
}

/// Removes `null` from fields that are neither nullable nor defaulted
/// (`PruneNonNullableNullsWithoutDefaults`).
pub(super) fn prune_nulls(value: &mut Value, node: Option<&Node>) {
    match value {
        Value::Object(map) => {
            map.retain(|k, v| {
                let child = node.and_then(|n| n.field(k));
                !(v.is_null() && child.is_some_and(|c| !c.nullable && c.default.is_none()))
            });
            for (k, v) in map.iter_mut() {
                prune_nulls(v, node.and_then(|n| n.field(k)));
            }
        }
        Value::Array(items) => {
            for v in items {
                prune_nulls(v, node.and_then(|n| n.items.as_deref()));
            }
        }
        _ => {}
    }
}

/// Fills schema defaults where a field is missing or a non-nullable `null`
/// (`structuraldefaulting.Default`).
pub(super) fn default(value: &mut Value, node: &Node) {
    match value {
        Value::Object(map) => {
            for (k, prop) in &node.properties {
                if let Some(d) = &prop.default {
                    let missing = map.get(k).is_none_or(|v| v.is_null() && !prop.nullable);
                    if missing {
                        map.insert(k.clone(), d.clone());
                    }
                }
            }
            for (k, v) in map.iter_mut() {
                if let Some(prop) = node.properties.get(k) {
                    default(v, prop);
                } else if let Some(extra) = &node.additional {
                    if v.is_null()
                        && !extra.nullable
                        && let Some(d) = &extra.default
                    {
                        *v = d.clone();
                    }
                    default(v, extra);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = &node.items {
                for v in items {
                    if v.is_null()
                        && !item.nullable
                        && let Some(d) = &item.default
                    {
                        *v = d.clone();
                    }
                    default(v, item);
                }
            }
        }
        _ => {}
    }
}
