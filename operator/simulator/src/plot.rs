//! The timeline picture of a run (SVG and PNG), in `pacer-bench`'s chart frame: P95 TTFT and
//! ITL (true and as Prometheus saw them) against their targets, replicas (desired, ready, pods)
//! with the policy's decisions marked, and the batch size with tier changes labelled.

use super::score::{Outcome, WindowRow};
use pacer_bench::plots::{frame, png_from_svg};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn top(values: impl Iterator<Item = f64>, floor: f64) -> f64 {
    values.filter(|v| v.is_finite()).fold(floor, f64::max) * 1.15
}

/// Writes `timeline.svg` and `timeline.png` into `dir`; returns both paths.
pub fn timeline(dir: &Path, outcome: &Outcome, targets: (f64, f64)) -> Result<Vec<PathBuf>, String> {
    let svg = dir.join("timeline.svg");
    draw(&svg, outcome, targets)?;
    let png = png_from_svg(&svg)?;
    Ok(vec![svg, png])
}

fn draw(path: &Path, o: &Outcome, (ttft_target, itl_target): (f64, f64)) -> Result<(), String> {
    let rows = &o.timeline;
    let minutes = |t: f64| t / 60.0;
    let x_max = rows.last().map_or(1.0, |r| minutes(r.t)).max(1.0);
    let root = SVGBackend::new(path, (1100, 1100)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((4, 1));
    let title = format!("{} on {}", o.summary.policy, o.summary.trace);

    // Latency panels: true window percentiles (solid), Prometheus' view (light), target (red).
    for (k, (name, target)) in [("TTFT", ttft_target), ("ITL", itl_target)].into_iter().enumerate() {
        let pick = |r: &WindowRow| {
            if k == 0 { (r.ttft, r.observed_ttft) } else { (r.itl, r.observed_itl) }
        };
        let y_max =
            top(rows.iter().flat_map(|r| [pick(r).0, pick(r).1]).flatten().map(|v| v * 1e3), target * 1e3);
        let caption = if k == 0 { format!("{title}: P95 {name}") } else { format!("P95 {name}") };
        let mut chart = frame(&panels[k], &caption, 0.0..x_max, 0.0..y_max, ("minutes", "ms"))?;
        let truth: Vec<(f64, f64)> =
            rows.iter().filter_map(|r| Some((minutes(r.t), pick(r).0? * 1e3))).collect();
        let seen: Vec<(f64, f64)> =
            rows.iter().filter_map(|r| Some((minutes(r.t), pick(r).1? * 1e3))).collect();
        chart
            .draw_series(LineSeries::new(truth, BLUE.stroke_width(2)))
            .map_err(err)?
            .label("true, per minute")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(seen, CYAN.mix(0.8)))
            .map_err(err)?
            .label("Prometheus (spec window)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], CYAN));
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, target * 1e3), (x_max, target * 1e3)],
                RED.stroke_width(1),
            ))
            .map_err(err)?
            .label("target")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }

    // Replicas, with each decision marked on the desired line.
    let y_max = top(rows.iter().map(|r| r.pods as f64), 2.0);
    let mut chart = frame(&panels[2], "Replicas", 0.0..x_max, 0.0..y_max, ("minutes", "replicas"))?;
    type Pick = fn(&WindowRow) -> f64;
    let series: [(&str, RGBColor, Pick); 3] = [
        ("desired", BLACK, |r| f64::from(r.desired)),
        ("ready", GREEN, |r| f64::from(r.ready)),
        ("pods (incl. starting, draining)", MAGENTA, |r| r.pods as f64),
    ];
    for (label, color, f) in series {
        let pts: Vec<(f64, f64)> = rows.iter().map(|r| (minutes(r.t), f(r))).collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .draw_series(
            o.decisions
                .iter()
                .map(|d| TriangleMarker::new((minutes(d.t), f64::from(d.to.replicas)), 5, RED.filled())),
        )
        .map_err(err)?
        .label("decision")
        .legend(|(x, y)| TriangleMarker::new((x + 9, y), 5, RED.filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    // Batch size, with the tier written where it changes.
    let y_max = top(rows.iter().map(|r| f64::from(r.max_batch_size)), 4.0);
    let mut chart =
        frame(&panels[3], "Batch size and tier", 0.0..x_max, 0.0..y_max, ("minutes", "max_batch_size"))?;
    let pts: Vec<(f64, f64)> = rows.iter().map(|r| (minutes(r.t), f64::from(r.max_batch_size))).collect();
    chart.draw_series(LineSeries::new(pts, BLUE.stroke_width(2))).map_err(err)?;
    let mut last_tier = String::new();
    for r in rows {
        if r.tier != last_tier {
            last_tier.clone_from(&r.tier);
            let at = (minutes(r.t), f64::from(r.max_batch_size) + y_max * 0.05);
            chart
                .draw_series(std::iter::once(Text::new(r.tier.clone(), at, ("sans-serif", 14).into_font())))
                .map_err(err)?;
        }
    }
    root.present().map_err(err)
}
