//! Header bombs and a `permessage-deflate` offer against `freeboard serve`.

use freeboard_hostile::{Serve, Watch, headers};

#[test]
fn header_bombs_get_431() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let mut bombs = 0;
    for _ in 0..100 {
        // Heads over the 8 KiB limit, up to 1 MiB: the server reads no more than it needs.
        for size in [9 << 10, 64 << 10, 1 << 20] {
            assert_eq!(headers::huge_header(serve.addr(), size), 431, "{size}-byte header");
            bombs += 1;
        }
        // More headers than the 64 the server parses.
        for count in [64, 1000] {
            assert_eq!(headers::many_headers(serve.addr(), count), 431, "{count} headers");
            bombs += 1;
        }
        // Just under both limits: accepted.
        assert_eq!(headers::huge_header(serve.addr(), 7 << 10), 101);
        assert_eq!(headers::many_headers(serve.addr(), 50), 101);
    }
    let figures = watch.finish();
    let after = serve.metrics();
    assert_eq!(after.delta(&before, "refusals_total{status=\"431\"}"), bombs as f64);
    figures.report("header_bombs");
}

#[test]
fn a_deflate_offer_is_not_accepted_and_rsv1_gets_1002() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    for _ in 0..1000 {
        let (head, code) = headers::compressed_frame(serve.addr());
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("sec-websocket-extensions"),
            "the server accepted an extension: {head}"
        );
        // RFC 6455 §5.2: RSV1 "MUST be 0 unless an extension is negotiated that defines
        // meanings for non-zero values".
        assert_eq!(code, Some(1002));
    }
    let figures = watch.finish();
    let after = serve.metrics();
    assert_eq!(after.delta(&before, "closes_total{reason=\"protocol_error\"}"), 1000.0);
    figures.report("deflate_offer");
}
