//! tokio-tungstenite's echo server over tokio-rustls (rustls on ring, TLS 1.3 and 1.2, ALPN
//! http/1.1, session tickets) on a one-worker multi-thread runtime.
//!
//! Usage: tokio-tungstenite-rustls ADDR CERT.pem KEY.pem

use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt, future};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9443".into());
    let cert = args.next().expect("CERT.pem");
    let key = args.next().expect("KEY.pem");
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(&cert).unwrap().map(|c| c.unwrap()).collect();
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
    config.send_tls13_tickets = 1;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(&addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else { return };
            let Ok(ws) = tokio_tungstenite::accept_async(tls).await else { return };
            let (write, read) = ws.split();
            let _ = read
                .try_filter(|m| future::ready(m.is_text() || m.is_binary()))
                .forward(write)
                .await;
        });
    }
}
