//! Connection churn: connect, upgrade, close, again and again, from several threads.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::ws::WsClient;

/// What the churn saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Cycles that completed the upgrade and the close handshake (1000 answered with 1000,
    /// then the server's EOF).
    pub closed: usize,
    /// Cycles that only connected and hung up before sending anything.
    pub bare: usize,
    /// Cycles that went wrong, with the first error.
    pub failed: usize,
    /// The first failure.
    pub first_failure: Option<String>,
    /// How long the whole churn took.
    pub elapsed: Duration,
}

/// Runs `cycles` cycles over `threads` threads. Every fourth cycle connects and hangs up
/// without a request; the others upgrade, close with 1000 and wait for the server's EOF.
pub fn run(addr: SocketAddr, cycles: usize, threads: usize) -> Outcome {
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut outcome = Outcome::default();
                for i in (t..cycles).step_by(threads) {
                    if i % 4 == 3 {
                        match TcpStream::connect(addr) {
                            Ok(_) => outcome.bare += 1,
                            Err(e) => fail(&mut outcome, format!("connect: {e}")),
                        }
                        continue;
                    }
                    let closed = WsClient::handshake(addr, &crate::upgrade_request("/echo", ""))
                        .and_then(|(client, status, head)| {
                            if status != 101 {
                                return Err(std::io::Error::other(head));
                            }
                            client.close(1000)
                        });
                    match closed {
                        Ok(Some(1000)) => outcome.closed += 1,
                        other => fail(&mut outcome, format!("cycle {i}: {other:?}")),
                    }
                }
                outcome
            })
        })
        .collect();
    let mut total = Outcome::default();
    for worker in workers {
        let o = worker.join().expect("churn worker");
        total.closed += o.closed;
        total.bare += o.bare;
        total.failed += o.failed;
        total.first_failure = total.first_failure.or(o.first_failure);
    }
    total.elapsed = start.elapsed();
    total
}

fn fail(outcome: &mut Outcome, what: String) {
    outcome.failed += 1;
    outcome.first_failure.get_or_insert(what);
}
