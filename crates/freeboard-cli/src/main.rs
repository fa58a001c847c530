//! `freeboard`: the WebSocket server (and, later, its load generator and client).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "bench")]
mod bench;
mod client;

use clap::{Args, Parser, Subcommand};
use freeboard::{Echo, HttpRoute, Router, ServerConfig, ServerHandle};
use freeboard_topics::Service;
use serde::Deserialize;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The browser's resuming subscription (bindings/browser), served at `/js/freeboard.js`.
const BROWSER_MODULE: HttpRoute = HttpRoute::File {
    content_type: "text/javascript; charset=utf-8",
    body: include_bytes!("../../../bindings/browser/freeboard.js"),
};
/// Its TypeScript declarations, at `/js/freeboard.d.ts`.
const BROWSER_TYPES: HttpRoute = HttpRoute::File {
    content_type: "application/typescript; charset=utf-8",
    body: include_bytes!("../../../bindings/browser/freeboard.d.ts"),
};

/// A WebSocket server whose memory is bounded and whose backpressure works.
#[derive(Parser)]
#[command(name = "freeboard", version, about)]
struct Cli {
    /// Log lines on stderr as `text` (coloured only on a terminal) or `json` (one object per
    /// line: `timestamp`, `level`, `message`, `target` and the event's own fields beside them).
    /// Filter them with RUST_LOG (default `info`).
    #[arg(long, global = true, value_enum, default_value = "text", value_name = "FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pub/sub server: a WebSocket at `/topic/NAME` subscribes to NAME, and to A and
    /// B with `/topic/NAME?also=A&also=B` (names: 1-128 of A-Z a-z 0-9 - . _ ~ :);
    /// `POST /topic/NAME` publishes its body (a text message for a `Content-Type` of text/*,
    /// application/json or application/*+json, which must be UTF-8; else binary) and answers
    /// `{"messages":1,"delivered":D,"dropped":X,"other_loops":L,"other_loops_dropped":Y,
    /// "complete":true}` (with --redis also `"redis_queued":Q,"redis_lost":Z,
    /// "redis_connected":true`) with status 200 when it went everywhere it had to, 202 when its
    /// fate is not known yet (Redis not connected, or `"complete":false`), 503 when it was not
    /// taken (Redis's queue full). `/healthz` answers plain HTTP. The demo (no --config,
    /// listening on loopback) also echoes at `/` and `/echo` and serves `/metrics`
    /// (OpenMetrics) and `/dashboard` (a live page of the server's figures) to loopback
    /// clients; production (--config, or listening beyond loopback) serves the echo only with
    /// --echo, /metrics and /dashboard only with --admin-token or --admin-listen, and `POST`
    /// only with a credential. Logs go to stderr, filtered by RUST_LOG (default `info`).
    /// SIGTERM/SIGINT shut down gracefully (close 1001, drain, a last `stopped` line with
    /// counts); a second signal exits at once. SIGHUP reads the configuration again and
    /// applies the limits, policies and tokens that can change while running (new
    /// connections get them; open ones are kept), and with TLS the certificate and key,
    /// logging each change.
    Serve(Box<ServeArgs>),
    /// Connect to a WebSocket server: stdin lines are sent as messages, received messages
    /// are written to stdout, one per line.
    #[command(after_help = client::EXIT_CODES)]
    Client(client::ClientArgs),
    /// Measure an echo server, or freeboard and peer servers side by side (`--peers`).
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        command: Box<bench::BenchCommand>,
    },
}

/// Flags override the config file, which overrides the defaults.
#[derive(Args)]
struct ServeArgs {
    /// TOML file with any of the settings below (snake_case keys; sizes and durations as the
    /// flags take them, e.g. `memory = "256M"`, `idle_timeout = "30s"`, `idle_timeout = 0`
    /// for no pings; `[topics]` for the topic settings, `[tls]` for cert, key and listen). Flags
    /// override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on: HOST:PORT (0.0.0.0:9001 for every interface, [::]:9001,
    /// localhost:9001) or a port alone (on loopback) [default: 127.0.0.1:9001]. An address
    /// another process listens on is refused ("address in use") unless --share-port. With
    /// --tls-cert and no --listen-tls it speaks TLS (wss://).
    #[arg(long, value_name = "ADDR", value_parser = listen)]
    listen: Option<SocketAddr>,
    /// Join the SO_REUSEPORT group of another process listening on the same address (a
    /// rolling restart), instead of failing with "address in use"; TOML `share_port`.
    #[arg(long)]
    share_port: bool,
    /// PEM certificate chain (leaf first) for wss://; reloaded with the key on SIGHUP (new
    /// handshakes use the new pair, open connections are kept).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A TLS listener beside the plain --listen one (then --listen stays ws://); the same
    /// forms as --listen.
    #[arg(long, value_name = "ADDR", value_parser = listen)]
    listen_tls: Option<SocketAddr>,
    /// TLS handshakes one client address (an IPv6 /64) may have in progress at once; beyond
    /// it a connection is closed at accept, before it holds TLS state (counted as
    /// tls_refusals reason per_ip_handshakes), so one address cannot take the handshake
    /// budget from the others; TOML `[tls] handshakes_per_ip` [default: 64].
    #[arg(long, value_name = "N")]
    tls_handshakes_per_ip: Option<usize>,
    /// TLS handshakes one client address may start per second (token bucket); beyond it a
    /// connection is closed at accept (per_ip_rate); 0 is off; TOML `[tls]
    /// handshake_rate_per_ip` [default: 0].
    #[arg(long, value_name = "PER_SEC")]
    tls_handshake_rate_per_ip: Option<u32>,
    /// Event loops (threads), each with its own SO_REUSEPORT listener [default: available cores].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// How the loops move plain-TCP bytes: epoll, or uring (io_uring, Linux 6.0+: multishot
    /// accept and receive into pool buffers, one submission of sends per turn; TLS and admin
    /// connections stay on epoll). A kernel that refuses io_uring (seccomp,
    /// kernel.io_uring_disabled) gets epoll and one log line; freeboard_loop_io says which
    /// each loop runs. epoll answers request/reply faster; uring delivers more where a
    /// server fans publications out to many subscribers [default: epoll].
    #[arg(long, value_name = "DRIVER", value_parser = ["epoll", "uring"])]
    io: Option<String>,
    /// Memory budget for all buffers, split between the loops: bytes or with a suffix K, M,
    /// G (powers of 1024; fractions like 1.5G allowed) [default: 1G].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    memory: Option<u64>,
    /// Largest message accepted; larger ones close the connection with 1009. The send cap
    /// follows it (max_message_size + 64K) unless --send-cap is given [default: 16M].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    max_message_size: Option<u64>,
    /// Open connections across all loops; beyond it upgrades get 503 [default: 100000].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Connections per client IP; beyond it upgrades get 429 with Retry-After [default: 1000].
    #[arg(long, value_name = "N")]
    max_connections_per_ip: Option<usize>,
    /// New connections per second across the server (token bucket); beyond it upgrades get
    /// 503 with Retry-After; 0 is off [default: 0].
    #[arg(long, value_name = "PER_SEC")]
    accept_rate: Option<f64>,
    /// New connections per second from one IP (token bucket); beyond it upgrades get 429 with
    /// Retry-After; 0 is off [default: 0].
    #[arg(long, value_name = "PER_SEC")]
    accept_rate_per_ip: Option<f64>,
    /// Time without input before a keep-alive ping (seconds, or with a unit: 30s, 2m) [default: 30s]; 0 turns pings off.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    idle_timeout: Option<Duration>,
    /// How long a keep-alive ping may stay unanswered [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pong_timeout: Option<Duration>,
    /// Turn automatic keep-alive pings off (the Autobahn run needs this).
    #[arg(long)]
    no_auto_ping: bool,
    /// Time from accept to a complete upgrade request (slowloris) [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    handshake_timeout: Option<Duration>,
    /// How long to wait for the peer's close frame after ours, and for what is still queued
    /// to leave once the connection has closed (a peer that stopped reading is then
    /// dropped) [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    close_timeout: Option<Duration>,
    /// How long shutdown waits for close handshakes [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    drain_timeout: Option<Duration>,
    /// Send queue high watermark: above it a connection is not writable and its reads pause;
    /// keep it at least --read-buffer so the replies to one read leave in one write
    /// [default: 128K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    send_high: Option<u64>,
    /// Send queue low watermark: writable again at or below it [default: 64K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    send_low: Option<u64>,
    /// Send queue hard cap; at it the slow-consumer policy decides [default: 16M + 64K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    send_cap: Option<u64>,
    /// Slow-consumer policy at the cap: block, drop-newest, drop-oldest, conflate, close
    /// (1008) [default: close].
    #[arg(long, value_name = "POLICY")]
    slow_consumer: Option<String>,
    /// Free pool bytes an upgrade needs, else 503; a message arriving in pieces that would
    /// leave less than half of it free gets close 1013 [default: 64K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    connection_reserve: Option<u64>,
    /// Unsent bytes the kernel may hold for one connection (TCP_NOTSENT_LOWAT); past them a
    /// slow reader's backlog waits in its send queue, inside --memory, where
    /// --slow-consumer sees it. 0: the kernel's own limit (tcp_wmem, up to 4 MiB a socket,
    /// outside the budget) [default: 64K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    kernel_send_queue: Option<u64>,
    /// permessage-deflate: off, shared (one compressor per event loop, no context takeover),
    /// dedicated (a context per connection, drawn from the budget; without budget the
    /// connection goes uncompressed) [default: off].
    #[arg(long, value_name = "MODE")]
    compression: Option<String>,
    /// Window of a dedicated compression context, 9-15 bits [default: 15].
    #[arg(long, value_name = "BITS")]
    compression_window: Option<u8>,
    /// Messages shorter than this go uncompressed; 0 compresses all [default: 64].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    compression_threshold: Option<u64>,
    /// Pool chunk size [default: 4K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    chunk_size: Option<u64>,
    /// Per-loop shared read buffer, and the cork beside it that replies are framed into, each
    /// this large, from the budget [default: 128K].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    read_buffer: Option<u64>,
    /// Publish what clients send on a /topic/NAME connection to NAME (otherwise such a
    /// message gets close 1008).
    #[arg(long)]
    client_publish: bool,
    /// Bearer token `POST /topic/NAME` must carry (`Authorization: Bearer TOKEN`; 401
    /// without, 403 if wrong); TOML `[topics] publish_token`. Default: no token needed.
    #[arg(long, value_name = "TOKEN", env = "FREEBOARD_PUBLISH_TOKEN", hide_env_values = true)]
    publish_token: Option<String>,
    /// Slow-consumer policy of topic subscribers: block (counts as a drop), drop-newest,
    /// drop-oldest, conflate, close [default: conflate].
    #[arg(long, value_name = "POLICY")]
    topic_slow_consumer: Option<String>,
    /// Under conflate, the character that ends a message's key (`|` for `EURUSD|{...}`): a
    /// subscriber that is behind keeps the latest message of each key; TOML `[topics]
    /// conflate_key` [default: none, only the latest message].
    #[arg(long, value_name = "CHAR")]
    topic_conflate_key: Option<char>,
    /// Send queue hard cap of one topic subscriber [default: 1M].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    topic_send_cap: Option<u64>,
    /// An origin browsers may connect from (repeatable): `https://app.example.com`,
    /// `https://*.example.com`, `*`. Others get 403. Default: any origin.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Reverse proxies whose `Forwarded` / `X-Forwarded-For` name the client (CIDR blocks,
    /// repeatable or comma-separated), for limits, logs and metrics. Default: none.
    #[arg(long = "trusted-proxy", value_name = "CIDR", value_delimiter = ',', num_args = 1..)]
    trusted_proxies: Vec<String>,
    /// Every connection starts with a PROXY protocol v1/v2 header naming the client.
    #[arg(long)]
    proxy_protocol: bool,
    /// WebSockets over HTTP/2 (RFC 8441): `on` offers `h2` by ALPN on the TLS listener and
    /// takes HTTP/2 with prior knowledge (h2c) on the plain one, each WebSocket a stream of
    /// one connection; `off` speaks HTTP/1.1 only [default: on].
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    http2: Option<bool>,
    /// Upgrade decisions that may wait at once [default: 1024].
    #[arg(long, value_name = "N")]
    max_pending_upgrades: Option<usize>,
    /// HS256 secret (32 bytes or more) of the JWTs topic connections must carry; TOML
    /// `[topics] jwt_secret`. Default: no token needed.
    #[arg(long, value_name = "SECRET", env = "FREEBOARD_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// A JWKS file of RSA / P-256 keys for RS256 / ES256 tokens; TOML `[topics] jwks_file`.
    #[arg(long, value_name = "FILE")]
    jwks: Option<std::path::PathBuf>,
    /// The `iss` tokens must carry.
    #[arg(long, value_name = "ISSUER")]
    jwt_issuer: Option<String>,
    /// The `aud` tokens must carry.
    #[arg(long, value_name = "AUDIENCE")]
    jwt_audience: Option<String>,
    /// Clock skew allowed with the tokens' issuer: accepted up to this long past `exp` and
    /// before `nbf` / `iat`, else 401; TOML `[topics] jwt_leeway` [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    jwt_leeway: Option<Duration>,
    /// A connect webhook (`http://host:port/path`) that decides every topic upgrade
    /// (Centrifugo's proxy model); TOML `[topics] connect_webhook`.
    #[arg(long, value_name = "URL")]
    connect_webhook: Option<String>,
    /// How long the connect webhook may take (then 503) [default: 2s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    webhook_timeout: Option<Duration>,
    /// Requests to the connect webhook in flight at once [default: 16].
    #[arg(long, value_name = "N")]
    webhook_in_flight: Option<usize>,
    /// An origin whose pages may publish with `POST` from a browser (CORS; repeatable).
    #[arg(long = "publish-cors-origin", value_name = "ORIGIN")]
    publish_cors_origins: Vec<String>,
    /// Redis backplane (`redis://HOST:PORT/`): topics span every node on the same Redis. A
    /// Redis Cluster is found by itself (`INFO cluster`) and used with sharded pub/sub
    /// (Redis 7.0+); give one or more of its nodes, comma-separated, as seeds. TOML
    /// `[topics] redis`. Default: topics stay on this machine.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Messages of history kept per topic, for subscribers reconnecting with `?since=OFFSET`;
    /// such topics' messages carry an `{offset}:` envelope; TOML `[topics] history`
    /// [default: 0, none].
    #[arg(long, value_name = "N")]
    history: Option<usize>,
    /// The oldest a kept message may be (0: no limit); TOML `[topics] history_seconds`.
    #[arg(long, value_name = "SECS")]
    history_seconds: Option<u64>,
    /// Bytes all topics' history may hold; TOML `[topics] history_memory` [default: 8M].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    history_memory: Option<u64>,
    /// Only topics named with this prefix keep history; TOML `[topics] history_prefix`
    /// [default: every topic].
    #[arg(long, value_name = "PREFIX")]
    history_prefix: Option<String>,
    /// Topics named with this prefix have presence: `GET /topic/NAME/presence` lists their
    /// subscribers, `?presence=1` sends join/leave events (`""`: every topic); TOML `[topics]
    /// presence_prefix` [default: none].
    #[arg(long, value_name = "PREFIX")]
    presence_prefix: Option<String>,
    /// Members one topic's presence holds; beyond, a subscriber is closed 1013; TOML
    /// `[topics] presence_max_per_topic` [default: 100000].
    #[arg(long, value_name = "N")]
    presence_max_per_topic: Option<usize>,
    /// Bytes all topics' presence may hold (about 145 per member); TOML `[topics]
    /// presence_memory` [default: 8M].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    presence_memory: Option<u64>,
    /// How long a node's members stay listed on other nodes (through Redis) unless refreshed:
    /// a dead node leaves within it; TOML `[topics] presence_ttl` [default: 6s].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    presence_ttl: Option<Duration>,
    /// Token claims a presence entry shows beside `sub` (comma-separated); TOML `[topics]
    /// presence_claims` [default: none].
    #[arg(long, value_name = "CLAIMS", value_delimiter = ',')]
    presence_claims: Vec<String>,
    /// Topics named with this prefix offer delta compression to subscribers that ask with
    /// `?delta=fossil` (`""`: every topic); TOML `[topics] delta_prefix` [default: none].
    #[arg(long, value_name = "PREFIX")]
    delta_prefix: Option<String>,
    /// Topics whose name starts with PREFIX get per-topic series on /metrics
    /// (`freeboard_named_topic_*{topic}`) and a row in the dashboard's topics table
    /// (repeatable, or a comma-separated list; `""` names every topic); TOML `[topics]
    /// metrics_prefixes` [default: none].
    #[arg(long = "topic-metrics-prefix", value_name = "PREFIX", value_delimiter = ',')]
    topic_metrics_prefixes: Vec<String>,
    /// Named topics that may have per-topic series at once (a subscription to one more is
    /// counted in `freeboard_named_topic_left_out_total`); TOML `[topics] metrics_topics`
    /// [default: 100].
    #[arg(long, value_name = "N")]
    topic_metrics_max: Option<usize>,
    /// The reconnection delay a Server-Sent Events subscriber is told (`retry:`), in
    /// milliseconds; TOML `[topics] sse_retry_ms` [default: 1000].
    #[arg(long, value_name = "MS")]
    sse_retry: Option<u64>,
    /// Topics one connection may subscribe to (its topic and its `also=` list; an upgrade
    /// naming more gets 400); TOML `[topics] max_topics_per_connection` [default: 64].
    #[arg(long, value_name = "N")]
    max_topics_per_connection: Option<usize>,
    /// Topics with a subscriber the server may have at once (a new one beyond: close 1008,
    /// counted in `topic_refusals`); TOML `[topics] max_topics` [default: 100000].
    #[arg(long, value_name = "N")]
    max_topics: Option<usize>,
    /// Bytes of publications the queue towards Redis holds while Redis is slow or down
    /// (beyond: counted lost); TOML `[topics] redis_queue` [default: 16M].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    redis_queue: Option<u64>,
    /// Refuse to start when --redis cannot be reached (exit 1 at once), instead of starting
    /// and reconnecting until it answers; TOML `[topics] redis_required`.
    #[arg(long)]
    redis_required: bool,
    /// When a POST on a history topic kept in Redis is answered as accepted: `none` (once
    /// queued towards Redis), `redis` (once Redis has kept it), `replica` (once a replica
    /// has it too: it survives the loss of any one machine; needs replicas); TOML `[topics]
    /// redis_durability` [default: redis].
    #[arg(long, value_name = "WHEN", value_parser = ["none", "redis", "replica"])]
    durability: Option<String>,
    /// Do not serve the live dashboard at /dashboard (and its stream at /dashboard/stream);
    /// TOML `[routes] dashboard = false`.
    #[arg(long)]
    no_dashboard: bool,
    /// Serve the echo routes (`/` and `/echo`) in production too (they are on in the demo);
    /// TOML `[routes] echo = true`.
    #[arg(long)]
    echo: bool,
    /// Bearer token the admin routes (/metrics, /dashboard and its stream) ask of every
    /// client: `Authorization: Bearer TOKEN`, or `/dashboard?token=TOKEN` in a browser (401
    /// without, 403 if wrong); TOML `[admin] token`. Default: none, and the admin routes
    /// answer loopback clients only (others get 403).
    #[arg(long, value_name = "TOKEN", env = "FREEBOARD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Serve the admin routes (and /healthz) on this address only, plain HTTP, to any client
    /// that reaches it (firewall it, or set --admin-token too); on the public listener they
    /// answer 404. TOML `[admin] listen` (the same forms as --listen). Default: none.
    #[arg(long, value_name = "ADDR", value_parser = listen)]
    admin_listen: Option<SocketAddr>,
    /// Admin requests (and dashboard-stream upgrades) one address may make per second; beyond
    /// it 429. 0 turns the limit off. TOML `[admin] rate_per_ip` [default: 100].
    #[arg(long, value_name = "PER_SEC")]
    admin_rate_per_ip: Option<f64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Client(args) => client::run(args),
        Command::Serve(args) => match serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("freeboard serve: {e}");
                ExitCode::FAILURE
            }
        },
        #[cfg(feature = "bench")]
        Command::Bench { command } => match bench::run(*command) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("freeboard bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, `target`, and the event's
    /// own fields beside them (`"addr":"127.0.0.1:9001"`).
    Json,
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    // One malloc arena. The loops allocate only as connections come and go (their tables),
    // never per message, so arenas of their own buy nothing; and the `malloc_trim` a loop
    // calls once a burst of connections is over gives back the free top of the main arena
    // only — a thread arena keeps its top up to glibc's trim threshold, which it raises to
    // twice the size of the last big block freed (the burst's connection table): measured,
    // +0.45 MiB after 10,000 connections closed with an arena per loop, none with one arena.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation policy; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let Settings { server: config, topics, routes } = settings(&args)?;
    // One descriptor per connection: the soft limit (often 1024) is raised to the hard one,
    // which only the operator can raise (docs/operating/scaling.md).
    let open_files = freeboard::capacity::raise_open_files_limit();
    if let Err(e) = &open_files {
        tracing::warn!(error = %e, "could not raise the open-file limit");
    }
    // The topic service reads its key files and starts its webhook once, for every loop.
    let service = Service::new(&topics).map_err(|e| e.to_string())?;
    let admin_guarded = config.admin.token.is_some() || config.admin.listen.is_some();
    // In production the admin routes are served only where they are guarded: on loopback a
    // reverse proxy on the same machine would make every client look local.
    let admin = routes.demo || admin_guarded;
    let (metrics, dashboard) = (routes.metrics && admin, routes.dashboard && admin);
    let echo = routes.echo;
    let summary = summary(&config, &topics, &routes);
    let server = service
        .bind(config, move |service| {
            let mut router = Router::new()
                .http("/healthz", HttpRoute::Health)
                .http("/js/freeboard.js", BROWSER_MODULE)
                .http("/js/freeboard.d.ts", BROWSER_TYPES);
            if echo {
                router = router.route("/", Echo).route("/echo", Echo);
            }
            if metrics {
                router = router.http("/metrics", HttpRoute::Metrics);
            }
            if dashboard {
                router = router.dashboard("/dashboard");
            }
            service.mount(router)
        })
        .map_err(|e| e.to_string())?;
    server.metrics().set_summary(&summary);
    let capacity = server.capacity();
    tracing::info!(
        connections = capacity.connections(),
        binding = capacity.binding(),
        "capacity: {capacity}"
    );
    if capacity.binding() == "open files" {
        let hard = open_files.map_or(0, |(_, hard)| hard);
        tracing::warn!(
            hard_limit = hard,
            "the open-file limit binds first: raise its hard limit (LimitNOFILE=, ulimit -Hn, \
             and fs.nr_open above it) to hold more connections"
        );
    }
    let addr = server.local_addr();
    match server.tls_addr() {
        Some(tls) if tls == addr => println!("freeboard listening on wss://{addr}/"),
        Some(tls) => println!("freeboard listening on ws://{addr}/ and wss://{tls}/"),
        None => println!("freeboard listening on ws://{addr}/"),
    }
    match server.tls_addr() {
        Some(wss) => tracing::info!(%addr, %wss, "listening"),
        None => tracing::info!(%addr, "listening"),
    }
    log_mode(&routes, &topics, echo, metrics, dashboard, admin_guarded);
    if let Some(admin) = server.admin_addr() {
        tracing::info!(url = %format_args!("http://{admin}/metrics"), "admin listener");
    }
    if dashboard {
        let at = server.admin_addr().unwrap_or(addr);
        tracing::info!(url = %format_args!("http://{at}/dashboard"), "dashboard");
    }
    let handle = server.handle();
    let metrics = server.metrics();
    let started = std::time::Instant::now();
    // What was open when shutdown began, and the closes counted by then.
    let at_signal = Arc::new(Mutex::new(None::<(i64, u64)>));
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(|e| e.to_string())?;
    {
        let (metrics, at_signal) = (metrics.clone(), at_signal.clone());
        std::thread::spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                match signal {
                    SIGHUP => reload(&handle, &args, &topics),
                    _ if stopping => {
                        tracing::warn!("second signal: exiting now");
                        std::process::exit(130);
                    }
                    _ => {
                        let open = metrics.connections();
                        *at_signal.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some((open, metrics.closes_total()));
                        tracing::info!(open, "shutting down: closing connections with 1001");
                        stopping = true;
                        handle.shutdown();
                    }
                }
            }
        });
    }
    server.run().map_err(|e| e.to_string())?;
    // The last line: what the shutdown drained, and what the server did in its life.
    let (open, closes_before) =
        at_signal.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or((0, metrics.closes_total()));
    let drained = metrics.closes_total().saturating_sub(closes_before).min(open.max(0) as u64);
    tracing::info!(
        open_at_signal = open,
        closed_in_drain = drained,
        cut_at_drain_timeout = open.max(0) as u64 - drained,
        accepted = metrics.accepted(),
        messages_in = metrics.messages_in(),
        messages_out = metrics.messages_out(),
        uptime_s = started.elapsed().as_secs(),
        "stopped"
    );
    Ok(())
}

/// What the dashboard shows of the configuration: the settings an operator looks for first,
/// secrets left out (a token is "set"; a Redis URL loses its password).
fn summary(
    config: &ServerConfig,
    topics: &freeboard_topics::Config,
    routes: &Routes,
) -> Vec<(&'static str, String)> {
    let set = |given: bool| if given { "set" } else { "none" }.to_owned();
    let size = |bytes: usize| match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    };
    let redis =
        topics.redis.redis.as_deref().map_or("none".to_owned(), |url| match url.split_once('@') {
            Some((scheme_auth, host)) => {
                let scheme = scheme_auth.split("://").next().unwrap_or("redis");
                format!("{scheme}://…@{host}")
            }
            None => url.to_owned(),
        });
    let tls = config.tls.as_ref().map_or("off".to_owned(), |t| match t.listen {
        Some(listen) => format!("on {listen}"),
        None => "on the listener".to_owned(),
    });
    vec![
        ("defaults", if routes.demo { "demo" } else { "production" }.to_owned()),
        ("listen", config.listen.to_string()),
        ("tls", tls),
        ("threads", config.threads.to_string()),
        ("io", config.io.name().to_owned()),
        ("memory", size(config.memory)),
        ("max_connections", config.max_connections.to_string()),
        ("max_message_size", size(config.limits.max_message_size)),
        ("slow_consumer", config.limits.slow_consumer.name().to_owned()),
        ("compression", format!("{:?}", config.compression).to_lowercase()),
        ("echo routes", routes.echo.to_string()),
        ("topics.publish_token", set(topics.hub.publish_token.is_some())),
        (
            "topics.jwt",
            set(topics.tokens.jwt_secret.is_some() || topics.tokens.jwks_file.is_some()),
        ),
        (
            "topics.connect_webhook",
            // Its query (where a key might ride) left out.
            topics
                .webhook
                .connect_webhook
                .as_deref()
                .map_or("none", |u| u.split('?').next().unwrap_or(u))
                .to_owned(),
        ),
        ("topics.history", topics.hub.history.to_string()),
        ("topics.metrics_prefixes", format!("{:?}", topics.hub.metrics_prefixes)),
        ("topics.redis", redis),
        ("admin.token", set(config.admin.token.is_some())),
        ("admin.listen", config.admin.listen.map_or("none".into(), |a| a.to_string())),
    ]
}

/// Says at start which defaults apply (the demo's or production's) and what they left open or
/// closed, so that an operator reads it once rather than finds it out.
fn log_mode(
    routes: &Routes,
    topics: &freeboard_topics::Config,
    echo: bool,
    metrics: bool,
    dashboard: bool,
    admin_guarded: bool,
) {
    const REFUSED: &str = "refused (no publish token is set)";
    let mode = if routes.demo { "demo" } else { "production" };
    let publish = if topics.hub.publish_token.is_some()
        || topics.tokens.jwt_secret.is_some()
        || topics.tokens.jwks_file.is_some()
    {
        "needs a credential"
    } else if topics.webhook.connect_webhook.is_some() || !topics.route.anonymous_publish {
        REFUSED
    } else {
        "open to anyone"
    };
    let admin = match (metrics || dashboard, admin_guarded) {
        (false, _) => "not served",
        (true, true) => "behind the admin token or listener",
        (true, false) => "loopback clients only",
    };
    tracing::info!(
        mode,
        echo,
        publish,
        admin,
        "defaults: docs/operating/serve.md#demo-and-production"
    );
    if !routes.demo && (routes.metrics || routes.dashboard) && !admin_guarded {
        tracing::warn!(
            "/metrics and /dashboard are not served: give [admin] listen or [admin] token \
             (--admin-listen, --admin-token) to serve them"
        );
    }
    if publish == REFUSED && topics.route.http_publish {
        tracing::warn!(
            "POST /topic/NAME is refused: set [topics] publish_token (--publish-token) or JWT \
             keys with a publish claim"
        );
    }
}

/// SIGHUP: reads the configuration again (the file, then the same flags) and applies what a
/// running server can change; logs each change, and each setting that needs a restart (every
/// setting of the topic service, `running`, does).
fn reload(handle: &ServerHandle, args: &ServeArgs, running: &freeboard_topics::Config) {
    // The certificate first: a configuration that no longer parses must not keep an expiring
    // certificate in service.
    match handle.reload_tls() {
        Ok(true) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
        Ok(false) => {}
        Err(e) => tracing::error!(error = %e, "SIGHUP: TLS reload failed; keeping the old pair"),
    }
    let reloaded = settings(args).and_then(|Settings { server, topics, .. }| {
        let mut report = handle.reload(server).map_err(|e| e.to_string())?;
        report.needs_restart.extend(running.changes(&topics));
        Ok(report)
    });
    let report = match reloaded {
        Ok(report) => report,
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: configuration not reloaded");
            return;
        }
    };
    for change in &report.applied {
        tracing::info!(setting = change.setting, from = %change.from, to = %change.to, "SIGHUP: changed");
    }
    for change in &report.needs_restart {
        tracing::warn!(setting = change.setting, from = %change.from, to = %change.to, "SIGHUP: needs a restart, not changed");
    }
    if report.applied.is_empty() && report.needs_restart.is_empty() {
        tracing::info!("SIGHUP: configuration reloaded, nothing changed");
    }
}

/// What `freeboard serve` runs with: the runtime's settings and the topic service's (the
/// `[topics]` table feeds both: the hub's keys are the runtime's), and the routes it serves.
#[derive(Debug)]
struct Settings {
    server: ServerConfig,
    topics: freeboard_topics::Config,
    routes: Routes,
}

/// The routes `freeboard serve` serves beside `/topic/` and `/healthz`, and which defaults
/// apply. The demo (no `--config`, listening on loopback only) serves the echo routes, and
/// the admin routes to loopback clients; production (a `--config` file, or a listener beyond
/// loopback) serves the echo routes only when asked, the admin routes only behind an admin
/// token or on the admin listener, and `POST` only with a credential. The `[routes]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Routes {
    /// The demo's defaults apply (else production's).
    demo: bool,
    /// `/` and `/echo` echo.
    echo: bool,
    /// `/metrics`, where admin routes are served.
    metrics: bool,
    /// `/dashboard`, where admin routes are served.
    dashboard: bool,
}

/// The `[routes]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesTable {
    echo: Option<bool>,
    metrics: Option<bool>,
    dashboard: Option<bool>,
}

/// The file's settings with the flags laid over them, read by one parser: each flag becomes
/// its TOML key, so a flag and a file line mean the same thing, and the derived settings
/// (`ServerConfig::derive_unset`) follow from whichever was given.
fn settings(args: &ServeArgs) -> Result<Settings, String> {
    use toml::Value;
    let mut table = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            text.parse::<toml::Table>().map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => toml::Table::new(),
    };
    let int = |v: u64| Value::Integer(i64::try_from(v).unwrap_or(i64::MAX));
    let secs = |d: Duration| Value::Float(d.as_secs_f64());
    let path = |p: &PathBuf| Value::String(p.display().to_string());
    let list = |v: &[String]| {
        (!v.is_empty()).then(|| Value::Array(v.iter().cloned().map(Value::String).collect()))
    };
    let flags: Vec<(&str, Option<Value>)> = vec![
        ("listen", args.listen.map(|v| Value::String(v.to_string()))),
        ("share_port", args.share_port.then_some(Value::Boolean(true))),
        ("threads", args.threads.map(|v| int(v as u64))),
        ("io", args.io.clone().map(Value::String)),
        ("memory", args.memory.map(int)),
        ("max_message_size", args.max_message_size.map(int)),
        ("max_connections", args.max_connections.map(|v| int(v as u64))),
        ("max_connections_per_ip", args.max_connections_per_ip.map(|v| int(v as u64))),
        ("accept_rate", args.accept_rate.map(Value::Float)),
        ("accept_rate_per_ip", args.accept_rate_per_ip.map(Value::Float)),
        ("idle_timeout", args.idle_timeout.map(secs)),
        ("idle_timeout", args.no_auto_ping.then_some(Value::Integer(0))),
        ("pong_timeout", args.pong_timeout.map(secs)),
        ("handshake_timeout", args.handshake_timeout.map(secs)),
        ("close_timeout", args.close_timeout.map(secs)),
        ("drain_timeout", args.drain_timeout.map(secs)),
        ("send_high", args.send_high.map(int)),
        ("send_low", args.send_low.map(int)),
        ("send_cap", args.send_cap.map(int)),
        ("slow_consumer", args.slow_consumer.clone().map(Value::String)),
        ("connection_reserve", args.connection_reserve.map(int)),
        ("kernel_send_queue", args.kernel_send_queue.map(int)),
        ("compression", args.compression.clone().map(Value::String)),
        ("compression_window", args.compression_window.map(|v| int(u64::from(v)))),
        ("compression_threshold", args.compression_threshold.map(int)),
        ("chunk_size", args.chunk_size.map(int)),
        ("read_buffer", args.read_buffer.map(int)),
        ("topics.client_publish", args.client_publish.then_some(Value::Boolean(true))),
        ("topics.publish_token", args.publish_token.clone().map(Value::String)),
        ("topics.slow_consumer", args.topic_slow_consumer.clone().map(Value::String)),
        ("topics.conflate_key", args.topic_conflate_key.map(|c| Value::String(c.to_string()))),
        ("topics.send_cap", args.topic_send_cap.map(int)),
        ("tls.cert", args.tls_cert.as_ref().map(path)),
        ("tls.key", args.tls_key.as_ref().map(path)),
        ("tls.listen", args.listen_tls.map(|v| Value::String(v.to_string()))),
        ("tls.handshakes_per_ip", args.tls_handshakes_per_ip.map(|v| int(v as u64))),
        ("tls.handshake_rate_per_ip", args.tls_handshake_rate_per_ip.map(|v| int(v.into()))),
        ("allowed_origins", list(&args.allowed_origins)),
        ("trusted_proxies", list(&args.trusted_proxies)),
        ("proxy_protocol", args.proxy_protocol.then_some(Value::Boolean(true))),
        ("http2", args.http2.map(Value::Boolean)),
        ("max_pending_upgrades", args.max_pending_upgrades.map(|v| int(v as u64))),
        ("topics.jwt_secret", args.jwt_secret.clone().map(Value::String)),
        ("topics.jwks_file", args.jwks.as_ref().map(path)),
        ("topics.jwt_issuer", args.jwt_issuer.clone().map(Value::String)),
        ("topics.jwt_audience", args.jwt_audience.clone().map(Value::String)),
        ("topics.jwt_leeway", args.jwt_leeway.map(secs)),
        ("topics.connect_webhook", args.connect_webhook.clone().map(Value::String)),
        ("topics.webhook_timeout", args.webhook_timeout.map(secs)),
        ("topics.webhook_in_flight", args.webhook_in_flight.map(|v| int(v as u64))),
        ("topics.cors_origins", list(&args.publish_cors_origins)),
        ("topics.redis", args.redis.clone().map(Value::String)),
        ("topics.redis_queue", args.redis_queue.map(int)),
        ("topics.redis_required", args.redis_required.then_some(Value::Boolean(true))),
        ("topics.redis_durability", args.durability.clone().map(Value::String)),
        ("topics.max_topics_per_connection", args.max_topics_per_connection.map(|v| int(v as u64))),
        ("topics.max_topics", args.max_topics.map(|v| int(v as u64))),
        ("topics.history", args.history.map(|v| int(v as u64))),
        ("topics.history_seconds", args.history_seconds.map(int)),
        ("topics.history_memory", args.history_memory.map(int)),
        ("topics.history_prefix", args.history_prefix.clone().map(Value::String)),
        ("topics.presence_prefix", args.presence_prefix.clone().map(Value::String)),
        ("topics.presence_max_per_topic", args.presence_max_per_topic.map(|v| int(v as u64))),
        ("topics.presence_memory", args.presence_memory.map(int)),
        ("topics.presence_ttl", args.presence_ttl.map(secs)),
        ("topics.presence_claims", list(&args.presence_claims)),
        ("topics.delta_prefix", args.delta_prefix.clone().map(Value::String)),
        ("topics.metrics_prefixes", list(&args.topic_metrics_prefixes)),
        ("topics.metrics_topics", args.topic_metrics_max.map(|v| int(v as u64))),
        ("topics.sse_retry_ms", args.sse_retry.map(int)),
        ("admin.token", args.admin_token.clone().map(Value::String)),
        ("admin.listen", args.admin_listen.map(|v| Value::String(v.to_string()))),
        ("admin.rate_per_ip", args.admin_rate_per_ip.map(Value::Float)),
        ("routes.echo", args.echo.then_some(Value::Boolean(true))),
        ("routes.dashboard", args.no_dashboard.then_some(Value::Boolean(false))),
    ];
    for (key, value) in flags {
        let Some(value) = value else { continue };
        match key.split_once('.') {
            Some((section, key)) => {
                let section = table
                    .entry(section)
                    .or_insert_with(|| Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .ok_or_else(|| format!("[{section}] must be a table"))?;
                section.insert(key.to_owned(), value);
            }
            None => {
                table.insert(key.to_owned(), value);
            }
        }
    }
    let given = |key: &str| match key.split_once('.') {
        Some((section, key)) => {
            table.get(section).and_then(|t| t.as_table()).is_some_and(|t| t.contains_key(key))
        }
        None => table.contains_key(key),
    };
    for (key, flag) in [
        ("tls.listen", "--listen-tls"),
        ("tls.handshakes_per_ip", "--tls-handshakes-per-ip"),
        ("tls.handshake_rate_per_ip", "--tls-handshake-rate-per-ip"),
    ] {
        if given(key) && !given("tls.cert") {
            return Err(format!("{flag} needs --tls-cert and --tls-key"));
        }
    }
    let in_file = |e: String| match &args.config {
        Some(path) => format!("{}: {e}", path.display()),
        None => e,
    };
    let Settings { server: mut config, mut topics, mut routes } =
        parse(table.clone()).map_err(in_file)?;
    config.derive_unset(given);
    config.validate().map_err(|e| e.to_string())?;
    topics.hub = config.topics.clone();
    topics.validate().map_err(|e| e.to_string())?;
    let loopback = |addr: Option<SocketAddr>| addr.is_none_or(|a| a.ip().is_loopback());
    let tls_listen = config.tls.as_ref().and_then(|t| t.listen);
    routes.demo = args.config.is_none() && loopback(Some(config.listen)) && loopback(tls_listen);
    if !routes.demo {
        let table = table.get("routes").and_then(|t| t.as_table());
        routes.echo = table.and_then(|t| t.get("echo")).and_then(|v| v.as_bool()).unwrap_or(false);
        if !given("topics.anonymous_publish") {
            topics.route.anonymous_publish = false;
        }
    }
    Ok(Settings { server: config, topics, routes })
}

/// The runtime's settings from `table`, the topic service's from its `[topics]` table (with
/// the hub's keys, which the runtime gets too), and the `[routes]` (with the demo's defaults).
fn parse(mut table: toml::Table) -> Result<Settings, String> {
    let routes = match table.remove("routes") {
        Some(routes) => RoutesTable::deserialize(routes).map_err(|e| format!("[routes]: {e}"))?,
        None => RoutesTable::default(),
    };
    let routes = Routes {
        demo: true,
        echo: routes.echo.unwrap_or(true),
        metrics: routes.metrics.unwrap_or(true),
        dashboard: routes.dashboard.unwrap_or(true),
    };
    let topics = match table.remove("topics") {
        Some(topics) => {
            freeboard_topics::Config::deserialize(topics).map_err(|e| format!("[topics]: {e}"))?
        }
        None => freeboard_topics::Config::default(),
    };
    let mut server =
        ServerConfig::deserialize(toml::Value::Table(table)).map_err(|e| e.to_string())?;
    server.topics = topics.hub.clone();
    Ok(Settings { server, topics, routes })
}

/// A size flag: `4096`, `64K`, `256M`, `1.5G` (powers of 1024), as in the TOML file.
fn size(s: &str) -> Result<u64, String> {
    freeboard::config::parse_size(s)
}

/// A switch flag: `on` or `off`.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

/// A listen address flag: `HOST:PORT` (names resolve) or a port alone, as in the TOML file.
fn listen(s: &str) -> Result<SocketAddr, String> {
    freeboard::config::parse_listen(s)
}

/// A size as a `usize` (the bench's flags).
#[cfg(feature = "bench")]
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    size(s)?.try_into().map_err(|_| format!("size too large: {s:?}"))
}

/// A duration flag: seconds (`30`, `0.5`) or with units (`30s`, `500ms`, `2m`), as in the TOML
/// file.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    freeboard::config::parse_duration(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("64K"), Ok(64 << 10));
        assert_eq!(size("16m"), Ok(16 << 20));
        assert_eq!(size("1G"), Ok(1 << 30));
        assert_eq!(size("1.5K"), Ok(1536));
        assert!(size("lots").is_err());
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("soon").is_err());
    }

    /// The settings a file and flags both give: the runtime's and the topic service's, but
    /// for the defaults production (a file) and the demo (flags alone) differ in.
    fn comparable(settings: &Settings) -> String {
        let mut topics = settings.topics.clone();
        topics.route.anonymous_publish = true;
        format!("{:?} {topics:?}", settings.server)
    }

    #[test]
    fn the_demo_and_production_have_their_own_defaults() {
        let demo = config_of(&[]).unwrap();
        assert!(demo.routes.demo && demo.routes.echo && demo.topics.route.anonymous_publish);
        let public = config_of(&["--listen", "0.0.0.0:9001"]).unwrap();
        assert!(!public.routes.demo && !public.routes.echo);
        assert!(!public.topics.route.anonymous_publish);
        with_file(
            "production",
            "[routes]\necho = true\n[topics]\nanonymous_publish = true\n",
            |file| {
                let production = config_of(&["--config", file]).unwrap();
                assert!(!production.routes.demo && production.routes.echo);
                assert!(production.topics.route.anonymous_publish);
            },
        );
        let echo = config_of(&["--listen", "0.0.0.0:9001", "--echo", "--no-dashboard"]).unwrap();
        assert!(echo.routes.echo && !echo.routes.dashboard);
        with_file("routes-typo", "[routes]\nmetric = false\n", |file| {
            let error = config_of(&["--config", file]).unwrap_err();
            assert!(error.contains("metric") && error.contains("dashboard"), "{error}");
        });
    }

    /// `freeboard serve ARGS` parsed into its configuration (or the error it prints).
    fn config_of(args: &[&str]) -> Result<Settings, String> {
        let cli = Cli::try_parse_from(["freeboard", "serve"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        let Command::Serve(args) = cli.command else { panic!("parsed as serve") };
        settings(&args)
    }

    fn with_file(name: &str, text: &str, f: impl FnOnce(&str)) {
        let dir = std::env::temp_dir().join(format!("freeboard-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(&file, text).unwrap();
        f(file.to_str().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_file_and_the_flags_give_the_same_configuration() {
        let flags = [
            "--threads",
            "2",
            "--memory",
            "256M",
            "--max-message-size",
            "20M",
            "--idle-timeout",
            "45s",
            "--pong-timeout",
            "2.5",
            "--handshake-timeout",
            "500ms",
            "--send-high",
            "128K",
            "--slow-consumer",
            "drop-oldest",
            "--chunk-size",
            "8K",
            "--topic-send-cap",
            "48K",
            "--publish-token",
            "t0k",
            "--accept-rate",
            "50",
        ];
        let toml = r#"
            threads = 2
            memory = "256M"
            max_message_size = "20M"
            idle_timeout = "45s"
            pong_timeout = 2.5
            handshake_timeout = "500ms"
            send_high = "128K"
            slow_consumer = "drop-oldest"
            chunk_size = 8192
            accept_rate = 50.0
            [topics]
            send_cap = "48K"
            publish_token = "t0k"
        "#;
        let from_flags = config_of(&flags).unwrap();
        with_file("parity", toml, |file| {
            let from_file = config_of(&["--config", file]).unwrap();
            assert_eq!(comparable(&from_file), comparable(&from_flags));
        });
        // The derived settings follow from either: a 20 MiB message fits the send cap (so a
        // 20 MiB echo works from a file as from the flags), and the topic watermarks fit
        // under the smaller topic cap.
        let from_flags = from_flags.server;
        assert_eq!(from_flags.memory, 256 << 20);
        assert_eq!(from_flags.limits.send_cap, (20 << 20) + (64 << 10));
        assert_eq!(from_flags.topics.send_high, 48 << 10);
        assert_eq!(from_flags.topics.send_low, 32 << 10);
        assert_eq!(from_flags.limits.idle_timeout, Some(Duration::from_secs(45)));
        // An explicit cap is kept as given.
        let capped =
            config_of(&["--max-message-size", "20M", "--send-cap", "1M", "--send-high", "64K"]);
        assert_eq!(capped.unwrap().server.limits.send_cap, 1 << 20);
    }

    #[test]
    fn tls_access_redis_and_topic_limits_take_the_same_language() {
        let jwks = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../freeboard-topics/tests/fixtures/test-jwks.json"
        );
        let secret = "0123456789abcdef0123456789abcdef";
        let flags = [
            "--tls-cert",
            "/etc/freeboard/chain.pem",
            "--tls-key",
            "/etc/freeboard/key.pem",
            "--listen-tls",
            "127.0.0.1:9443",
            "--tls-handshakes-per-ip",
            "16",
            "--tls-handshake-rate-per-ip",
            "50",
            "--allowed-origin",
            "https://app.example",
            "--allowed-origin",
            "https://*.example.org",
            "--trusted-proxy",
            "10.0.0.0/8,192.168.0.0/16",
            "--proxy-protocol",
            "--max-pending-upgrades",
            "99",
            "--jwt-secret",
            secret,
            "--jwks",
            jwks,
            "--jwt-issuer",
            "https://auth.example",
            "--jwt-audience",
            "scores",
            "--jwt-leeway",
            "45s",
            "--connect-webhook",
            "http://127.0.0.1:8080/connect",
            "--webhook-timeout",
            "1500ms",
            "--webhook-in-flight",
            "4",
            "--publish-cors-origin",
            "https://admin.example",
            "--redis",
            "redis://127.0.0.1:6379/",
            "--redis-queue",
            "8M",
            "--max-topics-per-connection",
            "8",
            "--max-topics",
            "500",
        ];
        let toml = format!(
            r#"
            allowed_origins = ["https://app.example", "https://*.example.org"]
            trusted_proxies = ["10.0.0.0/8", "192.168.0.0/16"]
            proxy_protocol = true
            max_pending_upgrades = 99
            [topics]
            jwt_secret = "{secret}"
            jwks_file = "{jwks}"
            jwt_issuer = "https://auth.example"
            jwt_audience = "scores"
            jwt_leeway = "45s"
            connect_webhook = "http://127.0.0.1:8080/connect"
            webhook_timeout = "1.5s"
            webhook_in_flight = 4
            cors_origins = ["https://admin.example"]
            redis = "redis://127.0.0.1:6379/"
            redis_queue = "8M"
            max_topics_per_connection = 8
            max_topics = 500
            [tls]
            cert = "/etc/freeboard/chain.pem"
            key = "/etc/freeboard/key.pem"
            listen = "127.0.0.1:9443"
            handshakes_per_ip = 16
            handshake_rate_per_ip = 50
        "#
        );
        let from_flags = config_of(&flags).unwrap();
        with_file("parity-access", &toml, |file| {
            let from_file = config_of(&["--config", file]).unwrap();
            assert_eq!(comparable(&from_file), comparable(&from_flags));
        });
        assert_eq!(from_flags.topics.redis.redis_queue, 8 << 20);
        assert_eq!(from_flags.topics.webhook.webhook_timeout, Duration::from_millis(1500));
        assert_eq!(from_flags.topics.tokens.jwt_leeway, Duration::from_secs(45));
        assert_eq!(from_flags.server.topics.max_topics, 500);
        let tls = from_flags.server.tls.unwrap();
        assert_eq!(tls.listen, Some("127.0.0.1:9443".parse().unwrap()));
        assert_eq!((tls.handshakes_per_ip, tls.handshake_rate_per_ip), (16, 50));
        // The file's TLS pair with the flag's listener: both layers meet in one table.
        with_file("tls-layers", "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", |file| {
            let config = config_of(&["--config", file, "--listen-tls", "127.0.0.1:9443"]).unwrap();
            let tls = config.server.tls.unwrap();
            assert_eq!((tls.cert.to_str(), tls.listen.is_some()), (Some("c.pem"), true));
        });
        let error = config_of(&["--listen-tls", "127.0.0.1:9443"]).unwrap_err();
        assert!(error.contains("--tls-cert"), "{error}");
        let error = config_of(&["--tls-handshakes-per-ip", "8"]).unwrap_err();
        assert!(error.contains("--tls-cert"), "{error}");
        let error = config_of(&["--max-topics", "0"]).unwrap_err();
        assert!(error.contains("max_topics"), "{error}");
        let error = config_of(&["--redis-queue", "lots"]).unwrap_err();
        assert!(error.contains("--redis-queue"), "{error}");
    }

    #[test]
    fn impossible_values_are_refused_by_name() {
        for (args, setting) in [
            (&["--max-message-size", "0"][..], "max_message_size"),
            (&["--chunk-size", "3"], "chunk_size"),
            (&["--max-connections", "0"], "max_connections"),
            (&["--max-connections-per-ip", "0"], "max_connections_per_ip"),
            (&["--threads", "0"], "threads"),
            (&["--send-low", "1M", "--send-high", "64K"], "send_low"),
            (&["--slow-consumer", "later"], "slow-consumer policy"),
            (&["--memory", "lots"], "--memory"),
            (&["--idle-timeout", "soon"], "--idle-timeout"),
        ] {
            let error = config_of(args).unwrap_err();
            assert!(error.contains(setting), "{args:?}: {error}");
        }
        with_file("bad", "memory = \"lots\"\n", |file| {
            let error = config_of(&["--config", file]).unwrap_err();
            assert!(error.contains("memory") && error.contains("not a size"), "{error}");
        });
        with_file("unknown", "max_conections = 5\n", |file| {
            let error = config_of(&["--config", file]).unwrap_err();
            assert!(error.contains("max_conections"), "{error}");
        });
    }

    #[test]
    fn flags_override_the_config_file() {
        let dir = std::env::temp_dir().join(format!("freeboard-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(
            &file,
            "max_connections = 7\nthreads = 1\nidle_timeout = 0\nslow_consumer = \"drop-oldest\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "freeboard",
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--threads",
            "2",
        ]);
        let Command::Serve(args) = cli.command else { panic!("parsed as serve") };
        let config = settings(&args).unwrap().server;
        assert_eq!(config.max_connections, 7);
        assert_eq!(config.threads, 2);
        assert_eq!(config.limits.idle_timeout, None);
        assert_eq!(config.limits.slow_consumer, freeboard::SlowConsumerPolicy::DropOldest);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_example_config_is_the_defaults() {
        let text = include_str!("../serve.example.toml");
        let parsed = parse(toml::from_str(text).unwrap()).unwrap();
        let defaults = Settings {
            server: ServerConfig::default(),
            topics: freeboard_topics::Config::default(),
            routes: Routes { demo: true, echo: true, metrics: true, dashboard: true },
        };
        assert_eq!(format!("{parsed:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn help_documents_the_knobs() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let help = cmd.find_subcommand_mut("serve").unwrap().render_long_help().to_string();
        for flag in [
            "--listen",
            "--threads",
            "--memory",
            "--max-message-size",
            "--max-connections",
            "--idle-timeout",
            "--handshake-timeout",
            "--config",
            "--no-auto-ping",
            "--client-publish",
            "--publish-token",
            "--jwt-leeway",
            "--tls-handshakes-per-ip",
            "--tls-handshake-rate-per-ip",
            "/topic/NAME",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help");
        }
        assert!(help.contains("127.0.0.1:9001"));
    }

    #[test]
    fn every_bench_flag_has_help() {
        use clap::CommandFactory;
        fn visit(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" {
                    assert!(arg.get_help().is_some(), "{path} --{id} has no help");
                }
            }
            for sub in cmd.get_subcommands() {
                assert!(sub.get_about().is_some(), "{path} {} has no help", sub.get_name());
                visit(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        let cmd = Cli::command();
        visit(cmd.find_subcommand("bench").unwrap(), "freeboard bench");
    }
}
