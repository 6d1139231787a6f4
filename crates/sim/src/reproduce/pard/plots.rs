//! The PARD reproduction's figures: Fig. 8 (drop and invalid rates per workload),
//! Fig. 9 (worst average drop rate vs window size), Fig. 11 (ablations: rates and
//! where drops happen), Fig. 14(c) (drop rate vs λ), and the time series of
//! lv-tweet. SVG always, PNG too when a system font is available.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::measure::SLIDING_WINDOWS_S;
use super::{Results, LAMBDAS};
use crate::report::{self, write_plots, RunReport};

const SIZE: (u32, u32) = (1200, 650);
const FAMILY: &str = "sans-serif";

/// A chart: what to draw, given a drawing area.
enum Chart<'a> {
    /// Groups of bars, one bar per series in each group.
    Bars { groups: &'a [String], series: &'a [(String, Vec<f64>)] },
    /// One stacked bar per group, one layer per series.
    Stacked { groups: &'a [String], series: &'a [(String, Vec<f64>)] },
    /// Lines through points.
    Lines { series: &'a [(String, Vec<(f64, f64)>)], x_desc: &'a str },
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, y_desc: &str, chart: &Chart) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    match chart {
        Chart::Bars { groups, series } | Chart::Stacked { groups, series } => {
            let stacked = matches!(chart, Chart::Stacked { .. });
            let top = if stacked {
                (0..groups.len()).map(|g| series.iter().map(|s| s.1[g]).sum::<f64>()).fold(0.0, f64::max)
            } else {
                series.iter().flat_map(|s| s.1.iter().copied()).fold(0.0, f64::max)
            };
            let mut c = ChartBuilder::on(root)
                .caption(title, (FAMILY, 24))
                .margin(14)
                .x_label_area_size(70)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..groups.len() as f64, 0f64..(top * 1.25).max(1e-9))
                .map_err(err)?;
            c.configure_mesh()
                .disable_x_mesh()
                .x_labels(groups.len().max(1) * 2 + 1)
                .x_label_formatter(&|x| {
                    let i = x.floor() as usize;
                    if (x - x.floor() - 0.5).abs() < 0.26 {
                        groups.get(i).cloned().unwrap_or_default()
                    } else {
                        String::new()
                    }
                })
                .y_desc(y_desc)
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 16))
                .draw()
                .map_err(err)?;
            let width = if stacked { 0.7 } else { 0.8 / series.len().max(1) as f64 };
            for (s, (name, values)) in series.iter().enumerate() {
                let colour = report::colour(s);
                let rects = values.iter().enumerate().map(|(g, &v)| {
                    let (x0, base) = if stacked {
                        (g as f64 + 0.15, series[..s].iter().map(|p| p.1[g]).sum::<f64>())
                    } else {
                        (g as f64 + 0.1 + s as f64 * width, 0.0)
                    };
                    Rectangle::new([(x0, base), (x0 + width, base + v)], colour.filled())
                });
                c.draw_series(rects)
                    .map_err(err)?
                    .label(name.as_str())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled()));
            }
            draw_legend(&mut c)
        }
        Chart::Lines { series, x_desc } => {
            let points = series.iter().flat_map(|s| s.1.iter());
            let (x_max, y_max) = points.fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
            let mut c = ChartBuilder::on(root)
                .caption(title, (FAMILY, 24))
                .margin(14)
                .x_label_area_size(50)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..x_max.max(1e-9) * 1.05, 0f64..(y_max * 1.25).max(1e-9))
                .map_err(err)?;
            c.configure_mesh()
                .x_desc(*x_desc)
                .y_desc(y_desc)
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 16))
                .draw()
                .map_err(err)?;
            for (s, (name, pts)) in series.iter().enumerate() {
                let colour = report::colour(s);
                c.draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
                    .map_err(err)?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
                c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, colour.filled()))).map_err(err)?;
            }
            draw_legend(&mut c)
        }
    }
}

/// The series' legend, in the upper right corner.
fn draw_legend<'a, DB: DrawingBackend + 'a>(
    c: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
) -> Result<(), String> {
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .draw()
        .map_err(err)
}

/// Render a chart as `stem.svg` (and `stem.png` with a system font).
fn render(dir: &Path, stem: &str, png: bool, title: &str, y_desc: &str, chart: Chart) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    let svg = dir.join(format!("{stem}.svg"));
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        draw(&root, title, y_desc, &chart)?;
        root.present().map_err(err)?;
    }
    files.push(svg);
    if png {
        let path = dir.join(format!("{stem}.png"));
        {
            let root = BitMapBackend::new(&path, SIZE).into_drawing_area();
            draw(&root, title, y_desc, &chart)?;
            root.present().map_err(err)?;
        }
        files.push(path);
    }
    Ok(files)
}

/// Write every figure into `dir`; returns the files.
pub fn write(dir: &Path, results: &Results) -> Result<Vec<PathBuf>, String> {
    // The lv-tweet time series (goodput, drop rate, latency CDF); this also registers
    // the charts' font.
    let lv_tweet = results.comparisons.iter().find(|r| r.workload == "lv-tweet");
    let reports: Vec<RunReport> = lv_tweet.map(|r| r.outcomes.iter().map(|o| o.report.clone()).collect()).unwrap_or_default();
    let series_dir = dir.join("lv-tweet");
    let plots = write_plots(&series_dir, &reports)?;
    let png = plots.font.is_some();
    let mut files = plots.files;

    // Fig. 8: drop and invalid rates per workload.
    let groups: Vec<String> = results.comparisons.iter().map(|r| r.workload.clone()).collect();
    let names: Vec<String> = results.comparisons.first().map(|r| r.metrics.iter().map(|m| m.name.clone()).collect()).unwrap_or_default();
    let per_policy = |value: &dyn Fn(&super::PardMetrics) -> f64| -> Vec<(String, Vec<f64>)> {
        names
            .iter()
            .enumerate()
            .map(|(p, name)| (name.clone(), results.comparisons.iter().map(|r| 100.0 * value(&r.metrics[p])).collect()))
            .collect()
    };
    let drops = per_policy(&|m| m.drop_rate);
    files.extend(render(
        dir,
        "fig8-drop-rate",
        png,
        "Fig. 8 — drop rate per workload",
        "drop rate (%)",
        Chart::Bars { groups: &groups, series: &drops },
    )?);
    let invalid = per_policy(&|m| m.invalid_rate);
    files.extend(render(
        dir,
        "fig8-invalid-rate",
        png,
        "Fig. 8 — invalid rate per workload",
        "invalid rate (%)",
        Chart::Bars { groups: &groups, series: &invalid },
    )?);

    // Fig. 9: worst average drop rate vs window size, lv-tweet.
    if let Some(runs) = lv_tweet {
        let series: Vec<(String, Vec<(f64, f64)>)> = runs
            .metrics
            .iter()
            .map(|m| (m.name.clone(), SLIDING_WINDOWS_S.iter().zip(&m.worst_drop_rate).map(|(&s, &r)| (s as f64, 100.0 * r)).collect()))
            .collect();
        files.extend(render(
            dir,
            "fig9-worst-drop-rate",
            png,
            "Fig. 9 — maximum average drop rate vs window (lv-tweet)",
            "max average drop rate (%)",
            Chart::Lines { series: &series, x_desc: "window (s)" },
        )?);
    }

    // Fig. 11: ablations.
    let variants: Vec<String> = results.ablations.metrics.iter().map(|m| m.name.clone()).collect();
    let rates = vec![
        ("drop rate".to_string(), results.ablations.metrics.iter().map(|m| 100.0 * m.drop_rate).collect()),
        ("invalid rate".to_string(), results.ablations.metrics.iter().map(|m| 100.0 * m.invalid_rate).collect()),
    ];
    files.extend(render(
        dir,
        "fig11a-ablations",
        png,
        "Fig. 11(a) — ablations on lv-tweet",
        "rate (%)",
        Chart::Bars { groups: &variants, series: &rates },
    )?);
    let modules = results.ablations.metrics.first().map_or(0, |m| m.drops_by_module.len());
    let shares: Vec<(String, Vec<f64>)> = (0..modules)
        .map(|k| (format!("module {}", k + 1), results.ablations.metrics.iter().map(|m| 100.0 * m.drop_shares()[k]).collect()))
        .collect();
    files.extend(render(
        dir,
        "fig11b-drop-positions",
        png,
        "Fig. 11(b) — share of drops per module (lv-tweet)",
        "share of drops (%)",
        Chart::Stacked { groups: &variants, series: &shares },
    )?);

    // Fig. 14(c): drop rate vs λ.
    let lambda = vec![
        ("drop rate".to_string(), results.lambdas.metrics.iter().zip(LAMBDAS).map(|(m, l)| (l, 100.0 * m.drop_rate)).collect::<Vec<_>>()),
        ("invalid rate".to_string(), results.lambdas.metrics.iter().zip(LAMBDAS).map(|(m, l)| (l, 100.0 * m.invalid_rate)).collect()),
        (
            "drop rate, scaling".to_string(),
            results.lambdas_scaled.metrics.iter().zip(LAMBDAS).map(|(m, l)| (l, 100.0 * m.drop_rate)).collect(),
        ),
    ];
    files.extend(render(
        dir,
        "fig14c-lambda",
        png,
        "Fig. 14(c) — drop rate vs λ (lv-tweet; fixed instances, and scaling)",
        "rate (%)",
        Chart::Lines { series: &lambda, x_desc: "λ" },
    )?);
    Ok(files)
}
