//! `wss://` for the load generator: the clients' [`ClientStream`](freeboard::client::ClientStream)
//! over each socket, with no certificate verification (benchmarks run against a server's
//! self-signed test certificate on loopback) and, unless asked otherwise, session resumption
//! with tickets.

use std::io;
use std::sync::{Arc, OnceLock};

use freeboard::client::{TlsRoots, tls_client_config, tls_connection};
use rustls::ClientConnection;

/// The client configuration: `resume` keeps a session cache shared by every connection (each
/// handshake after the first resumes with a ticket); without it every handshake is full.
pub fn client_config(resume: bool) -> Arc<rustls::ClientConfig> {
    static CONFIGS: [OnceLock<Arc<rustls::ClientConfig>>; 2] = [OnceLock::new(), OnceLock::new()];
    CONFIGS[usize::from(resume)]
        .get_or_init(|| {
            // NOTE(expect): the configuration without verification reads no file.
            let insecure = tls_client_config(&TlsRoots::Insecure).expect("no roots to load");
            let mut config = (*insecure).clone();
            if !resume {
                config.resumption = rustls::client::Resumption::disabled();
            }
            Arc::new(config)
        })
        .clone()
}

/// A new TLS client connection to `host` (a name or an IP address, without the port).
pub fn connect(host: &str, resume: bool) -> io::Result<ClientConnection> {
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    tls_connection(client_config(resume), host).map_err(io::Error::other)
}
