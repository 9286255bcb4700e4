//! The bucket bounds of `pacer-engine`'s histograms (vLLM's, with 1–5 ms steps in front for
//! CPU-scale latencies). One source for the engine's exposition and the simulator's Prometheus,
//! so a percentile the simulator's policies see is quantized exactly as a real one.

/// Time to first token, seconds.
pub const TTFT: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency (and time per output token), seconds.
pub const ITL: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Whole-request phases (E2E, queue, prefill, decode), seconds.
pub const REQUEST: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];
/// Token counts per request (`vllm:request_prompt_tokens`, `vllm:request_generation_tokens`).
pub const TOKENS: &[f64] =
    &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0];
/// Rows per scheduler step.
pub const BATCH: &[f64] = &[1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0];

/// vLLM's own bucket bounds (V1 engine, `vllm/v1/metrics/loggers.py`), which a `runtime: vllm`
/// deployment's percentiles are quantized by. Prometheus interpolates linearly inside a bucket,
/// so a percentile is exact at a bound and only bounded by the bucket's two ends between them:
/// an SLA target on a bound gets an exact verdict, one between bounds an interpolated one.
pub mod vllm {
    /// `vllm:time_to_first_token_seconds`.
    pub const TTFT: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
        40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
    /// `vllm:inter_token_latency_seconds`.
    pub const ITL: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0,
    ];
    /// `vllm:e2e_request_latency_seconds`.
    pub const E2E: &[f64] = &[
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
        480.0, 960.0, 1920.0, 7680.0,
    ];
}

/// The bucket of `bounds` a percentile at `target` falls in: `(lower, upper]`, with `lower` 0
/// below the first bound and `upper` infinite past the last. Its width is how far apart two
/// percentiles may be that the histogram cannot tell apart.
pub fn bucket_of(bounds: &[f64], target: f64) -> (f64, f64) {
    let i = bounds.partition_point(|b| *b < target);
    let lower = if i == 0 { 0.0 } else { bounds[i - 1] };
    (lower, bounds.get(i).copied().unwrap_or(f64::INFINITY))
}

#[cfg(test)]
mod tests {
    #[test]
    fn vllms_bounds_are_the_recorded_expositions() {
        let recorded = include_str!("../../../operator/tests/data/vllm-metrics.txt");
        let bounds = |name: &str| -> Vec<f64> {
            recorded
                .lines()
                .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
                .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
                .filter(|b: &f64| b.is_finite())
                .collect()
        };
        assert_eq!(bounds("vllm:time_to_first_token_seconds"), super::vllm::TTFT);
        assert_eq!(bounds("vllm:inter_token_latency_seconds"), super::vllm::ITL);
        assert_eq!(bounds("vllm:e2e_request_latency_seconds"), super::vllm::E2E);
    }

    /// The table in `docs/vllm.md`: at typical targets, which bucket a percentile lands in.
    #[test]
    fn typical_targets_land_on_or_between_vllms_bounds_as_documented() {
        use super::{bucket_of, vllm};
        // On a bound: exact verdicts.
        for t in [0.1, 0.25, 0.5, 0.75, 1.0, 2.5] {
            assert_eq!(bucket_of(vllm::TTFT, t).1, t);
        }
        for t in [0.025, 0.05, 0.075, 0.1, 0.15, 0.2] {
            assert_eq!(bucket_of(vllm::ITL, t).1, t);
        }
        // Between bounds: the widths the docs quote.
        assert_eq!(bucket_of(vllm::TTFT, 0.2), (0.1, 0.25));
        assert_eq!(bucket_of(vllm::TTFT, 0.4), (0.25, 0.5));
        assert_eq!(bucket_of(vllm::TTFT, 2.0), (1.0, 2.5));
        assert_eq!(bucket_of(vllm::ITL, 0.04), (0.025, 0.05));
        assert_eq!(bucket_of(vllm::ITL, 0.06), (0.05, 0.075));
        assert_eq!(bucket_of(vllm::TTFT, 0.0005), (0.0, 0.001));
        assert_eq!(bucket_of(vllm::ITL, 100.0), (80.0, f64::INFINITY));
    }

    #[test]
    fn every_list_rises_strictly() {
        for list in [
            super::TTFT,
            super::ITL,
            super::REQUEST,
            super::TOKENS,
            super::BATCH,
            super::vllm::TTFT,
            super::vllm::ITL,
            super::vllm::E2E,
        ] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
    }
}
