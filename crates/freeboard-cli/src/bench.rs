//! `freeboard bench`: the experiments behind every figure freeboard publishes, runnable
//! against any WebSocket echo server or, with `--peers`, against freeboard and peer servers
//! side by side.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use freeboard_bench::Target;
use freeboard_bench::connections::Opening;
use freeboard_bench::load::Load;
use freeboard_bench::peers::{Peer, Peers};
use freeboard_bench::process;
use freeboard_bench::report::{HandshakeRow, Report};
use freeboard_bench::suite::{self, Subject};
use freeboard_bench::threshold::{self, Threshold};
use std::process::ExitCode;

/// The experiments.
#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// One message in flight per client (ping-pong): msg/s and round-trip latency
    /// percentiles, for every combination of --clients and --size.
    #[command(mut_arg("charts", |a| a.help("Write the SVG charts (latency_by_payload.svg, msgs_by_clients.svg) into DIR")))]
    Echo {
        #[command(flatten)]
        common: Common,
        /// Concurrent clients; a comma-separated list runs each.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        clients: Vec<usize>,
        /// Payload bytes; a comma-separated list runs each.
        #[arg(long, value_delimiter = ',', default_value = "64")]
        size: Vec<usize>,
        /// Messages per client and run.
        #[arg(long, default_value_t = 10_000)]
        messages: u64,
    },
    /// W messages in flight per client for --duration: msg/s and MiB/s.
    #[command(mut_arg("charts", |a| a.help("Write the SVG charts (latency_by_payload.svg, msgs_by_clients.svg) into DIR")))]
    Pipeline {
        #[command(flatten)]
        common: Common,
        /// Concurrent clients; a comma-separated list runs each.
        #[arg(long, value_delimiter = ',', default_value = "4")]
        clients: Vec<usize>,
        /// Messages in flight per client.
        #[arg(long, default_value_t = 64)]
        in_flight: usize,
        /// Payload bytes; a comma-separated list runs each.
        #[arg(long, value_delimiter = ',', default_value = "64,1024")]
        size: Vec<usize>,
        /// Seconds per run.
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
    },
    /// New wss:// connections per second (TCP, the TLS handshake, the upgrade, then dropped)
    /// from --clients threads for --duration: full handshakes and resumed ones (tickets),
    /// alternating run by run, with the server's user and system CPU time per handshake and
    /// so handshakes per second of one server core. A ws:// server (freeboard-ws) gets the
    /// same without TLS.
    Handshakes {
        #[command(flatten)]
        common: Common,
        /// Concurrent clients; a comma-separated list runs each.
        #[arg(long, value_delimiter = ',', default_value = "4")]
        clients: Vec<usize>,
        /// Seconds per run.
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
    },
    /// Idle connections: connected/failed, connect time, server RSS before, open and after
    /// close, KiB per connection, and repeated connect/close cycles at the largest count.
    #[command(mut_arg("charts", |a| a.help("Write the SVG chart (rss_by_connections.svg) into DIR")))]
    Connections {
        #[command(flatten)]
        common: Common,
        /// Connection counts, one step each.
        #[arg(long, value_delimiter = ',', default_value = "10,50,100,500,1000,10000")]
        counts: Vec<usize>,
        /// A further, larger step.
        #[arg(long)]
        max: Option<usize>,
        /// Connect/close cycles at the largest count.
        #[arg(long, default_value_t = 3)]
        cycles: usize,
        /// Connections started per second; 0 starts them as fast as --in-flight allows.
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Most connections between connect and 101 at once.
        #[arg(long, default_value_t = 512)]
        in_flight: usize,
        /// Loopback source addresses (127.0.1.1 on), used in turn; 0 picks as many as the
        /// count needs (one per 25,000 connections above 20,000).
        #[arg(long, default_value_t = 0)]
        sources: usize,
        /// The first source address (generators run side by side each take their own).
        #[arg(long, default_value = "127.0.1.1", value_name = "IPV4")]
        sources_from: std::net::Ipv4Addr,
        /// How long each step holds its connections once all are in, before reading the
        /// server's memory: 300ms, 5s.
        #[arg(long, default_value = "300ms", value_parser = crate::duration)]
        hold: Duration,
        /// Once a step's connections are in, stop the server (SIGTERM to --server-pid) and
        /// count the close codes it sends and how long it takes to close them all (hold
        /// with --hold long enough for the drain).
        #[arg(long, requires = "server_pid")]
        shutdown: bool,
        /// permessage-deflate instead: for each mode (off, shared, dedicated; a
        /// comma-separated list) start `freeboard serve --compression MODE`, open each count
        /// of connections offering the extension as browsers do, and read the server's RSS
        /// with them idle and again after each has sent one compressed 1 KiB JSON message and
        /// read its echo; --repeat rounds, modes interleaved.
        #[arg(long, value_delimiter = ',', value_name = "MODES")]
        compression: Vec<String>,
    },
    /// Memory that comes back, for several server builds side by side in the same run: RSS at
    /// rest (default budget), with --connections idle connections open, over --idle after they
    /// close; then, on a server started with --burst-args, RSS while echoes that clients do not
    /// read fill --burst-fill of the pools, and over --idle after they drain. Medians [min–max]
    /// over --repeat runs; each server is started, measured and killed (by PID) in turn.
    Memory {
        /// A server build to measure, NAME=PATH of a `freeboard` binary (repeat the flag to
        /// compare builds). Default: this binary, as "freeboard".
        #[arg(long = "server", value_name = "NAME=PATH")]
        servers: Vec<String>,
        /// Idle connections opened and closed.
        #[arg(long, default_value_t = 10_000)]
        connections: usize,
        /// Idle time watched after the close and after the drain: 10s, 1m.
        #[arg(long, default_value = "10s", value_parser = crate::duration)]
        idle: Duration,
        /// Fraction of the pools' chunks the burst fills.
        #[arg(long, default_value_t = 0.9)]
        burst_fill: f64,
        /// Clients of the burst (each sends 60,000-byte messages and reads nothing until the
        /// pools are full).
        #[arg(long, default_value_t = 8)]
        burst_connections: usize,
        /// Further `serve` arguments for both servers, split at spaces (e.g. "--threads 2").
        #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
        serve_args: Option<String>,
        /// `serve` arguments of the burst's server, split at spaces.
        #[arg(
            long,
            value_name = "ARGS",
            allow_hyphen_values = true,
            default_value = "--threads 1 --memory 64M --max-message-size 64K --send-low 6M --send-high 12M"
        )]
        burst_args: String,
        /// Runs per server (interleaved: A, B, A, B...).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Write every run as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// A client that writes and never reads while an innocent client pings: what the server
    /// did with the slow one, its RSS over time, and the innocent client's latency.
    #[command(mut_arg("charts", |a| a.help("Write the SVG charts into DIR (this experiment has none yet: its figures are in the table)")))]
    SlowConsumer {
        #[command(flatten)]
        common: Common,
        /// Payload bytes of the slow client's messages.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Seconds.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
    },
    /// The LED-controller study: 2 clients × 960 B frames × 60 FPS to a device with a 400 KiB
    /// budget, for buffer (chunk) sizes of 1-16 KiB — a compressed-time simulation through
    /// freeboard's pool and a TLSF heap, or a real-socket soak through `freeboard serve`.
    Buffers {
        #[command(subcommand)]
        part: BuffersCommand,
    },
    /// Presence memory: MEMBERS subscribers of one topic joined to a presence table (each with
    /// a `sub`), the heap they take as glibc counts it and what the presence budget is charged,
    /// per member (in this process, nothing else allocating).
    Presence {
        /// Members of the one topic.
        #[arg(long, default_value_t = 10_000)]
        members: usize,
    },
    /// Write-buffer watermark pairs: for each LOW/HIGH pair `freeboard serve --send-low LOW
    /// --send-high HIGH` is started on loopback and measured with (a) sequential
    /// request/response batches and (b) bursts of requests in flight, warm-up iterations first,
    /// then measured iterations: ops/s mean ± 99.9 % confidence interval (Student's t), as
    /// JMH prints.
    #[command(mut_arg("charts", |a| a.help("Write the SVG chart (watermarks.svg: ops/s by watermark pair) into DIR")))]
    Watermarks {
        /// An echo server to measure once instead (its watermarks are whatever it runs with).
        url: Option<String>,
        /// LOW/HIGH pairs; suffixes K, M.
        #[arg(long, value_delimiter = ',', default_value = "4K/16K,8K/32K,16K/64K,32K/128K", value_parser = parse_pair)]
        pairs: Vec<(usize, usize)>,
        /// Requests per sequential iteration (each waits for its response).
        #[arg(long, default_value_t = 10_000)]
        batch: u64,
        /// Requests written per burst before reading the responses.
        #[arg(long, default_value_t = 1_000)]
        burst: usize,
        /// Bursts per burst iteration.
        #[arg(long, default_value_t = 10)]
        bursts: usize,
        /// Payload bytes per request.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Warm-up iterations (not reported in the score).
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        /// Measured iterations.
        #[arg(long, default_value_t = 10)]
        iterations: usize,
        /// Further arguments for `freeboard serve`, split at spaces.
        #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
        serve_args: Option<String>,
        #[command(flatten)]
        output: Output,
    },
    /// Delivery under repeated network drops: N subscribers of a history topic per client
    /// kind — freeboard's resuming subscription, freeboard's client reconnecting without
    /// `since` (the baseline), Node's `ws` with its reconnect loop (when interop/node has it:
    /// `npm ci` there) — a publisher at a steady rate, and every connection cut by a loopback
    /// proxy at the same moments, the network then down for --outage: delivered %,
    /// duplicates, reconnects, and the resume latency (end of an outage to the first delivery
    /// after it, p50/p99), side by side in one run, against `freeboard serve --history`.
    Drops {
        /// Subscribers per client kind.
        #[arg(long, default_value_t = 20)]
        subscribers: usize,
        /// Publications per second.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Seconds of publishing.
        #[arg(long, default_value_t = 30.0)]
        duration: f64,
        /// Seconds between two drops.
        #[arg(long, default_value_t = 5.0)]
        every: f64,
        /// Seconds the network stays down at each drop.
        #[arg(long, default_value_t = 2.0)]
        outage: f64,
        /// Seeds the Rust clients' jitter.
        #[arg(long, default_value_t = 37)]
        seed: u64,
    },
    /// A reconnect storm: --clients connections to URL (a `freeboard serve` or any ws://
    /// server), then --rounds times every one of them reset at once and each client back
    /// after a jittered wait (--initial doubling to --max after each failure, no sooner than
    /// a 503's Retry-After): time until all are back, attempts, refusals and failures by
    /// cause, and with --server-pid the server's RSS and the host's socket memory at their
    /// peak (beside --memory when given).
    Storm {
        /// The server: ws://host:port/path.
        url: String,
        /// Clients.
        #[arg(long, default_value_t = 10_000)]
        clients: usize,
        /// Cuts (each resets every connection at once).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// A client's first wait after its connection is cut: 250ms, 1s.
        #[arg(long, default_value = "250ms", value_parser = crate::duration)]
        initial: Duration,
        /// The longest wait between two attempts.
        #[arg(long, default_value = "30s", value_parser = crate::duration)]
        max: Duration,
        /// Most clients between connect and 101 at once.
        #[arg(long, default_value_t = 4096)]
        in_flight: usize,
        /// Loopback source addresses (127.0.1.1 on), used in turn; 0 picks as many as the
        /// ephemeral ports need. A server's per-address limit (`freeboard serve
        /// --max-connections-per-ip`, 1,000 by default) refuses the rest with 429: give one
        /// address per that many clients.
        #[arg(long, default_value_t = 0)]
        sources: usize,
        /// The first source address.
        #[arg(long, default_value = "127.0.1.1", value_name = "IPV4")]
        sources_from: std::net::Ipv4Addr,
        /// How long everyone stays connected before each cut.
        #[arg(long, default_value = "2s", value_parser = crate::duration)]
        hold: Duration,
        /// A round that has not brought everyone back by then ends, the rest counted.
        #[arg(long, default_value = "5m", value_parser = crate::duration)]
        round_deadline: Duration,
        /// PID of the server, to sample its RSS through the storm.
        #[arg(long, value_name = "PID")]
        server_pid: Option<u32>,
        /// The server's --memory, to set its peak RSS plus kernel memory beside it: 64M.
        #[arg(long, value_parser = crate::parse_size)]
        memory: Option<usize>,
        /// Seeds the jitter.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the rounds as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// One publisher, N subscribers on a topic: deliveries/s and the latency of the last
    /// subscriber (p50/p99/max), against `freeboard serve` (started with --client-publish,
    /// drop-oldest and a 4 MiB subscriber cap) and, with --peers, a raw TCP fan-out (the limit)
    /// and Node's `ws` broadcast peer side by side. Past the open-file limit the subscribers
    /// are held by --shards child processes, which report to this one (scripts/scale-broadcast
    /// runs several servers of each peer so).
    #[command(mut_arg("charts", |a| a.help("Write the SVG chart (broadcast_by_subscribers.svg: deliveries/s by subscribers) into DIR")))]
    Broadcast {
        /// A topic URL to subscribe and publish to (ws://host:port/topic/NAME on a server with
        /// --client-publish) instead of starting servers. Several URLs (tcp://host:port for
        /// raw fan-outs): servers that share nothing; subscribers go to each in turn and every
        /// publication is written to each, over one publisher connection per server.
        #[arg(value_name = "URL")]
        urls: Vec<String>,
        /// Where the publisher connects, when not at the URLs subscribed to: one connection
        /// each, every publication written to each (Node's `ws` peer takes publications on
        /// its own path: ws://host:port/pub beside ws://host:port/sub); comma-separated.
        #[arg(long, value_name = "URL", value_delimiter = ',', requires = "urls")]
        publish: Vec<String>,
        /// Servers to start one after the other: freeboard, raw-tcp-broadcast (a TCP fan-out
        /// with no WebSocket work: the limit), node-ws-broadcast (a comma-separated list;
        /// without a value these three), freeboard-uring (freeboard with --io uring).
        #[arg(long, num_args = 0..=1, default_missing_value = "freeboard,raw-tcp-broadcast,node-ws-broadcast", value_name = "LIST")]
        peers: Option<String>,
        /// Subscriber counts, one run each.
        #[arg(long, value_delimiter = ',', default_value = "100,1000")]
        subscribers: Vec<usize>,
        /// Payload bytes (16-65535), one run each.
        #[arg(long, value_delimiter = ',', default_value = "64,1024")]
        size: Vec<usize>,
        /// Messages in flight at most (1: each message alone).
        #[arg(long, default_value_t = 16)]
        window: u64,
        /// Messages per run [default: 2,000,000 / subscribers, 100 to 2,000].
        #[arg(long)]
        messages: Option<u64>,
        /// freeboard nodes: 2 starts two nodes on the Redis at --redis, subscribers spread
        /// over both and the publisher on the first, each run beside the same load on one
        /// node without Redis.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        nodes: u8,
        /// The Redis of the two nodes (redis://HOST:PORT/; --nodes 2 only).
        #[arg(long, value_name = "URL")]
        redis: Option<String>,
        /// permessage-deflate: freeboard runs with --compression shared, and each case runs
        /// twice per round on the same server, subscribers offering nothing, then offering
        /// the extension (each publication is compressed once for all of them); with the
        /// server's CPU time per publication.
        #[arg(long)]
        compression: bool,
        /// Server-Sent Events beside WebSocket: each case runs on freeboard twice per round,
        /// each on a freshly started server (so each has its memory figure to itself):
        /// WebSocket subscribers, then SSE subscribers (`Accept: text/event-stream`) on the
        /// same topic, payloads text in both; with the server's CPU time and bytes per
        /// delivery, its resident memory per idle subscriber (meaningful for the first case
        /// each server runs), and the SSE/WebSocket ratios.
        #[arg(long, conflicts_with = "compression")]
        sse: bool,
        /// Delta compression: freeboard runs with --delta-prefix "", payloads are a JSON
        /// document of which each publication changes about 1 %, and each case runs twice per
        /// round on the same server: subscribers taking every message whole, then asking for
        /// deltas (`?delta=fossil`); with the server's CPU time and bytes per delivery, and
        /// the delta/whole ratios as medians [min–max] over the rounds.
        #[arg(long, conflicts_with_all = ["compression", "sse"])]
        delta: bool,
        /// Rounds of every case (interleaved with --compression); medians [min–max]. With
        /// --peers, each round starts every server in turn, and each is compared with the
        /// first one of its own round.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Pin the servers started (--peers) and the load generator: SERVER_CPU,CLIENT_CPU,
        /// e.g. 0,1.
        #[arg(long, value_name = "SERVER,CLIENT")]
        pin: Option<String>,
        /// PIDs of the servers behind the URLs (comma-separated), to report their CPU time
        /// per delivery and, in a sharded run, their memory at the end.
        #[arg(long, value_name = "PID", value_delimiter = ',')]
        server_pid: Vec<u32>,
        /// Subscriber processes, each holding its share of the subscribers below the
        /// open-file limit and reporting to this one [default: as many as the limit needs].
        /// Above 1 (or with several URLs, or --non-readers) payloads are binary only.
        #[arg(long, value_name = "N")]
        shards: Option<usize>,
        /// Percent of the subscribers that never read (spread over shards and servers): the
        /// readers must still get every message; the servers' drop counters (/metrics), their
        /// RSS and the host's TCP buffers are reported at the end.
        #[arg(long, value_name = "PERCENT", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..100))]
        non_readers: u8,
        /// Each server's --memory, to set their RSS and the host's TCP buffers beside (a
        /// sharded run's figures).
        #[arg(long, value_parser = crate::parse_size)]
        memory: Option<usize>,
        #[command(flatten)]
        output: Output,
    },
    /// One shard of a sharded `bench broadcast`: started by it, reporting on standard output.
    #[command(hide = true)]
    BroadcastShard {
        /// What the shard holds (JSON).
        spec: String,
    },
    /// Latency at a fixed rate, as users feel it (wrk2, k6's constant-arrival-rate): every
    /// connection sends --rate messages per second on a schedule that never waits for echoes,
    /// and each round trip is timed from the message's intended send time, so a stall counts
    /// for every message it held up (coordinated omission corrected). Reports p50, p90, p99,
    /// p99.9 and max (HDR histogram), the rate achieved (marked when short of the target by
    /// more than 3 %), the send lag (intended time to written: the generator's own lateness)
    /// and both sides' CPU. With --sweep, finds instead the highest total rate whose p99 stays
    /// under --bound ("capacity at p99 < 1 ms"), then runs every server at --at of the first
    /// server's capacity. With --peers the servers are started in turn each round (the first
    /// is the reference), pinned to one CPU and the generator to another.
    #[command(
        after_help = "Example: capacity at p99 < 1 ms, freeboard beside uWebSockets and the raw echoes, \
                      100 and 10,000 connections, 3 rounds:\n  freeboard bench latency --peers \
                      freeboard,uwebsockets,raw-tcp-echo,raw-uring-echo --sweep --connections 100,10000 \
                      --repeat 3"
    )]
    Latency {
        /// The echo server: ws://host:port/path, or tcp://host:port for a raw TCP echo. Not
        /// needed with --peers.
        url: Option<String>,
        /// Servers to start one after the other, a comma-separated list: freeboard,
        /// raw-tcp-echo, raw-uring-echo, uwebsockets (built by peers/uwebsockets/build.sh DIR,
        /// or set FREEBOARD_UWEBSOCKETS=DIR), freeboard-uring, tokio-tungstenite, …; without a
        /// value freeboard and the three after it.
        #[arg(long, num_args = 0..=1, default_missing_value = LATENCY_PEERS, value_name = "LIST")]
        peers: Option<String>,
        /// Connections; a comma-separated list runs each (10,000 and more need the open-file
        /// limit raised: the bench raises its own to the hard limit and says what else is
        /// missing).
        #[arg(long, value_delimiter = ',', default_value = "100")]
        connections: Vec<usize>,
        /// Messages per second per connection, one run each (a comma-separated list);
        /// ignored with --sweep.
        #[arg(long, value_delimiter = ',', default_value = "100")]
        rate: Vec<f64>,
        /// Payload bytes per message.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Length of each run, warm-up included: 2s, 1500ms.
        #[arg(long, default_value = "2s", value_parser = crate::duration)]
        duration: Duration,
        /// The first part of each run, sent but not measured.
        #[arg(long, default_value = "500ms", value_parser = crate::duration)]
        warmup: Duration,
        /// Find the highest total rate whose p99 stays under --bound: doubling from --from
        /// while runs pass, halving while they fail, then bisecting to --resolution. A run
        /// passes when it reaches its rate, its p99 is under the bound and no message is lost.
        #[arg(long)]
        sweep: bool,
        /// The p99 bound of --sweep: 1ms, 500us.
        #[arg(long, default_value = "1ms", value_parser = crate::duration)]
        bound: Duration,
        /// The total rate (all connections, msg/s) a sweep starts at.
        #[arg(long, default_value_t = 20_000.0)]
        from: f64,
        /// A sweep stops bisecting when its highest pass and lowest failure are within this
        /// factor.
        #[arg(long, default_value_t = 1.1)]
        resolution: f64,
        /// Most rates a sweep tries. A failed run made while the generator itself was late
        /// (its send lag p99 at half the bound or more) is made once more, at no extra count.
        #[arg(long, default_value_t = 14)]
        max_steps: usize,
        /// After each sweep, a run of every server at this fraction of the first server's
        /// capacity found in the same round (0: none).
        #[arg(long, default_value_t = 0.5)]
        at: f64,
        /// Rounds; tables show the median with min and max. Each round starts every server in
        /// turn.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Pin the servers started and the generator: SERVER_CPU,CLIENT_CPU. With --peers and
        /// two CPUs or more, 0,1 unless given.
        #[arg(long, value_name = "SERVER,CLIENT")]
        pin: Option<String>,
        /// Do not pin anything.
        #[arg(long, conflicts_with = "pin")]
        no_pin: bool,
        /// Further arguments for `freeboard serve` under --peers, split at spaces.
        #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
        serve_args: Option<String>,
        /// PID of the server behind URL, for its CPU time.
        #[arg(long, value_name = "PID")]
        server_pid: Option<u32>,
        #[command(flatten)]
        output: Output,
    },
    /// The whole suite, one experiment after the other with its defaults (echo over payloads
    /// and clients, pipeline, connections, slow consumer, broadcast, latency, watermarks, buffers
    /// simulation and soak), each written to OUT as NAME.json, NAME.csv and NAME.md; then
    /// REPORT.md with every table and the SVG charts of all of them. An experiment that fails
    /// is reported and the suite goes on (the exit status says whether any failed).
    All {
        /// Peers for the experiments that take them (echo, pipeline, connections, slow
        /// consumer; broadcast runs raw-tcp-broadcast and node-ws-broadcast instead, latency
        /// uwebsockets and both raw echoes): all of them, or a comma-separated list.
        /// Without it only freeboard runs.
        #[arg(long, num_args = 0..=1, default_missing_value = "all", value_name = "LIST")]
        peers: Option<String>,
        /// The folder for results.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Seconds instead of the defaults' minutes and hours: a smoke run of every experiment.
        #[arg(long)]
        quick: bool,
    },
    /// Print the Markdown tables of saved `--json` reports and draw their SVG charts.
    Report {
        /// A JSON file, or a folder whose `*.json` files are printed in name order (and whose
        /// charts are written into the folder unless --charts says elsewhere).
        file: PathBuf,
        /// Write the SVG charts of all the reports together into this folder.
        #[arg(long, value_name = "DIR")]
        charts: Option<PathBuf>,
    },
}

/// The two parts of the buffers study.
#[derive(Subcommand)]
pub(crate) enum BuffersCommand {
    /// Simulated hours of the device's allocation pattern (frames, driver stalls, pattern
    /// switches, status buffers, reconnects), seeded, run through freeboard's budget and chunk
    /// pool and through a TLSF heap (`rlsf`) of the same size — one buffer-size allocation per
    /// message (per buffer size of a larger one), and once at exact message sizes. Prints
    /// allocation success, delivered frames and FPS, pattern-switch latency, fragmentation
    /// index (1 − largest free / total free, sampled) and memory overhead.
    #[command(mut_arg("charts", |a| a.help("Write the SVG charts (fragmentation_over_time.svg, fps_by_buffer_size.svg) into DIR")))]
    Simulate {
        /// Simulated hours.
        #[arg(long, default_value_t = 24.0)]
        hours: f64,
        /// Chunk (pool) and buffer (TLSF) sizes, one configuration each; suffixes K, M.
        #[arg(long, value_delimiter = ',', default_value = "1K,2K,4K,8K,16K", value_parser = crate::parse_size)]
        sizes: Vec<usize>,
        /// Memory for all buffers, bytes; suffixes K, M.
        #[arg(long, default_value = "400K", value_parser = crate::parse_size)]
        budget: usize,
        /// Seed of every random choice: the same seed gives the same table.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Simulated seconds between fragmentation samples.
        #[arg(long, default_value_t = 60)]
        sample: u64,
        #[command(flatten)]
        output: Output,
    },
    /// Real sockets: `freeboard serve` (started on loopback, or URL) with a small budget, N
    /// clients publishing frames at FPS on a topic, a device client subscribed to it that
    /// stalls now and then; every --sample: delivered FPS, server RSS, pool chunks in use,
    /// allocation failures and drops (from /metrics), pattern-switch latency.
    #[command(mut_arg("charts", |a| a.help("Write the SVG chart (soak_fps_over_time.svg) into DIR")))]
    Soak {
        /// The topic to publish on, ws://host:port/topic/NAME, of a server running with
        /// --client-publish. Without it, `freeboard serve` is started for each --chunk-size.
        url: Option<String>,
        /// Pool chunk sizes, one run each (a started server only); suffixes K, M.
        #[arg(long, value_delimiter = ',', default_value = "4K", value_parser = crate::parse_size)]
        chunk_size: Vec<usize>,
        /// The started server's --memory; suffixes K, M.
        #[arg(long, default_value = "400K", value_parser = crate::parse_size)]
        budget: usize,
        /// Length of each run: 90s, 10m, 1h.
        #[arg(long, default_value = "10m", value_parser = crate::duration)]
        duration: Duration,
        /// Time between samples.
        #[arg(long, default_value = "60s", value_parser = crate::duration)]
        sample: Duration,
        /// Publishing clients.
        #[arg(long, default_value_t = 2)]
        clients: usize,
        /// Frames per second per client.
        #[arg(long, default_value_t = 60)]
        fps: u32,
        /// Payload bytes per frame (320 RGB LEDs).
        #[arg(long, default_value_t = 960)]
        frame: usize,
        /// Time between pattern switches (clients take turns); 0s for none.
        #[arg(long, default_value = "30s", value_parser = crate::duration)]
        pattern_every: Duration,
        /// Payload bytes of a pattern message.
        #[arg(long, default_value = "8K", value_parser = crate::parse_size)]
        pattern_size: usize,
        /// The device reads steadily instead of stalling now and then.
        #[arg(long)]
        no_stalls: bool,
        /// PID of the server behind URL, for its RSS.
        #[arg(long, value_name = "PID")]
        server_pid: Option<u32>,
        #[command(flatten)]
        output: Output,
    },
}

/// Where a report goes besides stdout.
#[derive(Args)]
pub(crate) struct Output {
    /// Write the whole report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write CSV (simulation: one line per configuration and sample; soak: one per sample).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the experiment's SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
}

/// What every experiment takes.
#[derive(Args)]
pub(crate) struct Common {
    /// The echo server: ws://host:port/path, or tcp://host:port for a raw TCP echo (frames
    /// come back verbatim). Not needed with --peers.
    url: Option<String>,
    /// Run against freeboard and the peer servers instead of URL: all of them, or a
    /// comma-separated list of freeboard, raw-tcp-echo, raw-uring-echo, tokio-tungstenite,
    /// fastwebsockets, node-ws, gorilla, and freeboard-uring (freeboard with --io uring) (with --tls: freeboard, tokio-tungstenite-rustls, and
    /// freeboard-ws for freeboard over plain ws:// beside them). Echo, pipeline and handshake runs are
    /// interleaved: --repeat rounds, each starting every server in turn for one run. Peers are
    /// built into target/peers on first use (cargo, npm, go); one that cannot be built or
    /// started is skipped with a warning.
    #[arg(long, num_args = 0..=1, default_missing_value = "all", value_name = "LIST")]
    peers: Option<String>,
    /// Further arguments for `freeboard serve` under --peers, split at spaces, e.g.
    /// "--send-low 4K --send-high 16K" for the watermark study.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    serve_args: Option<String>,
    /// Runs per figure; tables show the median with min and max.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// wss://: with --peers, freeboard serves TLS and "all" means freeboard and
    /// tokio-tungstenite-rustls; the certificate is --tls-cert/--tls-key, or a self-signed one
    /// made with `openssl` into target/peers/tls. With a URL, give wss://.
    #[arg(long)]
    tls: bool,
    /// Over TLS, a full handshake for every connection (no session resumption).
    #[arg(long)]
    no_resume: bool,
    /// The certificate chain (PEM) the --tls peers serve.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Pin the server (peers only) and the load generator: SERVER_CPU,CLIENT_CPU, e.g. 0,1.
    /// Placement changes 1-client latency several times over on a small VM.
    #[arg(long, value_name = "SERVER,CLIENT")]
    pin: Option<String>,
    /// PID of the server behind URL, to report its CPU time per message and RSS.
    #[arg(long, value_name = "PID")]
    server_pid: Option<u32>,
    /// Write the whole report (every run) as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write one CSV line per run.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the experiment's SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// A pass/fail criterion on every row's median (echo and pipeline): 'p99<5ms',
    /// 'p50<500us', 'msg/s>100k', 'MiB/s>50'; repeat for several. A failed one is printed
    /// and the exit status is 99 (as k6's).
    #[arg(long, value_name = "FIGURE<BOUND", value_parser = Threshold::parse)]
    threshold: Vec<Threshold>,
}

/// Exit status of a run whose tables were printed but some of whose connections failed (each
/// failure explained on stderr): its figures count only the connections that stayed.
const EXIT_CONNECTIONS_FAILED: u8 = 3;

/// Runs `command` and prints its Markdown tables. A target that cannot be measured is an
/// error; a failed `--threshold` is exit status 99; connections that failed during the runs,
/// 3.
pub(crate) fn run(command: BenchCommand) -> Result<ExitCode, String> {
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let (common, experiment) = match command {
        BenchCommand::Report { file, charts } => {
            let mut all = Report::default();
            let mut files = vec![file.clone()];
            if file.is_dir() {
                let entries =
                    std::fs::read_dir(&file).map_err(|e| format!("{}: {e}", file.display()))?;
                files = entries
                    .filter_map(|e| Some(e.ok()?.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect();
                files.sort();
            }
            for path in files {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let report =
                    Report::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                print_markdown(&report);
                all.merge(report);
            }
            if let Some(dir) = charts.or_else(|| file.is_dir().then(|| file.clone())) {
                write_charts(&all, &dir)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Latency {
            url,
            peers,
            connections,
            rate,
            size,
            duration,
            warmup,
            sweep,
            bound,
            from,
            resolution,
            max_steps,
            at,
            repeat,
            pin,
            no_pin,
            serve_args,
            server_pid,
            output,
        } => {
            if warmup >= duration {
                return Err("--warmup must be shorter than --duration".into());
            }
            if !sweep && rate.iter().any(|&r| !(r > 0.0 && r.is_finite())) {
                return Err("--rate must be above 0".into());
            }
            if sweep && !(from > 0.0 && resolution > 1.0) {
                return Err("--from must be above 0 and --resolution above 1".into());
            }
            let pin = match (pin, no_pin, &peers) {
                (Some(pin), _, _) => Some(pin),
                (None, false, Some(_)) if two_cpus() => Some("0,1".to_string()),
                _ => None,
            };
            let plan = LatencyPlan {
                connections,
                rates: rate,
                size,
                duration,
                warmup,
                sweep: sweep.then_some(freeboard_bench::latency::SweepPlan {
                    bound,
                    from,
                    resolution,
                    max_steps: max_steps.max(1),
                    duration,
                    warmup,
                }),
                at,
                repeat: repeat.max(1),
                pin: pin.as_deref().map(pin_load_generator).transpose()?,
                server_pid,
                serve_args: serve_args
                    .iter()
                    .flat_map(|a| a.split_whitespace())
                    .map(String::from)
                    .collect(),
            };
            let report = latency(url, peers, &plan, command_line)?;
            finish(&report, &output, |r| r.latency.csv())?;
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Buffers { part } => {
            return buffers(part, command_line).map(|()| ExitCode::SUCCESS);
        }
        BenchCommand::Presence { members } => {
            let measured = freeboard::presence::measure(members);
            let heap = measured
                .heap_per_member
                .map_or("unknown (not glibc)".into(), |b| format!("{b:.0} B"));
            println!(
                "presence, {} members of one topic: heap {heap} per member, charged {:.0} B per member",
                measured.members, measured.charged_per_member
            );
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::All { peers, out, quick } => {
            return all(peers, &out, quick).map(|()| ExitCode::SUCCESS);
        }
        BenchCommand::Memory {
            servers,
            connections,
            idle,
            burst_fill,
            burst_connections,
            serve_args,
            burst_args,
            repeat,
            json,
        } => {
            let split = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
            let plan = freeboard_bench::memory::Plan {
                connections,
                idle,
                burst_fill,
                burst_connections,
                burst_args: split(&burst_args),
                ..Default::default()
            };
            return memory(&servers, serve_args.as_deref().map(split), &plan, repeat, json)
                .map(|()| ExitCode::SUCCESS);
        }
        BenchCommand::BroadcastShard { spec } => {
            freeboard_bench::broadcast::shard::serve(&spec).map_err(|e| format!("shard: {e}"))?;
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Broadcast {
            urls,
            publish,
            peers,
            subscribers,
            size,
            window,
            messages,
            nodes,
            redis,
            compression,
            sse,
            delta,
            repeat,
            pin,
            server_pid,
            shards,
            non_readers,
            memory,
            output,
        } => {
            let redis = match (nodes, redis) {
                (2, Some(redis)) => Some(redis),
                (2, None) => return Err("--nodes 2 needs --redis URL".into()),
                (_, Some(_)) => return Err("--redis goes with --nodes 2".into()),
                _ => None,
            };
            if !server_pid.is_empty() && urls.is_empty() {
                return Err(
                    "--server-pid goes with a topic URL (servers it starts are measured anyway)"
                        .into(),
                );
            }
            if pin.is_some() && peers.is_none() {
                return Err("--pin goes with --peers (pin a server behind a URL yourself)".into());
            }
            let plan = BroadcastPlan {
                subscribers,
                sizes: size,
                window,
                messages,
                redis,
                compression,
                sse,
                delta,
                repeat: repeat.max(1),
                pin: pin.as_deref().map(pin_load_generator).transpose()?,
                server_pids: server_pid,
                shards: shards.unwrap_or(0),
                non_readers,
                memory: memory.map(|m| m as u64),
            };
            let report = broadcast(urls, publish, peers, &plan, command_line)?;
            finish(&report, &output, Report::broadcasts_csv)?;
            if compression {
                use std::io::Write;
                let table = freeboard_bench::compression::broadcast_markdown(&report.broadcasts);
                let _ = writeln!(std::io::stdout().lock(), "{table}");
            }
            if sse {
                use std::io::Write;
                let table = freeboard_bench::broadcast::sse_markdown(&report.broadcasts);
                let _ = writeln!(std::io::stdout().lock(), "{table}");
            }
            if delta {
                use std::io::Write;
                let table = freeboard_bench::broadcast::delta_markdown(&report.broadcasts);
                let _ = writeln!(std::io::stdout().lock(), "{table}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Watermarks {
            url,
            pairs,
            batch,
            burst,
            bursts,
            size,
            warmup,
            iterations,
            serve_args,
            output,
        } => {
            let plan = freeboard_bench::watermarks::Plan {
                batch,
                burst,
                bursts: bursts.max(1),
                size,
                warmup,
                iterations: iterations.max(1),
            };
            return watermarks(url, &pairs, &plan, serve_args, output, command_line)
                .map(|()| ExitCode::SUCCESS);
        }
        BenchCommand::Storm {
            url,
            clients,
            rounds,
            initial,
            max,
            in_flight,
            sources,
            sources_from,
            hold,
            round_deadline,
            server_pid,
            memory,
            seed,
            json,
        } => {
            use freeboard_bench::crowd::Crowd;
            let sources = match sources {
                0 if clients > 20_000 => Crowd::sources_needed(clients, 1),
                n => n,
            };
            let storm = freeboard_bench::storm::Storm {
                rounds,
                in_flight,
                sources: Crowd::loopback_sources(sources_from, sources),
                initial,
                max,
                hold,
                round_deadline,
                server_pid,
                seed,
                ..freeboard_bench::storm::Storm::new(Target::parse(&url)?, clients)
            };
            let mut progress = |round: usize, back: usize, connecting: usize, refused: u64| {
                eprintln!(
                    "round {round}: {back} of {clients} back, {connecting} connecting, \
                     {refused} refused so far"
                );
            };
            let rows =
                freeboard_bench::storm::run(&storm, &mut progress).map_err(|e| e.to_string())?;
            let budget_kib = memory.map(|m| m as u64 / 1024);
            print!("{}", freeboard_bench::storm::markdown(&storm, &rows, budget_kib));
            if let Some(path) = json {
                std::fs::write(&path, freeboard_bench::storm::json(&rows))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            let missing = rows.iter().any(|r| r.back < clients);
            return Ok(if missing {
                ExitCode::from(EXIT_CONNECTIONS_FAILED)
            } else {
                ExitCode::SUCCESS
            });
        }
        BenchCommand::Drops { subscribers, rate, duration, every, outage, seed } => {
            let secs = |what: &str, s: f64| {
                Duration::try_from_secs_f64(s).map_err(|e| format!("--{what}: {e}"))
            };
            let plan = freeboard_bench::drops::Plan {
                subscribers: subscribers.max(1),
                rate,
                duration: secs("duration", duration)?,
                every: secs("every", every)?,
                outage: secs("outage", outage)?,
                seed,
            };
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let script = root.join("interop/node/reconnecting_subscriber.js");
            let node_ready = root.join("interop/node/node_modules/ws").exists()
                && std::process::Command::new("node").arg("--version").output().is_ok();
            if !node_ready {
                eprintln!("freeboard bench drops: no Node ws (npm ci in interop/node): left out");
            }
            let rows = freeboard_bench::drops::run(&plan, &exe, node_ready.then_some(&*script))?;
            print!("{}", freeboard_bench::drops::markdown(&plan, &rows));
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Echo { common, clients, size, messages } => {
            let cases = product(&clients, &size, |clients, size| Load {
                clients,
                in_flight: 1,
                size,
                messages: Some(messages),
                duration: Duration::from_secs(600),
                server_pid: None,
            });
            (common, Experiment::Load("echo", cases))
        }
        BenchCommand::Pipeline { common, clients, in_flight, size, duration } => {
            let cases = product(&clients, &size, |clients, size| Load {
                clients,
                in_flight,
                size,
                messages: None,
                duration: Duration::from_secs_f64(duration),
                server_pid: None,
            });
            (common, Experiment::Load("pipeline", cases))
        }
        BenchCommand::Handshakes { common, clients, duration } => {
            (common, Experiment::Handshakes(clients, Duration::from_secs_f64(duration)))
        }
        BenchCommand::SlowConsumer { common, size, duration } => {
            (common, Experiment::SlowConsumer(size, Duration::from_secs_f64(duration)))
        }
        BenchCommand::Connections {
            common,
            mut counts,
            max,
            cycles,
            rate,
            in_flight,
            sources,
            sources_from,
            hold,
            shutdown,
            compression,
        } => {
            counts.extend(max);
            if !compression.is_empty() {
                return compression_memory(&common, &counts, &compression)
                    .map(|()| ExitCode::SUCCESS);
            }
            let largest = counts.iter().copied().max().unwrap_or(0);
            for missing in freeboard_bench::system::missing_settings(largest) {
                eprintln!("freeboard bench: {missing}");
            }
            let opening = Opening {
                rate,
                in_flight,
                sources,
                sources_from,
                hold,
                shutdown,
                ..Opening::default()
            };
            (common, Experiment::Connections(counts, cycles, opening))
        }
    };
    let began = std::time::Instant::now();
    if let Experiment::Load(name, cases) = &experiment
        && cases.iter().all(|c| c.messages.is_none())
    {
        // The plan's length up front: --duration is per run, and --repeat multiplies it.
        let servers = common.peers.as_deref().map_or(1, |p| p.split(',').count());
        let runs = common.repeat.max(1);
        let each = cases.first().map_or(0.0, |c| c.duration.as_secs_f64());
        let total = cases.len() * runs * servers;
        let peers = if servers > 1 { format!(" × {servers} servers") } else { String::new() };
        eprintln!(
            "freeboard bench: {name}: {} cases × {runs} runs × {each} s{peers} = {:.0} s of load \
             (plus connecting and draining); --repeat and --duration change it",
            cases.len(),
            total as f64 * each
        );
    }
    let pin = common.pin.as_deref().map(pin_load_generator).transpose()?;
    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let mut report = Report {
        command: command_line,
        load_average: (process::load_average(), None),
        pinned: pin,
        ..Report::default()
    };
    // With several servers, load and handshake runs are interleaved: each round starts every
    // server in turn for one run of each case, so a change in the machine's load falls on all
    // of them alike.
    let rounds = match (&experiment, &common.peers) {
        (Experiment::Load(..) | Experiment::Handshakes(..), Some(_)) => common.repeat.max(1),
        _ => 1,
    };
    let repeat = if rounds > 1 { 1 } else { common.repeat };
    let measure = |subject: &Subject, report: &mut Report| -> Result<(), String> {
        match &experiment {
            Experiment::Load(name, cases) => report.loads.extend(
                suite::loads(subject, name, cases, repeat)
                    .map_err(|e| format!("{}: {e}", subject.name))?,
            ),
            Experiment::Connections(counts, cycles, opening) => report.connections.push(
                suite::connections(subject, counts, *cycles, opening)
                    .map_err(|e| format!("{}: {e}", subject.name))?,
            ),
            Experiment::Handshakes(clients, duration) => {
                for &n in clients {
                    let modes: &[bool] = if subject.target.tls { &[false, true] } else { &[false] };
                    let mut rows: Vec<HandshakeRow> = modes
                        .iter()
                        .map(|&resume| HandshakeRow {
                            server: subject.name.clone(),
                            clients: n,
                            tls: subject.target.tls,
                            resume,
                            runs: Vec::new(),
                        })
                        .collect();
                    for _ in 0..repeat.max(1) {
                        for row in &mut rows {
                            let target = Target { resume: row.resume, ..subject.target.clone() };
                            let run = freeboard_bench::handshakes::run(
                                &target,
                                n,
                                *duration,
                                subject.pid,
                            )
                            .map_err(|e| format!("{}: {e}", subject.name))?;
                            row.runs.push(run);
                        }
                    }
                    report.handshakes.extend(rows);
                }
            }
            Experiment::SlowConsumer(size, duration) => {
                let outcome = freeboard_bench::slow_consumer::run(
                    &subject.target,
                    *size,
                    *duration,
                    subject.pid,
                )
                .map_err(|e| format!("{}: {e}", subject.name))?;
                report.slow_consumers.push((subject.name.clone(), outcome));
            }
        }
        Ok(())
    };
    match (&common.peers, &common.url) {
        (Some(list), _) => {
            let chosen: Vec<Peer> = match list.as_str() {
                "all" if common.tls => vec![Peer::Freeboard, Peer::TokioTungsteniteRustls],
                "all" => Peer::ALL.to_vec(),
                list => list.split(',').map(|n| Peer::parse(n.trim())).collect::<Result<_, _>>()?,
            };
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut peers = Peers::in_repository(exe);
            peers.serve_args = common
                .serve_args
                .iter()
                .flat_map(|a| a.split_whitespace())
                .map(String::from)
                .collect();
            if common.tls {
                peers.tls = Some(match (&common.tls_cert, &common.tls_key) {
                    (Some(cert), Some(key)) => (cert.clone(), key.clone()),
                    _ => self_signed(&peers.cache.join("tls"))?,
                });
            }
            let mut skipped = Vec::new();
            for _ in 0..rounds {
                for &peer in &chosen {
                    if skipped.contains(&peer) {
                        continue;
                    }
                    let running = match peers.start(peer, pin.map(|(server, _)| server)) {
                        Ok(running) => running,
                        Err(e) => {
                            eprintln!("freeboard bench: skipping {}: {e}", peer.name());
                            skipped.push(peer);
                            continue;
                        }
                    };
                    let mut target = running.target.clone();
                    target.resume = !common.no_resume;
                    let name = peer.name().into();
                    measure(&Subject { name, target, pid: Some(running.pid) }, &mut report)?;
                }
            }
            report.merge_repeats();
        }
        (None, Some(url)) => {
            let mut target = Target::parse(url)?;
            target.resume = !common.no_resume;
            let subject = Subject { name: url.clone(), target, pid: common.server_pid };
            measure(&subject, &mut report)?;
        }
        (None, None) => return Err("give a server URL or --peers".into()),
    }
    report.load_average.1 = process::load_average();
    print_markdown(&report);
    if let Some(path) = &common.json {
        std::fs::write(path, report.to_json()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &common.csv {
        std::fs::write(path, report.csv()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(dir) = &common.charts {
        write_charts(&report, dir)?;
    }
    if !common.threshold.is_empty() && report.loads.is_empty() {
        return Err(
            "--threshold applies to echo and pipeline rows; this experiment has none".into()
        );
    }
    let failures: Vec<String> =
        common.threshold.iter().flat_map(|t| t.failures(&report.loads)).collect();
    for failure in &failures {
        eprintln!("freeboard bench: {failure}");
    }
    let failed_connections = explain_failed_connections(&report);
    eprintln!("freeboard bench: took {:.1} s", began.elapsed().as_secs_f64());
    if !failures.is_empty() {
        Ok(ExitCode::from(threshold::EXIT_FAILED))
    } else if failed_connections > 0 {
        Ok(ExitCode::from(EXIT_CONNECTIONS_FAILED))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}

/// Says on stderr why each connection that failed during a run failed, row by row; how many
/// failed in all.
fn explain_failed_connections(report: &Report) -> usize {
    let (lines, total) = failed_connections(report);
    for line in lines {
        eprintln!("freeboard bench: {line}");
    }
    total
}

/// The lines that explain the connections that failed during the runs, and their number.
fn failed_connections(report: &Report) -> (Vec<String>, usize) {
    let (mut lines, mut total) = (Vec::new(), 0);
    for row in &report.loads {
        for (i, run) in row.runs.iter().enumerate().filter(|(_, r)| r.failed > 0) {
            total += run.failed;
            let mut reasons: Vec<String> =
                run.failures.iter().map(|(why, n)| format!("{n} × {why}")).collect();
            let unexplained = run.failed - run.failures.iter().map(|(_, n)| n).sum::<usize>();
            if unexplained > 0 {
                reasons.push(format!("{unexplained} × could not connect"));
            }
            lines.push(format!(
                "{} {} ({} clients, {} B), run {}: {} of {} connections failed: {}",
                row.server,
                row.experiment,
                row.clients,
                row.size,
                i + 1,
                run.failed,
                row.clients,
                reasons.join("; ")
            ));
        }
    }
    if total > 0 {
        lines.push(format!(
            "{total} connections failed during the runs (above): the figures count only the \
             messages of the connections that stayed; exit status {EXIT_CONNECTIONS_FAILED}"
        ));
    }
    (lines, total)
}

/// A self-signed certificate for `localhost` and 127.0.0.1 made with `openssl` in `dir`
/// (once): the load generator does not verify certificates.
fn self_signed(dir: &std::path::Path) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-nodes", "-days", "30", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("openssl (to make a test certificate; or give --tls-cert): {e}"))?;
    match status.success() {
        true => Ok((cert, key)),
        false => Err("openssl could not make a test certificate; give --tls-cert".into()),
    }
}

/// Writes `report`'s SVG charts into `dir` and says which.
fn write_charts(report: &Report, dir: &std::path::Path) -> Result<(), String> {
    for path in freeboard_bench::charts::write(report, dir)? {
        eprintln!("freeboard bench: wrote {}", path.display());
    }
    Ok(())
}

/// Prints `report`'s tables; a closed stdout (`| head`) is not an error worth a panic.
fn print_markdown(report: &Report) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{}", report.markdown());
}

enum Experiment {
    Load(&'static str, Vec<Load>),
    Handshakes(Vec<usize>, Duration),
    Connections(Vec<usize>, usize, Opening),
    SlowConsumer(usize, Duration),
}

/// Every (clients, size) combination, clients outermost.
fn product(clients: &[usize], sizes: &[usize], case: impl Fn(usize, usize) -> Load) -> Vec<Load> {
    clients
        .iter()
        .flat_map(|&c| sizes.iter().map(move |&s| (c, s)))
        .map(|(c, s)| case(c, s))
        .collect()
}

/// `90s`, `10m`, `1h`, `1.5` (seconds).
/// `bench memory`: each server in turn, `repeat` times, then the table.
fn memory(
    servers: &[String],
    serve_args: Option<Vec<String>>,
    plan: &freeboard_bench::memory::Plan,
    repeat: usize,
    json: Option<PathBuf>,
) -> Result<(), String> {
    use freeboard_bench::memory::{self, Server};
    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let args = serve_args.unwrap_or_default();
    let mut list = Vec::new();
    for s in servers {
        let (name, path) =
            s.split_once('=').ok_or_else(|| format!("--server {s}: expected NAME=PATH"))?;
        list.push(Server { name: name.into(), binary: path.into(), args: args.clone() });
    }
    if list.is_empty() {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        list.push(Server { name: "freeboard".into(), binary: exe, args });
    }
    let mut runs = Vec::new();
    for round in 0..repeat.max(1) {
        for server in &list {
            let run = memory::run(server, plan)
                .map_err(|e| format!("{} (run {}): {e}", server.name, round + 1))?;
            eprintln!(
                "{} run {}: rest {} KiB, {} open {} KiB, closed {} KiB; burst rest {} KiB, \
                 top {} KiB ({:.0} % of the pools), drained {} KiB",
                server.name,
                round + 1,
                run.rest_kib,
                run.connected,
                run.open_kib,
                run.closed_kib(),
                run.burst_rest_kib,
                run.burst_kib,
                run.burst_fill * 100.0,
                run.drained_kib()
            );
            runs.push(run);
        }
    }
    println!("{}", memory::table(&runs, plan));
    if let Some(path) = json {
        let text = memory::to_json(&runs);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// `freeboard bench buffers simulate|soak`.
fn buffers(part: BuffersCommand, command_line: String) -> Result<(), String> {
    use freeboard_bench::buffers::{simulation, soak};
    use indicatif::{ProgressBar, ProgressStyle};

    let mut report = Report {
        command: command_line,
        load_average: (process::load_average(), None),
        ..Report::default()
    };
    let output = match part {
        BuffersCommand::Simulate { hours, sizes, budget, seed, sample, output } => {
            let workload = simulation::Workload {
                seed,
                seconds: (hours * 3600.0) as u64,
                budget,
                sample_every: sample.max(1),
                ..simulation::Workload::default()
            };
            let mut allocators = Vec::new();
            for &size in &sizes {
                allocators.push(simulation::Allocator::Pool { chunk: size });
                allocators.push(simulation::Allocator::TlsfBuffer { buffer: size });
            }
            allocators.push(simulation::Allocator::TlsfExact);
            let style = ProgressStyle::with_template(
                "{msg:>28} [{bar:40}] {pos}/{len} simulated s ({elapsed})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let mut outcomes = Vec::new();
            for allocator in allocators {
                let bar = ProgressBar::new(workload.seconds).with_style(style.clone());
                bar.set_message(format!("{} {}", allocator.name(), allocator.size()));
                let outcome =
                    simulation::simulate(&workload, allocator, &mut |t| bar.set_position(t))?;
                bar.finish_and_clear();
                outcomes.push(outcome);
            }
            report.simulation = Some((workload, outcomes));
            output
        }
        BuffersCommand::Soak {
            url,
            chunk_size,
            budget,
            duration,
            sample,
            clients,
            fps,
            frame,
            pattern_every,
            pattern_size,
            no_stalls,
            server_pid,
            output,
        } => {
            let settings = |target: Target, pid: Option<u32>| soak::Soak {
                target,
                producers: clients,
                fps,
                frame_bytes: frame.max(soak::HEADER),
                pattern_bytes: pattern_size.max(soak::HEADER),
                pattern_every,
                stalls: !no_stalls,
                duration,
                sample,
                server_pid: pid,
            };
            let run = |settings: &soak::Soak, name: &str| -> Result<soak::SoakRun, String> {
                let bar = ProgressBar::new(duration.as_secs()).with_style(
                    ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} s")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.set_message(format!("soak {name}"));
                let run = soak::run(settings, &mut |s| {
                    bar.set_position(s.t as u64);
                    // A hidden bar (stderr is not a terminal) would swallow the line too.
                    let say = |line: String| match bar.is_hidden() {
                        true => eprintln!("{line}"),
                        false => bar.println(line),
                    };
                    say(format!(
                        "{name} t={:.0}s: {:.1} FPS/client, RSS {} KiB, chunks {}/{}, failures {}",
                        s.t,
                        s.delivered_fps,
                        s.server_rss_kib.unwrap_or(0),
                        s.chunks_in_use.unwrap_or(0),
                        s.chunks_total.unwrap_or(0),
                        s.allocation_failures.unwrap_or(0),
                    ));
                })
                .map_err(|e| format!("soak {name}: {e}"))?;
                bar.finish_and_clear();
                Ok(run)
            };
            match url {
                Some(url) => {
                    let target = Target::parse(&url)?;
                    let mut result = run(&settings(target, server_pid), &url)?;
                    result.server = url;
                    report.soaks.push(result);
                }
                None => {
                    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                    for chunk in chunk_size {
                        let mut peers = Peers::in_repository(exe.clone());
                        peers.serve_args = soak_serve_args(budget, chunk);
                        let running =
                            peers.start(Peer::Freeboard, None).map_err(|e| e.to_string())?;
                        let target = Target::at(running.target.addr, "/topic/led", false);
                        let name = format!("freeboard --chunk-size {}K", chunk >> 10);
                        let mut result = run(&settings(target, Some(running.pid)), &name)?;
                        result.server = name;
                        result.chunk = chunk;
                        result.budget = budget;
                        report.soaks.push(result);
                    }
                }
            }
            output
        }
    };
    report.load_average.1 = process::load_average();
    print_markdown(&report);
    if let Some(path) = &output.json {
        std::fs::write(path, report.to_json()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &output.csv {
        std::fs::write(path, report.buffers_csv())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(dir) = &output.charts {
        write_charts(&report, dir)?;
    }
    Ok(())
}

/// `freeboard serve` flags of a soak: the budget and chunk size under study, a 16 KiB read
/// buffer and message limit (a device-sized server: the default 64 KiB read buffer and
/// 16 MiB message assembly reserve would take most of a 400 KiB budget), publishing from
/// WebSocket clients, and no keep-alive pings.
pub(crate) fn soak_serve_args(budget: usize, chunk: usize) -> Vec<String> {
    [
        "--memory",
        &budget.to_string(),
        "--chunk-size",
        &chunk.to_string(),
        "--read-buffer",
        "16K",
        "--max-message-size",
        "16K",
        "--connection-reserve",
        "16K",
        "--client-publish",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// `4K/16K`: a low and a high watermark.
fn parse_pair(s: &str) -> Result<(usize, usize), String> {
    let (low, high) = s.split_once('/').ok_or_else(|| format!("{s:?}: expected LOW/HIGH"))?;
    let (low, high) = (crate::parse_size(low)?, crate::parse_size(high)?);
    if low > high {
        return Err(format!("{s:?}: the low watermark is above the high one"));
    }
    Ok((low, high))
}

/// `freeboard bench watermarks`.
fn watermarks(
    url: Option<String>,
    pairs: &[(usize, usize)],
    plan: &freeboard_bench::watermarks::Plan,
    serve_args: Option<String>,
    output: Output,
    command_line: String,
) -> Result<(), String> {
    use freeboard_bench::watermarks;
    use indicatif::{ProgressBar, ProgressStyle};

    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let mut report = Report {
        command: command_line,
        load_average: (process::load_average(), None),
        ..Report::default()
    };
    let bar = ProgressBar::new(((plan.warmup + plan.iterations) * 2 * pairs.len().max(1)) as u64)
        .with_style(
            ProgressStyle::with_template("[{bar:40}] {pos}/{len} iterations {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    let mut tick = |line: &str| {
        bar.inc(1);
        bar.set_message(line.to_string());
    };
    match url {
        Some(url) => {
            let target = Target::parse(&url)?;
            let rows = watermarks::run(&target, &url, (0, 0), plan, &mut tick)
                .map_err(|e| format!("{url}: {e}"))?;
            report.watermarks.extend(rows);
        }
        None => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            for &(low, high) in pairs {
                let mut peers = Peers::in_repository(exe.clone());
                peers.serve_args = vec![
                    "--send-low".into(),
                    low.to_string(),
                    "--send-high".into(),
                    high.to_string(),
                ];
                peers
                    .serve_args
                    .extend(serve_args.iter().flat_map(|a| a.split_whitespace()).map(String::from));
                let running = peers.start(Peer::Freeboard, None).map_err(|e| e.to_string())?;
                let rows =
                    watermarks::run(&running.target, "freeboard", (low, high), plan, &mut tick)
                        .map_err(|e| format!("freeboard {low}/{high}: {e}"))?;
                report.watermarks.extend(rows);
            }
        }
    }
    bar.finish_and_clear();
    report.load_average.1 = process::load_average();
    print_markdown(&report);
    if let Some(path) = &output.json {
        std::fs::write(path, report.to_json()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &output.csv {
        std::fs::write(path, report.watermarks_csv())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(dir) = &output.charts {
        write_charts(&report, dir)?;
    }
    Ok(())
}

/// `freeboard bench connections --compression MODES`: memory per compressing connection,
/// each mode's server started in turn, `--repeat` rounds.
fn compression_memory(common: &Common, counts: &[usize], modes: &[String]) -> Result<(), String> {
    use freeboard_bench::compression;
    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let extra: Vec<String> =
        common.serve_args.iter().flat_map(|a| a.split_whitespace()).map(String::from).collect();
    let mut rows = Vec::new();
    for _ in 0..common.repeat.max(1) {
        for mode in modes {
            let mut peers = Peers::in_repository(exe.clone());
            peers.serve_args = ["--compression", mode].into_iter().map(String::from).collect();
            peers.serve_args.extend(extra.iter().cloned());
            let running = peers
                .start(Peer::Freeboard, None)
                .map_err(|e| format!("--compression {mode}: {e}"))?;
            for &count in counts {
                let name = format!("freeboard --compression {mode} ({count} connections)");
                rows.push(
                    compression::memory(&name, &running.target, count, 1024, running.pid)
                        .map_err(|e| format!("{name}: {e}"))?,
                );
            }
        }
    }
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{}", compression::memory_markdown(&rows));
    if let Some(path) = &common.json {
        std::fs::write(path, compression::memory_json(&rows))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Parses `--pin SERVER_CPU,CLIENT_CPU` and pins this thread (and so the load generator's
/// threads, started from it) to the client's CPU; the server's CPU, for the peers started.
fn pin_load_generator(s: &str) -> Result<(usize, usize), String> {
    let (server, client) = s
        .split_once(',')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
        .ok_or_else(|| format!("--pin {s}: expected SERVER_CPU,CLIENT_CPU"))?;
    process::pin_current_thread(client).map_err(|e| format!("pinning to CPU {client}: {e}"))?;
    Ok((server, client))
}

/// The servers `bench latency --peers` compares unless told otherwise.
const LATENCY_PEERS: &str = "freeboard,uwebsockets,raw-tcp-echo,raw-uring-echo";

/// What `freeboard bench latency` runs.
struct LatencyPlan {
    connections: Vec<usize>,
    /// Messages per second per connection, one fixed-rate run each (without a sweep).
    rates: Vec<f64>,
    size: usize,
    duration: Duration,
    warmup: Duration,
    sweep: Option<freeboard_bench::latency::SweepPlan>,
    /// After a sweep, each server at this fraction of the first server's capacity.
    at: f64,
    repeat: usize,
    /// The CPUs of the servers started and of the generator (pinned already).
    pin: Option<(usize, usize)>,
    server_pid: Option<u32>,
    serve_args: Vec<String>,
}

/// Whether this host has two CPUs or more to pin the server and the generator apart.
fn two_cpus() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

/// `freeboard bench latency`: for each round, connection count and server (started in turn,
/// or the one URL), a sweep or fixed-rate runs, with the connections opened once and reused.
fn latency(
    url: Option<String>,
    peers: Option<String>,
    plan: &LatencyPlan,
    command_line: String,
) -> Result<Report, String> {
    use freeboard_bench::latency::{self, FixedRate, Generator};

    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let largest = plan.connections.iter().copied().max().unwrap_or(0);
    for missing in freeboard_bench::system::missing_settings(largest) {
        eprintln!("freeboard bench: {missing}");
    }
    let mut report = Report {
        command: command_line,
        load_average: (process::load_average(), None),
        pinned: plan.pin,
        ..Report::default()
    };
    let servers: Vec<Option<Peer>> = match (&url, &peers) {
        (Some(_), Some(_)) => return Err("give a server URL or --peers, not both".into()),
        (None, None) => return Err("give a server URL or --peers".into()),
        (Some(_), None) => vec![None],
        (None, Some(list)) => {
            // `bench all --peers` passes "all": the servers this experiment compares.
            let list = if list == "all" { LATENCY_PEERS } else { list.as_str() };
            list.split(',').map(|n| Peer::parse(n.trim()).map(Some)).collect::<Result<_, _>>()?
        }
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut starter = Peers::in_repository(exe);
    starter.serve_args = plan.serve_args.clone();
    let show = |r: &FixedRate| {
        format!(
            "{:.0} msg/s → achieved {:.0}{}, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, max {:.0} µs, send lag p99 {:.0} µs{}",
            r.target_rate,
            r.achieved_rate,
            if r.reached { "" } else { " (not reached)" },
            r.latency_us.p50,
            r.latency_us.p99,
            r.latency_us.p999,
            r.latency_us.max,
            r.send_lag_us.p99,
            match (r.unanswered, r.failures.len()) {
                (0, 0) => String::new(),
                (u, f) => format!(", {u} unanswered, {f} kinds of connection failure"),
            }
        )
    };
    let mut skipped: Vec<Peer> = Vec::new();
    for round in 1..=plan.repeat {
        for &connections in &plan.connections {
            // The first server's capacity in this round: the others run at `at` of it.
            let mut reference: Option<(String, f64)> = None;
            for server in &servers {
                if server.is_some_and(|p| skipped.contains(&p)) {
                    continue;
                }
                let (running, target, name, pid) = match server {
                    Some(peer) => {
                        let running = match starter.start(*peer, plan.pin.map(|(s, _)| s)) {
                            Ok(running) => running,
                            Err(e) => {
                                eprintln!("freeboard bench: skipping {}: {e}", peer.name());
                                skipped.push(*peer);
                                continue;
                            }
                        };
                        let (target, pid) = (running.target.clone(), Some(running.pid));
                        (Some(running), target, peer.name().to_string(), pid)
                    }
                    None => {
                        let url = url.clone().unwrap_or_default();
                        (None, Target::parse(&url)?, url, plan.server_pid)
                    }
                };
                let context = |e: std::io::Error| {
                    format!("{name}, {connections} connections, round {round}: {e}")
                };
                let mut generator =
                    Generator::connect(&target, connections, plan.size).map_err(context)?;
                let label =
                    format!("{name}, {connections} connections, round {round}/{}", plan.repeat);
                match &plan.sweep {
                    Some(sweep_plan) => {
                        let sweep =
                            latency::sweep(&mut generator, sweep_plan, pid, &mut |r, passed| {
                                eprintln!(
                                    "{label}: {}{}",
                                    show(r),
                                    if passed { " — pass" } else { " — fail" }
                                );
                            })
                            .map_err(context)?;
                        eprintln!(
                            "{label}: capacity at p99 < {:?}: {:.0} msg/s",
                            sweep_plan.bound, sweep.capacity
                        );
                        let capacity = sweep.capacity;
                        report.latency.add_sweep(&name, connections, plan.size, sweep);
                        let (reference_name, reference_capacity) =
                            reference.get_or_insert((name.clone(), capacity)).clone();
                        if plan.at > 0.0 && reference_capacity > 0.0 && generator.live() > 0 {
                            let total = plan.at * reference_capacity;
                            let run = generator
                                .run(total / connections as f64, plan.duration, plan.warmup, pid)
                                .map_err(context)?;
                            eprintln!(
                                "{label}: at {:.0} % of {reference_name}'s capacity: {}",
                                plan.at * 100.0,
                                show(&run)
                            );
                            let rate =
                                format!("{:.0} % of {reference_name}'s capacity", plan.at * 100.0);
                            report.latency.add_fixed(&name, &rate, run);
                        }
                    }
                    None => {
                        for &rate in &plan.rates {
                            let run = generator
                                .run(rate, plan.duration, plan.warmup, pid)
                                .map_err(context)?;
                            eprintln!("{label}: {}", show(&run));
                            report.latency.add_fixed(
                                &name,
                                &format!("{rate}/s per connection"),
                                run,
                            );
                        }
                    }
                }
                drop(generator);
                drop(running);
            }
        }
    }
    report.load_average.1 = process::load_average();
    Ok(report)
}

/// What `freeboard bench broadcast` runs.
struct BroadcastPlan {
    subscribers: Vec<usize>,
    sizes: Vec<usize>,
    window: u64,
    messages: Option<u64>,
    /// Two freeboard nodes on this Redis, beside one node.
    redis: Option<String>,
    /// Each case with plain subscribers, then compressing ones, on a compressing server.
    compression: bool,
    /// Each case over WebSocket (text), then over Server-Sent Events, each on a fresh server.
    sse: bool,
    /// Each case with subscribers taking a changing document whole, then as deltas.
    delta: bool,
    /// Rounds of every case.
    repeat: usize,
    /// The CPUs of the servers started and of the load generator (pinned already).
    pin: Option<(usize, usize)>,
    /// The servers behind the URLs.
    server_pids: Vec<u32>,
    /// Subscriber processes (0: as many as the open-file limit needs).
    shards: usize,
    /// Percent of the subscribers that never read.
    non_readers: u8,
    /// Each server's `--memory`.
    memory: Option<u64>,
}

/// `freeboard bench broadcast`: against the servers at `urls` (publishing at `publish`, or at
/// `urls` when it is empty), or the `peers` it starts.
fn broadcast(
    urls: Vec<String>,
    publish: Vec<String>,
    peers: Option<String>,
    plan: &BroadcastPlan,
    command_line: String,
) -> Result<Report, String> {
    use freeboard_bench::broadcast::{self, Broadcast};
    use indicatif::{ProgressBar, ProgressStyle};

    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let mut report = Report {
        command: command_line,
        load_average: (process::load_average(), None),
        pinned: plan.pin,
        ..Report::default()
    };
    let server_cpu = plan.pin.map(|(server, _)| server);
    // (deflate, delta): `Some(delta)` is one side of the delta comparison.
    let variants: &[(bool, Option<bool>)] = match (plan.compression, plan.delta) {
        (true, _) => &[(false, None), (true, None)],
        (false, true) => &[(false, Some(false)), (false, Some(true))],
        (false, false) => &[(false, None)],
    };
    // `Some(sse)`: one side of the SSE comparison.
    let mut measure = |name: &str,
                       subscribe: &[Target],
                       publish: &[Target],
                       server_pids: &[u32],
                       rounds: usize,
                       sse: Option<bool>|
     -> Result<(), String> {
        for _ in 0..rounds {
            for &n in &plan.subscribers {
                for &size in &plan.sizes {
                    for &(deflate, delta) in variants {
                        let name = match (deflate, sse, delta) {
                            (_, _, Some(false)) => format!("{name}+whole"),
                            (_, _, Some(true)) => format!("{name}+delta"),
                            (true, _, None) => format!("{name}+deflate"),
                            (false, Some(false), None) => format!("{name}+ws-text"),
                            (false, Some(true), None) => format!("{name}+sse"),
                            (false, None, None) => name.to_string(),
                        };
                        let messages =
                            plan.messages.unwrap_or_else(|| broadcast::default_messages(n));
                        let bar = ProgressBar::new(messages).with_style(
                            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} messages")
                                .unwrap_or_else(|_| ProgressStyle::default_bar()),
                        );
                        bar.set_message(format!("{name}: {n} subscribers × {size} B"));
                        let run = Broadcast {
                            subscribe: subscribe.to_vec(),
                            publish: publish.to_vec(),
                            subscribers: n,
                            size,
                            window: plan.window,
                            messages,
                            deflate,
                            server_pids: server_pids.to_vec(),
                            text: sse.is_some(),
                            sse: sse == Some(true),
                            document: delta.is_some(),
                            delta: delta == Some(true),
                            shards: plan.shards,
                            non_readers: plan.non_readers,
                            memory: plan.memory,
                        };
                        let row =
                            broadcast::run(&run, &name, &mut |done| bar.set_position(done))
                                .map_err(|e| format!("{name}, {n} subscribers × {size} B: {e}"))?;
                        bar.finish_and_clear();
                        report.broadcasts.push(row);
                    }
                }
            }
        }
        Ok(())
    };
    match (urls.is_empty(), peers) {
        (false, None) => {
            let targets = urls.iter().map(|u| Target::parse(u)).collect::<Result<Vec<_>, _>>()?;
            let publish = match publish.is_empty() {
                true => targets.clone(),
                false => publish.iter().map(|u| Target::parse(u)).collect::<Result<_, _>>()?,
            };
            let sides: &[Option<bool>] =
                if plan.sse { &[Some(false), Some(true)] } else { &[None] };
            let name = urls.join(",");
            for _ in 0..plan.repeat {
                for &side in sides {
                    measure(&name, &targets, &publish, &plan.server_pids, 1, side)?;
                }
            }
        }
        (false, Some(_)) => return Err("give topic URLs or --peers, not both".into()),
        (true, peers) => {
            let list = peers.unwrap_or_else(|| "freeboard".into());
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut servers = Peers::in_repository(exe);
            servers.serve_args = [
                "--client-publish",
                "--topic-slow-consumer",
                "drop-oldest",
                "--topic-send-cap",
                "4M",
            ]
            .into_iter()
            .map(String::from)
            .collect();
            if plan.compression {
                servers.serve_args.extend(["--compression".to_string(), "shared".to_string()]);
            }
            if plan.delta {
                servers.serve_args.extend(["--delta-prefix".to_string(), String::new()]);
            }
            let chosen: Vec<&str> = list.split(',').map(str::trim).collect();
            for name in &chosen {
                if plan.delta && Peer::parse(name)? != Peer::Freeboard {
                    return Err(format!("--delta runs freeboard only, not {name}"));
                }
                if plan.compression && Peer::parse(name)? != Peer::Freeboard {
                    return Err(format!("--compression runs freeboard only, not {name}"));
                }
            }
            // Interleaved, as the load experiments are: each round starts every server in
            // turn for one run of each case, so a change in the machine's load falls on all.
            let mut skipped = Vec::new();
            for name in (0..plan.repeat).flat_map(|_| chosen.iter().copied()) {
                if skipped.contains(&name) {
                    continue;
                }
                let peer = Peer::parse(name)?;
                let (sub, publ) = match peer {
                    Peer::Freeboard | Peer::FreeboardUring => ("/topic/bench", "/topic/bench"),
                    Peer::NodeWsBroadcast => ("/sub", "/pub"),
                    Peer::RawTcpBroadcast => ("/", "/"),
                    _ => return Err(format!("{name} has no broadcast route")),
                };
                let sides: &[Option<bool>] = match (plan.sse, peer) {
                    (true, Peer::Freeboard) => &[Some(false), Some(true)],
                    _ => &[None],
                };
                for &side in sides {
                    let running = match servers.start(peer, server_cpu) {
                        Ok(running) => running,
                        Err(e) => {
                            eprintln!("freeboard bench: skipping {name}: {e}");
                            skipped.push(name);
                            break;
                        }
                    };
                    let at = |path: &str| Target::at(running.target.addr, path, running.target.raw);
                    measure(name, &[at(sub)], &[at(publ)], &[running.pid], 1, side)?;
                    drop(running);
                }
                if skipped.contains(&name) {
                    continue;
                }
                if let (Peer::Freeboard, Some(redis)) = (peer, &plan.redis) {
                    // The same load on two nodes of one Redis: subscribers on both, the
                    // publisher on the first.
                    let mut two =
                        Peers::in_repository(std::env::current_exe().map_err(|e| e.to_string())?);
                    two.serve_args = servers.serve_args.clone();
                    two.serve_args.extend(["--redis".to_string(), redis.clone()]);
                    let a = two.start(peer, server_cpu).map_err(|e| format!("node A: {e}"))?;
                    let b = two.start(peer, server_cpu).map_err(|e| format!("node B: {e}"))?;
                    let at = |r: &freeboard_bench::peers::Running| {
                        Target::at(r.target.addr, sub, r.target.raw)
                    };
                    let both = [at(&a), at(&b)];
                    measure("freeboard-2-nodes-redis", &both, &[at(&a)], &[], 1, None)?;
                }
            }
        }
    }
    report.load_average.1 = process::load_average();
    Ok(report)
}

/// Prints `report` and writes what `output` asks for (`csv` renders the CSV).
fn finish(report: &Report, output: &Output, csv: fn(&Report) -> String) -> Result<(), String> {
    print_markdown(report);
    if let Some(path) = &output.json {
        std::fs::write(path, report.to_json()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &output.csv {
        std::fs::write(path, csv(report)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(dir) = &output.charts {
        write_charts(report, dir)?;
    }
    Ok(())
}

/// The experiments of `freeboard bench all`: name and arguments, full and `--quick`.
fn suite(peers: &str, quick: bool) -> Vec<(&'static str, Vec<String>)> {
    let broadcast_peers = match peers {
        "freeboard" => "freeboard".to_string(),
        _ => "freeboard,raw-tcp-broadcast,node-ws-broadcast".to_string(),
    };
    let with_peers = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        v.extend(["--peers".to_string(), peers.to_string()]);
        v
    };
    let plain = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
    let q = |full: &[&'static str], short: &[&'static str]| -> Vec<&'static str> {
        if quick { short.to_vec() } else { full.to_vec() }
    };
    let mut broadcast = plain(&q(
        &["broadcast", "--subscribers", "100,1000"],
        &["broadcast", "--subscribers", "10", "--size", "64", "--messages", "100"],
    ));
    broadcast.extend(["--peers".to_string(), broadcast_peers]);
    vec![
        (
            "echo",
            with_peers(&q(
                &["echo", "--clients", "1,4", "--size", "64,1024,16384"],
                &[
                    "echo",
                    "--clients",
                    "1,2",
                    "--size",
                    "64,1024",
                    "--messages",
                    "200",
                    "--repeat",
                    "1",
                ],
            )),
        ),
        (
            "pipeline",
            with_peers(&q(
                &["pipeline", "--clients", "1,4,16"],
                &["pipeline", "--clients", "1,2", "--duration", "0.5", "--repeat", "1"],
            )),
        ),
        (
            "connections",
            with_peers(&q(
                &["connections"],
                &["connections", "--counts", "10,100", "--cycles", "1", "--repeat", "1"],
            )),
        ),
        (
            "slow-consumer",
            with_peers(&q(&["slow-consumer"], &["slow-consumer", "--duration", "1"])),
        ),
        ("broadcast", broadcast),
        (
            "latency",
            with_peers(&q(
                &["latency", "--sweep", "--connections", "100,10000"],
                &[
                    "latency",
                    "--sweep",
                    "--bound",
                    "50ms",
                    "--connections",
                    "10",
                    "--from",
                    "500",
                    "--max-steps",
                    "2",
                    "--duration",
                    "500ms",
                    "--warmup",
                    "100ms",
                    "--repeat",
                    "1",
                ],
            )),
        ),
        (
            "watermarks",
            plain(&q(
                &["watermarks"],
                &[
                    "watermarks",
                    "--batch",
                    "300",
                    "--burst",
                    "100",
                    "--bursts",
                    "2",
                    "--warmup",
                    "1",
                    "--iterations",
                    "3",
                ],
            )),
        ),
        (
            "buffers-simulation",
            plain(&q(&["buffers", "simulate"], &["buffers", "simulate", "--hours", "0.25"])),
        ),
        (
            "buffers-soak",
            plain(&q(
                &["buffers", "soak", "--chunk-size", "1K,4K,16K"],
                &["buffers", "soak", "--duration", "3s", "--sample", "1s", "--pattern-every", "1s"],
            )),
        ),
    ]
}

/// `freeboard bench all`: every experiment as a child `freeboard bench …`, then the report.
fn all(peers: Option<String>, out: &std::path::Path, quick: bool) -> Result<(), String> {
    use std::process::{Command, Stdio};

    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let peers = peers.unwrap_or_else(|| "freeboard".into());
    let mut failed = Vec::new();
    let mut markdown = String::new();
    for (name, args) in suite(&peers, quick) {
        eprintln!("freeboard bench all: {name}: freeboard bench {}", args.join(" "));
        let file = |ext: &str| out.join(format!("{name}.{ext}"));
        let status = Command::new(&exe)
            .arg("bench")
            .args(&args)
            .arg("--json")
            .arg(file("json"))
            .arg("--csv")
            .arg(file("csv"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output();
        match status {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                std::fs::write(file("md"), text.as_bytes())
                    .map_err(|e| format!("{}: {e}", file("md").display()))?;
                markdown.push_str(&format!("\n## {name}\n\n{text}"));
            }
            Ok(o) => {
                eprintln!("freeboard bench all: {name} failed ({})", o.status);
                failed.push(name);
            }
            Err(e) => {
                eprintln!("freeboard bench all: {name} could not start: {e}");
                failed.push(name);
            }
        }
    }
    let report_md = out.join("REPORT.md");
    std::fs::write(&report_md, &markdown).map_err(|e| format!("{}: {e}", report_md.display()))?;
    print!("{markdown}");
    let mut everything = Report::default();
    let mut names: Vec<_> = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    for path in names {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        everything.merge(Report::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    write_charts(&everything, out)?;
    match failed.is_empty() {
        true => Ok(()),
        false => Err(format!("failed: {}", failed.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_connections_are_explained_run_by_run() {
        use freeboard_bench::load::Measured;
        use freeboard_bench::report::LoadRow;
        let failing = Measured {
            connected: 4,
            failed: 2,
            failures: vec![("closed by the server with 1001 (server shutting down)".into(), 2)],
            sent: 100,
            received: 98,
            ..Measured::default()
        };
        let clean = Measured { connected: 4, sent: 100, received: 100, ..Measured::default() };
        let row = LoadRow::new("pipeline", "freeboard", (4, 64, 64), vec![clean, failing]);
        let report = Report { loads: vec![row], ..Report::default() };
        let (lines, total) = failed_connections(&report);
        assert_eq!(total, 2);
        assert_eq!(
            lines[0],
            "freeboard pipeline (4 clients, 64 B), run 2: 2 of 4 connections failed: \
             2 × closed by the server with 1001 (server shutting down)"
        );
        assert!(lines[1].contains("2 connections failed") && lines[1].contains("exit status 3"));
        let (lines, total) = failed_connections(&Report::default());
        assert!(lines.is_empty() && total == 0);
    }

    #[test]
    fn durations_parse_with_units() {
        // The bench's flags read durations with the configuration's one grammar.
        use crate::duration as parse_duration;
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn pairs_parse_low_over_high() {
        assert_eq!(parse_pair("4K/16K"), Ok((4 << 10, 16 << 10)));
        assert!(parse_pair("16K/4K").is_err());
        assert!(parse_pair("4K").is_err());
    }
}
