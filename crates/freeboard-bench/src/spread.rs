//! The median of a figure over repeated runs, with its range: how every report gives a
//! figure.

use serde::{Deserialize, Serialize};

/// The median of a figure over repeated runs, with its range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The middle run (the mean of the two middle ones for an even count).
    pub median: f64,
    /// The lowest run.
    pub min: f64,
    /// The highest run.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; all zero when there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Self { median, min: v[0], max: v[n - 1] }
    }
}
