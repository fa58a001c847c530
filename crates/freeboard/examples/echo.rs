//! The smallest server: echo at `/` on 127.0.0.1:9001.
//!
//!     cargo run --release -p freeboard --example echo

use freeboard::{Echo, Router, Server, ServerConfig};

fn main() -> std::io::Result<()> {
    let server = Server::bind(ServerConfig::default(), || Router::new().route("/", Echo))?;
    println!("echo on ws://{}/", server.local_addr());
    server.run()
}
