//! SVG (and PNG) plots of a run (TTFT and ITL histograms, TTFT against prompt length, ITL against output
//! position) and of a sweep (latency against throughput), for when looking beats reading.

use crate::metrics::RequestRecord;
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

type PlotResult = Result<(), String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Grid colours as solid light greys rather than translucent black, so every SVG renderer
/// (browsers, librsvg, ImageMagick) draws the same faint grid.
const GRID_LIGHT: RGBColor = RGBColor(238, 238, 238);
const GRID_BOLD: RGBColor = RGBColor(205, 205, 205);

/// A chart on an SVG drawing area with linear axes, as [`frame`] returns it.
pub type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// What every plot shares: white background, title, axes with descriptions, the light grid.
/// Public so other crates' charts (the operator's simulator timeline) look the same.
pub fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    (x_desc, y_desc): (&str, &str),
) -> Result<Chart<'a, 'b>, String> {
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(GRID_LIGHT)
        .bold_line_style(GRID_BOLD)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

fn histogram(path: &Path, title: &str, x_desc: &str, samples_ms: &[f64]) -> PlotResult {
    if samples_ms.is_empty() {
        return Ok(());
    }
    let mut v = samples_ms.to_vec();
    v.sort_by(f64::total_cmp);
    // Clip the far tail so one outlier does not flatten the shape; its count shows in the JSON.
    let hi = crate::metrics::percentile(&v, 99.5).unwrap_or(v[v.len() - 1]).max(v[0] + 1e-6);
    let lo = v[0].min(hi);
    let bins = 40;
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    for x in v.iter().filter(|&&x| x <= hi) {
        counts[(((x - lo) / width) as usize).min(bins - 1)] += 1;
    }
    let top = *counts.iter().max().unwrap_or(&1) as f64 * 1.1;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let title = format!("{title} (n = {})", v.len());
    let mut chart = frame(&root, &title, lo..hi, 0f64..top, (x_desc, "count"))?;
    chart
        .draw_series(counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, &c)| {
            let x0 = lo + i as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width, c as f64)], BLUE.mix(0.6).filled())
        }))
        .map_err(err)?;
    root.present().map_err(err)
}

fn scatter(path: &Path, title: &str, x_desc: &str, y_desc: &str, points: &[(f64, f64)]) -> PlotResult {
    if points.is_empty() {
        return Ok(());
    }
    let max = |f: fn(&(f64, f64)) -> f64| points.iter().map(f).fold(0.0, f64::max) * 1.05 + 1e-9;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let mut chart = frame(&root, title, 0f64..max(|p| p.0), 0f64..max(|p| p.1), (x_desc, y_desc))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 2, RED.mix(0.5).filled()))).map_err(err)?;
    root.present().map_err(err)
}

/// The system's fonts, scanned once per process, and the sans face to use for `sans-serif`.
fn system_fonts() -> &'static (std::sync::Arc<resvg::usvg::fontdb::Database>, Option<String>) {
    static FONTS: std::sync::OnceLock<(std::sync::Arc<resvg::usvg::fontdb::Database>, Option<String>)> =
        std::sync::OnceLock::new();
    FONTS.get_or_init(|| {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        let families: Vec<String> =
            db.faces().flat_map(|f| f.families.iter().map(|(name, _)| name.clone())).collect();
        let sans = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "Arial", "Helvetica"]
            .iter()
            .find(|p| families.iter().any(|f| f == *p))
            .map(|s| s.to_string())
            .or_else(|| families.first().cloned());
        (std::sync::Arc::new(db), sans)
    })
}

/// Renders `svg` to a PNG next to it (same name, `.png`), for viewers without SVG support.
/// Text uses the system's fonts; where there are none, the PNG has no labels (the SVG does).
pub fn png_from_svg(svg: &Path) -> Result<PathBuf, String> {
    use resvg::{tiny_skia, usvg};
    let (fonts, sans) = system_fonts();
    let options = usvg::Options { fontdb: fonts.clone(), ..Default::default() };
    let mut text = std::fs::read_to_string(svg).map_err(err)?;
    // plotters writes the generic `sans-serif`; name a face this system has instead, so the
    // rasterizer finds it whatever its generic-family defaults are.
    if let Some(family) = sans {
        text = text.replace("font-family=\"sans-serif\"", &format!("font-family=\"{family}\""));
    }
    let data = text.into_bytes();
    let tree = usvg::Tree::from_data(&data, &options).map_err(err)?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).ok_or("empty image")?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    let png = svg.with_extension("png");
    pixmap.save_png(&png).map_err(err)?;
    Ok(png)
}

/// Writes the run plots into `dir` (SVG and PNG); returns the files written.
pub fn run_plots(dir: &Path, records: &[RequestRecord]) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(err)?;
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).map(|s| s * 1e3).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itls()).map(|s| s * 1e3).collect();
    let by_prompt: Vec<(f64, f64)> =
        ok.iter().filter_map(|r| Some((r.prompt_tokens as f64, r.ttft()? * 1e3))).collect();
    let by_position: Vec<(f64, f64)> =
        ok.iter().flat_map(|r| r.itls().enumerate().map(|(i, g)| ((i + 1) as f64, g * 1e3))).collect();
    let files = [
        ("ttft_histogram.svg", 0),
        ("itl_histogram.svg", 1),
        ("ttft_vs_prompt_tokens.svg", 2),
        ("itl_vs_output_position.svg", 3),
    ];
    let mut written = Vec::new();
    for (name, kind) in files {
        let path = dir.join(name);
        match kind {
            0 => histogram(&path, "Time to first token", "TTFT (ms)", &ttft)?,
            1 => histogram(&path, "Inter-token latency", "ITL (ms)", &itl)?,
            2 => scatter(&path, "TTFT against prompt length", "prompt tokens", "TTFT (ms)", &by_prompt)?,
            _ => scatter(&path, "ITL against output position", "token position", "ITL (ms)", &by_position)?,
        }
        if path.exists() {
            written.push(png_from_svg(&path)?);
            written.push(path);
        }
    }
    Ok(written)
}

/// Latency against throughput across the levels of a sweep: P50 and P95 TTFT and TPOT.
pub fn sweep_plot(path: &Path, reports: &[Value]) -> PlotResult {
    let get = |r: &Value, k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let series =
        [("p50_ttft_ms", &BLUE), ("p95_ttft_ms", &RED), ("p50_tpot_ms", &GREEN), ("p95_tpot_ms", &MAGENTA)];
    let x_max = reports.iter().map(|r| get(r, "output_throughput")).fold(0.0, f64::max) * 1.1 + 1e-9;
    let y_max = reports
        .iter()
        .flat_map(|r| series.iter().map(move |(k, _)| get(r, k)))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.1
        + 1e-9;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    let mut chart =
        frame(&root, "Latency against throughput", 0f64..x_max, 0f64..y_max, ("output tokens/s", "ms"))?;
    for (key, color) in series {
        let pts: Vec<(f64, f64)> =
            reports.iter().map(|r| (get(r, "output_throughput"), get(r, key))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(key)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_written_as_svg() {
        let dir = std::env::temp_dir().join(format!("pacer-bench-plots-{}", std::process::id()));
        let records: Vec<RequestRecord> = (0..20)
            .map(|i| RequestRecord {
                sent: 0.0,
                content_events: (0..5).map(|j| 0.05 + i as f64 * 0.001 + j as f64 * 0.02).collect(),
                prompt_tokens: 10 + i,
                output_tokens: 5,
                ..Default::default()
            })
            .collect();
        let files = run_plots(&dir, &records).unwrap();
        assert_eq!(files.len(), 8);
        for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
            assert!(std::fs::read(f).unwrap().starts_with(b"\x89PNG"), "{}", f.display());
        }
        for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "svg")) {
            let svg = std::fs::read_to_string(f).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("<rect") || svg.contains("<circle"),
                "{}",
                f.display()
            );
        }
        let reports: Vec<Value> = (1..4)
            .map(|i| serde_json::json!({"output_throughput": 100.0 * i as f64, "p50_ttft_ms": 10.0 * i as f64, "p95_ttft_ms": 20.0 * i as f64, "p50_tpot_ms": 5.0, "p95_tpot_ms": 7.0}))
            .collect();
        let sweep = dir.join("sweep.svg");
        sweep_plot(&sweep, &reports).unwrap();
        assert!(std::fs::read_to_string(&sweep).unwrap().contains("p95_ttft_ms"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
