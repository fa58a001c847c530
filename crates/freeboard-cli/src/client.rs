//! `freeboard client URL`: stdin lines become messages, received messages go to stdout;
//! `--listen` only receives, `--ping` keeps the connection checked, `--reconnect` comes back
//! after a drop, and Ctrl-C (or SIGTERM) closes with 1000 and waits briefly for the answer.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use freeboard::client::{
    Client, ClientConfig, ClientError, CloseCode, Event, MessageKind, PushOutcome, SendOutcome,
    Subscription, SubscriptionEvent,
};

/// Exit statuses, as documented in `--help`.
const EXIT_CLEAN: u8 = 0;
const EXIT_CONNECT: u8 = 1;
const EXIT_ABNORMAL: u8 = 3;
const EXIT_ERROR_CODE: u8 = 4;
const EXIT_LOCAL_IO: u8 = 5;

/// The help text's exit-status table.
pub(crate) const EXIT_CODES: &str = "\
Exit status:
  0  the connection closed cleanly with 1000 (normal), 1001 (going away) or 1005 (no code)
  1  could not connect: bad URL, DNS, TCP, TLS (untrusted certificate, wrong name), timeout,
     or the server refused the upgrade (its status and body are printed)
  2  usage error
  3  the connection ended abnormally: no close handshake (1006), socket error, timeout
  4  the connection closed with another code (e.g. 1002, 1008, 1009, 1011, 4000): printed
  5  reading stdin or writing stdout failed
Ctrl-C or SIGTERM sends close 1000 and waits up to 2 s for the server's answer (exit 0 if it
came). With --reconnect, 1, 3 and a close with 1001 (going away: a server restarting), 1012
(service restart) or 1013 (try again later) lead to another attempt instead of an exit.";

/// How long Ctrl-C waits for the server's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Options of `freeboard client`.
#[derive(Args)]
pub(crate) struct ClientArgs {
    /// The server: ws:// or wss://host[:port][/path][?query]; IPv6 as ws://[::1]:9001/.
    /// Without a scheme, ws:// is assumed (`localhost:9001/echo`); a port alone is a server
    /// on this machine (`9001`: ws://127.0.0.1:9001/).
    #[arg(value_name = "URL")]
    url: String,
    /// Send each stdin line as a binary message (default: text; lines must be UTF-8).
    #[arg(long)]
    binary: bool,
    /// An extra request header, e.g. --header 'Authorization: Bearer t0k3n' (repeatable).
    #[arg(long = "header", value_name = "NAME:VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// A subprotocol to offer, most preferred first (repeatable).
    #[arg(long = "subprotocol", value_name = "NAME")]
    subprotocols: Vec<String>,
    /// Close (1000) after receiving N messages; without it, close when stdin ends.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Wait MS milliseconds between two messages sent.
    #[arg(long, value_name = "MS")]
    interval: Option<u64>,
    /// Seconds allowed for the TCP connection, then again for the opening handshake.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
    /// Largest message received; a larger one closes the connection with 1009.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    max_message_size: usize,
    /// wss://: trust only the CA certificates in this PEM file (default: the operating
    /// system's roots).
    #[arg(long, value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// wss://: accept any certificate, unverified (prints a warning). For tests only.
    #[arg(long, conflicts_with = "ca")]
    insecure: bool,
    /// Do not offer permessage-deflate (offered by default; the agreed parameters are
    /// printed to stderr).
    #[arg(long)]
    no_compression: bool,
    /// Only receive: do not read stdin, stay connected until the server closes or Ctrl-C
    /// (for a subscriber started in the background, `freeboard client --listen URL &`).
    #[arg(long)]
    listen: bool,
    /// Ping after this long without input (seconds, or 30s, 1m); no pong within 10 s ends
    /// the connection as abnormal (exit 3, or a reconnect).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration)]
    ping: Option<Duration>,
    /// Connect again after a failed connect, an abnormal end, or a close with 1001 (going
    /// away: a server restarting or deploying), 1011, 1012 (service restart) or 1013 (try
    /// again later): after about 0.25 s, then twice as long each time up to 30 s, each wait
    /// drawn at random between half and all of it (so clients that lost one server do not all
    /// come back at once; reset by a connection that delivered a message); stops on a close
    /// with 1000 or another code, a usage error or Ctrl-C. On a history topic it resumes:
    /// it reconnects with `?since=` the last offset received, drops a message whose offset
    /// it already printed, and prints the payloads without their envelope; a close with 4410
    /// (cannot resume from there) is said on stderr and the subscription starts afresh.
    #[arg(long)]
    reconnect: bool,
    /// With --reconnect: print each message of a history topic as `OFFSET:payload`, the
    /// envelope as the server sent it (a message without one is printed as it came).
    #[arg(long, requires = "reconnect")]
    offsets: bool,
    /// Show the connection on stderr: the address, the request and the server's `101`
    /// answer (headers), the subprotocol and the extensions agreed, each close and reconnect.
    #[arg(short, long)]
    verbose: bool,
}

/// What a connection's end leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Exit with this status (with --reconnect too).
    Exit(u8),
    /// Exit with this status, or connect again with --reconnect.
    Retry(u8),
}

/// The URL `given` names: with `ws://` assumed when it has no scheme, and a bare port taken as
/// `ws://127.0.0.1:PORT/`.
fn websocket_url(given: &str) -> String {
    if given.parse::<u16>().is_ok() {
        return format!("ws://127.0.0.1:{given}/");
    }
    match given.contains("://") {
        true => given.to_owned(),
        false => format!("ws://{given}"),
    }
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once(':').ok_or("expected NAME:VALUE")?;
    let name = name.trim();
    if name.is_empty() || name.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(format!("invalid header name {name:?}"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

/// Runs the client; the exit status says how the connection ended.
pub(crate) fn run(args: ClientArgs) -> ExitCode {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(signal, interrupted.clone()) {
            eprintln!("freeboard client: cannot handle signal {signal}: {e}");
        }
    }
    let lines = (!args.listen).then(spawn_stdin_reader);
    let url = websocket_url(&args.url);
    if args.verbose && url != args.url {
        eprintln!("freeboard client: {:?} taken as {url}", args.url);
    }
    if args.reconnect {
        return run_resuming(&args, &url, lines.as_ref(), &interrupted);
    }
    let status = match session(&args, &url, lines.as_ref(), &interrupted) {
        Ok(Ending::Exit(status) | Ending::Retry(status)) => status,
        Err(e) => {
            eprintln!("freeboard client: {e}");
            match e {
                ClientError::Io(_) => EXIT_ABNORMAL,
                e if e.is_connect_failure() => EXIT_CONNECT,
                _ => EXIT_ABNORMAL,
            }
        }
    };
    ExitCode::from(status)
}

/// One connection to `url`, until it ends; the exit status it earns, and whether
/// `--reconnect` tries again.
fn session(
    args: &ClientArgs,
    url: &str,
    lines: Option<&Receiver<io::Result<Vec<u8>>>>,
    interrupted: &AtomicBool,
) -> Result<Ending, ClientError> {
    let config = client_config(args)?;
    if args.verbose {
        eprintln!("freeboard client: connecting to {url}");
    }
    let mut client = Client::connect(url, config)?;
    describe(&client, args.verbose);

    let interval = Duration::from_millis(args.interval.unwrap_or(0));
    let kind = if args.binary { MessageKind::Binary } else { MessageKind::Text };
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut next_send = Instant::now();
    let mut received = 0u64;
    let mut stdin_open = lines.is_some();
    let mut closing = false;
    let mut close_deadline = None;
    loop {
        if interrupted.load(Ordering::Relaxed) && !closing {
            // Ctrl-C: the server hears a normal close rather than a dropped connection.
            client.close(CloseCode::NORMAL, "")?;
            closing = true;
            close_deadline = Some(Instant::now() + CLOSE_WAIT);
        }
        if close_deadline.is_some_and(|at| Instant::now() >= at) {
            eprintln!("freeboard client: no close answer within {} s", CLOSE_WAIT.as_secs());
            return Ok(Ending::Exit(EXIT_ABNORMAL));
        }
        // Send what stdin has, paced by --interval.
        while let Some(lines) =
            lines.filter(|_| stdin_open && !closing && Instant::now() >= next_send)
        {
            match lines.try_recv() {
                Ok(Ok(line)) => {
                    if !send_line(&mut client, kind, line)? {
                        continue;
                    }
                    next_send = Instant::now() + interval;
                }
                Ok(Err(e)) => {
                    eprintln!("freeboard client: reading stdin: {e}");
                    return Ok(Ending::Exit(EXIT_LOCAL_IO));
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => stdin_open = false,
            }
        }
        if lines.is_some() && !stdin_open && !closing && args.count.is_none() {
            client.close(CloseCode::NORMAL, "")?;
            closing = true;
        }
        // Wait for the server a little at a time: stdin may bring more, Ctrl-C may come.
        let tick = Duration::from_millis(100);
        let wait = if closing || !stdin_open {
            tick
        } else {
            next_send
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(5), tick)
        };
        let wait = Some(wait);
        match client.recv_timeout(wait)? {
            None => {}
            Some(Event::Message(message)) => {
                let written = message
                    .segments()
                    .try_for_each(|s| out.write_all(s))
                    .and_then(|()| out.write_all(b"\n"))
                    .and_then(|()| out.flush());
                if let Err(e) = written {
                    eprintln!("freeboard client: writing stdout: {e}");
                    return Ok(Ending::Exit(EXIT_LOCAL_IO));
                }
                received += 1;
                if args.count.is_some_and(|n| received >= n) && !closing {
                    client.close(CloseCode::NORMAL, "")?;
                    closing = true;
                }
            }
            Some(Event::Closed(close)) => {
                // A server going away or restarting (1001, 1012) or asking for patience
                // (1013) is where a subscriber most wants to come back.
                let come_back = matches!(
                    close.code,
                    CloseCode::GOING_AWAY | CloseCode::SERVICE_RESTART | CloseCode::TRY_AGAIN_LATER
                ) && !closing;
                let normal = matches!(
                    close.code,
                    CloseCode::NORMAL | CloseCode::GOING_AWAY | CloseCode::NO_STATUS
                );
                if args.verbose || !(close.was_clean && normal) || (come_back && args.reconnect) {
                    eprintln!(
                        "freeboard client: closed {} with {} {:?}",
                        if close.was_clean { "cleanly" } else { "abnormally" },
                        close.code,
                        close.reason
                    );
                }
                return Ok(match (close.was_clean, normal, come_back) {
                    (false, _, _) => Ending::Retry(EXIT_ABNORMAL),
                    (true, true, true) => Ending::Retry(EXIT_CLEAN),
                    (true, true, false) => Ending::Exit(EXIT_CLEAN),
                    (true, false, true) => Ending::Retry(EXIT_ERROR_CODE),
                    (true, false, false) => Ending::Exit(EXIT_ERROR_CODE),
                });
            }
        }
    }
}

/// Says on stderr what the handshake agreed: everything with `-v`, else the extensions.
fn describe(client: &Client, verbose: bool) {
    if verbose {
        let heads = client.handshake();
        for (what, head) in [("sent", &heads.request), ("received", &heads.response)] {
            eprintln!("freeboard client: {what}:");
            for line in head.lines().filter(|l| !l.is_empty()) {
                eprintln!("  {line}");
            }
        }
        eprintln!("freeboard client: subprotocol: {}", client.protocol().unwrap_or("none"));
        let extensions = client.compression().map(|a| a.response().to_string());
        eprintln!("freeboard client: extensions: {}", extensions.as_deref().unwrap_or("none"));
    } else if let Some(agreed) = client.compression() {
        eprintln!("freeboard client: {}", agreed.response());
    }
}

/// The client's configuration from the command line.
fn client_config(args: &ClientArgs) -> Result<ClientConfig, ClientError> {
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .map_err(|e| ClientError::Config(format!("--timeout: {e}")))?;
    let mut config = ClientConfig::default()
        .connect_timeout(timeout)
        .limits(|limits| {
            limits
                .handshake_timeout(timeout)
                .max_message_size(args.max_message_size)
                .idle_timeout(args.ping)
        })
        .memory((args.max_message_size * 2).max(32 << 20))
        .compression(!args.no_compression);
    config.headers = args.headers.clone();
    config.protocols = args.subprotocols.clone();
    if let Some(ca) = &args.ca {
        config = config.ca_file(ca);
    }
    if args.insecure {
        eprintln!(
            "freeboard client: warning: --insecure: the server's certificate is not verified; \
             anyone on the path can read and change this connection"
        );
        config = config.insecure(true);
    }
    Ok(config)
}

/// `--reconnect`: one [`Subscription`] that resumes with `since` until it stops, Ctrl-C comes
/// or `--count` messages arrived; stdin lines are sent while a connection is open.
fn run_resuming(
    args: &ClientArgs,
    url: &str,
    lines: Option<&Receiver<io::Result<Vec<u8>>>>,
    interrupted: &AtomicBool,
) -> ExitCode {
    let config = match client_config(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("freeboard client: {e}");
            return ExitCode::from(EXIT_CONNECT);
        }
    };
    let kind = if args.binary { MessageKind::Binary } else { MessageKind::Text };
    let interval = Duration::from_millis(args.interval.unwrap_or(0));
    let mut feed = Subscription::new(url, config);
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut received = 0u64;
    let mut next_send = Instant::now();
    let mut stdin_open = lines.is_some();
    // The status the last connection's end earned, should Ctrl-C come during a wait.
    let mut status = EXIT_CLEAN;
    loop {
        let done = args.count.is_some_and(|n| received >= n) || (lines.is_some() && !stdin_open);
        if interrupted.load(Ordering::Relaxed) || done {
            let open = feed.client().is_some();
            return match feed.close() {
                Ok(()) if open => ExitCode::from(EXIT_CLEAN),
                Ok(()) => ExitCode::from(status),
                Err(_) => ExitCode::from(EXIT_ABNORMAL),
            };
        }
        while let Some(lines) = lines.filter(|_| stdin_open && Instant::now() >= next_send) {
            let Some(client) = feed.client() else { break };
            match lines.try_recv() {
                Ok(Ok(line)) => {
                    // A send on a connection that just failed is lost with it: the
                    // subscription reports the end at its next event.
                    if let Ok(true) = send_line(client, kind, line) {
                        next_send = Instant::now() + interval;
                    }
                }
                Ok(Err(e)) => {
                    eprintln!("freeboard client: reading stdin: {e}");
                    return ExitCode::from(EXIT_LOCAL_IO);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => stdin_open = false,
            }
        }
        let event = match feed.recv_timeout(Duration::from_millis(50)) {
            Ok(Some(event)) => event,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("freeboard client: {e}");
                return ExitCode::from(EXIT_CONNECT);
            }
        };
        match event {
            SubscriptionEvent::Opened { since } => {
                let since = since.map(|s| s.to_string());
                if let Some(client) = feed.client() {
                    describe(client, args.verbose);
                }
                if let (true, Some(since)) = (args.verbose, since) {
                    eprintln!("freeboard client: resuming after {since}");
                }
            }
            SubscriptionEvent::Message { offset, payload, .. } => {
                let written = match (args.offsets, offset) {
                    (true, Some(offset)) => write!(out, "{offset}:"),
                    _ => Ok(()),
                }
                .and_then(|()| out.write_all(payload))
                .and_then(|()| out.write_all(b"\n"))
                .and_then(|()| out.flush());
                if let Err(e) = written {
                    eprintln!("freeboard client: writing stdout: {e}");
                    return ExitCode::from(EXIT_LOCAL_IO);
                }
                received += 1;
            }
            SubscriptionEvent::Gone { last } => {
                let last = last.map_or("(none)".to_owned(), |l| l.to_string());
                eprintln!(
                    "freeboard client: cannot resume after {last} (4410): what was published \
                     meanwhile is gone; going on from the current stream"
                );
            }
            SubscriptionEvent::Reconnecting { after, cause } => {
                eprintln!("freeboard client: {cause}");
                eprintln!("freeboard client: reconnecting in {:.1} s", after.as_secs_f64());
                status = match cause.contains("closed with") {
                    true => EXIT_ABNORMAL,
                    false => EXIT_CONNECT,
                };
            }
            SubscriptionEvent::Failed(e) => {
                eprintln!("freeboard client: {e}");
                return ExitCode::from(EXIT_CONNECT);
            }
            SubscriptionEvent::Closed(close) => {
                let normal = matches!(close.code, CloseCode::NORMAL | CloseCode::NO_STATUS);
                if args.verbose || !(close.was_clean && normal) {
                    eprintln!(
                        "freeboard client: closed {} with {} {:?}",
                        if close.was_clean { "cleanly" } else { "abnormally" },
                        close.code,
                        close.reason
                    );
                }
                return ExitCode::from(match normal && close.was_clean {
                    true => EXIT_CLEAN,
                    false => EXIT_ERROR_CODE,
                });
            }
        }
    }
}

/// Sends one stdin line; `false` if it was skipped (not UTF-8 in text mode).
fn send_line(client: &mut Client, kind: MessageKind, line: Vec<u8>) -> Result<bool, ClientError> {
    if kind == MessageKind::Text && std::str::from_utf8(&line).is_err() {
        eprintln!("freeboard client: skipped a line that is not UTF-8 (use --binary)");
        return Ok(false);
    }
    let mut pushed = client.send(kind, &line)?;
    while let SendOutcome::Queue(PushOutcome::WouldBlock { .. }) = pushed {
        // The send queue is full: wait until the socket takes some of it, then retry.
        client.flush(Some(Duration::from_millis(100)))?;
        pushed = client.send(kind, &line)?;
    }
    if let SendOutcome::Queue(PushOutcome::Dropped { .. }) = pushed {
        eprintln!("freeboard client: a message larger than the send queue's cap was dropped");
    }
    Ok(true)
}

/// Reads stdin lines (without their `\n` or `\r\n`) on a thread; the channel closes at EOF.
fn spawn_stdin_reader() -> Receiver<io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if line.ends_with(b"\n") {
                        line.pop();
                        if line.ends_with(b"\r") {
                            line.pop();
                        }
                    }
                    if tx.send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_scheme_is_ws() {
        assert_eq!(websocket_url("127.0.0.1:9001"), "ws://127.0.0.1:9001");
        assert_eq!(websocket_url("localhost:9001/echo"), "ws://localhost:9001/echo");
        assert_eq!(websocket_url("9001"), "ws://127.0.0.1:9001/");
        assert_eq!(websocket_url("wss://example.com/"), "wss://example.com/");
    }

    #[test]
    fn headers_are_name_colon_value() {
        assert_eq!(
            parse_header("Authorization: Bearer a:b").unwrap(),
            ("Authorization".to_owned(), "Bearer a:b".to_owned())
        );
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: x").is_err());
        assert!(parse_header(": x").is_err());
    }
}
