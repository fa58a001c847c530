//! Pass/fail criteria on a load experiment's figures, as k6 has them: `p99<5ms`,
//! `msg/s>100k`. `freeboard bench` exits with [`EXIT_FAILED`] when one fails.

use std::fmt;

use crate::report::LoadRow;

/// The exit status of a run whose thresholds failed (k6's `ThresholdsHaveFailed`).
pub const EXIT_FAILED: u8 = 99;

/// One criterion: a figure, a comparison and a bound, checked against the median of the
/// runs of every row.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    figure: Figure,
    less: bool,
    /// In the figure's unit (µs for latencies, messages or MiB per second).
    bound: f64,
    /// The bound as written (`5ms`, `100k`).
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Figure {
    P50,
    P99,
    P999,
    MsgPerSec,
    MibPerSec,
}

impl Figure {
    const NAMES: [(&'static str, Figure); 5] = [
        ("p50", Figure::P50),
        ("p99", Figure::P99),
        ("p999", Figure::P999),
        ("msg/s", Figure::MsgPerSec),
        ("MiB/s", Figure::MibPerSec),
    ];

    fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, f)| *f == self).map_or("", |(n, _)| n)
    }

    fn of(self, row: &LoadRow) -> f64 {
        match self {
            Figure::P50 => row.p50_us.median,
            Figure::P99 => row.p99_us.median,
            Figure::P999 => row.p999_us.median,
            Figure::MsgPerSec => row.msgs_per_sec.median,
            Figure::MibPerSec => row.mib_per_sec.median,
        }
    }

    fn is_latency(self) -> bool {
        matches!(self, Figure::P50 | Figure::P99 | Figure::P999)
    }
}

impl Threshold {
    /// Parses `FIGURE<BOUND` or `FIGURE>BOUND`: figures `p50`, `p99`, `p999` (bounds with a
    /// unit: `us`, `ms`, `s`), `msg/s` and `MiB/s` (bounds with an optional `k` or `M`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("threshold {text:?}: {why}; e.g. 'p99<5ms', 'msg/s>100k', 'MiB/s>50'")
        };
        let at = text.find(['<', '>']).ok_or_else(|| bad("no < or >"))?;
        let (name, rest) = text.split_at(at);
        let less = rest.starts_with('<');
        let bound_text = rest[1..].trim();
        let figure = Figure::NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|(_, f)| *f)
            .ok_or_else(|| bad("unknown figure (p50, p99, p999, msg/s, MiB/s)"))?;
        let split = bound_text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(bound_text.len());
        let (number, unit) = bound_text.split_at(split);
        let number: f64 = number.parse().map_err(|_| bad("the bound is not a number"))?;
        let scale = match (figure.is_latency(), unit.trim()) {
            (true, "us" | "µs") => 1.0,
            (true, "ms") => 1e3,
            (true, "s") => 1e6,
            (true, _) => return Err(bad("a latency bound needs a unit: us, ms or s")),
            (false, "") => 1.0,
            (false, "k") => 1e3,
            (false, "M") => 1e6,
            (false, _) => return Err(bad("a rate bound takes k or M, or no suffix")),
        };
        Ok(Self { figure, less, bound: number * scale, text: bound_text.to_owned() })
    }

    /// The rows that break this threshold, each with a sentence saying how.
    pub fn failures(&self, rows: &[LoadRow]) -> Vec<String> {
        rows.iter()
            .filter(|row| {
                let value = self.figure.of(row);
                if self.less { value >= self.bound } else { value <= self.bound }
            })
            .map(|row| {
                let value = self.figure.of(row);
                let shown = match self.figure.is_latency() {
                    true => format!("{:.1} µs", value),
                    false => format!("{value:.0}"),
                };
                format!(
                    "threshold {self} failed: {} = {shown} ({} {}, {} clients × {} in flight × {} B)",
                    self.figure.name(),
                    row.server,
                    row.experiment,
                    row.clients,
                    row.in_flight,
                    row.size
                )
            })
            .collect()
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.less { '<' } else { '>' };
        write!(f, "{}{op}{}", self.figure.name(), self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let t = Threshold::parse("p99<5ms").unwrap();
        assert_eq!((t.figure, t.less, t.bound), (Figure::P99, true, 5000.0));
        let t = Threshold::parse("msg/s>100k").unwrap();
        assert_eq!((t.figure, t.less, t.bound), (Figure::MsgPerSec, false, 100_000.0));
        assert_eq!(t.to_string(), "msg/s>100k");
        assert!(Threshold::parse("p99<5").is_err(), "a latency needs its unit");
        assert!(Threshold::parse("rps>5").is_err());
        assert!(Threshold::parse("p99=5ms").is_err());
        let mut row = LoadRow::default();
        row.msgs_per_sec.median = 50_000.0;
        row.p99_us.median = 4_000.0;
        assert_eq!(t.failures(std::slice::from_ref(&row)).len(), 1);
        assert!(Threshold::parse("p99<5ms").unwrap().failures(&[row]).is_empty());
    }
}
