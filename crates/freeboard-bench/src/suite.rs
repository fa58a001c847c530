//! Running an experiment over its cases and repeats against one server, with progress.

use std::io;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::Target;
use crate::connections;
use crate::load::{self, Load};
use crate::report::{ConnectionsRow, LoadRow};

/// A server under measurement.
#[derive(Debug, Clone)]
pub struct Subject {
    /// Its name in the tables.
    pub name: String,
    /// Where it listens.
    pub target: Target,
    /// Its process, for CPU time and RSS (unknown for a server given by URL alone).
    pub pid: Option<u32>,
}

/// Runs each of `cases` `repeat` times against `subject` and summarises each case.
pub fn loads(
    subject: &Subject,
    experiment: &str,
    cases: &[Load],
    repeat: usize,
) -> io::Result<Vec<LoadRow>> {
    let mut rows = Vec::new();
    for case in cases {
        let mut runs = Vec::new();
        for i in 0..repeat.max(1) {
            let bar = spinner(format!(
                "{} {experiment}: {} clients × {} in flight × {} B, run {}/{}",
                subject.name,
                case.clients,
                case.in_flight,
                case.size,
                i + 1,
                repeat.max(1)
            ));
            let case = Load { server_pid: subject.pid, ..case.clone() };
            let measured = load::run(&subject.target, &case, &mut |n| bar.set_position(n))?;
            bar.finish_and_clear();
            runs.push(measured);
        }
        rows.push(LoadRow::new(
            experiment,
            &subject.name,
            (case.clients, case.in_flight, case.size),
            runs,
        ));
    }
    Ok(rows)
}

/// Opens and closes `counts` idle connections one step after the other, then repeats the
/// largest step `cycles` times to see whether the server's memory returns to its baseline.
pub fn connections(
    subject: &Subject,
    counts: &[usize],
    cycles: usize,
) -> io::Result<ConnectionsRow> {
    // A first connection may initialise the server's lazily built state (a pool, a slab):
    // that is not the cost of a connection.
    connections::step(&subject.target, 1, None)?;
    let mut steps = Vec::new();
    for &count in counts {
        let bar = spinner(format!("{} connections: {count}", subject.name));
        steps.push(connections::step(&subject.target, count, subject.pid)?);
        bar.finish_and_clear();
    }
    let mut cycle_rss_kib = Vec::new();
    if let (Some(&largest), Some(pid)) = (counts.iter().max(), subject.pid) {
        if let (true, Ok(s)) = (cycles > 0, crate::process::Sample::of(pid)) {
            cycle_rss_kib.push(s.rss_kib);
        }
        for i in 0..cycles {
            let bar = spinner(format!("{} connect/close cycle {}/{cycles}", subject.name, i + 1));
            let step = connections::step(&subject.target, largest, Some(pid))?;
            cycle_rss_kib.extend(step.rss_closed_kib);
            bar.finish_and_clear();
        }
    }
    Ok(ConnectionsRow { server: subject.name.clone(), steps, cycle_rss_kib })
}

fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner().with_message(message);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} echoes, {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
