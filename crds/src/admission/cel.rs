//! The CRD's `x-kubernetes-validations` rules, evaluated with a CEL interpreter at the node they
//! are attached to, `self` bound to that node's value typed by the schema (integers as `int`,
//! numbers as `double`), as the API server's CEL validator does on create (no `oldSelf`). The
//! Kubernetes CEL libraries the rules may call are registered here: URLs (`isURL`, `url()` and
//! its accessors) and quantities (`isQuantity`, `quantity()` with `compareTo`, `isGreaterThan`,
//! `isLessThan`, `sign`, `asApproximateFloat`, `isInteger`, `asInteger`).

use super::error::{BadValue, ErrorType, FieldError};
use super::quantity::Quantity;
use super::schema::Node;
use super::url::Url;
use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, Env, ExecutionError, Program};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
use serde_json::{Map, Value};
use std::sync::{Arc, OnceLock};

/// One rule, compiled.
pub(super) struct CompiledRule {
    source: String,
    message: Option<String>,
    reason: Option<String>,
    field_path: Option<String>,
    program: Program,
}

impl std::fmt::Debug for CompiledRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledRule").field("source", &self.source).finish_non_exhaustive()
    }
}

/// The shared environment: the CEL standard library and its macros.
fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib()))
}

impl CompiledRule {
    /// Compiles a rule, or says why it does not compile.
    pub fn compile(rule: &ValidationRule) -> Result<CompiledRule, String> {
        let program = env().compile(&rule.rule).map_err(|e| e.to_string())?;
        Ok(CompiledRule {
            source: rule.rule.clone(),
            message: rule.message.clone().filter(|m| !m.trim().is_empty()),
            reason: rule.reason.clone(),
            field_path: rule.field_path.clone().filter(|p| !p.is_empty()),
            program,
        })
    }

    /// `ruleErrorString`: the message, or the rule itself.
    fn error_string(&self) -> String {
        self.message.as_deref().unwrap_or(&self.source).trim().to_string()
    }

    /// `ruleMessageOrDefault`: the message, or `failed rule: <rule>`.
    fn message_or_default(&self) -> String {
        match &self.message {
            Some(m) => m.trim().to_string(),
            None => format!("failed rule: {}", self.source.trim()),
        }
    }
}

/// A URL as a CEL value (`kubernetes.URL`).
#[derive(Debug, PartialEq, Eq)]
struct UrlValue(Url);

impl Opaque for UrlValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

/// A quantity as a CEL value (`kubernetes.Quantity`).
#[derive(Debug, PartialEq, Eq)]
struct QuantityValue(Quantity);

impl Opaque for QuantityValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

fn function_error(function: &str, message: impl Into<String>) -> ExecutionError {
    ExecutionError::FunctionError { function: function.to_string(), message: message.into() }
}

fn url_of(value: &Arc<dyn Opaque>, function: &str) -> Result<Url, ExecutionError> {
    value.downcast_ref::<UrlValue>().map(|u| u.0.clone()).ok_or_else(|| {
        ExecutionError::no_such_member_overload(function, vec![value.runtime_type_name().into()])
    })
}

/// A string result as a CEL value.
fn text(result: Result<String, ExecutionError>) -> Result<cel::Value, ExecutionError> {
    result.map(|s| cel::Value::String(Arc::new(s)))
}

fn quantity_of(value: &Arc<dyn Opaque>, function: &str) -> Result<Quantity, ExecutionError> {
    value.downcast_ref::<QuantityValue>().map(|q| q.0.clone()).ok_or_else(|| {
        ExecutionError::no_such_member_overload(function, vec![value.runtime_type_name().into()])
    })
}

/// Registers the Kubernetes URL and quantity libraries on a context.
fn register_kubernetes_library(ctx: &mut Context<'_, '_>) -> Result<(), cel::DeclarationError> {
    ctx.add_function("isURL", |s: Arc<String>| Url::parse(&s).is_ok())?;
    ctx.add_function("url", |s: Arc<String>| -> Result<Arc<dyn Opaque>, ExecutionError> {
        let url = Url::parse(&s).map_err(|e| {
            function_error(
                "url",
                format!(
                    "URL parse error during conversion from string: parse {}: {e}",
                    super::url::go_quote(&s)
                ),
            )
        })?;
        Ok(Arc::new(UrlValue(url)))
    })?;
    ctx.add_function("getScheme", |This(u): This<Arc<dyn Opaque>>| {
        text(url_of(&u, "getScheme").map(|u| u.scheme().to_string()))
    })?;
    ctx.add_function("getHost", |This(u): This<Arc<dyn Opaque>>| {
        text(url_of(&u, "getHost").map(|u| u.host().to_string()))
    })?;
    ctx.add_function("getHostname", |This(u): This<Arc<dyn Opaque>>| {
        text(url_of(&u, "getHostname").map(|u| u.hostname().to_string()))
    })?;
    ctx.add_function("getPort", |This(u): This<Arc<dyn Opaque>>| {
        text(url_of(&u, "getPort").map(|u| u.port().to_string()))
    })?;
    ctx.add_function("getEscapedPath", |This(u): This<Arc<dyn Opaque>>| {
        text(url_of(&u, "getEscapedPath").map(|u| u.escaped_path()))
    })?;
    ctx.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok())?;
    ctx.add_function("quantity", |s: Arc<String>| -> Result<Arc<dyn Opaque>, ExecutionError> {
        let q = Quantity::parse(&s).map_err(|e| function_error("quantity", e.to_string()))?;
        Ok(Arc::new(QuantityValue(q)))
    })?;
    ctx.add_function("compareTo", |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| {
        Ok::<i64, ExecutionError>(quantity_of(&a, "compareTo")?.cmp(&quantity_of(&b, "compareTo")?) as i64)
    })?;
    ctx.add_function("isGreaterThan", |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| {
        Ok::<bool, ExecutionError>(quantity_of(&a, "isGreaterThan")? > quantity_of(&b, "isGreaterThan")?)
    })?;
    ctx.add_function("isLessThan", |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| {
        Ok::<bool, ExecutionError>(quantity_of(&a, "isLessThan")? < quantity_of(&b, "isLessThan")?)
    })?;
    ctx.add_function("sign", |This(a): This<Arc<dyn Opaque>>| quantity_of(&a, "sign").map(|q| q.sign()))?;
    ctx.add_function("asApproximateFloat", |This(a): This<Arc<dyn Opaque>>| {
        quantity_of(&a, "asApproximateFloat").map(|q| q.as_approximate_float())
    })?;
    ctx.add_function("isInteger", |This(a): This<Arc<dyn Opaque>>| {
        quantity_of(&a, "isInteger").map(|q| q.as_integer().is_some())
    })?;
    ctx.add_function("asInteger", |This(a): This<Arc<dyn Opaque>>| {
        quantity_of(&a, "asInteger")?
            .as_integer()
            .ok_or_else(|| function_error("asInteger", "cannot convert value to integer"))
    })?;
    Ok(())
}

/// The value as the API server hands it to CEL: typed by the schema, so a `number` field is a
/// `double` even when written `100`, and at the resource root `metadata` holds only `name` and
/// `generateName`.
fn typed(value: &Value, node: Option<&Node>, root: bool) -> Value {
    match value {
        Value::Number(n) => match node.map(Node::single_type) {
            Some("number") => serde_json::Number::from_f64(n.as_f64().unwrap_or_default())
                .map(Value::Number)
                .unwrap_or(Value::Null),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(
            items.iter().map(|v| typed(v, node.and_then(|n| n.items.as_deref()), false)).collect(),
        ),
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                if root && k == "metadata" {
                    let meta: Map<String, Value> = ["name", "generateName"]
                        .iter()
                        .filter_map(|f| v.get(*f).map(|x| (f.to_string(), x.clone())))
                        .collect();
                    out.insert(k.clone(), Value::Object(meta));
                    continue;
                }
                let child = node.and_then(|n| n.properties.get(k).or(n.additional.as_deref()));
                out.insert(k.clone(), typed(v, child, false));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Go's wording of a CEL evaluation error, as far as the two interpreters' errors correspond.
fn go_error(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::NoSuchOverload(_) => "no such overload".to_string(),
        ExecutionError::IndexOutOfBounds(i) => format!("index out of bounds: {i:?}"),
        ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
        ExecutionError::Overflow(..) => "integer overflow".to_string(),
        ExecutionError::FunctionError { function, .. } if function == "duration" => {
            "type conversion error from 'string' to 'google.protobuf.Duration'".to_string()
        }
        ExecutionError::FunctionError { function, .. } if function == "timestamp" => {
            "type conversion error from 'string' to 'google.protobuf.Timestamp'".to_string()
        }
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Evaluates the rules of `node` on `value` and of every node below it (`Validator.validate`),
/// appending the API server's field errors. `path` is a field path (`spec.a[0]`, map keys as
/// `[key]`).
pub(super) fn check(value: &Value, node: &Node, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    if value.is_null() {
        return;
    }
    if !node.rules.is_empty() {
        // The API server validates from a nil field path: errors at the root read `<nil>`.
        let here = if path.is_empty() { "<nil>" } else { path };
        let this = typed(value, Some(node), root);
        let node_type = if root { "object" } else { node.single_type() };
        let shown = match node_type {
            "object" | "array" => BadValue::Omitted,
            _ => BadValue::from_json(value),
        };
        let invalid = |field: String, bad: BadValue, detail: String| FieldError {
            kind: ErrorType::Invalid,
            field,
            bad_value: bad,
            detail,
        };
        for rule in &node.rules {
            let mut ctx = Context::with_env(Arc::clone(env()));
            let outcome = register_kubernetes_library(&mut ctx)
                .map_err(|e| e.to_string())
                .and_then(|()| cel::to_value(&this).map_err(|e| e.to_string()))
                .and_then(|v| ctx.add_variable("self", v).map_err(|e| e.to_string()))
                .map(|()| rule.program.execute(&ctx));
            match outcome {
                Err(setup) => errs.push(invalid(
                    here.to_string(),
                    BadValue::String(node_type.to_string()),
                    format!("rule compiler initialization error: {setup}"),
                )),
                Ok(Ok(cel::Value::Bool(true))) => {}
                Ok(Ok(_)) => {
                    let field = match &rule.field_path {
                        Some(p) => format!("{path}{p}"),
                        None => here.to_string(),
                    };
                    let detail = rule.message_or_default();
                    errs.push(match rule.reason.as_deref() {
                        Some("FieldValueForbidden") => FieldError {
                            kind: ErrorType::Forbidden,
                            field,
                            bad_value: BadValue::String(String::new()),
                            detail,
                        },
                        Some("FieldValueRequired") => FieldError {
                            kind: ErrorType::Required,
                            field,
                            bad_value: BadValue::String(String::new()),
                            detail,
                        },
                        Some("FieldValueDuplicate") => FieldError {
                            kind: ErrorType::Duplicate,
                            field,
                            bad_value: shown.clone(),
                            detail: String::new(),
                        },
                        _ => invalid(field, shown.clone(), detail),
                    });
                }
                Ok(Err(e)) => {
                    let go = go_error(&e);
                    let detail = if go.starts_with("no such overload") {
                        format!(
                            "'{go}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                            rule.error_string()
                        )
                    } else {
                        format!("{go} evaluating rule: {}", rule.error_string())
                    };
                    errs.push(invalid(here.to_string(), BadValue::String(node_type.to_string()), detail));
                }
            }
        }
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let Some(child) = node.properties.get(k) {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    check(v, child, &p, false, errs);
                } else if let Some(extra) = &node.additional {
                    check(v, extra, &format!("{path}[{k}]"), false, errs);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = &node.items {
                for (i, v) in items.iter().enumerate() {
                    check(v, item, &format!("{path}[{i}]"), false, errs);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(source: &str, this: Value) -> Result<cel::Value, ExecutionError> {
        let program = env().compile(source).expect("compiles");
        let mut ctx = Context::with_env(Arc::clone(env()));
        register_kubernetes_library(&mut ctx).expect("library");
        ctx.add_variable("self", cel::to_value(&this).expect("value")).expect("self");
        program.execute(&ctx)
    }

    fn truth(source: &str, this: Value) -> bool {
        match eval(source, this) {
            Ok(cel::Value::Bool(b)) => b,
            other => panic!("{source}: {other:?}"),
        }
    }

    #[test]
    fn url_functions() {
        let s = Value::from("https://models.example.com:8443/a%20b/m.gguf?x=1");
        assert!(truth("isURL(self)", s.clone()));
        assert!(!truth("isURL('models.example.com/m.gguf')", Value::Null));
        assert!(truth("url(self).getScheme() == 'https'", s.clone()));
        assert!(truth("url(self).getHost() == 'models.example.com:8443'", s.clone()));
        assert!(truth("url(self).getHostname() == 'models.example.com'", s.clone()));
        assert!(truth("url(self).getPort() == '8443'", s.clone()));
        assert!(truth("url(self).getEscapedPath() == '/a%20b/m.gguf'", s));
        assert!(truth("isURL('https:///x') && url('https:///x').getHostname() == ''", Value::Null));
        assert!(eval("url('not a url')", Value::Null).is_err());
    }

    #[test]
    fn quantity_functions() {
        assert!(truth("isQuantity('500m') && !isQuantity('5 00m')", Value::Null));
        assert!(truth("quantity('1Gi').compareTo(quantity('1024Mi')) == 0", Value::Null));
        assert!(truth("quantity('2').isGreaterThan(quantity('1500m'))", Value::Null));
        assert!(truth("quantity('1k').isLessThan(quantity('1Ki'))", Value::Null));
        assert!(truth("quantity('-1').sign() == -1 && quantity('0').sign() == 0", Value::Null));
        assert!(truth("quantity('250m').asApproximateFloat() == 0.25", Value::Null));
        assert!(truth("quantity('2k').isInteger() && quantity('2k').asInteger() == 2000", Value::Null));
        assert!(truth("!quantity('1500m').isInteger()", Value::Null));
        assert!(eval("quantity('x')", Value::Null).is_err());
        let resources =
            serde_json::json!({"requests": {"cpu": "2", "nvidia.com/gpu": 1}, "limits": {"cpu": "4"}});
        assert!(truth(
            "self.requests.all(k, !(k in self.limits) || quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
            resources
        ));
    }

    #[test]
    fn standard_functions_and_macros() {
        let obj = serde_json::json!({"l": ["a", "b"], "m": {"k": "v"}, "s": "90s", "n": 3});
        for rule in [
            "self.s.matches('^[0-9]+s$') && !self.s.matches('\\\\s')",
            "self.s.startsWith('9') && self.s.contains('0s') && size(self.s) == 3",
            "has(self.l) && !has(self.z)",
            "self.l.all(x, size(x) == 1) && self.l.exists(x, x == 'b') && self.l.filter(x, x == 'a').size() == 1",
            "self.m.all(k, self.m[k] == 'v') && 'k' in self.m && 'a' in self.l",
            "duration(self.s) >= duration('30s') && duration(self.s) <= duration('24h')",
            "[has(self.l), has(self.m), has(self.q)].filter(x, x).size() == 2",
        ] {
            assert!(truth(rule, obj.clone()), "{rule}");
        }
        assert!(matches!(eval("self.missing > 1", obj), Err(ExecutionError::NoSuchKey(_))));
    }

    #[test]
    fn numbers_are_typed_by_the_schema() {
        let props: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps =
            serde_json::from_value(serde_json::json!({
                "type": "object",
                "properties": {"p": {"type": "number"}, "i": {"type": "integer"}},
            }))
            .expect("schema");
        let node = Node::build(&props, "").expect("node");
        let v = typed(&serde_json::json!({"p": 100, "i": 3}), Some(&node), false);
        assert!(v["p"].is_f64() && v["i"].is_i64());
        assert!(truth("self.p >= 50.0 && self.i == 3", v));
    }
}
