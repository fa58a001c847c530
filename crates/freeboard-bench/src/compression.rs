//! What permessage-deflate costs a server: memory per compressing connection, idle and after
//! one compressed echo each, by compression mode beside an uncompressed server; and the
//! summary of a broadcast with compressing subscribers beside plain ones
//! ([`crate::broadcast`] runs it).

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::time::Duration;

use flate2::{Compress, Compression, FlushCompress};
use serde::{Deserialize, Serialize};

use crate::Target;
use crate::broadcast::BroadcastRow;
use crate::corpus::json;
use crate::load::{Opened, Rng, open_any};
use crate::process::Sample;

/// Raw deflate with a sync flush and the tail removed (RFC 7692 §7.2.1), as a client with
/// no context takeover sends it.
pub fn deflate(data: &[u8]) -> Vec<u8> {
    let mut z = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(data.len() + 1024);
    loop {
        let at = z.total_in() as usize;
        let _ = z.compress_vec(&data[at..], &mut out, FlushCompress::Sync);
        if z.total_in() as usize == data.len() && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity());
    }
    if out.ends_with(&[0, 0, 0xff, 0xff]) {
        out.truncate(out.len() - 4);
    }
    out
}

/// One server's memory per connection, idle and active.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemoryRow {
    /// The server and its mode.
    pub server: String,
    /// Connections opened (each offering permessage-deflate).
    pub connections: usize,
    /// Of them, those the server agreed to compress.
    pub compressing: usize,
    /// RSS growth per connection with all of them open and idle, KiB.
    pub idle_kib_per_conn: f64,
    /// RSS growth per connection after each has sent one compressed message (plain if not
    /// agreed) and read its echo, KiB.
    pub active_kib_per_conn: f64,
    /// Bytes of the echo on the wire (what the client read), per connection.
    pub echo_wire_bytes: f64,
}

/// How long the server gets to settle before its RSS is read.
const SETTLE: Duration = Duration::from_millis(500);

/// Opens `count` connections to `target` offering permessage-deflate and reads the server's
/// RSS with all of them idle; then each sends one `size`-byte JSON message (compressed when
/// agreed) and reads its echo, and the RSS is read again; then they close.
pub fn memory(
    name: &str,
    target: &Target,
    count: usize,
    size: usize,
    server_pid: u32,
) -> io::Result<MemoryRow> {
    let rss = || Sample::of(server_pid).map(|s| s.rss_kib);
    let target = target.clone().with_deflate(true);
    let mut rng = Rng::seeded();
    // A first connection and echo build the loop's lazily made state (its compressor): not
    // the cost of a connection.
    let (mut warm, leftover) = open_any(&target, Duration::from_secs(5), &mut rng)?;
    echo(&mut warm, leftover, size)?;
    drop(warm);
    std::thread::sleep(SETTLE);
    let before = rss()?;
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        open.push(open_any(&target, Duration::from_secs(5), &mut rng)?);
    }
    std::thread::sleep(SETTLE);
    let idle = rss()?;
    let compressing = open.iter().filter(|(o, _)| o.deflate).count();
    let mut wire = 0;
    for (opened, leftover) in &mut open {
        wire += echo(opened, std::mem::take(leftover), size)?;
    }
    std::thread::sleep(SETTLE);
    let active = rss()?;
    drop(open);
    let per = |kib: u64| (kib as f64 - before as f64) / count.max(1) as f64;
    Ok(MemoryRow {
        server: name.into(),
        connections: count,
        compressing,
        idle_kib_per_conn: per(idle),
        active_kib_per_conn: per(active),
        echo_wire_bytes: wire as f64 / count.max(1) as f64,
    })
}

/// Sends one JSON message of `size` bytes (compressed if agreed) and reads its echo whole;
/// the echo's bytes on the wire.
fn echo(opened: &mut Opened, mut pending: Vec<u8>, size: usize) -> io::Result<usize> {
    if opened.tls.is_some() {
        return Err(io::Error::other("this experiment has no TLS"));
    }
    let payload = json(size);
    let frame = match opened.deflate {
        true => freeboard_test::frame(0xc1, &deflate(&payload), freeboard_test::TEST_MASK),
        false => freeboard_test::frame(0x81, &payload, freeboard_test::TEST_MASK),
    };
    let s = &mut opened.tcp;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&frame)?;
    let mut buf = [0u8; 16 << 10];
    loop {
        match freeboard_test::parse_frame(&pending).map_err(io::Error::other)? {
            Some((header, payload)) => {
                if header.rsv & 0b100 != 0 && !opened.deflate {
                    return Err(io::Error::other("a compressed echo on a plain connection"));
                }
                return Ok(payload.end);
            }
            None => match s.read(&mut buf)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => pending.extend_from_slice(&buf[..n]),
            },
        }
    }
}

/// The memory rows as JSON.
pub fn memory_json(rows: &[MemoryRow]) -> String {
    serde_json::to_string_pretty(rows).unwrap_or_default()
}

/// The median and the range of `values`.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    match values {
        [] => (0.0, 0.0, 0.0),
        v => (v[v.len() / 2], v[0], v[v.len() - 1]),
    }
}

/// The memory table: per server, medians [min–max] over its runs, and the ratio of its
/// medians to the first server's.
pub fn memory_markdown(rows: &[MemoryRow]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.server.as_str()) {
            names.push(&r.server);
        }
    }
    let mut s = String::from(
        "\n### memory per compressing connection (RSS growth; median [min–max] over runs)\n\n\
         | server | connections | compressing | idle KiB/conn | active KiB/conn (after one echo) | active ÷ first server's | echo bytes on the wire |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut base = None;
    for name in names {
        let runs: Vec<&MemoryRow> = rows.iter().filter(|r| r.server == name).collect();
        let (idle, idle_lo, idle_hi) =
            spread(&mut runs.iter().map(|r| r.idle_kib_per_conn).collect::<Vec<_>>());
        let (active, lo, hi) =
            spread(&mut runs.iter().map(|r| r.active_kib_per_conn).collect::<Vec<_>>());
        let base = *base.get_or_insert(active);
        let ratio = if base > 0.0 { format!("{:.2}", active / base) } else { "–".into() };
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {idle:.2} [{idle_lo:.2}–{idle_hi:.2}] | {active:.2} [{lo:.2}–{hi:.2}] | {ratio} | {:.0} |",
            runs[0].connections, runs[0].compressing, runs[0].echo_wire_bytes
        );
    }
    s
}

/// The broadcast table with compressing subscribers beside plain ones: per case and
/// server, medians [min–max] of deliveries/s and of the server's CPU per publication, and
/// the ratio of each to the plain subscribers' in the same run.
pub fn broadcast_markdown(rows: &[BroadcastRow]) -> String {
    let mut s = String::from(
        "\n### broadcast with permessage-deflate (median [min–max] over interleaved runs)\n\n\
         | subscribers | size B | subscribers offer | compressing | deliveries/s | ÷ plain | server CPU µs/publication | ÷ plain | bytes/delivery |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut cases: Vec<(usize, usize)> = Vec::new();
    for r in rows {
        if !cases.contains(&(r.subscribers, r.size)) {
            cases.push((r.subscribers, r.size));
        }
    }
    for (n, size) in cases {
        let mut plain = None;
        for offer in [false, true] {
            let runs: Vec<&BroadcastRow> = rows
                .iter()
                .filter(|r| {
                    (r.subscribers, r.size, r.server.ends_with("+deflate")) == (n, size, offer)
                })
                .collect();
            let Some(first) = runs.first() else { continue };
            let (rate, rate_lo, rate_hi) =
                spread(&mut runs.iter().map(|r| r.deliveries_per_sec).collect::<Vec<_>>());
            let mut cpus: Vec<f64> = runs.iter().filter_map(|r| r.server_cpu_us_per_msg).collect();
            let (cpu, cpu_lo, cpu_hi) = spread(&mut cpus);
            let cpu_text = match cpus.is_empty() {
                true => "–".to_string(),
                false => format!("{cpu:.0} [{cpu_lo:.0}–{cpu_hi:.0}]"),
            };
            let (bytes, _, _) =
                spread(&mut runs.iter().map(|r| r.wire_bytes_per_delivery).collect::<Vec<_>>());
            let ratio = |x: f64, base: f64| match base > 0.0 && x > 0.0 {
                true => format!("{:.2}", x / base),
                false => "–".to_string(),
            };
            let (rate_ratio, cpu_ratio) = match plain {
                Some((r0, c0)) => (ratio(rate, r0), ratio(cpu, c0)),
                None => ("–".into(), "–".into()),
            };
            plain.get_or_insert((rate, cpu));
            let _ = writeln!(
                s,
                "| {n} | {size} | {} | {} | {rate:.0} [{rate_lo:.0}–{rate_hi:.0}] | {rate_ratio} | {cpu_text} | {cpu_ratio} | {bytes:.0} |",
                if offer { "permessage-deflate" } else { "nothing" },
                first.compressing,
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_is_json_of_the_size_asked_and_compresses() {
        let j = json(4096);
        assert_eq!(j.len(), 4096);
        assert!(j.starts_with(br#"[{"match":1000,"#));
        let z = deflate(&j);
        assert!(z.len() * 3 < j.len(), "{} bytes", z.len());
        assert_eq!(json(4096), j);
    }
}
