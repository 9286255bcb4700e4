//! Kubernetes resource quantities (`500m`, `2`, `4Gi`, `1e3`) as `k8s.io/apimachinery`'s
//! `resource.ParseQuantity` reads them: the same accepted strings, the same rounding up to 10⁻⁹,
//! the same cap of binary-suffixed values at 2⁶³−1, and exact comparison. It backs the CEL
//! functions `isQuantity` and `quantity(...)`.

use std::cmp::Ordering;

/// Why a string is not a quantity, in `resource.ParseQuantity`'s words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string does not have the shape of a quantity.
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    FormatWrong,
    /// The suffix is not one of the known ones.
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// An exact quantity: `(-1)^negative × digits × 10^exponent`, with `digits` a decimal number
/// without leading or trailing zeros (empty for zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
}

/// The most a binary-suffixed quantity may hold (`resource.maxAllowed`, 2⁶³−1).
const MAX_ALLOWED: &str = "9223372036854775807";

enum Format {
    Decimal,
    Binary,
}

impl Quantity {
    /// Parses `text` as `resource.ParseQuantity` does.
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        if text.is_empty() {
            return Err(QuantityError::FormatWrong);
        }
        let parts = split(text)?;
        let (base_two, exponent, format) = interpret_suffix(parts.suffix).ok_or(QuantityError::Suffix)?;
        let mut digits: Vec<u8> = parts.num.bytes().chain(parts.denom.bytes()).map(|b| b - b'0').collect();
        let mut exp = -(parts.denom.len() as i64);
        if base_two {
            for _ in 0..exponent {
                double(&mut digits);
            }
        } else {
            exp += exponent;
        }
        let mut q = Quantity { negative: false, digits, exponent: exp };
        q.normalize();
        q.round_up_to_nano();
        if matches!(format, Format::Binary) {
            let max = Quantity::parse_plain(MAX_ALLOWED);
            if q.cmp_magnitude(&max) == Ordering::Greater {
                q = max;
            }
        }
        q.negative = !parts.positive && !q.digits.is_empty();
        Ok(q)
    }

    /// A non-negative integer given as decimal digits.
    fn parse_plain(digits: &str) -> Quantity {
        let mut q =
            Quantity { negative: false, digits: digits.bytes().map(|b| b - b'0').collect(), exponent: 0 };
        q.normalize();
        q
    }

    /// Strips leading zeros, and trailing zeros into the exponent.
    fn normalize(&mut self) {
        let lead = self.digits.iter().take_while(|&&d| d == 0).count();
        self.digits.drain(..lead);
        while self.digits.last() == Some(&0) {
            self.digits.pop();
            self.exponent += 1;
        }
        if self.digits.is_empty() {
            self.exponent = 0;
        }
    }

    /// Rounds the magnitude up to a multiple of 10⁻⁹: "if you want some resources, you should
    /// get some resources".
    fn round_up_to_nano(&mut self) {
        if self.digits.is_empty() || self.exponent >= -9 {
            return;
        }
        let drop = (-9 - self.exponent) as usize;
        let keep = self.digits.len().saturating_sub(drop);
        let dropped_nonzero = self.digits[keep..].iter().any(|&d| d != 0);
        self.digits.truncate(keep);
        self.exponent = -9;
        if dropped_nonzero {
            increment(&mut self.digits);
        }
        self.normalize();
    }

    /// -1, 0 or 1.
    pub fn sign(&self) -> i64 {
        match (self.digits.is_empty(), self.negative) {
            (true, _) => 0,
            (false, true) => -1,
            (false, false) => 1,
        }
    }

    fn cmp_magnitude(&self, other: &Quantity) -> Ordering {
        match (self.digits.is_empty(), other.digits.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        // The position of the leading digit decides, then the digits themselves.
        let lead = |q: &Quantity| q.digits.len() as i64 + q.exponent;
        lead(self).cmp(&lead(other)).then_with(|| {
            let n = self.digits.len().max(other.digits.len());
            let at = |q: &Quantity, i: usize| q.digits.get(i).copied().unwrap_or(0);
            (0..n).map(|i| at(self, i).cmp(&at(other, i))).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
        })
    }

    /// The value as the nearest `f64` (`Quantity.AsApproximateFloat64`).
    pub fn as_approximate_float(&self) -> f64 {
        if self.digits.is_empty() {
            return 0.0;
        }
        let text: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let magnitude: f64 = format!("{text}e{}", self.exponent).parse().unwrap_or(f64::INFINITY);
        if self.negative { -magnitude } else { magnitude }
    }

    /// The value as an `i64` when it is a whole number that fits (`Quantity.AsInt64`).
    pub fn as_integer(&self) -> Option<i64> {
        if self.exponent < 0 {
            return None;
        }
        let mut value: i128 = 0;
        for &d in &self.digits {
            value = value.checked_mul(10)?.checked_add(i128::from(d))?;
        }
        for _ in 0..self.exponent {
            value = value.checked_mul(10)?;
        }
        i64::try_from(if self.negative { -value } else { value }).ok()
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    /// `Quantity.Cmp`: exact comparison of the values.
    fn cmp(&self, other: &Self) -> Ordering {
        match self.sign().cmp(&other.sign()) {
            Ordering::Equal if self.sign() < 0 => other.cmp_magnitude(self),
            Ordering::Equal => self.cmp_magnitude(other),
            unequal => unequal,
        }
    }
}

/// Doubles a big-endian decimal digit vector in place.
fn double(digits: &mut Vec<u8>) {
    let mut carry = 0;
    for d in digits.iter_mut().rev() {
        let v = *d * 2 + carry;
        *d = v % 10;
        carry = v / 10;
    }
    if carry > 0 {
        digits.insert(0, carry);
    }
}

/// Adds one to a big-endian decimal digit vector in place.
fn increment(digits: &mut Vec<u8>) {
    for d in digits.iter_mut().rev() {
        if *d == 9 {
            *d = 0;
        } else {
            *d += 1;
            return;
        }
    }
    digits.insert(0, 1);
}

struct Parts<'a> {
    positive: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

/// `parseQuantityString`: sign, numerator (leading zeros stripped), denominator and suffix, with
/// its quirks kept (`.` and `-` are zero, `1.G` is accepted).
fn split(text: &str) -> Result<Parts<'_>, QuantityError> {
    let bytes = text.as_bytes();
    let end = bytes.len();
    let mut pos = 0;
    let mut positive = true;
    match bytes.first() {
        Some(b'-') => {
            positive = false;
            pos += 1;
        }
        Some(b'+') => pos += 1,
        _ => {}
    }
    while pos < end && bytes[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Ok(Parts { positive, num: "0", denom: "", suffix: "" });
    }
    let num_start = pos;
    while pos < end && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let mut num = &text[num_start..pos];
    if num.is_empty() {
        num = "0";
    }
    let mut denom = "";
    if pos < end && bytes[pos] == b'.' {
        pos += 1;
        let denom_start = pos;
        while pos < end && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &text[denom_start..pos];
    }
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&bytes[pos]) {
        pos += 1;
    }
    if pos < end && (bytes[pos] == b'-' || bytes[pos] == b'+') {
        pos += 1;
    }
    while pos < end && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::FormatWrong);
    }
    Ok(Parts { positive, num, denom, suffix: &text[suffix_start..] })
}

/// The suffix as (base two?, exponent, format), `None` when it is not one.
fn interpret_suffix(suffix: &str) -> Option<(bool, i64, Format)> {
    let decimal = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(e) = decimal {
        return Some((false, e, Format::Decimal));
    }
    let binary = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(e) = binary {
        return Some((true, e, Format::Binary));
    }
    let rest = suffix.strip_prefix(['e', 'E'])?;
    // Go truncates the parsed int64 to int32.
    let parsed: i64 = rest.parse().ok()?;
    Some((false, i64::from(parsed as i32), Format::Decimal))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn accepts_what_parse_quantity_accepts() {
        for ok in [
            "0",
            "1",
            "500m",
            "2",
            "4Gi",
            "1.5Ki",
            "1e3",
            "1E-3",
            "1e+3",
            "+1",
            "-1",
            ".",
            "-",
            "1.",
            ".5",
            "1.G",
            "100n",
            "12Ei",
            "0.000000001",
        ] {
            assert!(Quantity::parse(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", QuantityError::FormatWrong),
            ("1 ", QuantityError::FormatWrong),
            ("1KiB", QuantityError::FormatWrong),
            ("abc", QuantityError::FormatWrong),
            ("1ki", QuantityError::Suffix),
            ("1e", QuantityError::Suffix),
            ("1Mm", QuantityError::Suffix),
            ("1.5.5", QuantityError::FormatWrong),
        ] {
            assert_eq!(Quantity::parse(bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn compares_exactly_across_suffixes() {
        assert_eq!(q("1Gi").cmp(&q("1073741824")), Ordering::Equal);
        assert_eq!(q("1k").cmp(&q("1000")), Ordering::Equal);
        assert_eq!(q("1.5Ki").cmp(&q("1536")), Ordering::Equal);
        assert_eq!(q("500m").cmp(&q("0.5")), Ordering::Equal);
        assert_eq!(q("1e3").cmp(&q("1k")), Ordering::Equal);
        assert_eq!(q("999m").cmp(&q("1")), Ordering::Less);
        assert_eq!(q("2Gi").cmp(&q("2G")), Ordering::Greater);
        assert_eq!(q("-1").cmp(&q("-2")), Ordering::Greater);
        assert_eq!(q("-1").cmp(&q("0")), Ordering::Less);
        assert_eq!(q("-").cmp(&q("0")), Ordering::Equal);
        assert_eq!(q("1e100").cmp(&q("1e99")), Ordering::Greater);
    }

    #[test]
    fn rounds_up_to_nano_and_caps_binary() {
        assert_eq!(q("0.0000000001"), q("1n"));
        assert_eq!(q("1.0000000001"), q("1000000001n"));
        assert_eq!(q("-0.0000000001"), q("-1n"));
        assert_eq!(q("16Ei"), q("9223372036854775807"));
        // Decimal quantities are not capped.
        assert_eq!(q("100E").cmp(&q("9223372036854775807")), Ordering::Greater);
    }

    #[test]
    fn sign_float_and_integer() {
        assert_eq!((q("-5m").sign(), q("0").sign(), q("3Ki").sign()), (-1, 0, 1));
        assert_eq!(q("1.5Gi").as_approximate_float(), 1_610_612_736.0);
        assert_eq!(q("250m").as_approximate_float(), 0.25);
        assert_eq!(q("-2k").as_approximate_float(), -2000.0);
        assert_eq!(q("2k").as_integer(), Some(2000));
        assert_eq!(q("1500m").as_integer(), None);
        assert_eq!(q("1e30").as_integer(), None);
    }
}
