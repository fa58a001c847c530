//! A `/metrics` scraper: one plain HTTP GET, the Prometheus text parsed into series.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The series of one `/metrics` scrape, by their full name with labels
/// (`freeboard_closes_total{reason="protocol_error"}`).
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    series: HashMap<String, f64>,
}

impl Scrape {
    /// Scrapes `addr`'s `/metrics`.
    ///
    /// The server rebuilds `/metrics` at most every 10 ms and answers the last build in
    /// between, so the scrape waits that long first: what happened before the call is in it.
    pub fn of(addr: SocketAddr) -> Self {
        std::thread::sleep(Duration::from_millis(10));
        let mut stream = TcpStream::connect(addr).expect("connect for /metrics");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("send GET /metrics");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read /metrics");
        assert!(text.starts_with("HTTP/1.1 200"), "/metrics answered {text:?}");
        Self::parse(&text)
    }

    /// Parses Prometheus text (the HTTP head, comments and blank lines are skipped).
    pub fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .filter(|l| l.starts_with("freeboard_"))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        Self { series }
    }

    /// The value of one series, e.g. `closes_total{reason="protocol_error"}` (the
    /// `freeboard_` prefix is added); 0 if absent (a counter never incremented).
    pub fn get(&self, series: &str) -> f64 {
        self.series.get(&format!("freeboard_{series}")).copied().unwrap_or(0.0)
    }

    /// The sum of every series of metric `name` whatever its labels (the per-loop gauges).
    pub fn sum(&self, name: &str) -> f64 {
        let bare = format!("freeboard_{name}");
        let labelled = format!("freeboard_{name}{{");
        self.series
            .iter()
            .filter(|(k, _)| **k == bare || k.starts_with(&labelled))
            .map(|(_, v)| v)
            .sum()
    }

    /// How much series `series` grew from `before` to this scrape.
    pub fn delta(&self, before: &Scrape, series: &str) -> f64 {
        self.get(series) - before.get(series)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labelled_and_bare_series() {
        let text = "HTTP/1.1 200 OK\r\n\r\n# HELP x\nfreeboard_accepted_total 7\n\
                    freeboard_pool_chunks_in_use{event_loop=\"0\"} 3\n\
                    freeboard_pool_chunks_in_use{event_loop=\"1\"} 4\n# EOF\n";
        let scrape = Scrape::parse(text);
        assert_eq!(scrape.get("accepted_total"), 7.0);
        assert_eq!(scrape.get("refusals_total{status=\"431\"}"), 0.0);
        assert_eq!(scrape.sum("pool_chunks_in_use"), 7.0);
    }
}
