//! Write-buffer watermark pairs under two request patterns, measured as JMH measures: warm-up
//! iterations first, then N measured iterations, reported as the mean with its 99.9 %
//! confidence interval (Student's t), min, max and standard deviation.
//!
//! - **sequential**: one client sends a batch of requests one after the other, each waiting
//!   for its response (ping-pong); an iteration is one batch (10,000 by default).
//! - **burst**: one client writes a burst of requests (1,000 by default) before reading any
//!   response, then reads them all; an iteration is several bursts, each on a fresh
//!   connection (connecting is not timed).

use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Target;
use crate::load::{self, Load};

/// How much to run per watermark pair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// Requests per sequential iteration.
    pub batch: u64,
    /// Requests per burst.
    pub burst: usize,
    /// Bursts per burst iteration.
    pub bursts: usize,
    /// Payload bytes per request.
    pub size: usize,
    /// Unreported iterations before the measured ones.
    pub warmup: usize,
    /// Measured iterations.
    pub iterations: usize,
}

impl Default for Plan {
    fn default() -> Self {
        Self { batch: 10_000, burst: 1_000, bursts: 10, size: 1024, warmup: 3, iterations: 10 }
    }
}

/// The statistics JMH prints for a score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// Measured iterations.
    pub n: usize,
    /// Their mean.
    pub mean: f64,
    /// Half-width of the 99.9 % confidence interval of the mean: `t(0.9995, n − 1) · s / √n`
    /// (NaN for one iteration, as JMH leaves it out).
    pub error: f64,
    /// Sample standard deviation.
    pub stdev: f64,
    /// Lowest iteration.
    pub min: f64,
    /// Highest iteration.
    pub max: f64,
}

impl Score {
    /// The statistics of `values`.
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let stdev = if n > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            f64::NAN
        };
        Self {
            n,
            mean,
            error: student_t_9995(n.saturating_sub(1)) * stdev / (n as f64).sqrt(),
            stdev,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    /// The confidence interval, `[mean − error, mean + error]`.
    pub fn interval(&self) -> (f64, f64) {
        (self.mean - self.error, self.mean + self.error)
    }
}

/// One watermark pair under one request pattern.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatermarkRow {
    /// The server's name.
    pub server: String,
    /// `--send-low`, bytes (0 when the server was given by URL).
    pub low: usize,
    /// `--send-high`, bytes.
    pub high: usize,
    /// `sequential` or `burst`.
    pub mode: String,
    /// Requests per iteration.
    pub ops_per_iteration: u64,
    /// Payload bytes per request.
    pub size: usize,
    /// Warm-up iterations, ops/s.
    pub warmup: Vec<f64>,
    /// Measured iterations, ops/s.
    pub iterations: Vec<f64>,
    /// Their statistics.
    pub score: Score,
    /// Requests that got no response, or connections that failed, over all iterations.
    pub lost: u64,
}

/// Runs `plan` against `target` in both patterns; `tick` gets a line of progress after each
/// iteration.
pub fn run(
    target: &Target,
    server: &str,
    (low, high): (usize, usize),
    plan: &Plan,
    tick: &mut dyn FnMut(&str),
) -> io::Result<Vec<WatermarkRow>> {
    let mut rows = Vec::new();
    for mode in ["sequential", "burst"] {
        let mut row = WatermarkRow {
            server: server.into(),
            low,
            high,
            mode: mode.into(),
            ops_per_iteration: match mode {
                "sequential" => plan.batch,
                _ => (plan.burst * plan.bursts) as u64,
            },
            size: plan.size,
            warmup: Vec::new(),
            iterations: Vec::new(),
            score: Score::default(),
            lost: 0,
        };
        for i in 0..plan.warmup + plan.iterations {
            let (ops, seconds, lost) = match mode {
                "sequential" => {
                    let m = load::run(target, &one_client(1, plan.batch, plan.size), &mut |_| {})?;
                    (m.received, m.seconds, m.sent - m.received + m.failed as u64)
                }
                _ => {
                    let (mut ops, mut seconds, mut lost) = (0, 0.0, 0);
                    for _ in 0..plan.bursts {
                        let load = one_client(plan.burst, plan.burst as u64, plan.size);
                        let m = load::run(target, &load, &mut |_| {})?;
                        ops += m.received;
                        seconds += m.seconds;
                        lost += m.sent - m.received + m.failed as u64;
                    }
                    (ops, seconds, lost)
                }
            };
            let rate = ops as f64 / seconds.max(1e-9);
            row.lost += lost;
            let warm = i < plan.warmup;
            match warm {
                true => row.warmup.push(rate),
                false => row.iterations.push(rate),
            }
            tick(&format!(
                "{server} {}/{} KiB {mode}: {} iteration {}: {rate:.0} ops/s",
                low >> 10,
                high >> 10,
                if warm { "warm-up" } else { "measured" },
                if warm { i + 1 } else { i + 1 - plan.warmup },
            ));
        }
        row.score = Score::of(&row.iterations);
        rows.push(row);
    }
    Ok(rows)
}

/// One connection keeping `in_flight` requests outstanding until it has sent `messages`.
fn one_client(in_flight: usize, messages: u64, size: usize) -> Load {
    Load {
        clients: 1,
        in_flight,
        size,
        messages: Some(messages),
        duration: Duration::from_secs(600),
        server_pid: None,
    }
}

/// `t` such that P(T ≤ t) = 0.9995 for Student's t with `df` degrees of freedom (two-sided
/// 99.9 %), from the standard table; between tabulated rows the smaller `df`'s (wider) value.
pub fn student_t_9995(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        636.619, 31.599, 12.924, 8.610, 6.869, 5.959, 5.408, 5.041, 4.781, 4.587, 4.437, 4.318,
        4.221, 4.140, 4.073, 4.015, 3.965, 3.922, 3.883, 3.850, 3.819, 3.792, 3.768, 3.745, 3.725,
        3.707, 3.690, 3.674, 3.659, 3.646,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        31..=40 => 3.646,
        41..=60 => 3.551,
        61..=120 => 3.460,
        _ => 3.373,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_is_jmh_statistics() {
        let s = Score::of(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!((s.n, s.mean, s.min, s.max), (5, 3.0, 1.0, 5.0));
        assert!((s.stdev - 2.5f64.sqrt()).abs() < 1e-12);
        // t(0.9995, 4) = 8.610
        assert!((s.error - 8.610 * 2.5f64.sqrt() / 5f64.sqrt()).abs() < 1e-9);
        let (lo, hi) = s.interval();
        assert!(lo < s.mean && s.mean < hi);
        assert!(Score::of(&[7.0]).error.is_nan());
        assert_eq!(Score::of(&[]).n, 0);
        assert!(student_t_9995(1000) < student_t_9995(10));
    }
}
