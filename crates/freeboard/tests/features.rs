//! A setting whose optional part this build leaves out is refused, naming the Cargo feature
//! that builds it; with the part built, the same setting passes that check. Runs in every
//! feature combination (`scripts/test` runs it without features and with all of them).

use freeboard::client::{Client, ClientConfig, ClientError, ClientHandler, ClientLoop, LoopConn};
use freeboard::config::ConfigError;
use freeboard::{
    Compression, Echo, MessageKind, MissingFeature, RouteOptions, Router, Server, ServerConfig,
    TlsConfig,
};

const TLS: bool = cfg!(feature = "tls");
const DEFLATE: bool = cfg!(feature = "deflate");

fn config() -> ServerConfig {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 16 << 20;
    config
}

#[test]
fn server_settings_are_refused_naming_the_feature_they_need() {
    type Set = fn(&mut ServerConfig);
    let cases: [(Set, &str, &str, bool); 2] = [
        (|c| c.tls = Some(TlsConfig::new("cert.pem", "key.pem")), "tls", "tls", TLS),
        (|c| c.compression = Compression::Shared, "compression", "deflate", DEFLATE),
    ];
    for (set, setting, feature, built) in cases {
        let mut config = config();
        set(&mut config);
        let checked = config.validate();
        if built {
            assert!(
                !matches!(checked, Err(ConfigError::MissingFeature(_))),
                "{setting}: {checked:?}"
            );
            continue;
        }
        let missing = MissingFeature { setting, feature };
        assert_eq!(checked, Err(ConfigError::MissingFeature(missing)));
        let error = Server::bind(config, || Router::new().route("/", Echo)).unwrap_err();
        let text = error.to_string();
        assert!(text.contains(setting) && text.contains(&format!("`{feature}`")), "{text}");
    }
}

#[test]
fn a_compressing_route_needs_deflate() {
    let options = RouteOptions::new().compression(Compression::Shared);
    let bound = Server::bind(config(), move || Router::new().route_with("/", Echo, options));
    let refused = bound.err().map(|e| e.to_string());
    assert_eq!(refused.is_some(), !DEFLATE, "{refused:?}");
    assert!(refused.is_none_or(|e| e.contains("a route's compression") && e.contains("`deflate`")));
}

struct Quiet;
impl ClientHandler for Quiet {
    fn on_message(&mut self, _: &mut LoopConn<'_>, _: MessageKind, _: &[u8]) {}
}

#[test]
fn clients_refuse_wss_and_compression_they_cannot_do() {
    // Nothing listens on port 9 of 127.0.0.1: a client that gets as far as connecting fails
    // with a connection error instead.
    let plain = ClientConfig::default().compression(false);
    let wss = Client::connect("wss://127.0.0.1:9/", plain.clone()).unwrap_err();
    let refused = |e: &ClientError, setting: &str, feature: &str| matches!(e, ClientError::MissingFeature(m) if m.setting == setting && m.feature == feature);
    assert_eq!(refused(&wss, "wss://", "tls"), !TLS, "{wss:?}");
    let mut clients = ClientLoop::new(plain, Quiet).unwrap();
    let from_loop = clients.connect("wss://127.0.0.1:9/").err();
    assert_eq!(from_loop.is_some_and(|e| refused(&e, "wss://", "tls")), !TLS);

    // Compression is offered by default when it is built, and refused when asked for without.
    assert_eq!(ClientConfig::default().compression, DEFLATE);
    let compressing = ClientConfig::default().compression(true);
    let error = Client::connect("ws://127.0.0.1:9/", compressing).unwrap_err();
    assert_eq!(refused(&error, "compression", "deflate"), !DEFLATE, "{error:?}");
}
