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

/// With `--compression` on, the same offer is accepted and the compressed "Hello" echoed;
/// a 64 MiB-of-zeros bomb (about 64 KB on the wire) whole, spread over 64 fragments, and on
/// 16 connections at once gets 1009 while it inflates (`--max-message-size 1M`), the RSS stays
/// under the budget and an innocent client echoes throughout. The budget is 128 MiB: a loop
/// keeps an eighth of its share for compression state, 8 MiB, which holds 19 dedicated contexts
/// (413 KiB each), so the 16 bombers, the client and bombers still closing all get the
/// extension even if every one lands on one loop (at 64 MiB one in a few runs did not, and its
/// upgrade rightly went without the extension).
#[test]
fn with_compression_an_offer_is_accepted_and_bombs_get_1009() {
    let bomb = headers::deflate(&vec![0u8; 64 << 20]);
    assert!(bomb.len() < 256 << 10, "{}", bomb.len());
    for mode in ["shared", "dedicated"] {
        let serve =
            Serve::start(&["--compression", mode, "--max-message-size", "1M", "--memory", "128M"]);
        let (mut client, status, head) = headers::deflate_offer(serve.addr());
        assert_eq!(status, 101, "{head}");
        assert!(head.contains("Sec-WebSocket-Extensions: permessage-deflate"), "{head}");
        client.send(0xc1, &[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]).expect("send");
        let echo = client.recv().expect("read").expect("an echo");
        // Under the 64-byte threshold the echo goes uncompressed.
        assert_eq!((echo.opcode, echo.rsv, &echo.payload[..]), (0x1, 0, &b"Hello"[..]));
        let watch = Watch::start(&serve);
        assert_eq!(headers::deflate_bomb(serve.addr(), &bomb, 1), Some(1009));
        assert_eq!(headers::deflate_bomb(serve.addr(), &bomb, 64), Some(1009));
        let many: Vec<_> = (0..16)
            .map(|_| {
                let (addr, bomb) = (serve.addr(), bomb.clone());
                std::thread::spawn(move || headers::deflate_bomb(addr, &bomb, 4))
            })
            .collect();
        for bomber in many {
            assert_eq!(bomber.join().expect("bomber"), Some(1009));
        }
        let figures = watch.finish();
        // --memory 128M: the server never holds more than its budget beyond its baseline.
        assert!(figures.rss_peak < figures.rss_before + (128 << 10), "{figures}");
        figures.report(&format!("deflate_bomb_{mode}"));
    }
}

/// RFC 9112 §6.1 and §6.3: a request's body is chunked only when `chunked` is its final
/// transfer coding, applied once; several `Transfer-Encoding` fields are one list. Anything
/// else is refused and the connection closed, so a request pipelined after the body (what a
/// proxy reading the codings differently would take for the next request) is never read:
/// 400 when the list does not end in exactly one `chunked`, 501 for a coding before it that
/// the server does not implement. 100 rounds of each variant; a plain chunked publish still
/// gets 200 and its pipelined request its answer.
#[test]
fn transfer_codings_other_than_one_final_chunked_are_refused_and_close() {
    let serve = Serve::start(&["--memory", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let variants: [(&[&str], u16); 12] = [
        (&["chunked, identity"], 400),
        (&["chunked", "chunked"], 400),
        (&["chunked, chunked"], 400),
        (&["chunked", "identity"], 400),
        (&["gzip"], 400),
        (&["chunked, gzip"], 400),
        (&[""], 400),
        (&["gzip, chunked"], 501),
        (&["gzip", "chunked"], 501),
        (&["deflate, chunked"], 501),
        (&["compress, chunked"], 501),
        (&["x-unknown;q=1, chunked"], 501),
    ];
    let mut refused = [0u32; 2];
    for _ in 0..100 {
        for (fields, status) in variants {
            let framing = headers::transfer_encoding(serve.addr(), "te", fields);
            let expected = headers::Framing { status, answers: 1, closed: true };
            assert_eq!(framing, expected, "Transfer-Encoding {fields:?}");
            refused[usize::from(status == 501)] += 1;
        }
        for fields in [&["chunked"][..], &["Chunked"], &[" chunked "]] {
            let framing = headers::transfer_encoding(serve.addr(), "te", fields);
            let expected = headers::Framing { status: 200, answers: 2, closed: true };
            assert_eq!(framing, expected, "Transfer-Encoding {fields:?}");
        }
    }
    let figures = watch.finish();
    let after = serve.metrics();
    assert_eq!(after.delta(&before, "refusals_total{status=\"400\"}"), f64::from(refused[0]));
    assert_eq!(after.delta(&before, "refusals_total{status=\"501\"}"), f64::from(refused[1]));
    // --memory 16M: the RSS stays within the budget (+10 %) above where it started.
    assert!(figures.rss_peak < figures.rss_before + (16 << 10) * 11 / 10, "{figures}");
    figures.report("transfer_encoding");
}
