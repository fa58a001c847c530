//! permessage-deflate over the io_uring driver: the session compresses and inflates whatever
//! carries its bytes, so the echo through both modes is the same as on epoll.
#![cfg(target_os = "linux")]

use freeboard::client::{Client, ClientConfig, Event, MessageKind};
use freeboard::{Compression, Echo, HttpRoute, IoDriver, Router, Server, ServerConfig};

const JSON: &str = r#"{"id":42,"method":"scores.update","params":{"home":2,"away":1,"minute":77}}"#;

#[test]
fn permessage_deflate_echoes_over_io_uring_in_both_modes() {
    let big: Vec<u8> = JSON.bytes().cycle().take(300_000).collect();
    for mode in [Compression::Shared, Compression::Dedicated] {
        let mut config = ServerConfig::default();
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.threads = 1;
        config.memory = 64 << 20;
        config.limits.idle_timeout = None;
        config.compression = mode;
        config.compression_threshold = 0;
        config.io = IoDriver::Uring;
        let routes = || Router::new().route("/echo", Echo).http("/metrics", HttpRoute::Metrics);
        let server = Server::bind(config, routes).unwrap().spawn();
        let url = format!("ws://{}/echo", server.local_addr());
        let mut client = Client::connect(&url, ClientConfig::default()).unwrap();
        assert!(client.compression().is_some(), "{mode:?}: compression agreed");
        for _ in 0..3 {
            client.send_text(JSON).unwrap();
            assert_eq!(recv(&mut client), (MessageKind::Text, JSON.as_bytes().to_vec()));
        }
        client.send_binary(&big).unwrap();
        assert_eq!(recv(&mut client), (MessageKind::Binary, big.clone()));
        let exposition = server.metrics().encode();
        assert!(
            exposition.contains("freeboard_loop_io{event_loop=\"0\",io=\"uring\"} 1"),
            "the loop runs on io_uring"
        );
        drop(client);
        server.handle().shutdown();
        server.join().unwrap();
    }
}

fn recv(client: &mut Client) -> (MessageKind, Vec<u8>) {
    match client.recv().unwrap() {
        Event::Message(m) => (m.kind(), m.to_vec()),
        Event::Closed(c) => panic!("closed: {c:?}"),
    }
}
