//! Running an experiment over its cases and repeats against one server, with progress.

use std::io;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::Target;
use crate::connections::{self, Opening, Step};
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

/// Opens and closes `counts` idle connections one step after the other (each opened in
/// parallel as `opening` says), then repeats the largest step `cycles` times to see whether
/// the server's memory returns to its baseline.
pub fn connections(
    subject: &Subject,
    counts: &[usize],
    cycles: usize,
    opening: &Opening,
) -> io::Result<ConnectionsRow> {
    let mut quiet = |_: &crate::crowd::Progress| {};
    // A first connection may initialise the server's lazily built state (a pool, a slab):
    // that is not the cost of a connection.
    let warm_up = Opening { hold: Duration::ZERO, shutdown: false, ..opening.clone() };
    connections::step(&subject.target, 1, None, &warm_up, &mut quiet)?;
    let mut steps = Vec::new();
    let run = |count: usize, label: String, pid: Option<u32>| -> io::Result<Step> {
        let bar = ProgressBar::new(count as u64).with_prefix(label);
        bar.set_style(
            ProgressStyle::with_template("{prefix}: {pos}/{len} open, {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let mut shown = |p: &crate::crowd::Progress| {
            bar.set_position(p.open as u64);
            if p.lost > 0 {
                bar.set_message(format!("({} connecting, {} lost)", p.connecting, p.lost));
            }
        };
        let step = connections::step(&subject.target, count, pid, opening, &mut shown);
        bar.finish_and_clear();
        step
    };
    for &count in counts {
        steps.push(run(count, format!("{} connections", subject.name), subject.pid)?);
    }
    let mut cycle_rss_kib = Vec::new();
    if let (Some(&largest), Some(pid)) = (counts.iter().max(), subject.pid) {
        if let (true, Ok(s)) = (cycles > 0, crate::process::Sample::of(pid)) {
            cycle_rss_kib.push(s.rss_kib);
        }
        for i in 0..cycles {
            let label = format!("{} connect/close cycle {}/{cycles}", subject.name, i + 1);
            let step = run(largest, label, Some(pid))?;
            cycle_rss_kib.extend(step.rss_closed_kib);
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
