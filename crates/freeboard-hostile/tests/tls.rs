//! The TLS listener against `freeboard serve --listen-tls`: 800 sockets from one address
//! that each send 10 bytes of a ClientHello and stop must not lock a `wss://` client from
//! another address out, while an innocent `ws://` client echoes.

use std::net::IpAddr;

use freeboard_hostile::{Serve, Watch, raise_fd_limit, tls};
use freeboard_test::tls::TestCa;

const STALLED: usize = 800;

/// 800 partial ClientHellos from 127.0.0.1 hold at most `--tls-handshakes-per-ip` (64 by
/// default) handshakes; the rest are closed at accept and counted
/// (`tls_refusals_total{reason="per_ip_handshakes"}`) before they cost any TLS state, so the
/// TLS budget (a quarter of each loop's 16 MiB) is never spent and 20 `wss://` clients from
/// 127.0.0.2 in a row complete their handshakes and echo. Before the per-address share, the
/// stalled sockets took the whole budget (341 per loop) and every new `wss://` client was
/// reset at accept (`reason="budget"`) until the handshake timeout passed.
#[test]
fn stalled_client_hellos_from_one_address_do_not_lock_out_another() {
    let limit = raise_fd_limit();
    assert!(limit >= 2 * STALLED as u64 + 200, "RLIMIT_NOFILE {limit} is too low for this test");
    let ca = TestCa::new("hostile-handshakes");
    let (cert, key) = (ca.cert_pem(), ca.key_pem());
    let serve = Serve::start(&[
        "--memory",
        "32M",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--listen-tls",
        "127.0.0.1:0",
    ]);
    let tls_addr = serve.tls_addr().expect("a wss:// listener");
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let attacker: IpAddr = [127, 0, 0, 1].into();
    let stalled = tls::stalled_client_hellos(tls_addr, attacker, STALLED);
    assert_eq!(stalled.len(), STALLED, "every attacking socket connected and wrote");
    let refusal = |m: &freeboard_hostile::Scrape, r: &str| {
        m.delta(&before, &format!("tls_refusals_total{{reason=\"{r}\"}}"))
    };
    // Every attacking socket is either held or refused (and counted) at accept.
    let during = serve.wait_metrics("every stalled socket held or refused", |m| {
        let refused = refusal(m, "per_ip_handshakes") + refusal(m, "budget");
        refused + tls::still_held(&stalled) as f64 == STALLED as f64
    });
    let other: IpAddr = [127, 0, 0, 2].into();
    let mut outcomes = Vec::new();
    for i in 0..20u8 {
        let outcome = tls::WssClient::open(tls_addr, other, &ca.ca_pem())
            .and_then(|mut client| (0..10u8).try_for_each(|j| client.echo(&[i, j, 0xa5])));
        outcomes.push(outcome);
    }
    let held = tls::still_held(&stalled);
    let after = serve.metrics();
    let figures = watch.finish();
    println!(
        "{held} of {STALLED} stalled handshakes held; refused at accept: {} per_ip_handshakes, {} budget",
        refusal(&during, "per_ip_handshakes"),
        refusal(&during, "budget"),
    );
    let failed: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    println!("{} of 20 wss:// clients from 127.0.0.2 failed: {failed:?}", failed.len());
    assert!(
        failed.is_empty(),
        "{} of 20 wss:// clients from 127.0.0.2 failed: {failed:?}",
        failed.len()
    );
    assert_eq!(held, 64, "one address holds its share of handshakes, no more");
    assert_eq!(refusal(&after, "per_ip_handshakes"), (STALLED - 64) as f64);
    assert_eq!(refusal(&after, "budget"), 0.0);
    assert_eq!(after.delta(&before, "tls_handshakes_total"), 20.0);
    // --memory 32M: the RSS stays within the budget (+10 %) above where it started.
    assert!(figures.rss_peak < figures.rss_before + (32 << 10) * 11 / 10, "{figures}");
    figures.report("stalled_client_hellos");
    drop(stalled);
}
