//! Hostile clients and transport faults against a real `freeboard serve` process on loopback.
//!
//! Each attack family is one module; every attack returns what the attacker saw (HTTP
//! statuses, close codes, EOFs) so a test can compare it with the defined outcome, while
//! [`Watch`] keeps an [`Innocent`] client echoing and samples the server's RSS:
//!
//! - [`admin`]: dashboard streams asked in a tight loop, `/metrics` scraped without pause,
//!   and `/healthz` timed beside them.
//! - [`access`]: forged bearer tokens, and real ones used before their time (`nbf`, `iat`);
//!   upgrades piling up behind a connect webhook that never answers.
//! - [`slowloris`]: many connections that trickle their request head.
//! - [`headers`]: request heads that are too large or have too many headers; a
//!   `permessage-deflate` offer; `Transfer-Encoding` lists that are not one final `chunked`.
//! - [`frames`]: a 2^63 length, unmasked client frames, fragment bombs, invalid UTF-8 at every
//!   split point, RSV1 without an extension.
//! - [`floods`]: ping floods and close floods.
//! - [`churn`]: connect / upgrade / close cycles.
//! - [`faults`]: peers that reset mid-frame, half-close, stop reading or read one byte at a
//!   time, and a descriptor limit the server hits.
//! - [`tls`]: partial ClientHellos from one address holding handshakes, beside a `wss://`
//!   client from another.
//! - [`soak`]: echo, pub/sub and connection churn at once for a bounded time, the server's
//!   memory sampled as it goes.
//! - [`topics`]: subscriptions by the ten thousand; subscribers that never read under a flood
//!   of large publications.
//!
//! The plumbing: [`Serve`] starts the binary (built on first use) with chosen flags and kills
//! it on drop, [`Scrape`] reads `/metrics`, [`WsClient`] is a blocking raw-frame client.

pub mod access;
pub mod admin;
pub mod budget;
pub mod churn;
pub mod faults;
pub mod floods;
pub mod frames;
pub mod headers;
mod innocent;
mod metrics;
mod serve;
pub mod slowloris;
pub mod soak;
pub mod tls;
pub mod topics;
mod ws;

pub use innocent::{EchoReport, Figures, Innocent, Watch};
pub use metrics::Scrape;
pub use serve::{Serve, cpu_seconds, raise_fd_limit, rss_kib};
pub use ws::{Frame, WsClient, upgrade_request};
