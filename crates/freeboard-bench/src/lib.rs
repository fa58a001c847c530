//! The load generator and experiments behind `freeboard bench`.
//!
//! Every figure freeboard publishes comes from here, measured side by side with peer servers
//! in the same run. The load generator speaks RFC 6455 through `freeboard-proto` only, from one
//! thread driving many non-blocking connections on `mio`, so it can be pointed at any
//! WebSocket echo server (`ws://host:port/path`) or at a raw TCP echo (`tcp://host:port`,
//! which sends the client's frames back verbatim; see [`Target`]).
//!
//! - [`load`]: the client side — connect, handshake, keep W messages in flight per client,
//!   record latency in an HDR histogram, count what came back.
//! - [`latency`]: latency at a fixed rate — an open-loop generator timing each round trip
//!   from its intended send time (coordinated omission corrected), and the highest rate whose
//!   p99 stays under a bound.
//! - [`connections`]: many idle connections and the server memory they cost.
//! - [`handshakes`]: new `wss://` connections per second, full or resumed, and the server's
//!   CPU time per handshake.
//! - [`memory`]: RSS at rest, with idle connections, and whether it comes back after they
//!   close and after a burst of queued messages drains — several server builds side by side.
//! - [`process`]: the numbers a reader needs to trust a run: CPU time of both sides, RSS,
//!   CPU pinning, the file-descriptor limit.
//! - [`peers`]: the servers measured side by side (freeboard, a raw TCP echo, tokio-tungstenite,
//!   fastwebsockets), built on first use into a cache folder and started one after the other.
//! - [`report`]: medians with min and max over repeats, as a Markdown table, JSON and CSV.
//! - [`spread`]: the median of a figure over repeated runs, with its range.

pub mod broadcast;
pub mod buffers;
pub mod chaos;
pub mod charts;
pub mod compression;
pub mod connections;
pub mod corpus;
pub mod crowd;
pub mod drops;
pub mod handshakes;
pub mod latency;
pub mod load;
pub mod memory;
pub mod peers;
pub mod process;
pub mod report;
pub mod slow_consumer;
pub mod spread;
pub mod storm;
pub mod suite;
pub mod system;
mod target;
pub mod threshold;
pub mod tls;
pub mod watermarks;

pub use target::Target;
