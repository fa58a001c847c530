//! SVG charts of a [`Report`]: latency percentiles by payload, msg/s by clients, RSS by
//! connections, fragmentation over time, delivered FPS by buffer size, soak FPS over time, and
//! the latency sweeps' p99 by offered rate.
//!
//! SVG keeps text as text, so charts need no font files (plotters' own font handling is off:
//! label sizes are estimated, the viewer renders the glyphs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::Report;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend.
    pub name: String,
    /// Points in data units, drawn in order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// File name, without the folder.
    pub file: &'static str,
    /// Caption.
    pub title: String,
    /// X axis description.
    pub x: &'static str,
    /// Y axis description.
    pub y: &'static str,
    /// X on a base-2 logarithmic scale (sizes, counts).
    pub log_x: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// Every chart `report` has data for.
pub fn charts(report: &Report) -> Vec<Chart> {
    let mut charts = Vec::new();
    // Echo latency by payload size, one line per server and percentile (1 client rows first).
    let mut latency: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in report.loads.iter().filter(|r| r.experiment == "echo") {
        for (name, v) in [("p50", r.p50_us), ("p99", r.p99_us), ("p99.9", r.p999_us)] {
            let key = format!("{} × {} clients {name}", r.server, r.clients);
            latency.entry(key).or_default().push((r.size as f64, v.median));
        }
    }
    charts.push(Chart {
        file: "latency_by_payload.svg",
        title: "echo: round-trip latency by payload (median of runs)".into(),
        x: "payload (bytes)",
        y: "round-trip latency (µs)",
        log_x: true,
        series: lines(latency),
    });
    // msg/s by clients, one line per experiment, server and payload.
    let mut rate: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &report.loads {
        let key = format!("{} {} {} B × {} in flight", r.experiment, r.server, r.size, r.in_flight);
        rate.entry(key).or_default().push((r.clients as f64, r.msgs_per_sec.median));
    }
    charts.push(Chart {
        file: "msgs_by_clients.svg",
        title: "echo and pipeline: messages per second by clients".into(),
        x: "clients (connections)",
        y: "messages per second (msg/s)",
        log_x: true,
        series: lines(rate),
    });
    let rss = report
        .connections
        .iter()
        .map(|c| Series {
            name: c.server.clone(),
            points: c
                .steps
                .iter()
                .filter_map(|s| Some((s.count as f64, s.rss_open_kib? as f64)))
                .collect(),
        })
        .collect();
    charts.push(Chart {
        file: "rss_by_connections.svg",
        title: "connections: server RSS with N idle connections open".into(),
        x: "idle connections (count)",
        y: "server RSS (KiB)",
        log_x: true,
        series: rss,
    });
    if let Some((w, outcomes)) = &report.simulation {
        let fragmentation = outcomes
            .iter()
            .map(|o| Series {
                name: label(&o.allocator, o.size),
                points: o.samples.iter().map(|s| (s.t as f64 / 3600.0, s.fragmentation)).collect(),
            })
            .collect();
        charts.push(Chart {
            file: "fragmentation_over_time.svg",
            title: format!(
                "buffers (simulated): fragmentation index over time, {} KiB budget",
                w.budget >> 10
            ),
            x: "simulated time (hours)",
            y: "fragmentation: 1 − largest free / total free (ratio)",
            log_x: false,
            series: fragmentation,
        });
    }
    let mut fps: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    if let Some((_, outcomes)) = &report.simulation {
        for o in outcomes.iter().filter(|o| o.size > 0) {
            let key = format!("simulated: {}", o.allocator);
            fps.entry(key).or_default().push(((o.size >> 10) as f64, o.delivered_fps));
        }
    }
    for run in report.soaks.iter().filter(|r| r.chunk > 0 && !r.samples.is_empty()) {
        let mean =
            run.samples.iter().map(|s| s.delivered_fps).sum::<f64>() / run.samples.len() as f64;
        fps.entry("soak: freeboard serve".into())
            .or_default()
            .push(((run.chunk >> 10) as f64, mean));
    }
    charts.push(Chart {
        file: "fps_by_buffer_size.svg",
        title: "buffers: delivered FPS per client by buffer (chunk) size".into(),
        x: "buffer / chunk size (KiB)",
        y: "delivered frames per second per client (FPS)",
        log_x: true,
        series: lines(fps),
    });
    let soak = report
        .soaks
        .iter()
        .map(|r| Series {
            name: r.server.clone(),
            points: r.samples.iter().map(|s| (s.t / 60.0, s.delivered_fps)).collect(),
        })
        .collect();
    charts.push(Chart {
        file: "soak_fps_over_time.svg",
        title: "buffers (soak): delivered FPS per client over time".into(),
        x: "time (minutes)",
        y: "delivered frames per second per client (FPS)",
        log_x: false,
        series: soak,
    });
    let mut fanout: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &report.broadcasts {
        let key = format!("{} {} B", r.server, r.size);
        fanout.entry(key).or_default().push((r.subscribers as f64, r.deliveries_per_sec));
    }
    charts.push(Chart {
        file: "broadcast_by_subscribers.svg",
        title: "broadcast: deliveries per second by subscribers".into(),
        x: "subscribers (connections)",
        y: "deliveries per second (msg/s)",
        log_x: true,
        series: lines(fanout),
    });
    let mut marks: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &report.watermarks {
        let key = format!("{} {} ({} ops/iteration)", r.server, r.mode, r.ops_per_iteration);
        marks.entry(key).or_default().push(((r.high >> 10).max(1) as f64, r.score.mean));
    }
    charts.push(Chart {
        file: "watermarks.svg",
        title: "watermarks: ops/s (mean of iterations) by high watermark (low = high / 4)".into(),
        x: "high watermark (KiB)",
        y: "operations per second (ops/s)",
        log_x: true,
        series: lines(marks),
    });
    // Every run of every latency sweep: p99 by the total rate offered, one line per server and
    // connection count, capped at ten times the bound so the runs near it stay readable.
    let mut sweep: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut bound_us = 0.0f64;
    for row in &report.latency.capacities {
        for w in &row.sweeps {
            bound_us = bound_us.max(w.bound_us);
            let key = format!("{} × {} connections", row.server, row.connections);
            for step in &w.steps {
                let p99 = step.latency_us.p99.min(10.0 * w.bound_us);
                sweep.entry(key.clone()).or_default().push((step.target_rate, p99));
            }
        }
    }
    charts.push(Chart {
        file: "latency_sweep.svg",
        title: format!(
            "latency: p99 by offered rate, every run of every sweep (bound {bound_us:.0} µs; capped at 10×)"
        ),
        x: "offered rate, all connections (msg/s)",
        y: "p99 round trip from the intended send time (µs)",
        log_x: true,
        series: lines(sweep),
    });
    charts.retain(|c| c.series.iter().any(|s| !s.points.is_empty()));
    charts
}

/// Writes every chart `report` has data for into `dir`; returns the files written.
pub fn write(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for chart in charts(report) {
        let path = dir.join(chart.file);
        draw(&chart, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Draws `chart` as an SVG file at `path`.
pub fn draw(chart: &Chart, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let map_x = |x: f64| if chart.log_x { x.max(1e-9).log2() } else { x };
    let points = chart.series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for (x, y) in points {
        x0 = x0.min(map_x(x));
        x1 = x1.max(map_x(x));
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        return Err("nothing to draw".into());
    }
    if x1 - x0 < 1e-9 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
    // The legend gets its own column right of the plot, so it never covers a line.
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (plot_area, legend_area) = root.split_horizontally(760);
    let mut plot = ChartBuilder::on(&plot_area)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(|e| err(&e))?;
    let log_x = chart.log_x;
    // Enough decimals that neighbouring ticks (about 10 of them) never read the same.
    let step = (x1 - x0) / 10.0;
    let decimals = if log_x { 0 } else { (-step.log10().floor()).clamp(0.0, 6.0) as usize };
    let x_label = move |x: &f64| {
        let v = if log_x { 2f64.powf(*x) } else { *x };
        if log_x { format!("{}", v.round()) } else { format!("{v:.decimals$}") }
    };
    let y_step = y1 / 10.0;
    let y_decimals = (-y_step.log10().floor()).clamp(0.0, 6.0) as usize;
    let y_label = move |y: &f64| format!("{y:.y_decimals$}");
    let mut mesh = plot.configure_mesh();
    if log_x {
        // One label per power of two: 64, 128, 256 rather than 91 and 181.
        mesh.x_labels(((x1 - x0).round() as usize + 1).clamp(2, 16));
    }
    mesh.x_desc(chart.x)
        .y_desc(chart.y)
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .bold_line_style(RGBColor(226, 229, 234))
        .light_line_style(RGBColor(245, 246, 248))
        .draw()
        .map_err(|e| err(&e))?;
    // Series that coincide (every pool line at 0) stay visible: the first drawn is the
    // widest, each later one narrower, so the ones below show at their edges.
    let n = chart.series.len() as u32;
    for (i, series) in chart.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let width = 1 + (n - 1 - i as u32).min(3);
        let points: Vec<(f64, f64)> = series.points.iter().map(|&(x, y)| (map_x(x), y)).collect();
        plot.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(width)))
            .map_err(|e| err(&e))?;
        if points.len() <= 64 {
            let radius = 2 + (n - 1 - i as u32).min(3) as i32;
            plot.draw_series(points.iter().map(|&p| Circle::new(p, radius, color.filled())))
                .map_err(|e| err(&e))?;
        }
        let y = 60 + 22 * i as i32;
        legend_area
            .draw(&PathElement::new(vec![(8, y), (32, y)], color.stroke_width(3)))
            .map_err(|e| err(&e))?;
        legend_area
            .draw(&Text::new(series.name.clone(), (40, y - 7), ("sans-serif", 13)))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn lines(map: BTreeMap<String, Vec<(f64, f64)>>) -> Vec<Series> {
    map.into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect()
}

fn label(allocator: &str, size: usize) -> String {
    match size {
        0 => allocator.to_string(),
        size => format!("{allocator} {} KiB", size >> 10),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_of_a_short_run_are_distinct() {
        // The fragmentation chart of a few minutes: x from 0 to 0.25 hours.
        let dir = std::env::temp_dir().join(format!("freeboard-ticks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let points = (0..=25).map(|i| (i as f64 / 100.0, 900.0)).collect();
        let chart = Chart {
            file: "ticks.svg",
            title: "short".into(),
            x: "simulated time (hours)",
            y: "count",
            log_x: false,
            series: vec![
                Series { name: "pool".into(), points },
                Series { name: "same".into(), points: vec![(0.0, 900.0), (0.25, 900.0)] },
            ],
        };
        let path = dir.join(chart.file);
        draw(&chart, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let x_labels: Vec<&str> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .map(str::trim)
            .filter(|t| t.starts_with("0.") && t.parse::<f64>().is_ok())
            .collect();
        assert!(x_labels.len() >= 4, "{x_labels:?}");
        let mut unique = x_labels.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), x_labels.len(), "repeated tick labels: {x_labels:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn draws_an_svg_with_its_legend() {
        let dir = std::env::temp_dir().join(format!("freeboard-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = Chart {
            file: "t.svg",
            title: "a chart".into(),
            x: "bytes",
            y: "µs",
            log_x: true,
            series: vec![
                Series { name: "alpha".into(), points: vec![(64.0, 10.0), (1024.0, 20.0)] },
                Series { name: "beta".into(), points: vec![(64.0, 5.0)] },
            ],
        };
        let path = dir.join(chart.file);
        draw(&chart, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("alpha") && svg.contains("a chart"));
        assert!(draw(&Chart { series: vec![], ..chart }, &path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
