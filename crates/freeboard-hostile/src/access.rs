//! Attacks on who gets in: forged bearer tokens (a brute force against the JWT check and the
//! publish token), validly signed tokens used before their time, and upgrades piling up
//! behind a connect webhook that never answers.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::ws::{WsClient, upgrade_request};

use freeboard_test::b64url;

/// The `i`-th forged token: an all-topics HS256 claim with a guessed signature, `alg: none`,
/// an RS256 header with no key behind it, or a truncated signature, in turn.
pub fn forged_token(i: u64, exp: u64) -> String {
    let claims = b64url(format!(r#"{{"exp":{exp},"subscribe":["*"],"publish":["*"]}}"#).as_bytes());
    let mut guess = [0u8; 32];
    for (k, b) in guess.iter_mut().enumerate() {
        *b = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (k % 8 * 8)) as u8 ^ k as u8;
    }
    let hs256 = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    match i % 4 {
        0 => format!("{hs256}.{claims}.{}", b64url(&guess)),
        1 => format!("{}.{claims}.", b64url(br#"{"alg":"none","typ":"JWT"}"#)),
        2 => format!("{}.{claims}.{}", b64url(br#"{"alg":"RS256"}"#), b64url(&guess)),
        _ => format!("{hs256}.{claims}.{}", &b64url(&guess)[..20]),
    }
}

/// The JWKS of the RSA and P-256 test keys (`kid` `rsa-1` for the RSA one), for `--jwks`.
pub const TEST_JWKS: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../freeboard-topics/tests/fixtures/test-jwks.json");

/// `claims` signed RS256 with the RSA test key of [`TEST_JWKS`].
pub fn rs256_token(claims: &serde_json::Value) -> String {
    let der = include_bytes!("../../freeboard-topics/tests/fixtures/test-rsa-private.der");
    let key = jsonwebtoken::EncodingKey::from_rsa_der(der);
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("rsa-1".into());
    jsonwebtoken::encode(&header, claims, &key).expect("the test key signs")
}

/// Upgrades at `path` with `?access_token={token}` (as a browser sends it); the status.
pub fn upgrade_with_query_token(addr: SocketAddr, path: &str, token: &str) -> u16 {
    let request = upgrade_request(&format!("{path}?access_token={token}"), "");
    WsClient::handshake(addr, &request).map_or(0, |(_, status, _)| status)
}

/// Upgrades at `path` with `Authorization: Bearer {token}`; the status.
pub fn upgrade_with_token(addr: SocketAddr, path: &str, token: &str) -> u16 {
    let request = upgrade_request(path, &format!("Authorization: Bearer {token}\r\n"));
    WsClient::handshake(addr, &request).map_or(0, |(_, status, _)| status)
}

/// `POST /topic/{topic}` with `Authorization: Bearer {token}`; the status.
pub fn publish_with_token(addr: SocketAddr, topic: &str, token: &str) -> u16 {
    let request = format!(
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\nContent-Length: 2\r\n\r\nhi"
    );
    WsClient::handshake(addr, &request).map_or(0, |(_, status, _)| status)
}

/// A connect webhook that accepts connections and never answers; stops when dropped.
pub struct StalledWebhook {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StalledWebhook {
    /// Listens on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream), // read nothing, answer nothing
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
                // Bounded: the server has at most its in-flight workers connected.
                held.retain(held_open);
            }
        });
        Self { addr, stop, thread: Some(thread) }
    }

    /// The webhook's URL.
    pub fn url(&self) -> String {
        format!("http://{}/connect", self.addr)
    }
}

/// Whether a held connection is still open (its peer has not closed it).
fn held_open(stream: &TcpStream) -> bool {
    let _ = stream.set_nonblocking(true);
    let mut bytes = [0u8; 4096];
    loop {
        match (&*stream).read(&mut bytes) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

impl Drop for StalledWebhook {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends `n` upgrade requests to `path` at once (each on its own connection), then reads
/// every answer (waiting up to `wait` for each); the count of each status (0: no answer).
pub fn pile_up(addr: SocketAddr, path: &str, n: usize, wait: Duration) -> BTreeMap<u16, usize> {
    let request = upgrade_request(path, "");
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(mut stream) = TcpStream::connect(addr) else { continue };
        if stream.write_all(request.as_bytes()).is_ok() {
            streams.push(stream);
        }
    }
    let mut statuses = BTreeMap::new();
    for stream in streams {
        let mut client = WsClient::raw(stream);
        let _ = client.stream.set_read_timeout(Some(wait));
        let status = client
            .read_head()
            .ok()
            .and_then(|head| head.get(9..12).and_then(|s| s.parse().ok()))
            .unwrap_or(0);
        *statuses.entry(status).or_insert(0) += 1;
    }
    statuses
}
