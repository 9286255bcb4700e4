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

#[cfg(test)]
mod tests {
    #[test]
    fn every_list_rises_strictly() {
        for list in [super::TTFT, super::ITL, super::REQUEST, super::TOKENS, super::BATCH] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
    }
}
