//! `freeboard bench`: the experiments behind every figure freeboard publishes, runnable
//! against any WebSocket echo server or, with `--peers`, against freeboard and peer servers
//! side by side.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use freeboard_bench::Target;
use freeboard_bench::load::Load;
use freeboard_bench::peers::{Peer, Peers};
use freeboard_bench::process;
use freeboard_bench::report::Report;
use freeboard_bench::suite::{self, Subject};

/// The experiments.
#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// One message in flight per client (ping-pong): msg/s and round-trip latency
    /// percentiles, for every combination of --clients and --size.
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
    /// Idle connections: connected/failed, connect time, server RSS before, open and after
    /// close, KiB per connection, and repeated connect/close cycles at the largest count.
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
    },
    /// A client that writes and never reads while an innocent client pings: what the server
    /// did with the slow one, its RSS over time, and the innocent client's latency.
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
    /// Print the Markdown tables of saved `--json` reports.
    Report {
        /// A JSON file, or a folder whose `*.json` files are printed in name order.
        file: PathBuf,
    },
}

/// What every experiment takes.
#[derive(Args)]
pub(crate) struct Common {
    /// The echo server: ws://host:port/path, or tcp://host:port for a raw TCP echo (frames
    /// come back verbatim). Not needed with --peers.
    url: Option<String>,
    /// Run against freeboard and the peer servers one after the other instead of URL:
    /// all of them, or a comma-separated list of freeboard, raw-tcp-echo, tokio-tungstenite,
    /// fastwebsockets, node-ws, gorilla. Peers are built into target/peers on first use
    /// (cargo, npm, go); one that cannot be built or started is skipped with a warning.
    #[arg(long, num_args = 0..=1, default_missing_value = "all", value_name = "LIST")]
    peers: Option<String>,
    /// Further arguments for `freeboard serve` under --peers, split at spaces, e.g.
    /// "--send-low 4K --send-high 16K" for the watermark study.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    serve_args: Option<String>,
    /// Runs per figure; tables show the median with min and max.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
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
}

/// Runs `command` and prints its Markdown tables.
pub(crate) fn run(command: BenchCommand) -> Result<(), String> {
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let (common, experiment) = match command {
        BenchCommand::Report { file } => {
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
            }
            return Ok(());
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
        BenchCommand::SlowConsumer { common, size, duration } => {
            (common, Experiment::SlowConsumer(size, Duration::from_secs_f64(duration)))
        }
        BenchCommand::Connections { common, mut counts, max, cycles } => {
            counts.extend(max);
            (common, Experiment::Connections(counts, cycles))
        }
    };
    let pin = match &common.pin {
        None => None,
        Some(s) => {
            let (server, client) = s
                .split_once(',')
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
                .ok_or_else(|| format!("--pin {s}: expected SERVER_CPU,CLIENT_CPU"))?;
            process::pin_current_thread(client)
                .map_err(|e| format!("pinning to CPU {client}: {e}"))?;
            Some((server, client))
        }
    };
    process::raise_fd_limit().map_err(|e| format!("raising the open-file limit: {e}"))?;
    let mut report = Report {
        command: command_line,
        load_average: (process::load_average(), None),
        pinned: pin,
        ..Report::default()
    };
    let measure = |subject: &Subject, report: &mut Report| -> Result<(), String> {
        match &experiment {
            Experiment::Load(name, cases) => report.loads.extend(
                suite::loads(subject, name, cases, common.repeat)
                    .map_err(|e| format!("{}: {e}", subject.name))?,
            ),
            Experiment::Connections(counts, cycles) => report.connections.push(
                suite::connections(subject, counts, *cycles)
                    .map_err(|e| format!("{}: {e}", subject.name))?,
            ),
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
            for peer in chosen {
                let running = match peers.start(peer, pin.map(|(server, _)| server)) {
                    Ok(running) => running,
                    Err(e) => {
                        eprintln!("freeboard bench: skipping {}: {e}", peer.name());
                        continue;
                    }
                };
                let subject = Subject {
                    name: peer.name().into(),
                    target: running.target.clone(),
                    pid: Some(running.pid),
                };
                measure(&subject, &mut report)?;
            }
        }
        (None, Some(url)) => {
            let target = Target::parse(url)?;
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
    Ok(())
}

/// Prints `report`'s tables; a closed stdout (`| head`) is not an error worth a panic.
fn print_markdown(report: &Report) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{}", report.markdown());
}

enum Experiment {
    Load(&'static str, Vec<Load>),
    Connections(Vec<usize>, usize),
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
