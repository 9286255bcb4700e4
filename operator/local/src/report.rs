//! Local mode's report: what the planner saw and did at each evaluation, what the clients saw
//! per 1-minute window, the verdict ("SLA held in X % of 1-minute windows"), as JSON, and the
//! timeline picture (SVG and PNG) of P95s against targets, replicas, batch size and tier with
//! the decisions marked.

use super::load::Profile;
use pacer_bench::metrics::{RequestRecord, percentile};
use pacer_planner::{Decision, Levers, Observation};
use plotters::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One evaluation of the planner.
#[derive(Debug, Clone, Serialize)]
pub struct EvaluationRow {
    /// Seconds since the run started.
    pub t: f64,
    /// What the planner saw.
    pub observation: Observation,
    /// The levers in force before the decision.
    pub before: Levers,
    /// What it decided.
    pub decision: DecisionRow,
    /// Replicas draining at that moment.
    pub draining: i32,
}

/// The parts of a [`Decision`] worth keeping per tick (not its history).
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRow {
    /// The levers to run at.
    pub levers: Levers,
    /// The reason code.
    pub reason: &'static str,
    /// The sentence.
    pub message: String,
    /// The lever moved, as `lever from → to`, if any.
    pub change: Option<String>,
    /// `Met`, `Violated` or `Unknown`.
    pub sla: &'static str,
}

impl DecisionRow {
    /// Keeps what the report shows of `d`.
    pub fn of(d: &Decision) -> DecisionRow {
        DecisionRow {
            levers: d.levers,
            reason: d.reason.as_str(),
            message: d.message.clone(),
            change: d.change.as_ref().map(|c| format!("{} {} → {}", c.lever.as_str(), c.from, c.to)),
            sla: d.sla.as_str(),
        }
    }
}

/// What the clients saw in one minute (requests by their send time).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientWindow {
    /// Start of the window, seconds since the load started.
    pub from: f64,
    /// Requests sent in it.
    pub requests: usize,
    /// Of which failed.
    pub failed: usize,
    /// P95 time to first token, seconds.
    pub ttft_p95: Option<f64>,
    /// P95 inter-token latency, seconds.
    pub itl_p95: Option<f64>,
    /// Whether both P95s were within target and no request failed.
    pub held: bool,
}

/// Client-side P95s per `width`-second window of send times, judged against the targets.
pub fn client_windows(records: &[RequestRecord], width: f64, ttft: f64, itl: f64) -> Vec<ClientWindow> {
    let end = records.iter().map(|r| r.scheduled).fold(0.0, f64::max);
    let mut windows = Vec::new();
    let mut from = 0.0;
    while from <= end && !records.is_empty() {
        let inside: Vec<&RequestRecord> =
            records.iter().filter(|r| r.scheduled >= from && r.scheduled < from + width).collect();
        let p95 = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            percentile(&v, 95.0)
        };
        let ttft_p95 = p95(inside.iter().filter_map(|r| r.ttft()).collect());
        let itl_p95 = p95(inside.iter().flat_map(|r| r.itls()).collect());
        let failed = inside.iter().filter(|r| !r.ok()).count();
        let held = failed == 0 && ttft_p95.is_none_or(|v| v <= ttft) && itl_p95.is_none_or(|v| v <= itl);
        windows.push(ClientWindow { from, requests: inside.len(), failed, ttft_p95, itl_p95, held });
        from += width;
    }
    windows
}

/// The verdict over the windows with requests in them.
pub fn verdict(windows: &[ClientWindow]) -> (f64, String) {
    let counted: Vec<&ClientWindow> = windows.iter().filter(|w| w.requests > 0).collect();
    if counted.is_empty() {
        return (0.0, "no requests were sent: no verdict".into());
    }
    let held = counted.iter().filter(|w| w.held).count();
    let share = 100.0 * held as f64 / counted.len() as f64;
    (share, format!("SLA held in {share:.0} % of 1-minute windows ({held} of {})", counted.len()))
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The InferenceService's name.
    pub service: String,
    /// Targets, seconds: TTFT, ITL.
    pub targets: (f64, f64),
    /// The SLA percentile.
    pub percentile: f64,
    /// The load profile, if one ran.
    pub load: Option<Profile>,
    /// Seconds from the run's start to the load's start.
    pub load_started_at: Option<f64>,
    /// Every evaluation.
    pub ticks: Vec<EvaluationRow>,
    /// Client-side minutes.
    pub client_windows: Vec<ClientWindow>,
    /// Requests sent, and of which failed.
    pub requests: usize,
    /// Failed requests.
    pub failed: usize,
    /// Share of 1-minute windows that held, percent.
    pub held_percent: f64,
    /// The one-line verdict.
    pub verdict: String,
    /// How the run ended.
    pub ended_by: String,
}

/// Writes `report.json` and the timeline into `dir`; returns the paths written.
pub fn write(dir: &Path, report: &Report) -> Result<Vec<PathBuf>, String> {
    let json = dir.join("report.json");
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(&json, text).map_err(|e| format!("writing {}: {e}", json.display()))?;
    let svg = dir.join("timeline.svg");
    timeline(&svg, report)?;
    let png = pacer_bench::plots::png_from_svg(&svg)?;
    Ok(vec![json, svg, png])
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The timeline: P95 TTFT and ITL (the planner's window, and the clients' per minute) against
/// targets; replicas (decided and ready) with the decisions that moved a lever marked; the
/// batch size with the tier written where it changes.
fn timeline(path: &Path, r: &Report) -> Result<(), String> {
    let root = SVGBackend::new(path, (1100, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((4, 1));
    let x_max = r.ticks.last().map_or(1.0, |t| minutes(t.t)).max(1.0);
    for (k, (name, target)) in [("TTFT", r.targets.0), ("ITL", r.targets.1)].into_iter().enumerate() {
        latency_panel(&panels[k], r, k == 0, name, target, x_max)?;
    }
    replicas_panel(&panels[2], r, x_max)?;
    batch_panel(&panels[3], r, x_max)?;
    root.present().map_err(err)?;
    Ok(())
}

type Panel<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

const FONT: (&str, u32) = ("sans-serif", 16);

fn minutes(t: f64) -> f64 {
    t / 60.0
}

/// The top of a panel's y axis: the highest finite value (at least `floor`) with a margin.
fn top(v: &mut dyn Iterator<Item = f64>, floor: f64) -> f64 {
    v.filter(|x| x.is_finite()).fold(floor, f64::max) * 1.15
}

/// P95 TTFT (`ttft`) or ITL: the planner's window and the clients' per minute, against `target`.
fn latency_panel(
    panel: &Panel<'_>,
    r: &Report,
    ttft: bool,
    name: &str,
    target: f64,
    x_max: f64,
) -> Result<(), String> {
    let offset = r.load_started_at.unwrap_or(0.0);
    let planner: Vec<(f64, f64)> = r
        .ticks
        .iter()
        .filter_map(|t| {
            let m = &t.observation.metrics;
            let q = if ttft { m.ttft } else { m.itl };
            Some((minutes(t.t), q.seconds()? * 1e3))
        })
        .collect();
    let clients: Vec<(f64, f64)> = r
        .client_windows
        .iter()
        .filter_map(|w| {
            let v = if ttft { w.ttft_p95 } else { w.itl_p95 }?;
            Some((minutes(offset + w.from + 30.0), v * 1e3))
        })
        .collect();
    let y_max = top(&mut planner.iter().chain(&clients).map(|p| p.1), target * 1e3).min(target * 1e3 * 8.0);
    let caption = format!("{}: P{} {name} (ms)", r.service, r.percentile);
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, FONT)
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart.configure_mesh().x_desc("minutes").y_desc("ms").draw().map_err(err)?;
    chart
        .draw_series(LineSeries::new(planner.iter().map(|&(x, y)| (x, y.min(y_max))), BLUE.stroke_width(2)))
        .map_err(err)?
        .label("engines, planner's window")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(clients.iter().map(|&(x, y)| Circle::new((x, y.min(y_max)), 4, MAGENTA.filled())))
        .map_err(err)?
        .label("clients, per minute")
        .legend(|(x, y)| Circle::new((x + 9, y), 4, MAGENTA.filled()));
    chart
        .draw_series(LineSeries::new(vec![(0.0, target * 1e3), (x_max, target * 1e3)], RED))
        .map_err(err)?
        .label("target")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)
}

/// Replicas, decided and ready, with the decisions that moved a lever marked.
fn replicas_panel(panel: &Panel<'_>, r: &Report, x_max: f64) -> Result<(), String> {
    let y_max = top(&mut r.ticks.iter().map(|t| f64::from(t.decision.levers.replicas)), 2.0);
    let mut chart = ChartBuilder::on(panel)
        .caption("Replicas", FONT)
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart.configure_mesh().x_desc("minutes").y_desc("replicas").draw().map_err(err)?;
    let decided: Vec<(f64, f64)> =
        r.ticks.iter().map(|t| (minutes(t.t), f64::from(t.decision.levers.replicas))).collect();
    let ready: Vec<(f64, f64)> =
        r.ticks.iter().map(|t| (minutes(t.t), f64::from(t.observation.ready_replicas))).collect();
    chart
        .draw_series(LineSeries::new(decided, BLACK.stroke_width(2)))
        .map_err(err)?
        .label("decided")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(ready, GREEN.stroke_width(2)))
        .map_err(err)?
        .label("ready")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], GREEN.stroke_width(2)));
    chart
        .draw_series(r.ticks.iter().filter(|t| t.decision.change.is_some()).map(|t| {
            TriangleMarker::new((minutes(t.t), f64::from(t.decision.levers.replicas)), 6, RED.filled())
        }))
        .map_err(err)?
        .label("decision")
        .legend(|(x, y)| TriangleMarker::new((x + 9, y), 6, RED.filled()));
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)
}

/// The batch size, with the tier written where it changes.
fn batch_panel(panel: &Panel<'_>, r: &Report, x_max: f64) -> Result<(), String> {
    let y_max = top(&mut r.ticks.iter().map(|t| f64::from(t.decision.levers.max_batch_size)), 4.0);
    let mut chart = ChartBuilder::on(panel)
        .caption("Batch size and tier", FONT)
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart.configure_mesh().x_desc("minutes").y_desc("max_batch_size").draw().map_err(err)?;
    let batch: Vec<(f64, f64)> =
        r.ticks.iter().map(|t| (minutes(t.t), f64::from(t.decision.levers.max_batch_size))).collect();
    chart.draw_series(LineSeries::new(batch, BLUE.stroke_width(2))).map_err(err)?;
    let mut last_tier = None;
    for t in &r.ticks {
        let tier = t.decision.levers.tier;
        if last_tier != Some(tier) {
            last_tier = Some(tier);
            let at = (minutes(t.t), f64::from(t.decision.levers.max_batch_size) + y_max * 0.05);
            chart
                .draw_series(std::iter::once(Text::new(tier.to_string(), at, ("sans-serif", 14).into_font())))
                .map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(scheduled: f64, ttft: f64, itl: f64, ok: bool) -> RequestRecord {
        let first = scheduled + ttft;
        RequestRecord {
            scheduled,
            sent: scheduled,
            content_events: if ok { vec![first, first + itl, first + 2.0 * itl] } else { vec![] },
            closed: first + 2.0 * itl,
            error: (!ok).then(|| "boom".into()),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn windows_judge_client_p95s_and_failures() {
        let mut records: Vec<RequestRecord> =
            (0..20).map(|i| record(f64::from(i), 0.2, 0.02, true)).collect();
        records.extend((0..20).map(|i| record(60.0 + f64::from(i), 0.9, 0.02, true)));
        records.push(record(125.0, 0.1, 0.01, false));
        let w = client_windows(&records, 60.0, 0.5, 0.05);
        assert_eq!(w.len(), 3);
        assert!(w[0].held && !w[1].held && !w[2].held, "{w:?}");
        assert_eq!((w[2].requests, w[2].failed), (1, 1));
        assert!((w[0].ttft_p95.expect("p95") - 0.2).abs() < 1e-9);
        let (share, line) = verdict(&w);
        assert!((share - 100.0 / 3.0).abs() < 1e-9);
        assert_eq!(line, "SLA held in 33 % of 1-minute windows (1 of 3)");
    }
}
