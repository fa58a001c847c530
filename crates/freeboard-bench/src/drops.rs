//! Delivery under repeated network drops (`freeboard bench drops`): N subscribers of one
//! history topic per client kind, a publisher at a steady rate, and every subscriber's
//! connection cut every few seconds by a loopback proxy that then refuses connections for the
//! outage (`freeboard_test::proxy::CutProxy`), all kinds cut at the same moments in the same
//! run:
//! - `resuming`: [`freeboard::client::Subscription`] (reconnects with `since`, drops repeated
//!   offsets);
//! - `baseline`: freeboard's client reconnecting the usual way, without `since`;
//! - `node-ws`: Node's `ws` with its usual reconnect loop (interop/node), when Node and the
//!   package are there.
//!
//! Every kind waits between attempts the same way (250 ms doubling to 30 s, equal jitter,
//! reset by a delivery). Reported per kind: delivered % (distinct publications received of
//! those published, over all subscribers), duplicates (publications received more than once),
//! reconnects, and the resume latency: from the end of an outage to the subscriber's first
//! delivery after it (p50, p99).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use freeboard::client::resume::{Backoff, Next, Resume};
use freeboard::client::{Client, ClientConfig, CloseCode, Event, Subscription, SubscriptionEvent};
use freeboard_test::proxy::CutProxy;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Subscribers per kind.
    pub subscribers: usize,
    /// Publications per second.
    pub rate: u32,
    /// How long the publisher publishes.
    pub duration: Duration,
    /// Time between two drops.
    pub every: Duration,
    /// How long the network stays down at each drop.
    pub outage: Duration,
    /// Seeds the jitter of the Rust clients.
    pub seed: u64,
}

/// One kind's figures.
#[derive(Debug, Clone)]
pub struct Row {
    /// `resuming`, `baseline` or `node-ws`.
    pub kind: &'static str,
    /// Subscribers.
    pub subscribers: usize,
    /// Publications published.
    pub published: u64,
    /// Distinct publications received, over all subscribers, per cent of `published` ×
    /// `subscribers`.
    pub delivered_pct: f64,
    /// Publications received more than once (each extra copy counted).
    pub duplicates: u64,
    /// Connections opened after the first, over all subscribers.
    pub reconnects: u64,
    /// Resume latency percentiles (p50, p99), over every subscriber and outage.
    pub resume_ms: (f64, f64),
    /// Drops (each cut every connection of the kind).
    pub drops: usize,
}

/// Each subscriber's deliveries: (publication number, when).
type Deliveries = Arc<Mutex<Vec<Vec<(u64, Instant)>>>>;

/// Runs the plan against a `freeboard serve` started from `freeboard` (with history), with
/// Node's `ws` kind when `node_script` is given; one row per kind.
pub fn run(plan: &Plan, freeboard: &Path, node_script: Option<&Path>) -> Result<Vec<Row>, String> {
    let mut server = Server::start(freeboard)?;
    let url_of = |proxy: &CutProxy| format!("ws://{}/topic/drops", proxy.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let mut kinds: Vec<(&'static str, CutProxy, Deliveries, Arc<AtomicU64>)> = Vec::new();
    let mut threads = Vec::new();
    let mut node: Option<Child> = None;
    for kind in ["resuming", "baseline", "node-ws"] {
        if kind == "node-ws" && node_script.is_none() {
            continue;
        }
        let proxy = CutProxy::start(server.addr);
        let url = url_of(&proxy);
        let deliveries: Deliveries = Arc::new(Mutex::new(vec![Vec::new(); plan.subscribers]));
        let opened = Arc::new(AtomicU64::new(0));
        match kind {
            "node-ws" => {
                let script = node_script.unwrap();
                let mut child = Command::new("node")
                    .arg(script)
                    .args([&url, &plan.subscribers.to_string()])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("node {}: {e}", script.display()))?;
                let out = child.stdout.take().unwrap();
                let (deliveries, opened) = (Arc::clone(&deliveries), Arc::clone(&opened));
                threads.push(thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        let Some((i, rest)) = line.split_once(' ') else { continue };
                        let Ok(i) = i.parse::<usize>() else { continue };
                        if rest == "open" {
                            opened.fetch_add(1, Ordering::Relaxed);
                        } else if let Some(seq) = publication(rest.as_bytes()) {
                            deliveries.lock().unwrap()[i].push((seq, Instant::now()));
                        }
                    }
                }));
                node = Some(child);
            }
            _ => {
                for i in 0..plan.subscribers {
                    let (deliveries, opened, stop) =
                        (Arc::clone(&deliveries), Arc::clone(&opened), Arc::clone(&stop));
                    let (url, seed) = (url.clone(), plan.seed ^ ((i as u64 + 1) * 0x9e37));
                    let resuming = kind == "resuming";
                    threads.push(thread::spawn(move || {
                        let record =
                            |seq| deliveries.lock().unwrap()[i].push((seq, Instant::now()));
                        match resuming {
                            true => resuming_subscriber(&url, seed, &stop, &opened, record),
                            false => baseline_subscriber(&url, seed, &stop, &opened, record),
                        }
                    }));
                }
            }
        }
        kinds.push((kind, proxy, deliveries, opened));
    }
    // Every subscriber sees a warm-up publication before the run starts.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let all_in =
            kinds.iter().all(|(_, _, d, _)| d.lock().unwrap().iter().all(|s| !s.is_empty()));
        if all_in {
            break;
        }
        if Instant::now() > until {
            return Err("the subscribers never all received a warm-up publication".into());
        }
        server.publish("d-warm")?;
        thread::sleep(Duration::from_millis(100));
    }
    for (_, _, deliveries, opened) in &kinds {
        deliveries.lock().unwrap().iter_mut().for_each(Vec::clear);
        opened.store(0, Ordering::Relaxed);
    }

    // The publisher, and the drops.
    let started = Instant::now();
    let publisher = {
        let (addr, rate, duration) = (server.addr, plan.rate.max(1), plan.duration);
        thread::spawn(move || -> Result<u64, String> {
            let mut publisher = Server { addr, child: None };
            let mut seq = 0u64;
            while started.elapsed() < duration {
                publisher.publish(&format!("d{seq}"))?;
                seq += 1;
                let due = started + Duration::from_secs_f64(seq as f64 / rate as f64);
                thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            Ok(seq)
        })
    };
    let mut outage_ends = Vec::new();
    while started.elapsed() + plan.every < plan.duration {
        thread::sleep(plan.every.saturating_sub(plan.outage));
        for (_, proxy, _, _) in &kinds {
            proxy.down(true);
            proxy.cut();
        }
        thread::sleep(plan.outage);
        for (_, proxy, _, _) in &kinds {
            proxy.down(false);
        }
        outage_ends.push(Instant::now());
    }
    let published = publisher.join().map_err(|_| "the publisher panicked")??;
    // Settled: nothing received for 3 s (30 s at most).
    let total = || -> usize {
        kinds.iter().map(|(_, _, d, _)| d.lock().unwrap().iter().map(Vec::len).sum::<usize>()).sum()
    };
    let settle = Instant::now();
    let mut last = (total(), Instant::now());
    while last.1.elapsed() < Duration::from_secs(3) && settle.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(100));
        if total() != last.0 {
            last = (total(), Instant::now());
        }
    }
    stop.store(true, Ordering::Relaxed);
    drop(node);
    let rows = kinds
        .iter()
        .map(|(kind, _, deliveries, opened)| {
            let deliveries = deliveries.lock().unwrap();
            let mut distinct = 0u64;
            let mut duplicates = 0u64;
            let mut resume = Vec::new();
            for got in deliveries.iter() {
                let mut seen = vec![false; published as usize];
                for &(seq, _) in got {
                    match seen.get_mut(seq as usize) {
                        Some(s) if *s => duplicates += 1,
                        Some(s) => {
                            *s = true;
                            distinct += 1;
                        }
                        None => {}
                    }
                }
                for end in &outage_ends {
                    if let Some((_, at)) = got.iter().find(|(_, at)| at > end) {
                        resume.push(at.duration_since(*end).as_secs_f64() * 1e3);
                    }
                }
            }
            resume.sort_by(f64::total_cmp);
            let pct = |p: f64| match resume.len() {
                0 => f64::NAN,
                n => resume[((n - 1) as f64 * p).round() as usize],
            };
            let subscribers = deliveries.len();
            Row {
                kind,
                subscribers,
                published,
                delivered_pct: 100.0 * distinct as f64
                    / (published * subscribers as u64).max(1) as f64,
                duplicates,
                reconnects: opened.load(Ordering::Relaxed),
                resume_ms: (pct(0.5), pct(0.99)),
                drops: outage_ends.len(),
            }
        })
        .collect();
    server.stop();
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown(plan: &Plan, rows: &[Row]) -> String {
    let outages = rows.first().map_or(0, |r| r.drops);
    let mut out = format!(
        "Delivery under drops: {} subscribers per kind, {} publications/s for {:.0} s, every \
         connection cut every {:.1} s with the network down {:.1} s ({outages} drops)\n\n\
         | client | delivered | duplicates | reconnects | resume p50 | resume p99 |\n\
         |---|---:|---:|---:|---:|---:|\n",
        plan.subscribers,
        plan.rate,
        plan.duration.as_secs_f64(),
        plan.every.as_secs_f64(),
        plan.outage.as_secs_f64(),
    );
    for row in rows {
        out += &format!(
            "| {} | {:.3} % | {} | {} | {:.0} ms | {:.0} ms |\n",
            row.kind,
            row.delivered_pct,
            row.duplicates,
            row.reconnects,
            row.resume_ms.0,
            row.resume_ms.1
        );
    }
    out
}

/// The number the warm-up publication (`d-warm`) is read as: beyond every real one.
const WARM: u64 = u64::MAX;

/// The publication number in `d{seq}` after the envelope, if any ([`WARM`] for `d-warm`).
fn publication(message: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(message).ok()?;
    let payload = text.rsplit_once(':').map_or(text, |(_, p)| p);
    match payload {
        "d-warm" => Some(WARM),
        _ => payload.strip_prefix('d')?.parse().ok(),
    }
}

/// The resuming client: a [`Subscription`] with the default backoff.
fn resuming_subscriber(
    url: &str,
    seed: u64,
    stop: &AtomicBool,
    opened: &AtomicU64,
    mut record: impl FnMut(u64),
) {
    let resume = Resume::with_seed(url, Backoff::default(), seed);
    let mut feed = Subscription::with_resume(resume, ClientConfig::default());
    while !stop.load(Ordering::Relaxed) {
        match feed.recv_timeout(Duration::from_millis(100)) {
            Ok(Some(SubscriptionEvent::Message { payload, .. })) => {
                if let Some(seq) = publication(payload) {
                    record(seq);
                }
            }
            Ok(Some(SubscriptionEvent::Opened { .. })) => {
                opened.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// The baseline: connect, read until the connection ends, wait, connect again, without
/// `since` (the same waits as the resuming client).
fn baseline_subscriber(
    url: &str,
    seed: u64,
    stop: &AtomicBool,
    opened: &AtomicU64,
    mut record: impl FnMut(u64),
) {
    // Only the backoff of `Resume` is used: it is never told an offset, so its URL has no
    // `since`.
    let mut waits = Resume::with_seed(url, Backoff::default(), seed);
    while !stop.load(Ordering::Relaxed) {
        let mut client = match Client::connect(url, ClientConfig::default()) {
            Ok(client) => client,
            Err(_) => {
                thread::sleep(waits.failed());
                continue;
            }
        };
        opened.fetch_add(1, Ordering::Relaxed);
        waits.opened();
        while !stop.load(Ordering::Relaxed) {
            match client.recv_timeout(Some(Duration::from_millis(100))) {
                Ok(Some(Event::Message(message))) => {
                    // Told as a message without an envelope: the backoff starts over after
                    // this connection, and no offset is kept.
                    waits.on_message(b"");
                    if let Some(seq) = publication(&message.to_vec()) {
                        record(seq);
                    }
                }
                Ok(None) => {}
                Ok(Some(Event::Closed(_))) | Err(_) => break,
            }
        }
        // NOTE: an abnormal close is always retried.
        if let Next::Reconnect(wait) = waits.closed(CloseCode::ABNORMAL) {
            thread::sleep(wait);
        }
    }
}

/// `freeboard serve --history` on loopback, or a publisher's handle on it.
struct Server {
    addr: SocketAddr,
    child: Option<Child>,
}

impl Server {
    fn start(freeboard: &Path) -> Result<Self, String> {
        let mut child = Command::new(freeboard)
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "1", "--memory", "256M"])
            .args(["--history", "100000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", freeboard.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ws://"))
            .and_then(|a| a.trim_end_matches('/').parse().ok())
            .ok_or_else(|| format!("no address from freeboard serve: {line:?}"))?;
        Ok(Self { addr, child: Some(child) })
    }

    /// `POST /topic/drops`.
    fn publish(&mut self, body: &str) -> Result<(), String> {
        let mut s = TcpStream::connect(self.addr).map_err(|e| format!("publish: {e}"))?;
        let request = format!(
            "POST /topic/drops HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).map_err(|e| format!("publish: {e}"))?;
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        match answer.starts_with("HTTP/1.1 200") {
            true => Ok(()),
            false => Err(format!("publish answered {:?}", answer.lines().next())),
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publications_are_read_with_or_without_an_envelope() {
        assert_eq!(publication(b"ab.17-3:d42"), Some(42));
        assert_eq!(publication(b"d7"), Some(7));
        assert_eq!(publication(b"d-warm"), Some(WARM));
        assert_eq!(publication(b"17-3:hello"), None);
    }
}
