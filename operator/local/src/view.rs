//! What local mode shows while it runs: on a terminal, a small panel redrawn in place (P95 TTFT
//! and ITL against targets, request rate, replicas, tier, batch, the last decision and why);
//! otherwise one plain line per evaluation.

use pacer_planner::{Decision, Levers, Observation, Quantile};
use std::io::Write;

/// The live view.
pub struct View {
    terminal: bool,
    drawn: usize,
}

/// One frame's content.
pub struct Frame<'a> {
    /// Seconds since start.
    pub t: f64,
    /// What the planner saw.
    pub observation: &'a Observation,
    /// What it decided.
    pub decision: &'a Decision,
    /// Levers in force now.
    pub levers: Levers,
    /// Replicas draining.
    pub draining: i32,
    /// Targets, seconds.
    pub targets: (f64, f64),
    /// The load's phase, if a load runs.
    pub load: Option<String>,
    /// The router's address.
    pub router: &'a str,
}

fn ms(q: &Quantile) -> String {
    match q {
        Quantile::Value { seconds, samples } => format!("{:>6.0} ms (n={samples:.0})", seconds * 1e3),
        Quantile::TooFewSamples { samples } => format!("  too few samples (n={samples:.0})"),
        Quantile::Missing => "  no data".into(),
    }
}

impl View {
    /// A view on stdout; redrawn in place when stdout is a terminal.
    pub fn new(terminal: bool) -> View {
        View { terminal, drawn: 0 }
    }

    /// Shows one evaluation.
    pub fn show(&mut self, f: &Frame<'_>) {
        let m = &f.observation.metrics;
        let d = f.decision;
        let rate = m.request_rate.map_or("-".into(), |r| format!("{r:.2}/s"));
        let change = d
            .change
            .as_ref()
            .map_or(String::new(), |c| format!(" [{} {} → {}]", c.lever.as_str(), c.from, c.to));
        let mut out = std::io::stdout().lock();
        if !self.terminal {
            let _ = writeln!(
                out,
                "t={:.0}s ttft_p95={} itl_p95={} rate={rate} replicas={}/{} tier={} batch={} decision={}{change}: {}",
                f.t,
                ms(&m.ttft).trim(),
                ms(&m.itl).trim(),
                f.observation.ready_replicas,
                f.levers.replicas,
                f.levers.tier,
                f.levers.max_batch_size,
                d.reason.as_str(),
                d.message
            );
            return;
        }
        let lines = [
            format!(
                "Pacer local mode — router http://{}   t = {:.0} s   SLA {}",
                f.router,
                f.t,
                d.sla.as_str()
            ),
            format!("  P95 TTFT {}   target {:.0} ms", ms(&m.ttft), f.targets.0 * 1e3),
            format!("  P95 ITL  {}   target {:.0} ms", ms(&m.itl), f.targets.1 * 1e3),
            format!("  requests {rate}   load {}", f.load.as_deref().unwrap_or("none")),
            format!(
                "  replicas {} ready / {} decided ({} draining)   tier {}   batch {} (wait {} ms)",
                f.observation.ready_replicas,
                f.levers.replicas,
                f.draining,
                f.levers.tier,
                f.levers.max_batch_size,
                f.levers.batch_wait_ms
            ),
            format!("  last decision {}{change}: {}", d.reason.as_str(), d.message),
        ];
        // Up over the last frame, clear to the end of the screen, draw.
        if self.drawn > 0 {
            let _ = write!(out, "\x1b[{}F\x1b[J", self.drawn);
        }
        for line in &lines {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
        self.drawn = lines.len();
    }

    /// A line that stays (an event), above the panel.
    pub fn note(&mut self, line: &str) {
        let mut out = std::io::stdout().lock();
        if self.terminal && self.drawn > 0 {
            let _ = write!(out, "\x1b[{}F\x1b[J", self.drawn);
            self.drawn = 0;
        }
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}
