//! The connect webhook (Centrifugo's proxy model): the application's backend decides each
//! topic upgrade. A bounded pool of worker threads posts the request's facts to the backend
//! with a timeout; the event loops never wait for it — they hand over the
//! [`Decision`] and go on.
//!
//! Bounds: `in_flight` requests to the backend at once (one per worker), a queue of at most
//! [`QUEUE`] waiting upgrades (beyond it 503 at once, `reason="webhook_busy"`), each request
//! at most `timeout` (then 503, `reason="webhook_timeout"`), and the server's
//! `max_pending_upgrades` over everything.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use freeboard::{Accepted, Decision};
use freeboard_proto::http;

use crate::Error;
use crate::config::WebhookConfig;
use crate::token::{Grant, unix_time};

/// Upgrades that may wait for a worker.
pub(crate) const QUEUE: usize = 1024;
/// The largest backend answer read.
const MAX_ANSWER: usize = 64 << 10;

/// Asks the application's backend whether a client may connect, and to what.
///
/// The backend gets `POST {url}` with a JSON body
/// `{"client":"203.0.113.7:0","path":"/topic/a?also=b","topics":["a","b"],"origin":…,"token":…}`
/// (`origin` and `token`, the bearer token, are `null` when absent) and answers:
/// - `200` with `{"subscribe":["a","b*"],"publish":[…],"expires_at":UNIX_SECONDS}` (every
///   field optional; without `subscribe` every topic asked for is granted; with
///   `expires_at` the connection is closed with 4001 then): accepted;
/// - `401` or `403`: refused with that status (`reason="webhook_refused"`);
/// - anything else, or nothing within the timeout: 503 (`webhook_error`, `webhook_timeout`).
///
/// Only `http://` URLs: keep the backend on loopback or a private network.
#[derive(Debug)]
pub struct ConnectWebhook {
    jobs: SyncSender<Job>,
}

struct Job {
    decision: Decision,
    body: String,
    topics: Vec<String>,
    /// The `since=` of a reconnecting subscriber: its history is made ready once accepted.
    since: Option<String>,
}

#[derive(Deserialize, Default)]
struct Answer {
    subscribe: Option<Vec<String>>,
    #[serde(default)]
    publish: Vec<String>,
    expires_at: Option<u64>,
}

impl ConnectWebhook {
    /// The webhook `config` names, started; `None` if it names none.
    pub fn from_config(config: &WebhookConfig) -> Result<Option<Self>, Error> {
        let Some(url) = &config.connect_webhook else { return Ok(None) };
        Self::new(url, config.webhook_timeout, config.webhook_in_flight).map(Some)
    }

    /// Starts `in_flight` worker threads posting to `url` (`http://host[:port]/path`), each
    /// request bounded by `timeout`.
    pub fn new(url: &str, timeout: Duration, in_flight: usize) -> Result<Self, Error> {
        let target = Target::parse(url, timeout, in_flight)?;
        let bad = |why: &str| Error::Webhook(format!("{url}: {why}"));
        let addr = (target.host.as_str(), target.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| bad("the host does not resolve"))?;
        let target = Arc::new((addr, target));
        let (jobs, queue) = sync_channel::<Job>(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..in_flight {
            let (queue, target) = (queue.clone(), target.clone());
            std::thread::Builder::new()
                .name(format!("freeboard-webhook-{i}"))
                .spawn(move || work(&queue, &target.0, &target.1, timeout))
                .map_err(|e| bad(&e.to_string()))?;
        }
        Ok(Self { jobs })
    }

    /// Queues the decision of an upgrade to `topics`; never blocks (a full queue refuses it
    /// with 503 at once).
    pub fn ask(
        &self,
        decision: Decision,
        path: &str,
        topics: &[&str],
        origin: Option<&str>,
        token: Option<&str>,
    ) {
        let body = serde_json::json!({
            "client": decision.peer().to_string(),
            "path": path,
            "topics": topics,
            "origin": origin,
            "token": token,
        })
        .to_string();
        let topics = topics.iter().map(|t| (*t).to_owned()).collect();
        let since = http::query_value(path, "since").map(str::to_owned);
        match self.jobs.try_send(Job { decision, body, topics, since }) {
            Ok(()) => {}
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                job.decision.reject_because(503, "webhook_busy");
            }
        }
    }
}

/// Where the webhook posts: an `http://` URL's host, port and path (with its query).
struct Target {
    host: String,
    port: u16,
    /// `Host:` as the URL gives it (with the port if it names one).
    authority: String,
    path: String,
}

impl Target {
    /// Checks the URL (`url`'s WHATWG parser) and the limits.
    fn parse(url: &str, timeout: Duration, in_flight: usize) -> Result<Self, Error> {
        let bad = |why: &str| Error::Webhook(format!("{url}: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if parsed.scheme() != "http" {
            return Err(bad("only http:// is supported"));
        }
        let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        let authority = match parsed.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        let path = match parsed.query() {
            Some(query) => format!("{}?{query}", parsed.path()),
            None => parsed.path().to_owned(),
        };
        if in_flight == 0 || timeout.is_zero() {
            return Err(bad("in-flight requests and the timeout must be above zero"));
        }
        // An IPv6 host is written in brackets in a URL and bare in a socket address.
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        Ok(Self { host, port, authority, path })
    }
}

/// Checks the webhook settings without starting it.
pub(crate) fn check(config: &WebhookConfig) -> Result<(), Error> {
    match &config.connect_webhook {
        Some(url) => Target::parse(url, config.webhook_timeout, config.webhook_in_flight).map(drop),
        None => Ok(()),
    }
}

/// One worker: takes jobs until the webhook is dropped.
fn work(queue: &Mutex<Receiver<Job>>, addr: &SocketAddr, target: &Target, timeout: Duration) {
    loop {
        let job = match queue.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        match post(addr, target, &job.body, timeout) {
            Err(reason) => job.decision.reject_because(503, reason),
            Ok((200, body)) => {
                let Ok(answer) = serde_json::from_slice::<Answer>(&body) else {
                    job.decision.reject_because(503, "webhook_error");
                    continue;
                };
                let subscribe = answer.subscribe.unwrap_or_else(|| job.topics.clone());
                let expires = unix_time(answer.expires_at.unwrap_or(u64::MAX));
                let publish = answer.publish;
                let grant =
                    Grant { subject: None, expires, subscribe, publish, presence_claims: None };
                if !job.topics.iter().all(|t| grant.may_subscribe(t)) {
                    job.decision.reject_because(403, "topic_not_granted");
                    continue;
                }
                let mut accepted = Accepted::new();
                if answer.expires_at.is_some() {
                    accepted = accepted.expires_at(expires);
                }
                let accepted = accepted.data(grant);
                match (&job.since, job.topics.first()) {
                    (Some(since), Some(topic)) => {
                        job.decision.accept_recovering(accepted, topic, since)
                    }
                    _ => job.decision.accept(accepted),
                }
            }
            Ok((status @ (401 | 403), _)) => job.decision.reject_because(status, "webhook_refused"),
            Ok(_) => job.decision.reject_because(503, "webhook_error"),
        }
    }
}

/// `POST`s `body` and reads the answer's status and body, all within `timeout`.
fn post(
    addr: &SocketAddr,
    target: &Target,
    body: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), &'static str> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "webhook_timeout",
        _ => "webhook_error",
    };
    let mut stream = TcpStream::connect_timeout(addr, timeout).map_err(timed_out)?;
    stream.set_write_timeout(left()).map_err(|_| "webhook_timeout")?;
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        target.path,
        target.authority,
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(timed_out)?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        stream.set_read_timeout(Some(left().ok_or("webhook_timeout")?)).map_err(timed_out)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) if answer.len() + n <= MAX_ANSWER => answer.extend_from_slice(&chunk[..n]),
            Ok(_) => return Err("webhook_error"),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(timed_out(e)),
        }
        if let Some(whole) = complete(&answer, false)? {
            return Ok(whole);
        }
    }
    complete(&answer, true)?.ok_or("webhook_error")
}

/// The status and body of an answer once it is complete (`None`: not yet): its
/// `Content-Length` bytes, its chunked body, or all of it at `eof` (RFC 9112 §6.3). An answer
/// whose framing cannot be trusted is an error, never guessed at.
fn complete(answer: &[u8], eof: bool) -> Result<Option<(u16, Vec<u8>)>, &'static str> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(answer) {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err("webhook_error"),
    };
    let status = response.code.ok_or("webhook_error")?;
    let rest = &answer[head..];
    if http::chunked_body(response.headers).map_err(|_| "webhook_error")? {
        let mut body = Vec::new();
        let mut chunked = http::Chunked::new(MAX_ANSWER as u64);
        let (_, done) = chunked
            .feed(rest, |data| {
                body.extend_from_slice(data);
                true
            })
            .map_err(|_| "webhook_error")?;
        return Ok(done.then_some((status, body)));
    }
    let body = match http::content_length(response.headers).map_err(|_| "webhook_error")? {
        Some(length) => usize::try_from(length).ok().and_then(|n| rest.get(..n)),
        None if eof => Some(rest),
        None => None,
    };
    Ok(body.map(|body| (status, body.to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_their_framing() {
        let ok = |text: &str, eof| complete(text.as_bytes(), eof);
        let whole = Ok(Some((200, b"{}".to_vec())));
        assert_eq!(ok("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", false), whole);
        assert_eq!(ok("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{", false), Ok(None));
        assert_eq!(ok("HTTP/1.1 200 OK\r\nContent-Len", false), Ok(None));
        // Chunked, as many frameworks answer: complete at its last chunk, not at the close.
        let chunked =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n";
        assert_eq!(ok(chunked, false), whole);
        assert_eq!(ok(&chunked[..chunked.len() - 5], false), Ok(None));
        // Without a length, the body is what came before the close.
        assert_eq!(ok("HTTP/1.1 200 OK\r\n\r\n{}", true), whole);
        assert_eq!(ok("HTTP/1.1 200 OK\r\n\r\n{}", false), Ok(None));
        // Framing that cannot be trusted is an error, not a guess (RFC 9112 §6.3).
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/9 200\r\n\r\n",
        ] {
            assert_eq!(ok(bad, true), Err("webhook_error"), "{bad:?}");
        }
    }

    #[test]
    fn the_url_is_read_by_the_url_crate() {
        let second = Duration::from_secs(1);
        let target = Target::parse("http://127.0.0.1:8080/connect?app=a", second, 1).unwrap();
        assert_eq!((target.host.as_str(), target.port), ("127.0.0.1", 8080));
        assert_eq!(
            (target.authority.as_str(), target.path.as_str()),
            ("127.0.0.1:8080", "/connect?app=a")
        );
        let target = Target::parse("http://[::1]/", second, 1).unwrap();
        assert_eq!(
            (target.host.as_str(), target.port, target.authority.as_str()),
            ("::1", 80, "[::1]")
        );
        let refused = |url: &str| Target::parse(url, second, 1).err().map(|e| e.to_string());
        assert!(refused("https://example.com/").unwrap().contains("only http://"));
        assert!(refused("http://:8080/").is_some());
        assert!(refused("not a url").is_some());
        assert!(Target::parse("http://127.0.0.1/", Duration::ZERO, 1).is_err());
        assert!(Target::parse("http://127.0.0.1/", second, 0).is_err());
    }
}
