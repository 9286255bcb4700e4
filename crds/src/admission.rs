//! Manifests checked with the CRD's own rules, off any cluster (local mode checks its config so): a manifest is accepted exactly when the
//! API server would accept it on create, with the schema defaults filled in as the API server
//! stores them, or refused with every violation in the API server's wording
//! (`InferenceService.serving.pacer.dev "x" is invalid: spec.sla.window: Invalid value: "10s":
//! sla.window must be between 30s and 24h`).
//!
//! Nothing here copies a rule: the source of truth is the generated CRD's `openAPIV3Schema`,
//! walked generically (types, required, bounds, lengths, patterns, enums, formats, list types,
//! defaults, pruning) with every `x-kubernetes-validations` rule evaluated by a CEL interpreter,
//! so a rule added to the CRD is enforced here without a change.
//!
//! The steps follow the API server's create path: type meta, dropping `status`, pruning unknown
//! fields and non-nullable nulls, defaulting, object-meta name checks, OpenAPI checks,
//! list-type checks, and, unless an earlier error blocks them, the CEL rules.

mod cel;
mod error;
mod quantity;
mod schema;
mod url;
mod values;

pub use self::error::{BadValue, ErrorType, FieldError, Invalid};
pub use self::quantity::{Quantity, QuantityError};
pub use self::schema::SchemaError;
pub use self::url::{Url, UrlError};

use crate::InferenceService;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use schema::Node;
use serde_json::Value;
use std::sync::OnceLock;

/// Why a manifest was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// The text is not YAML (or JSON).
    #[error("the manifest is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// The document is not a mapping.
    #[error("the manifest must be a mapping with apiVersion, kind, metadata and spec")]
    NotAnObject,
    /// The API server would refuse it; the message is the API server's.
    #[error("{0}")]
    Invalid(#[from] Invalid),
    /// The CRD's schema could not be loaded (a bug in the CRD, not in the manifest).
    #[error("the InferenceService schema cannot be used: {0}")]
    Schema(String),
    /// Valid for the schema but not decodable as an `InferenceService`.
    #[error("the manifest passes the schema but does not decode as an InferenceService: {0}")]
    Decode(#[from] serde_json::Error),
}

/// An accepted manifest.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The InferenceService with the schema defaults filled in.
    pub service: InferenceService,
    /// The API server's warnings, e.g. `unknown field "spec.foo"` for a field it would drop.
    pub warnings: Vec<String>,
}

/// A checked document: the object as the API server would store it, and its warnings.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The object after pruning and defaulting.
    pub object: Value,
    /// The API server's warnings (unknown fields dropped).
    pub warnings: Vec<String>,
}

/// The create-time checks of one custom resource version, built from its CRD.
#[derive(Debug)]
pub struct Validator {
    root: Node,
    group: String,
    version: String,
    kind: String,
}

impl Validator {
    /// Loads `version` of `crd`: its schema, with every pattern and CEL rule compiled.
    pub fn new(crd: &CustomResourceDefinition, version: &str) -> Result<Validator, SchemaError> {
        let served = crd.spec.versions.iter().find(|v| v.name == version);
        let props = served.and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.clone());
        let root = Node::build(&props.unwrap_or_default(), "")?;
        Ok(Validator {
            root,
            group: crd.spec.group.clone(),
            version: version.to_string(),
            kind: crd.spec.names.kind.clone(),
        })
    }

    /// The validator of Pacer's `InferenceService`, built once from the generated CRD.
    pub fn inference_service() -> Result<&'static Validator, ValidationError> {
        static VALIDATOR: OnceLock<Result<Validator, String>> = OnceLock::new();
        VALIDATOR
            .get_or_init(|| {
                use kube::CustomResourceExt;
                Validator::new(&InferenceService::crd(), crate::VERSION).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ValidationError::Schema(e.clone()))
    }

    /// `Kind.group`, as the API server names the resource in its errors.
    pub fn group_kind(&self) -> String {
        format!("{}.{}", self.kind, self.group)
    }

    /// Checks `doc` as the API server does on create. Returns the object as it would be stored
    /// (pruned, defaulted, without `status`), or every violation.
    pub fn check(&self, mut doc: Value) -> Result<Checked, Invalid> {
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let invalid = |causes| Invalid { group_kind: self.group_kind(), name: name.clone(), causes };
        let mut errs = self.check_type_meta(&doc);
        if !errs.is_empty() {
            return Err(invalid(errs));
        }
        if let Value::Object(map) = &mut doc {
            map.remove("status");
        }
        let mut unknown = Vec::new();
        schema::prune(&mut doc, &self.root, "", true, &mut unknown);
        schema::prune_nulls(&mut doc, Some(&self.root));
        schema::default(&mut doc, &self.root);

        errs.extend(check_name(&doc));
        values::check(&doc, &self.root, "", &mut errs);
        values::check_lists(&doc, &self.root, "", &mut errs);
        if errs.iter().any(|e| e.kind.blocks_rules()) {
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: "<nil>".into(),
                bad_value: BadValue::Json(Value::Null),
                detail: "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
            });
        } else {
            cel::check(&doc, &self.root, "", true, &mut errs);
        }
        if errs.is_empty() {
            let warnings =
                unknown.into_iter().map(|p| format!("unknown field {}", url::go_quote(&p))).collect();
            Ok(Checked { object: doc, warnings })
        } else {
            Err(invalid(errs))
        }
    }

    /// `ValidateTypeMeta`: the kind and apiVersion this validator is for.
    fn check_type_meta(&self, doc: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let text = |key: &str| doc.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        let (kind, api_version) = (text("kind"), text("apiVersion"));
        let want_version = format!("{}/{}", self.group, self.version);
        if kind != self.kind {
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: "kind".into(),
                bad_value: BadValue::String(kind),
                detail: format!("must be {}", self.kind),
            });
        }
        if api_version != want_version {
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: "apiVersion".into(),
                bad_value: BadValue::String(api_version),
                detail: format!("must be {want_version}"),
            });
        }
        errs
    }
}

/// The object-meta name checks (`ValidateObjectMetaAccessor` with `NameIsDNSSubdomain`).
fn check_name(doc: &Value) -> Vec<FieldError> {
    const SUBDOMAIN: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
    static SUBDOMAIN_RE: OnceLock<Option<regex::Regex>> = OnceLock::new();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let invalid = |detail: String| FieldError {
        kind: ErrorType::Invalid,
        field: "metadata.name".into(),
        bad_value: BadValue::String(name.to_string()),
        detail,
    };
    if name.is_empty() {
        return vec![FieldError {
            kind: ErrorType::Required,
            field: "metadata.name".into(),
            bad_value: BadValue::String(String::new()),
            detail: "name or generateName is required".into(),
        }];
    }
    let mut errs = Vec::new();
    if name.len() > 253 {
        errs.push(invalid("must be no more than 253 characters".into()));
    }
    let re = SUBDOMAIN_RE.get_or_init(|| regex::Regex::new(&format!("^{SUBDOMAIN}$")).ok());
    if re.as_ref().is_some_and(|re| !re.is_match(name)) {
        errs.push(invalid(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{SUBDOMAIN}')"
        )));
    }
    errs
}

/// Reads an InferenceService manifest (YAML or JSON) and checks it as the API server would on
/// `kubectl apply`: the typed InferenceService with defaults filled in, or every violation in the
/// API server's words.
pub fn validate(manifest: &str) -> Result<Validated, ValidationError> {
    let doc: Value = serde_yaml::from_str(manifest)?;
    validate_value(doc)
}

/// [`validate`] for a document already parsed.
pub fn validate_value(doc: Value) -> Result<Validated, ValidationError> {
    if !doc.is_object() {
        return Err(ValidationError::NotAnObject);
    }
    let checked = Validator::inference_service()?.check(doc)?;
    let service = serde_json::from_value(checked.object)?;
    Ok(Validated { service, warnings: checked.warnings })
}

#[cfg(test)]
mod tests;
