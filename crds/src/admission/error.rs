//! Field errors in the API server's words: `k8s.io/apimachinery`'s `field.Error` (type, path,
//! bad value, detail) and the `StatusError` message that aggregates them.

use super::url::go_quote;
use serde_json::Value;
use std::fmt;

/// The kind of a field error (`field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorType {
    /// `Required value`.
    Required,
    /// `Invalid value`.
    Invalid,
    /// `Invalid value`, for a value of the wrong type.
    TypeInvalid,
    /// `Unsupported value`: not one of an enum.
    NotSupported,
    /// `Duplicate value`.
    Duplicate,
    /// `Too long`.
    TooLong,
    /// `Too many`.
    TooMany,
    /// `Forbidden`.
    Forbidden,
    /// `Internal error`.
    Internal,
}

impl ErrorType {
    /// The API server's words for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Invalid | ErrorType::TypeInvalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::Internal => "Internal error",
        }
    }

    /// Whether the API server skips the CEL rules when this error is present (`hasBlockingErr`).
    pub fn blocks_rules(self) -> bool {
        matches!(
            self,
            ErrorType::NotSupported
                | ErrorType::Required
                | ErrorType::TooLong
                | ErrorType::TooMany
                | ErrorType::TypeInvalid
        )
    }
}

/// The value a field error shows, formatted as Go formats it.
#[derive(Debug, Clone, PartialEq)]
pub enum BadValue {
    /// Not shown (objects and lists under CEL rules, too-long values).
    Omitted,
    /// A string, shown quoted.
    String(String),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// Anything else, shown as JSON.
    Json(Value),
}

impl BadValue {
    /// The bad value for a decoded JSON value, as Go holds it (int64, float64, string, ...).
    pub fn from_json(value: &Value) -> BadValue {
        match value {
            Value::String(s) => BadValue::String(s.clone()),
            Value::Bool(b) => BadValue::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => BadValue::Int(i),
                None => BadValue::Float(n.as_f64().unwrap_or_default()),
            },
            other => BadValue::Json(other.clone()),
        }
    }
}

/// One violation: a field path, what is wrong, and the detail (`field.Error`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The kind of error.
    pub kind: ErrorType,
    /// The field path, e.g. `spec.sla.window` or `spec.engine.nodeSelector[disk]`.
    pub field: String,
    /// The offending value.
    pub bad_value: BadValue,
    /// The explanation: a schema message or a CEL rule's message.
    pub detail: String,
}

impl FieldError {
    /// The message without the field path (`field.Error.ErrorBody`), which the API server also
    /// returns as a cause's `message`.
    pub fn body(&self) -> String {
        let kind = self.kind.as_str();
        let mut s = match self.kind {
            ErrorType::Required | ErrorType::Forbidden | ErrorType::TooLong | ErrorType::Internal => {
                kind.to_string()
            }
            _ => match &self.bad_value {
                BadValue::Omitted => kind.to_string(),
                BadValue::String(v) => format!("{kind}: {}", go_quote(v)),
                BadValue::Int(v) => format!("{kind}: {v}"),
                BadValue::Float(v) => format!("{kind}: {}", go_float(*v)),
                BadValue::Bool(v) => format!("{kind}: {v}"),
                BadValue::Json(v) => format!("{kind}: {v}"),
            },
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// A manifest the API server would refuse with `422 Unprocessable Entity`.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// `Kind.group`, e.g. `InferenceService.serving.pacer.dev`.
    pub group_kind: String,
    /// The object's name (may be empty).
    pub name: String,
    /// Every violation, in the order found.
    pub causes: Vec<FieldError>,
}

impl fmt::Display for Invalid {
    /// The `StatusError` message: `Kind.group "name" is invalid: <errors>`, one error bare,
    /// several in brackets, duplicates dropped (`field.ErrorList.ToAggregate`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut messages: Vec<String> = Vec::new();
        for cause in &self.causes {
            let m = cause.to_string();
            if !messages.contains(&m) {
                messages.push(m);
            }
        }
        write!(f, "{} {} is invalid", self.group_kind, go_quote(&self.name))?;
        match messages.len() {
            0 => Ok(()),
            1 => write!(f, ": {}", messages[0]),
            _ => write!(f, ": [{}]", messages.join(", ")),
        }
    }
}

impl std::error::Error for Invalid {}

/// Go's `%v` of a `float64` (`strconv.FormatFloat(f, 'g', -1, 64)`).
pub fn go_float(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Go's shortest formatting does.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or_default();
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    // Shortest formatting decides with a precision of 6: an exponent below -4 or from 6 up
    // is written as `d.ddde±XX`.
    if (-4..6).contains(&exp) {
        return format!("{sign}{}", fixed(&digits, exp));
    }
    let (first, rest) = digits.split_at(1);
    let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
}

/// `digits` (d.ddd × 10^exp) written without an exponent.
fn fixed(digits: &str, exp: i32) -> String {
    if exp < 0 {
        format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            format!("{digits}{}", "0".repeat(int_len - digits.len()))
        } else {
            format!("{}.{}", &digits[..int_len], &digits[int_len..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_go_prints_them() {
        for (f, want) in [
            (1.0, "1"),
            (3_600_000.0, "3.6e+06"),
            (1_048_576.0, "1.048576e+06"),
            (100_000.0, "100000"),
            (123_456.0, "123456"),
            (1_000_000.0, "1e+06"),
            (0.5, "0.5"),
            (99.9, "99.9"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (86_400_000.0, "8.64e+07"),
        ] {
            assert_eq!(go_float(f), want, "{f}");
        }
    }

    #[test]
    fn messages_read_as_the_api_server_writes_them() {
        let one = FieldError {
            kind: ErrorType::Invalid,
            field: "spec.sla.window".into(),
            bad_value: BadValue::String("10s".into()),
            detail: "sla.window must be between 30s and 24h".into(),
        };
        let required = FieldError {
            kind: ErrorType::Required,
            field: "spec.sla".into(),
            bad_value: BadValue::String(String::new()),
            detail: String::new(),
        };
        let invalid = Invalid {
            group_kind: "InferenceService.serving.pacer.dev".into(),
            name: "x".into(),
            causes: vec![one.clone()],
        };
        assert_eq!(
            invalid.to_string(),
            r#"InferenceService.serving.pacer.dev "x" is invalid: spec.sla.window: Invalid value: "10s": sla.window must be between 30s and 24h"#
        );
        let two = Invalid { causes: vec![one.clone(), required.clone(), one], ..invalid };
        assert_eq!(
            two.to_string(),
            r#"InferenceService.serving.pacer.dev "x" is invalid: [spec.sla.window: Invalid value: "10s": sla.window must be between 30s and 24h, spec.sla: Required value]"#
        );
        let omitted = FieldError { kind: ErrorType::Invalid, bad_value: BadValue::Omitted, ..required };
        assert_eq!(omitted.body(), "Invalid value");
    }
}
