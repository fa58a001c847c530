//! Drives an Autobahn fuzzing server with freeboard's blocking client: every message is echoed
//! back until the server closes.
//!
//! ```text
//! kosoku -m fuzzingserver 127.0.0.1:9001 -x '12.*' -x '13.*' -o conformance/reports-client &
//! (or -i '12.*' -i '13.*' for permessage-deflate: `conformance/run --deflate client`)
//! cargo run --release -p freeboard --example autobahn_client -- ws://127.0.0.1:9001 freeboard
//! python3 conformance/check.py conformance/reports-client conformance/expected-client.json
//! ```
//!
//! It asks `/getCaseCount`, runs `/runCase?case=N&agent=AGENT` for every case, then asks
//! `/updateReports?agent=AGENT`. Over `wss://` (`conformance/run --tls` puts a TLS terminator
//! in front of the fuzzing server) a third argument names the CA file to trust.

use std::process::ExitCode;
use std::sync::OnceLock;

use freeboard::client::{Client, ClientConfig, ClientError, CloseCode, Event};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| "ws://127.0.0.1:9001".into());
    let agent = args.next().unwrap_or_else(|| "freeboard".into());
    let _ = CA.set(args.next());
    let base = base.trim_end_matches('/');
    match run(base, &agent) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("autobahn_client: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(base: &str, agent: &str) -> Result<(), ClientError> {
    let count = case_count(base)?;
    println!("running {count} cases against {base} as {agent}");
    for case in 1..=count {
        if let Err(e) = echo(&format!("{base}/runCase?case={case}&agent={agent}")) {
            eprintln!("case {case}: {e}");
        }
    }
    echo(&format!("{base}/updateReports?agent={agent}"))?;
    println!("reports updated");
    Ok(())
}

/// The CA file a `wss://` fuzzing server's certificate is checked against, if given.
static CA: OnceLock<Option<String>> = OnceLock::new();

fn config() -> ClientConfig {
    // Section 9 sends messages of up to 16 MiB, and may have several in flight.
    // permessage-deflate is offered (sections 12-13); every message is compressed, as the
    // conformance run expects (threshold 0).
    let config = ClientConfig::default()
        .memory(256 << 20)
        .limits(|limits| {
            limits
                .max_message_size(64 << 20)
                .send_low(32 << 20)
                .send_high(64 << 20)
                .send_cap(128 << 20)
        })
        .compression_threshold(0);
    match CA.get() {
        Some(Some(ca)) => config.ca_file(ca),
        _ => config,
    }
}

fn case_count(base: &str) -> Result<u32, ClientError> {
    let mut client = Client::connect(&format!("{base}/getCaseCount"), config())?;
    let count = match client.recv()? {
        Event::Message(m) => m.to_text().and_then(|t| t.trim().parse().ok()),
        Event::Closed(_) => None,
    };
    let _ = client.close(CloseCode::NORMAL, "");
    while let Ok(Event::Message(_)) = client.recv() {}
    count.ok_or_else(|| ClientError::Config("the server sent no case count".into()))
}

/// Echoes every message, text as text and binary as binary, until the connection closes.
fn echo(url: &str) -> Result<(), ClientError> {
    let mut client = Client::connect(url, config())?;
    loop {
        let (kind, payload) = match client.recv()? {
            Event::Message(m) => (m.kind(), m.to_vec()),
            Event::Closed(_) => return Ok(()),
        };
        // Sends fail once the server has started closing; the close event follows.
        let _ = client.send_owned(kind, payload);
    }
}
