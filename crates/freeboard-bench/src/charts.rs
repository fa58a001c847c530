//! SVG charts of a [`Report`]: latency percentiles by payload, msg/s by clients, RSS by
//! connections, fragmentation over time, delivered FPS by buffer size, and soak FPS over time.
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
        x: "payload bytes",
        y: "µs",
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
        x: "clients",
        y: "msg/s",
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
        x: "connections",
        y: "RSS KiB",
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
            x: "simulated hours",
            y: "1 − largest free / total free",
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
        x: "buffer / chunk KiB",
        y: "FPS per client",
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
        x: "minutes",
        y: "FPS per client",
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
        x: "subscribers",
        y: "deliveries/s",
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
        x: "high watermark KiB",
        y: "ops/s",
        log_x: true,
        series: lines(marks),
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
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut plot = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(|e| err(&e))?;
    let log_x = chart.log_x;
    let x_label = move |x: &f64| {
        let v = if log_x { 2f64.powf(*x) } else { *x };
        if v >= 100.0 || log_x { format!("{}", v.round()) } else { format!("{v:.1}") }
    };
    let mut mesh = plot.configure_mesh();
    if log_x {
        // One label per power of two: 64, 128, 256 rather than 91 and 181.
        mesh.x_labels(((x1 - x0).round() as usize + 1).clamp(2, 16));
    }
    mesh.x_desc(chart.x).y_desc(chart.y).x_label_formatter(&x_label).draw().map_err(|e| err(&e))?;
    for (i, series) in chart.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = series.points.iter().map(|&(x, y)| (map_x(x), y)).collect();
        plot.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(series.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if points.len() <= 64 {
            plot.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
    }
    plot.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
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
