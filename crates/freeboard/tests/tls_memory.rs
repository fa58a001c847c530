//! What a TLS connection's rustls state costs on the heap, measured, against what the server
//! charges to its TLS budget (`src/tls/mod.rs`: 8 KiB per handshake in progress, 4 KiB per
//! established connection). The server side is rustls' `UnbufferedServerConnection`, as in
//! the server, with freeboard's configuration (ring, tickets, ALPN); a counting allocator
//! adds up what the server's calls allocate and free, apart from the client's.

use std::sync::Arc;

use freeboard_test::alloc::LiveBytes;
use freeboard_test::tls::TestCa;
use rustls::pki_types::pem::PemObject;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, UnbufferedStatus};

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

const HANDSHAKE_CHARGE: isize = 8 * 1024;
const ESTABLISHED_CHARGE: isize = 4 * 1024;

/// The server's net heap bytes, summed over its calls only.
struct Meter {
    server: isize,
    peak: isize,
}

impl Meter {
    fn measure<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let before = LiveBytes::live();
        let r = f();
        self.server += LiveBytes::live() - before;
        self.peak = self.peak.max(self.server);
        r
    }
}

#[test]
fn tls_state_is_within_its_charge() {
    let ca = TestCa::new("memory");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(ca.cert_pem())
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(ca.key_pem()).unwrap();
    let mut server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    server_config.alpn_protocols = vec![b"http/1.1".to_vec()];
    server_config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
    server_config.send_tls13_tickets = 1;
    let server_config = Arc::new(server_config);
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca.ca_pem()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        client_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();

        let mut meter = Meter { server: 0, peak: 0 };
        let mut server = meter
            .measure(|| Box::new(UnbufferedServerConnection::new(server_config.clone()).unwrap()));
        let mut to_server = Vec::with_capacity(64 * 1024);
        let mut to_client = vec![0u8; 64 * 1024];
        let mut out_len = 0;
        let mut established = false;
        for _ in 0..64 {
            to_server.clear();
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            let mut start = 0;
            loop {
                let (discard, done) = meter.measure(|| {
                    let UnbufferedStatus { discard, state } =
                        server.process_tls_records(&mut to_server[start..]);
                    let done = match state.unwrap() {
                        ConnectionState::EncodeTlsData(mut e) => {
                            out_len += e.encode(&mut to_client[out_len..]).unwrap();
                            false
                        }
                        ConnectionState::TransmitTlsData(t) => {
                            t.done();
                            false
                        }
                        ConnectionState::WriteTraffic(_) => {
                            established = true;
                            true
                        }
                        _ => true,
                    };
                    (discard, done)
                });
                start += discard;
                if done {
                    break;
                }
            }
            if out_len > 0 {
                client.read_tls(&mut &to_client[..out_len]).unwrap();
                client.process_new_packets().unwrap();
                out_len = 0;
            }
            if established && !client.is_handshaking() && !client.wants_write() {
                break;
            }
        }
        assert!(established);
        let resident = meter.server;
        println!(
            "{:?}: handshake peak {} B, established {} B (the connection itself is {} B, boxed)",
            version.version,
            meter.peak,
            resident,
            size_of::<UnbufferedServerConnection>()
        );
        assert!(meter.peak <= HANDSHAKE_CHARGE, "handshake peak {} B", meter.peak);
        assert!(resident <= ESTABLISHED_CHARGE, "established {resident} B");
        drop(server);
    }
}
