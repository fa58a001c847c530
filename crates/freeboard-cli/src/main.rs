//! `freeboard`: the WebSocket server (and, later, its load generator and client).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod bench;
mod client;

use clap::{Args, Parser, Subcommand};
use freeboard::config::parse_policy;
use freeboard::{Echo, HttpRoute, Router, Server, ServerConfig, TlsConfig};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// A WebSocket server whose memory is bounded and whose backpressure works.
#[derive(Parser)]
#[command(name = "freeboard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the echo and pub/sub server: `/` and `/echo` echo text as text and binary as
    /// binary; a WebSocket at `/topic/NAME` subscribes to NAME, and to A and B with
    /// `/topic/NAME?also=A&also=B` (names: 1-128 of A-Z a-z 0-9 - . _ ~ :); `POST /topic/NAME`
    /// publishes its body (text for `Content-Type: text/*`, else binary; answers
    /// `{"loops":N,"dropped":M}`); `/healthz` and `/metrics` (Prometheus) answer plain HTTP.
    /// Logs go to stderr, filtered by RUST_LOG (default `info`). SIGTERM/SIGINT shut down
    /// gracefully (close 1001, drain); a second signal exits at once.
    Serve(Box<ServeArgs>),
    /// Connect to a WebSocket server: stdin lines are sent as messages, received messages
    /// are written to stdout, one per line.
    #[command(after_help = client::EXIT_CODES)]
    Client(client::ClientArgs),
    /// Measure an echo server, or freeboard and peer servers side by side (`--peers`).
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
}

/// Flags override the config file, which overrides the defaults.
#[derive(Args)]
struct ServeArgs {
    /// TOML file with any of the settings below (snake_case keys, durations in seconds,
    /// sizes in bytes, e.g. `max_message_size = 1048576`, `idle_timeout = 0` for no pings).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:9001]. An address another process listens
    /// on is refused ("address in use") unless --share-port. With --tls-cert and no
    /// --listen-tls it speaks TLS (wss://).
    #[arg(long, value_name = "ADDR")]
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
    /// A TLS listener beside the plain --listen one (then --listen stays ws://).
    #[arg(long, value_name = "ADDR")]
    listen_tls: Option<SocketAddr>,
    /// Event loops (threads), each with its own SO_REUSEPORT listener [default: available cores].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Memory budget in bytes for all buffers, split between the loops; suffixes K, M, G
    /// (powers of 1024) [default: 1G].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    memory: Option<usize>,
    /// Largest message accepted; larger ones close the connection with 1009 [default: 16M].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    max_message_size: Option<usize>,
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
    /// Seconds without input before a keep-alive ping [default: 30].
    #[arg(long, value_name = "SECS")]
    idle_timeout: Option<f64>,
    /// Seconds a keep-alive ping may stay unanswered [default: 10].
    #[arg(long, value_name = "SECS")]
    pong_timeout: Option<f64>,
    /// Turn automatic keep-alive pings off (the Autobahn run needs this).
    #[arg(long)]
    no_auto_ping: bool,
    /// Seconds from accept to a complete upgrade request (slowloris) [default: 10].
    #[arg(long, value_name = "SECS")]
    handshake_timeout: Option<f64>,
    /// Seconds to wait for the peer's close frame after ours, and for what is still queued
    /// to leave once the connection has closed (a peer that stopped reading is then
    /// dropped) [default: 5].
    #[arg(long, value_name = "SECS")]
    close_timeout: Option<f64>,
    /// Seconds shutdown waits for close handshakes [default: 5].
    #[arg(long, value_name = "SECS")]
    drain_timeout: Option<f64>,
    /// Send queue high watermark: above it a connection is not writable and its reads pause
    /// [default: 64K].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    send_high: Option<usize>,
    /// Send queue low watermark: writable again at or below it [default: 32K].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    send_low: Option<usize>,
    /// Send queue hard cap; at it the slow-consumer policy decides [default: 16M + 64K].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    send_cap: Option<usize>,
    /// Slow-consumer policy at the cap: block, drop-newest, drop-oldest, conflate, close
    /// (1008) [default: close].
    #[arg(long, value_name = "POLICY")]
    slow_consumer: Option<String>,
    /// Free pool bytes an upgrade needs, else 503; a message arriving in pieces that would
    /// leave less than half of it free gets close 1013 [default: 64K].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    connection_reserve: Option<usize>,
    /// Pool chunk size [default: 4K].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    chunk_size: Option<usize>,
    /// Per-loop shared read buffer, and the cork beside it that replies are framed into, each
    /// this large, from the budget [default: 64K].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    read_buffer: Option<usize>,
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
    /// Send queue hard cap of one topic subscriber [default: 1M].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    topic_send_cap: Option<usize>,
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
    /// A connect webhook (`http://host:port/path`) that decides every topic upgrade
    /// (Centrifugo's proxy model); TOML `[topics] connect_webhook`.
    #[arg(long, value_name = "URL")]
    connect_webhook: Option<String>,
    /// How long the connect webhook may take (then 503) [default: 2].
    #[arg(long, value_name = "SECS")]
    webhook_timeout: Option<f64>,
    /// Requests to the connect webhook in flight at once [default: 16].
    #[arg(long, value_name = "N")]
    webhook_in_flight: Option<usize>,
    /// An origin whose pages may publish with `POST` from a browser (CORS; repeatable).
    #[arg(long = "publish-cors-origin", value_name = "ORIGIN")]
    publish_cors_origins: Vec<String>,
    /// Redis backplane (`redis://HOST:PORT/`): topics span every node on the same Redis;
    /// TOML `[topics] redis`. Default: topics stay on this machine.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Topics one connection may subscribe to (its topic and its `also=` list; an upgrade
    /// naming more gets 400); TOML `[topics] max_topics_per_connection` [default: 64].
    #[arg(long, value_name = "N")]
    max_topics_per_connection: Option<usize>,
    /// Topics with a subscriber the server may have at once (a new one beyond: close 1008,
    /// counted in `topic_refusals`); TOML `[topics] max_topics` [default: 100000].
    #[arg(long, value_name = "N")]
    max_topics: Option<usize>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Client(args) => client::run(args),
        Command::Serve(args) => match serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("freeboard serve: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Bench { command } => match bench::run(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("freeboard bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let config = server_config(&args)?;
    let topics = config.topics.clone();
    let webhook = topics.webhook().map_err(|e| e.to_string())?.map(Arc::new);
    let server = Server::bind(config, move || {
        let router = Router::new()
            .route("/", Echo)
            .route("/echo", Echo)
            .topics_with(&topics, webhook.clone())
            .http("/healthz", HttpRoute::Health)
            .http("/metrics", HttpRoute::Metrics);
        match topics.http_publish && !topics.path.is_empty() {
            true => router.http(&topics.path, HttpRoute::Publish),
            false => router,
        }
    })
    .map_err(|e| e.to_string())?;
    let addr = server.local_addr();
    match server.tls_addr() {
        Some(tls) if tls == addr => println!("freeboard listening on wss://{addr}/"),
        Some(tls) => println!("freeboard listening on ws://{addr}/ and wss://{tls}/"),
        None => println!("freeboard listening on ws://{addr}/"),
    }
    tracing::info!(%addr, tls = ?server.tls_addr(), "listening");
    let handle = server.handle();
    if server.tls_addr().is_some() {
        let reload = server.handle();
        let mut hup = Signals::new([SIGHUP]).map_err(|e| e.to_string())?;
        std::thread::spawn(move || {
            for _ in hup.forever() {
                match reload.reload_tls() {
                    Ok(_) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: TLS reload failed; keeping the old pair")
                    }
                }
            }
        });
    }
    let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let mut signals = signals.forever();
        if signals.next().is_some() {
            tracing::info!("shutting down: closing connections with 1001");
            handle.shutdown();
        }
        if signals.next().is_some() {
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        }
    });
    server.run().map_err(|e| e.to_string())
}

fn server_config(args: &ServeArgs) -> Result<ServerConfig, String> {
    let mut config = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            toml::from_str::<ServerConfig>(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => ServerConfig::default(),
    };
    let secs = |s: f64| Duration::try_from_secs_f64(s).map_err(|e| e.to_string());
    if let Some(v) = args.listen {
        config.listen = v;
    }
    config.share_port |= args.share_port;
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let mut tls = TlsConfig::new(cert, key);
            if let Some(old) = &config.tls {
                tls.state_share = old.state_share;
                tls.listen = old.listen;
            }
            config.tls = Some(tls);
        }
        _ if args.listen_tls.is_some() && config.tls.is_none() => {
            return Err("--listen-tls needs --tls-cert and --tls-key".into());
        }
        _ => {}
    }
    if let (Some(at), Some(tls)) = (args.listen_tls, &mut config.tls) {
        tls.listen = Some(at);
    }
    if let Some(v) = args.threads {
        config.threads = v;
    }
    if let Some(v) = args.memory {
        config.memory = v;
    }
    if let Some(v) = args.max_message_size {
        config.max_message_size = v as u64;
        if args.send_cap.is_none() {
            config.send_cap = config.send_cap.max(v + (64 << 10));
        }
    }
    if let Some(v) = args.max_connections {
        config.max_connections = v;
    }
    if let Some(v) = args.max_connections_per_ip {
        config.max_connections_per_ip = v;
    }
    if let Some(v) = args.accept_rate {
        config.accept_rate = v;
    }
    if let Some(v) = args.accept_rate_per_ip {
        config.accept_rate_per_ip = v;
    }
    if let Some(v) = args.idle_timeout {
        config.idle_timeout = if v == 0.0 { None } else { Some(secs(v)?) };
    }
    if args.no_auto_ping {
        config.idle_timeout = None;
    }
    if let Some(v) = args.pong_timeout {
        config.pong_timeout = secs(v)?;
    }
    if let Some(v) = args.handshake_timeout {
        config.handshake_timeout = secs(v)?;
    }
    if let Some(v) = args.close_timeout {
        config.close_timeout = secs(v)?;
    }
    if let Some(v) = args.drain_timeout {
        config.drain_timeout = secs(v)?;
    }
    if let Some(v) = args.send_high {
        config.send_high = v;
    }
    if let Some(v) = args.send_low {
        config.send_low = v;
    }
    if let Some(v) = args.send_cap {
        config.send_cap = v;
    }
    if let Some(v) = &args.slow_consumer {
        config.slow_consumer = parse_policy(v).map_err(|e| e.to_string())?;
    }
    if let Some(v) = args.connection_reserve {
        config.connection_reserve = v;
    }
    if let Some(v) = args.chunk_size {
        config.chunk_size = v;
    }
    if let Some(v) = args.read_buffer {
        config.read_buffer = v;
    }
    if args.client_publish {
        config.topics.client_publish = true;
    }
    if let Some(v) = &args.publish_token {
        config.topics.publish_token = Some(v.clone());
    }
    if let Some(v) = &args.topic_slow_consumer {
        config.topics.slow_consumer = parse_policy(v).map_err(|e| e.to_string())?;
    }
    if let Some(v) = args.topic_send_cap {
        config.topics.send_cap = v;
        config.topics.send_high = config.topics.send_high.min(v);
        config.topics.send_low = config.topics.send_low.min(config.topics.send_high);
    }
    if !args.allowed_origins.is_empty() {
        config.allowed_origins = args.allowed_origins.clone();
    }
    if !args.trusted_proxies.is_empty() {
        config.trusted_proxies = args.trusted_proxies.clone();
    }
    config.proxy_protocol |= args.proxy_protocol;
    if let Some(v) = args.max_pending_upgrades {
        config.max_pending_upgrades = v;
    }
    if let Some(v) = &args.jwt_secret {
        config.topics.jwt_secret = Some(v.clone());
    }
    if let Some(v) = &args.jwks {
        config.topics.jwks_file = Some(v.clone());
    }
    if let Some(v) = &args.jwt_issuer {
        config.topics.jwt_issuer = Some(v.clone());
    }
    if let Some(v) = &args.jwt_audience {
        config.topics.jwt_audience = Some(v.clone());
    }
    if let Some(v) = &args.connect_webhook {
        config.topics.connect_webhook = Some(v.clone());
    }
    if let Some(v) = args.webhook_timeout {
        config.topics.webhook_timeout =
            Duration::try_from_secs_f64(v).map_err(|e| format!("--webhook-timeout: {e}"))?;
    }
    if let Some(v) = args.webhook_in_flight {
        config.topics.webhook_in_flight = v;
    }
    if !args.publish_cors_origins.is_empty() {
        config.topics.cors_origins = args.publish_cors_origins.clone();
    }
    if let Some(v) = &args.redis {
        config.topics.redis = Some(v.clone());
    }
    if let Some(v) = args.max_topics_per_connection {
        config.topics.max_topics_per_connection = v;
    }
    if let Some(v) = args.max_topics {
        config.topics.max_topics = v;
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// `4096`, `64K`, `16M`, `1G` (powers of 1024).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits.trim().parse().map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_shl(shift).filter(|v| v >> shift == n).ok_or_else(|| format!("size too large: {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
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
        let config = server_config(&args).unwrap();
        assert_eq!(config.max_connections, 7);
        assert_eq!(config.threads, 2);
        assert_eq!(config.idle_timeout, None);
        assert_eq!(config.slow_consumer, freeboard::SlowConsumerPolicy::DropOldest);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_example_config_is_the_defaults() {
        let text = include_str!("../serve.example.toml");
        let parsed: ServerConfig = toml::from_str(text).unwrap();
        let defaults = ServerConfig::default();
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
