//! The report's charts, drawn with `plotters` (SVG): each lock service beside its raw
//! operation, the legend in a panel of its own so it never covers data.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::perf::{LockPerf, OURS, RAW};

/// One service's figures and how the chart names it.
pub struct Series<'a> {
    /// The legend label.
    pub label: &'a str,
    /// Its measurements.
    pub perf: &'a LockPerf,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

const SIZE: (u32, u32) = (900, 440);
const PLOT_WIDTH: u32 = 620;
const FONT: &str = "sans-serif";

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

type Failure = String;

fn fail<E: std::fmt::Debug>(e: E) -> Failure {
    format!("chart: {e:?}")
}

/// The legend panel: a swatch per service, then what solid and dashed/pale mean.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, series: &[Series<'_>], raw_key: &str) -> Result<(), Failure> {
    let mut y = 50;
    for (i, s) in series.iter().enumerate() {
        area.draw(&Rectangle::new([(10, y - 6), (30, y + 6)], colour(i).filled())).map_err(fail)?;
        area.draw(&Text::new(s.label.to_string(), (38, y - 7), (FONT, 13))).map_err(fail)?;
        y += 22;
    }
    y += 10;
    area.draw(&Text::new("solid: Palisade".to_string(), (10, y), (FONT, 12))).map_err(fail)?;
    area.draw(&Text::new(raw_key.to_string(), (10, y + 18), (FONT, 12))).map_err(fail)?;
    area.draw(&Text::new("(same server, same run)".to_string(), (10, y + 36), (FONT, 12))).map_err(fail)?;
    Ok(())
}

/// Latency distribution (CDF) of uncontended acquire + release, log-scale milliseconds:
/// each service solid, its raw operation dashed in the same colour.
pub fn latency(series: &[Series<'_>]) -> Result<String, Failure> {
    let samples = |p: &LockPerf, name: &str| p.latency(name).map(|l| l.samples_ms.clone()).unwrap_or_default();
    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| [samples(s.perf, OURS), samples(s.perf, RAW)])
        .flatten()
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(0.0f64, f64::max);
    // Whole decades, so the ticks are round.
    let (lo, hi) = if all.is_empty() { (0.1, 10.0) } else { decades(lo, hi) };
    let (bold, light) = log_ticks(lo, hi);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(fail)?;
        let (plot, side) = root.split_horizontally(PLOT_WIDTH);
        let mut chart = ChartBuilder::on(&plot)
            .caption("acquire + release latency (one task, CDF)", (FONT, 16))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d((lo..hi).log_scale().with_key_points(bold).with_light_points(light), 0f64..1f64)
            .map_err(fail)?;
        chart
            .configure_mesh()
            .x_desc("milliseconds (log scale)")
            .y_desc("fraction of cycles at or below")
            .x_label_formatter(&|v| round_tick(*v))
            .light_line_style(RGBColor(238, 238, 238))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .label_style((FONT, 12))
            .draw()
            .map_err(fail)?;
        for (i, s) in series.iter().enumerate() {
            let cdf = |v: Vec<f64>| {
                let n = v.len().max(1) as f64;
                v.into_iter().enumerate().map(move |(k, x)| (x.max(lo), (k + 1) as f64 / n)).collect::<Vec<_>>()
            };
            let style = colour(i).stroke_width(2);
            chart.draw_series(LineSeries::new(cdf(samples(s.perf, OURS)), style)).map_err(fail)?;
            let raw = cdf(samples(s.perf, RAW));
            if !raw.is_empty() {
                chart.draw_series(DashedLineSeries::new(raw, 6, 4, style)).map_err(fail)?;
            }
        }
        legend(&side, series, "dashed: the raw operation")?;
        root.present().map_err(fail)?;
    }
    Ok(svg)
}

/// Throughput per concurrency (a category each): for each service a solid bar (Palisade) and
/// a pale bar (its raw operation) side by side, with the min–max of the rounds as a whisker.
pub fn throughput(series: &[Series<'_>], concurrency: &[usize]) -> Result<String, Failure> {
    let rates: Vec<f64> = series
        .iter()
        .flat_map(|s| s.perf.throughput.iter().flat_map(|r| [r.per_sec.min, r.per_sec.max]))
        .filter(|v| *v > 0.0)
        .collect();
    let (bottom, top) = decades(
        rates.iter().copied().fold(f64::INFINITY, f64::min).min(100.0),
        rates.iter().copied().fold(1.0f64, f64::max),
    );
    let categories = concurrency.len().max(1);
    let (bold, light) = log_ticks(bottom, top);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(fail)?;
        let (plot, side) = root.split_horizontally(PLOT_WIDTH);
        let mut chart = ChartBuilder::on(&plot)
            .caption("acquire + release throughput (keys of their own per task)", (FONT, 16))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (0..categories - 1).into_segmented(),
                (bottom..top).log_scale().with_key_points(bold).with_light_points(light),
            )
            .map_err(fail)?;
        let labels: Vec<String> =
            concurrency.iter().map(|c| format!("{c} task{}", if *c == 1 { "" } else { "s" })).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("concurrent tasks")
            .y_desc("cycles per second (log scale)")
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .y_label_formatter(&|v| round_tick(*v))
            .light_line_style(RGBColor(238, 238, 238))
            .label_style((FONT, 12))
            .draw()
            .map_err(fail)?;
        // Bars are drawn in pixels inside each category's segment.
        let bars = (series.len() * 2).max(1);
        for (c, &tasks) in concurrency.iter().enumerate() {
            let left = chart.backend_coord(&(SegmentValue::Exact(c), bottom));
            let right = chart.backend_coord(&(SegmentValue::Exact(c + 1), bottom));
            let width = f64::from(right.0 - left.0);
            let bar = width * 0.8 / bars as f64;
            for (i, s) in series.iter().enumerate() {
                for (j, name) in [OURS, RAW].into_iter().enumerate() {
                    let Some(rate) = s.perf.rate(name, tasks) else { continue };
                    let x0 = f64::from(left.0) + width * 0.1 + bar * (2 * i + j) as f64;
                    let y = |v: f64| chart.backend_coord(&(SegmentValue::Exact(c), v.max(bottom))).1;
                    let (x0, x1) = (x0.round() as i32, (x0 + bar - 1.0).round() as i32);
                    let style = if j == 0 { colour(i).filled() } else { colour(i).mix(0.35).filled() };
                    root.draw(&Rectangle::new([(x0, y(rate.per_sec.median)), (x1, left.1)], style)).map_err(fail)?;
                    let mid = (x0 + x1) / 2;
                    root.draw(&PathElement::new(
                        vec![(mid, y(rate.per_sec.min)), (mid, y(rate.per_sec.max))],
                        BLACK.stroke_width(1),
                    ))
                    .map_err(fail)?;
                }
            }
        }
        legend(&side, series, "pale: the raw operation")?;
        root.present().map_err(fail)?;
    }
    Ok(svg)
}

/// The whole decades around `lo..hi` (a hair wider, so the end ticks fall inside the range).
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.max(1e-6).log10().floor());
    let hi = 10f64.powf(hi.max(lo).log10().ceil()).max(lo * 10.0);
    (lo * 0.999, hi * 1.001)
}

/// A log axis' ticks within `lo..=hi`: labelled at 1, 2 and 5 × 10ⁿ, light lines at every
/// other integer multiple.
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    let mut decade = 10f64.powf((lo.log10() - 1e-9).floor());
    while decade <= hi {
        for m in 1..10 {
            let v = decade * f64::from(m);
            if v >= lo && v <= hi {
                if [1, 2, 5].contains(&m) { bold.push(v) } else { light.push(v) }
            }
        }
        decade *= 10.0;
    }
    (bold, light)
}

/// A log axis' tick label: 1, 2 and 5 × 10ⁿ are labelled, the other light lines are not.
fn round_tick(v: f64) -> String {
    if v <= 0.0 {
        return String::new();
    }
    // A hair over, so 0.0999999… (a tick computed in floating point) counts as 0.1.
    let decade = 10f64.powf((v.log10() + 1e-9).floor());
    let mantissa = (v / decade).round();
    if ![1.0, 2.0, 5.0].contains(&mantissa) || ((v / decade) - mantissa).abs() > 0.01 {
        return String::new();
    }
    let v = mantissa * decade;
    if v >= 1.0 { format!("{v:.0}") } else { format!("{}", (v * 1e6).round() / 1e6) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    use crate::perf::LockPerf;
    use palisade_compare::measure::{Latency, Rate, Spread};

    #[test]
    fn log_axes_label_one_two_five() {
        let labels: Vec<String> =
            [0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 7.0, 10.0, 20_000.0].into_iter().map(round_tick).collect();
        assert_eq!(labels, ["0.1", "0.2", "", "0.5", "1", "2", "", "10", "20000"]);
        let (bold, light) = log_ticks(0.0999, 10.01);
        assert_eq!(bold.iter().map(|v| round_tick(*v)).collect::<Vec<_>>(), ["0.1", "0.2", "0.5", "1", "2", "5", "10"]);
        assert_eq!(light.len(), 12);
        let (lo, hi) = decades(0.13, 4.2);
        assert!(lo < 0.1 && lo > 0.099 && hi > 10.0 && hi < 10.02, "{lo} {hi}");
    }

    fn perf(scale: f64) -> LockPerf {
        let latency = |name: &str, ms: f64| Latency {
            name: name.into(),
            p50_ms: ms,
            p99_ms: ms * 2.0,
            round_p50_ms: Spread { median: ms, min: ms, max: ms },
            samples_ms: (1..=100).map(|i| ms * (0.5 + f64::from(i) / 100.0)).collect(),
        };
        let rate = |name: &str, tasks: usize, v: f64| Rate {
            name: name.into(),
            tasks,
            per_sec: Spread { median: v, min: v * 0.9, max: v * 1.1 },
        };
        LockPerf {
            latency: vec![latency(RAW, 0.2 * scale), latency(OURS, 0.25 * scale)],
            throughput: [1, 16, 64]
                .into_iter()
                .flat_map(|t| [rate(RAW, t, 5000.0 * t as f64 / scale), rate(OURS, t, 4000.0 * t as f64 / scale)])
                .collect(),
            handoff: vec![],
            primitives: None,
            sets: crate::perf::SetPerf { multi_acquire: "OneRequest".into(), latency: vec![], throughput: vec![] },
        }
    }

    #[test]
    fn charts_show_every_service_and_its_raw_operation() {
        let (fast, slow) = (perf(1.0), perf(5.0));
        let series = [Series { label: "Fast & co", perf: &fast }, Series { label: "Slow", perf: &slow }];
        let svg = latency(&series).unwrap();
        if let Ok(dir) = std::env::var("PALISADE_CHART_SAMPLES") {
            std::fs::write(format!("{dir}/throughput.svg"), throughput(&series, &[1, 16, 64]).unwrap()).unwrap();
            std::fs::write(format!("{dir}/latency.svg"), &svg).unwrap();
        }
        for label in [
            "Fast &amp; co",
            "Slow",
            "dashed: the raw operation",
            "milliseconds (log scale)",
            "\n0.1\n",
            "\n1\n",
            "\n10\n",
        ] {
            assert!(svg.contains(label), "latency chart without {label:?}");
        }
        // Each service in its colour: one solid line and many dashes.
        for colour in ["#1F77B4", "#D62728"] {
            assert!(svg.matches(&format!("stroke=\"{colour}\"")).count() > 10, "{colour}: {svg}");
        }
        let svg = throughput(&series, &[1, 16, 64]).unwrap();
        for label in ["1 task", "16 tasks", "64 tasks", "pale: the raw operation", "\n1000\n"] {
            assert!(svg.contains(label), "throughput chart without {label:?}");
        }
    }
}
