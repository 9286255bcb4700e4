//! The load the planner sizes for: the request rate expected over the time a decision takes to
//! work (a new replica's start plus two evaluations), from the leading signals — the short
//! rate window against the long one, and the backlog the engines report — not from a lagging
//! percentile.
//!
//! - **Level.** The short window's rate plus the growth of the requests in flight (arrivals
//!   the finished-request counters do not show yet), once it differs from the long window's
//!   by more than its Poisson noise; otherwise the long window's, which is steadier.
//! - **Trend.** A level above the long rate means the load is rising; a quarter of that rise
//!   again is added ([`TREND_WEIGHT`]): a ramp's lag covered, a step's overshoot bounded.
//! - **Backlog.** Requests waiting for a slot must drain within the horizon: `waiting /
//!   horizon` more requests per second.
//!
//! Scale-down reads a second figure: the highest of the two windows' rates, with no trend and
//! no noise allowance, so capacity is given back only when both windows agree the load fell.

use super::observation::{SHORT_RATE_WINDOW, Seconds, ServiceMetrics};

/// The long rate window, seconds (at most the SLA window).
pub const RATE_WINDOW: Seconds = 60.0;
/// How much of a rise seen between the two windows is assumed to continue over the horizon.
pub const TREND_WEIGHT: f64 = 0.25;
/// Standard deviations of Poisson noise the short rate must clear to count as a change.
pub const NOISE_SIGMAS: f64 = 4.0;

/// The load the planner plans for, requests per second over the whole service.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// The rate over the long window.
    pub long: f64,
    /// The rate over the short window (the long one's when unknown).
    pub short: f64,
    /// Requests waiting for a batch slot.
    pub waiting: f64,
    /// Seconds a capacity decision takes to work: replica start plus two evaluations.
    pub horizon: Seconds,
    /// The rate to size capacity for.
    pub up: f64,
    /// The rate a smaller configuration must carry before capacity is given back.
    pub down: f64,
}

impl Forecast {
    /// The forecast from `m`, with the windows' lengths (`rate_window` is the long one's) and
    /// the horizon; `None` without a long-window rate.
    ///
    /// `growth` is how fast the requests in flight (running and waiting) grew since the last
    /// observation, per second: arrivals beyond completions, which the finished-request rates
    /// do not see yet.
    pub fn from_metrics(
        m: &ServiceMetrics,
        rate_window: Seconds,
        horizon: Seconds,
        growth: Option<f64>,
    ) -> Option<Forecast> {
        let long = m.request_rate.filter(|r| r.is_finite() && *r >= 0.0)?;
        let short = m.request_rate_short.filter(|r| r.is_finite() && *r >= 0.0).unwrap_or(long);
        let waiting = m.waiting.filter(|w| w.is_finite() && *w >= 0.0).unwrap_or(0.0);
        let arriving = short + growth.filter(|g| g.is_finite()).unwrap_or(0.0).max(0.0);
        Some(Forecast::new(long, arriving, waiting, rate_window, horizon))
    }

    /// The forecast from the two rates and the backlog.
    pub fn new(long: f64, short: f64, waiting: f64, rate_window: Seconds, horizon: Seconds) -> Forecast {
        let horizon = horizon.max(1.0);
        // Poisson noise of the difference between the windows' counts, as a rate.
        let short_window = SHORT_RATE_WINDOW.min(rate_window);
        let sigma = (long.max(short).max(1e-9) * (1.0 / short_window - 1.0 / rate_window).max(0.0)).sqrt();
        let level = if (short - long).abs() > NOISE_SIGMAS * sigma { short } else { long };
        let rise = (level - long).max(0.0);
        let up = level + TREND_WEIGHT * rise + waiting / horizon;
        Forecast { long, short, waiting, horizon, up, down: long.max(short) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_load_is_its_long_rate_and_noise_is_not_a_trend() {
        let f = Forecast::new(2.0, 2.3, 0.0, 60.0, 60.0);
        assert_eq!(f.up, 2.0, "{f:?}");
        assert_eq!(f.down, 2.3);
    }

    #[test]
    fn a_rise_is_seen_in_the_short_window_and_extended_over_the_horizon() {
        let f = Forecast::new(2.0, 4.0, 0.0, 60.0, 60.0);
        assert!((f.up - 4.5).abs() < 1e-9, "{f:?}");
        // A fall lowers the level for scale-up, but scale-down still reads the higher window.
        let f = Forecast::new(4.0, 2.0, 0.0, 60.0, 60.0);
        assert_eq!((f.up, f.down), (2.0, 4.0));
    }

    #[test]
    fn a_backlog_adds_the_rate_that_drains_it_within_the_horizon() {
        let f = Forecast::new(2.0, 2.0, 30.0, 60.0, 60.0);
        assert!((f.up - 2.5).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn without_a_short_rate_the_long_one_stands_in() {
        let m = ServiceMetrics { request_rate: Some(1.5), ..ServiceMetrics::missing() };
        let f = Forecast::from_metrics(&m, 60.0, 60.0, None).expect("a rate");
        assert_eq!((f.up, f.down, f.short), (1.5, 1.5, 1.5));
        assert!(Forecast::from_metrics(&ServiceMetrics::missing(), 60.0, 60.0, None).is_none());
        // Requests in flight growing by 2/s are arrivals the finished rates do not show yet.
        let f = Forecast::from_metrics(&m, 60.0, 60.0, Some(2.0)).expect("a rate");
        assert!(f.up > 3.5 && f.short == 3.5, "{f:?}");
    }
}
