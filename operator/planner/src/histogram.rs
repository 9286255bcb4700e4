//! Prometheus text exposition (the subset engines emit: counters, gauges and classic histograms,
//! with labels) and percentiles from histogram buckets computed exactly as PromQL's
//! `histogram_quantile` computes them: linear interpolation inside the bucket, the lowest bucket
//! starting at 0, the `+Inf` bucket answering with the highest finite bound.
//!
//! Local mode's scraper computes its windowed percentiles with this from the bucket deltas
//! between two scrapes; the tests use it for a value independent of Prometheus.

use std::collections::BTreeMap;

/// A line of the exposition that is not valid text format.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

/// One sample: a series (name and labels) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, including any `_bucket`/`_count`/`_sum`/`_total` suffix.
    pub name: String,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    /// Every sample, in exposition order.
    pub samples: Vec<Sample>,
}

/// A classic histogram: cumulative bucket counts by upper bound, the `+Inf` bucket last.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)`, sorted by `le`.
    pub buckets: Vec<(f64, f64)>,
    /// Observations (`_count`).
    pub count: f64,
    /// Sum of the observations (`_sum`).
    pub sum: f64,
}

impl Exposition {
    /// Parses text exposition format 0.0.4. Comment lines (`# HELP`, `# TYPE`) and blank lines
    /// are skipped; timestamps after the value are accepted and ignored.
    pub fn parse(text: &str) -> Result<Exposition, ParseError> {
        let mut samples = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |message: &str| ParseError { line: i + 1, message: message.to_string() };
            samples.push(parse_sample(line).map_err(|m| err(&m))?);
        }
        Ok(Exposition { samples })
    }

    /// Samples named `name` whose labels include every `(label, value)` of `matchers`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        matchers: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name && matchers.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The sum of the matching samples of `name` (`sum(name{matchers})`), `None` when none match.
    pub fn sum(&self, name: &str, matchers: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, matchers).map(|s| s.value).fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
    }

    /// The histogram `name` (without suffix), its buckets summed by `le` over every matching
    /// label set (`sum by (le) (name_bucket{matchers})`); `None` when no bucket matches.
    pub fn histogram(&self, name: &str, matchers: &[(&str, &str)]) -> Option<Histogram> {
        let mut by_le: Vec<(f64, f64)> = Vec::new();
        for sample in self.matching(&format!("{name}_bucket"), matchers) {
            let le = sample.labels.get("le").and_then(|le| parse_value(le))?;
            match by_le.iter_mut().find(|(bound, _)| *bound == le) {
                Some((_, count)) => *count += sample.value,
                None => by_le.push((le, sample.value)),
            }
        }
        if by_le.is_empty() {
            return None;
        }
        by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram {
            buckets: by_le,
            count: self.sum(&format!("{name}_count"), matchers).unwrap_or(f64::NAN),
            sum: self.sum(&format!("{name}_sum"), matchers).unwrap_or(f64::NAN),
        })
    }
}

impl Histogram {
    /// The observations made between `earlier` and `self` (two scrapes of one histogram):
    /// bucket by bucket, `self − earlier`. A bucket that went down was reset (the process
    /// restarted), and counts from zero, as PromQL's `increase` does.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let delta = |now: f64, before: f64| if now >= before { now - before } else { now };
        let buckets = self
            .buckets
            .iter()
            .map(|&(le, now)| {
                let before = earlier.buckets.iter().find(|(b, _)| *b == le).map_or(0.0, |(_, c)| *c);
                (le, delta(now, before))
            })
            .collect();
        Histogram { buckets, count: delta(self.count, earlier.count), sum: delta(self.sum, earlier.sum) }
    }

    /// The `q`-quantile (0..1) as PromQL's `histogram_quantile` computes it; `None` where PromQL
    /// answers NaN (no observations, no `+Inf` bucket, fewer than two buckets).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let value = bucket_quantile(q, &self.buckets);
        (!value.is_nan()).then_some(value)
    }

    /// The bucket `(lower, upper]` that holds `value` (`lower` is 0 for the lowest bucket).
    pub fn bucket_of(&self, value: f64) -> Option<(f64, f64)> {
        let mut lower = 0.0;
        for &(le, _) in &self.buckets {
            if value <= le {
                return Some((lower, le));
            }
            lower = le;
        }
        None
    }
}

/// Relative difference below which two bucket counts are the same count (PromQL's tolerance for
/// floating-point noise in summed rates).
const SMALL_DELTA_TOLERANCE: f64 = 1e-12;

/// PromQL's classic-histogram quantile over `(upper bound, cumulative count)` buckets in any
/// order: NaN for `q` NaN, no observations, fewer than two buckets or no `+Inf` bucket; −∞/+∞
/// for `q` below 0/above 1. Buckets with equal bounds are merged and counts forced monotonic
/// first, as PromQL does.
pub fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    let mut sorted = buckets.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    match sorted.last() {
        Some((le, _)) if *le == f64::INFINITY => {}
        _ => return f64::NAN,
    }
    // Merge equal bounds (their counts add up).
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    for (le, count) in sorted {
        match merged.last_mut() {
            Some((last, total)) if *last == le => *total += count,
            _ => merged.push((le, count)),
        }
    }
    // The envelope: ignore negligible differences, then remove any decrease.
    for i in 1..merged.len() {
        let (prev, curr) = (merged[i - 1].1, merged[i].1);
        if curr != prev && (almost_equal(prev, curr, SMALL_DELTA_TOLERANCE) || curr < prev) {
            merged[i].1 = prev;
        }
    }
    if merged.len() < 2 {
        return f64::NAN;
    }
    let observations = merged[merged.len() - 1].1;
    if observations == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * observations;
    // The first bucket (the +Inf one excluded from the search) whose count reaches the rank.
    let b = merged[..merged.len() - 1].iter().position(|(_, c)| *c >= rank).unwrap_or(merged.len() - 1);
    if b == merged.len() - 1 {
        return merged[merged.len() - 2].0;
    }
    if b == 0 && merged[0].0 <= 0.0 {
        return merged[0].0;
    }
    let bucket_end = merged[b].0;
    let mut count = merged[b].1;
    let mut bucket_start = 0.0;
    if b > 0 {
        bucket_start = merged[b - 1].0;
        count -= merged[b - 1].1;
        rank -= merged[b - 1].1;
    }
    bucket_start + (bucket_end - bucket_start) * (rank / count)
}

/// Relative float comparison, as PromQL's `almost.Equal`.
fn almost_equal(a: f64, b: f64, epsilon: f64) -> bool {
    if a == b {
        return true;
    }
    let abs_sum = a.abs() + b.abs();
    let diff = (a - b).abs();
    if a == 0.0 || b == 0.0 || abs_sum < f64::MIN_POSITIVE {
        return diff < epsilon * f64::MIN_POSITIVE;
    }
    diff / abs_sum.min(f64::MAX) < epsilon
}

/// A sample value: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).unwrap_or(line.len());
    let name = &line[..name_end];
    let valid_name = name
        .chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()));
    if name.is_empty() || !valid_name {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = parse_value(value).ok_or_else(|| format!("invalid value {value:?}"))?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().map_err(|_| format!("invalid timestamp {ts:?}"))?;
    }
    if fields.next().is_some() {
        return Err("unexpected text after the timestamp".into());
    }
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Parses `name="value",...}` into `labels`; returns what follows the closing brace.
fn parse_labels<'a>(mut text: &'a str, labels: &mut BTreeMap<String, String>) -> Result<&'a str, String> {
    loop {
        text = text.trim_start();
        if let Some(after) = text.strip_prefix('}') {
            return Ok(after);
        }
        let eq = text.find('=').ok_or("label without '='")?;
        let name = text[..eq].trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("invalid label name {name:?}"));
        }
        let quoted = text[eq + 1..].trim_start().strip_prefix('"').ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("invalid escape in a label value".into()),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        labels.insert(name.to_string(), value);
        text = quoted[end + 1..].trim_start();
        if let Some(after) = text.strip_prefix(',') {
            text = after;
        } else if !text.starts_with('}') {
            return Err("expected ',' or '}' after a label".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP vllm:time_to_first_token_seconds Time to first token.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m",engine="0"} 2
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m",engine="0"} 6
vllm:time_to_first_token_seconds_bucket{le="1",model_name="m",engine="0"} 9
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m",engine="0"} 10
vllm:time_to_first_token_seconds_count{model_name="m",engine="0"} 10
vllm:time_to_first_token_seconds_sum{model_name="m",engine="0"} 4.5
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m",engine="1"} 0
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m",engine="1"} 0
vllm:time_to_first_token_seconds_bucket{le="1",model_name="m",engine="1"} 10
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m",engine="1"} 10
vllm:time_to_first_token_seconds_count{model_name="m",engine="1"} 10
vllm:time_to_first_token_seconds_sum{model_name="m",engine="1"} 8
vllm:num_requests_running{model_name="m",engine="0"} 3 1700000000000
vllm:request_success_total{finished_reason="stop",model_name="m",note="a \"quoted\", \\ text"} 7
up 1
"#;

    fn exposition() -> Exposition {
        Exposition::parse(TEXT).expect("parses")
    }

    #[test]
    fn parses_labels_escapes_values_and_timestamps() {
        let e = exposition();
        assert_eq!(e.samples.len(), 15);
        assert_eq!(e.sum("vllm:num_requests_running", &[]), Some(3.0));
        let success = e.matching("vllm:request_success_total", &[("finished_reason", "stop")]).next();
        assert_eq!(success.expect("sample").labels["note"], r#"a "quoted", \ text"#);
        assert_eq!(e.sum("up", &[]), Some(1.0));
        assert_eq!(e.sum("absent", &[]), None);
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in ["1abc 1", "x{le=\"1\" 1", "x{le=1} 1", "x", "x one", "x 1 2 3", "x{a=\"\\q\"} 1"] {
            let err = Exposition::parse(bad).expect_err(bad);
            assert_eq!(err.line, 1, "{bad}");
        }
    }

    #[test]
    fn histograms_sum_by_le_over_label_sets() {
        let h = exposition().histogram("vllm:time_to_first_token_seconds", &[]).expect("histogram");
        assert_eq!(h.buckets, vec![(0.1, 2.0), (0.5, 6.0), (1.0, 19.0), (f64::INFINITY, 20.0)]);
        assert_eq!((h.count, h.sum), (20.0, 12.5));
        let one = exposition().histogram("vllm:time_to_first_token_seconds", &[("engine", "0")]).expect("h");
        assert_eq!(one.count, 10.0);
    }

    // Hand-computed: 20 observations, rank(0.95) = 19 → bucket (0.5, 1] holds ranks 7..19:
    // 0.5 + 0.5 × (19 − 6) / (19 − 6) = 1.0. rank(0.5) = 10 → 0.5 + 0.5 × 4/13.
    #[test]
    fn quantiles_interpolate_linearly_inside_the_bucket() {
        let h = exposition().histogram("vllm:time_to_first_token_seconds", &[]).expect("h");
        assert_eq!(h.quantile(0.95), Some(1.0));
        assert!((h.quantile(0.5).expect("q") - (0.5 + 0.5 * 4.0 / 13.0)).abs() < 1e-12);
        // rank(0.05) = 1 in the lowest bucket, which starts at 0: 0.1 × 1/2.
        assert!((h.quantile(0.05).expect("q") - 0.05).abs() < 1e-12);
        assert_eq!(h.quantile(0.0), Some(0.0));
    }

    #[test]
    fn the_inf_bucket_answers_with_the_highest_finite_bound() {
        let buckets = [(0.1, 1.0), (0.2, 2.0), (f64::INFINITY, 10.0)];
        assert_eq!(bucket_quantile(0.99, &buckets), 0.2);
    }

    #[test]
    fn special_cases_match_promql() {
        let buckets = [(0.1, 1.0), (f64::INFINITY, 2.0)];
        assert!(bucket_quantile(f64::NAN, &buckets).is_nan());
        assert_eq!(bucket_quantile(-0.1, &buckets), f64::NEG_INFINITY);
        assert_eq!(bucket_quantile(1.1, &buckets), f64::INFINITY);
        // No +Inf bucket, only one bucket, no observations: NaN.
        assert!(bucket_quantile(0.5, &[(0.1, 1.0), (0.2, 2.0)]).is_nan());
        assert!(bucket_quantile(0.5, &[(f64::INFINITY, 2.0)]).is_nan());
        assert!(bucket_quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]).is_nan());
        // A lowest bucket at or below zero answers with its bound.
        assert_eq!(bucket_quantile(0.25, &[(-1.0, 1.0), (0.0, 2.0), (f64::INFINITY, 4.0)]), -1.0);
        // Unsorted input, duplicate bounds merged (1 + 1 = 2 at 0.1), a decrease removed.
        let messy = [(f64::INFINITY, 4.0), (0.1, 1.0), (0.3, 1.5), (0.1, 1.0), (0.2, 3.0)];
        // Merged: 0.1→2, 0.2→3, 0.3→1.5 forced to 3, +Inf→4. rank(0.5) = 2 → 0.1 exactly.
        assert!((bucket_quantile(0.5, &messy) - 0.1).abs() < 1e-12);
        // rank(0.75) = 3 → first bucket reaching 3 is 0.2: 0.1 + 0.1 × (3 − 2)/(3 − 2).
        assert!((bucket_quantile(0.75, &messy) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn deltas_between_scrapes_and_counter_resets() {
        let before = Histogram { buckets: vec![(0.1, 2.0), (f64::INFINITY, 4.0)], count: 4.0, sum: 1.0 };
        let after = Histogram { buckets: vec![(0.1, 3.0), (f64::INFINITY, 10.0)], count: 10.0, sum: 5.0 };
        let d = after.since(&before);
        assert_eq!(d.buckets, vec![(0.1, 1.0), (f64::INFINITY, 6.0)]);
        assert_eq!((d.count, d.sum), (6.0, 4.0));
        // 1 of 6 at or below 0.1; rank(0.95) = 5.7 → +Inf bucket → 0.1.
        assert_eq!(d.quantile(0.95), Some(0.1));
        let reset = before.since(&after);
        assert_eq!(reset.buckets, before.buckets);
        assert_eq!(d.bucket_of(0.05), Some((0.0, 0.1)));
        assert_eq!(d.bucket_of(7.0), Some((0.1, f64::INFINITY)));
    }
}
