//! The run report: throughput, goodput and latency distributions, as JSON whose field names
//! follow `vllm bench serve` where the meaning is the same (`mean_ttft_ms`, `p99_itl_ms`,
//! `request_goodput`, ...), and as a terminal table.

use crate::metrics::{Distribution, RequestRecord, Slo, TokenSource};
use crate::run::RunResult;
use serde_json::{Map, Value, json};

/// Builds the JSON report of `result`; `config` (load shape, target) is copied in as is.
pub fn report(result: &RunResult, slo: &Slo, config: Value) -> Value {
    let rs = &result.records;
    let ok: Vec<&RequestRecord> = rs.iter().filter(|r| r.ok()).collect();
    let dur = result.duration.max(1e-9);
    let out_tokens: usize = ok.iter().map(|r| r.output_tokens).sum();
    let in_tokens: usize = ok.iter().map(|r| r.prompt_tokens).sum();
    let good: Vec<&&RequestRecord> = ok.iter().filter(|r| slo.good(r)).collect();
    let mut m = Map::new();
    m.insert("config".into(), config);
    m.insert("duration".into(), json!(result.duration));
    m.insert("completed".into(), json!(ok.len()));
    m.insert("failed".into(), json!(rs.len() - ok.len()));
    m.insert("connect_retries".into(), json!(rs.iter().map(|r| r.retries).sum::<u32>()));
    m.insert("total_input_tokens".into(), json!(in_tokens));
    m.insert("total_output_tokens".into(), json!(out_tokens));
    m.insert("request_throughput".into(), json!(ok.len() as f64 / dur));
    m.insert("output_throughput".into(), json!(out_tokens as f64 / dur));
    m.insert("total_token_throughput".into(), json!((in_tokens + out_tokens) as f64 / dur));
    let sources: Map<String, Value> = [
        ("usage", TokenSource::Usage),
        ("events", TokenSource::Events),
        ("tokenizer", TokenSource::Tokenizer),
    ]
    .iter()
    .map(|(name, s)| (name.to_string(), json!(rs.iter().filter(|r| r.token_source == *s).count())))
    .collect();
    m.insert("token_source".into(), Value::Object(sources));
    if slo.any() {
        m.insert("slo".into(), serde_json::to_value(slo).unwrap_or(Value::Null));
        m.insert("request_goodput".into(), json!(good.len() as f64 / dur));
        m.insert(
            "token_goodput".into(),
            json!(good.iter().map(|r| r.output_tokens).sum::<usize>() as f64 / dur),
        );
        m.insert("slo_attainment".into(), json!(good.len() as f64 / rs.len().max(1) as f64));
        for (k, name) in ["ttft", "tpot", "e2el", "itl"].iter().enumerate() {
            let given: Vec<bool> = rs.iter().filter_map(|r| slo.verdicts(r)[k]).collect();
            if !given.is_empty() {
                let rate = given.iter().filter(|&&p| p).count() as f64 / given.len() as f64;
                m.insert(format!("{name}_slo_pass_rate"), json!(rate));
            }
        }
    }
    let dists = [
        ("ttft", Distribution::of_seconds(ok.iter().filter_map(|r| r.ttft()))),
        ("ttft_from_schedule", Distribution::of_seconds(ok.iter().filter_map(|r| r.ttft_from_schedule()))),
        ("tpot", Distribution::of_seconds(ok.iter().filter_map(|r| r.tpot()))),
        ("itl", Distribution::of_seconds(ok.iter().flat_map(|r| r.itls()))),
        ("e2el", Distribution::of_seconds(ok.iter().filter_map(|r| r.e2e()))),
        ("schedule_lag", Distribution::of_seconds(rs.iter().map(RequestRecord::schedule_lag))),
    ];
    // Bootstrap intervals for the tails: a P99 from 100 requests is a rough number, and the
    // interval says how rough.
    let mut rng = crate::load::Rng::new(0xC1);
    let tail_samples: [(&str, Vec<f64>); 4] = [
        ("ttft", ok.iter().filter_map(|r| r.ttft()).map(|s| s * 1e3).collect()),
        ("tpot", ok.iter().filter_map(|r| r.tpot()).map(|s| s * 1e3).collect()),
        ("itl", ok.iter().flat_map(|r| r.itls()).map(|s| s * 1e3).collect()),
        ("e2el", ok.iter().filter_map(|r| r.e2e()).map(|s| s * 1e3).collect()),
    ];
    for (name, samples) in &tail_samples {
        let iterations = if samples.len() > 20_000 { 100 } else { 400 };
        for q in [95.0, 99.0] {
            if let Some((lo, hi)) = crate::stats::percentile_ci(samples, q, iterations, &mut rng) {
                m.insert(format!("p{q}_{name}_ms_ci95"), json!([lo, hi]));
            }
        }
    }
    for (name, d) in dists {
        m.insert(format!("n_{name}"), json!(d.n));
        m.insert(format!("mean_{name}_ms"), json!(d.mean));
        m.insert(format!("median_{name}_ms"), json!(d.p50));
        m.insert(format!("std_{name}_ms"), json!(d.std));
        for (p, v) in [("p50", d.p50), ("p90", d.p90), ("p95", d.p95), ("p99", d.p99), ("p99.9", d.p999)] {
            m.insert(format!("{p}_{name}_ms"), json!(v));
        }
        m.insert(format!("max_{name}_ms"), json!(d.max));
    }
    if let Some(e) = rs.iter().find_map(|r| r.error.clone()) {
        m.insert("first_error".into(), json!(e));
    }
    Value::Object(m)
}

/// A terminal summary of a report.
pub fn table(r: &Value) -> String {
    let f = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let mut s = String::new();
    s.push_str(&format!(
        "requests: {} completed, {} failed in {:.2} s\n",
        r["completed"],
        r["failed"],
        f("duration")
    ));
    if r.get("connect_retries").and_then(Value::as_u64).is_some_and(|n| n > 0) {
        s.push_str(&format!(
            "connect retries: {} (connections that could not be opened)\n",
            r["connect_retries"]
        ));
    }
    s.push_str(&format!(
        "throughput: {:.2} req/s, {:.1} output tok/s, {:.1} total tok/s\n",
        f("request_throughput"),
        f("output_throughput"),
        f("total_token_throughput")
    ));
    if r.get("request_goodput").is_some() {
        s.push_str(&format!(
            "goodput: {:.2} req/s, {:.1} tok/s, SLO attainment {:.1}%\n",
            f("request_goodput"),
            f("token_goodput"),
            100.0 * f("slo_attainment")
        ));
    }
    s.push_str(&format!(
        "{:<20} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "metric (ms)", "n", "mean", "p50", "p90", "p95", "p99"
    ));
    for name in ["ttft", "tpot", "itl", "e2el", "schedule_lag"] {
        s.push_str(&format!(
            "{:<20} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
            name,
            r[format!("n_{name}")],
            f(&format!("mean_{name}_ms")),
            f(&format!("p50_{name}_ms")),
            f(&format!("p90_{name}_ms")),
            f(&format!("p95_{name}_ms")),
            f(&format!("p99_{name}_ms")),
        ));
    }
    s
}

/// One row per level of a sweep or search: load, throughput, goodput and P95 latencies.
pub fn sweep_table(reports: &[Value]) -> String {
    let f = |r: &Value, k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let mut s = format!(
        "{:<16} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        "load", "req/s", "out tok/s", "goodput", "attain %", "p95 ttft", "p95 tpot", "p95 itl"
    );
    for r in reports {
        let a = &r["config"]["arrivals"];
        let load = match a["kind"].as_str() {
            Some("closed") => format!("conc {}", a["concurrency"]),
            _ => format!("rate {:.3}", a["rate"].as_f64().unwrap_or(f64::NAN)),
        };
        // Without SLOs there is no goodput: show a dash, not NaN.
        let or_dash =
            |v: f64, digits: usize| if v.is_finite() { format!("{v:.digits$}") } else { "-".into() };
        s.push_str(&format!(
            "{:<16} {:>9.2} {:>10.1} {:>10} {:>10} {:>10.1} {:>10.1} {:>10.1}\n",
            load,
            f(r, "request_throughput"),
            f(r, "output_throughput"),
            or_dash(f(r, "request_goodput"), 2),
            or_dash(100.0 * f(r, "slo_attainment"), 1),
            f(r, "p95_ttft_ms"),
            f(r, "p95_tpot_ms"),
            f(r, "p95_itl_ms"),
        ));
    }
    s
}

/// One CSV row per request: times in seconds from the start, latencies in milliseconds.
pub fn requests_csv(records: &[RequestRecord]) -> String {
    let ms = |v: Option<f64>| v.map_or(String::new(), |s| format!("{:.3}", s * 1e3));
    let mut out = String::from(
        "index,scheduled_s,sent_s,ttft_ms,tpot_ms,e2e_ms,max_itl_ms,prompt_tokens,output_tokens,token_source,error\n",
    );
    for (i, r) in records.iter().enumerate() {
        let max_itl = r.itls().fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
        let source = match r.token_source {
            TokenSource::Usage => "usage",
            TokenSource::Events => "events",
            TokenSource::Tokenizer => "tokenizer",
        };
        // Quote the error and double its quotes, as RFC 4180 asks.
        let error = r.error.as_deref().map_or(String::new(), |e| format!("\"{}\"", e.replace('"', "\"\"")));
        out.push_str(&format!(
            "{i},{:.6},{:.6},{},{},{},{},{},{},{source},{error}\n",
            r.scheduled,
            r.sent,
            ms(r.ttft()),
            ms(r.tpot()),
            ms(r.e2e()),
            ms(max_itl),
            r.prompt_tokens,
            r.output_tokens,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_a_header_and_one_quoted_row_per_request() {
        let ok = RequestRecord {
            sent: 1.0,
            content_events: vec![1.1, 1.2],
            output_tokens: 2,
            ..Default::default()
        };
        let bad = RequestRecord { error: Some("HTTP 429: \"queue\"".into()), ..Default::default() };
        let csv = requests_csv(&[ok, bad]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].starts_with("0,0.000000,1.000000,100.000,100.000,200.000,100.000,0,2,events,"),
            "{}",
            lines[1]
        );
        assert!(lines[2].ends_with(",\"HTTP 429: \"\"queue\"\"\""), "{}", lines[2]);
    }
}
