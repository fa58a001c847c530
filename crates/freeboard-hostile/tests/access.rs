//! Attacks on who gets in, against `freeboard serve`: a brute force of forged tokens, validly
//! signed tokens used before their time, and 10,000 upgrades waiting on a connect webhook
//! that never answers — each refused with a defined status, counted, bounded, while an
//! innocent client echoes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freeboard_hostile::{Scrape, Serve, Watch, access, raise_fd_limit};

const SECRET: &str = "hostile-suite-secret-of-at-least-32-bytes";
const PUBLISH_TOKEN: &str = "publish-token-0123456789abcdef";

fn exp() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 3600
}

/// Token brute force: 2,000 forged JWTs (guessed HS256 signatures, `alg: none`, an RS256
/// header with no key, truncated signatures) get 401, and 1,000 publish tokens of the right
/// length that differ from the real one at every position get 403 — all counted; the real
/// ones still work. Both checks compare in constant time (the `hmac` crate's
/// `verify_slice`, and a fold over every byte for the publish token), so the answers'
/// timing says nothing about how many bytes were right; this test checks the outcomes.
#[test]
fn forged_tokens_are_refused_and_counted() {
    let serve = Serve::start(&["--jwt-secret", SECRET, "--publish-token", PUBLISH_TOKEN]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let exp = exp();
    for i in 0..2000 {
        let status =
            access::upgrade_with_token(serve.addr(), "/topic/admin", &access::forged_token(i, exp));
        assert_eq!(status, 401, "forged token {i}");
    }
    let real = PUBLISH_TOKEN.as_bytes();
    for i in 0..1000 {
        let mut guess = real.to_vec();
        let at = i % guess.len();
        guess[at] = if guess[at] == b'x' { b'y' } else { b'x' };
        let guess = String::from_utf8(guess).unwrap();
        // With JWT access configured, a bearer that is neither the publish token nor a valid
        // JWT is an invalid token: 401 (RFC 6750 §3.1), as for an upgrade.
        assert_eq!(access::publish_with_token(serve.addr(), "scores", &guess), 401);
    }
    let claims = serde_json::json!({"exp": exp, "subscribe": ["admin"]});
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
    let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
    assert_eq!(access::upgrade_with_token(serve.addr(), "/topic/admin", &token), 101);
    assert_eq!(access::publish_with_token(serve.addr(), "scores", PUBLISH_TOKEN), 200);
    let figures = watch.finish();
    let after = serve.metrics();
    let invalid = "access_refusals_total{reason=\"token_invalid\"}";
    assert_eq!(after.delta(&before, invalid), 3000.0);
    assert_eq!(after.delta(&before, "refusals_total{status=\"401\"}"), 3000.0);
    assert_eq!(after.delta(&before, "refusals_total{status=\"403\"}"), 0.0);
    figures.report("token_brute_force");
}

/// Validly signed RS256 tokens (`--jwks`) that are not valid yet: `nbf` an hour ahead, or
/// `iat` an hour ahead (a token minted in the future), sent in `Authorization` and in
/// `?access_token=`, 250 of each — every one 401 and counted by its reason; the same claims
/// within the leeway (`--jwt-leeway 30s`, 20 s ahead) and a token without them get 101.
/// Before `nbf` was checked, the `nbf` tokens were accepted (101).
#[test]
fn tokens_used_before_their_time_are_refused_and_counted() {
    let serve =
        Serve::start(&["--memory", "16M", "--jwks", access::TEST_JWKS, "--jwt-leeway", "30s"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let now = exp() - 3600;
    let token = |extra: serde_json::Value| {
        let mut claims = serde_json::json!({"exp": now + 7200, "subscribe": ["scores"]});
        claims.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        access::rs256_token(&claims)
    };
    let early = token(serde_json::json!({"nbf": now + 3600}));
    let minted_ahead = token(serde_json::json!({"iat": now + 3600}));
    for _ in 0..250 {
        for refused in [&early, &minted_ahead] {
            assert_eq!(access::upgrade_with_token(serve.addr(), "/topic/scores", refused), 401);
            assert_eq!(
                access::upgrade_with_query_token(serve.addr(), "/topic/scores", refused),
                401
            );
        }
    }
    let skewed = token(serde_json::json!({"nbf": now + 20, "iat": now + 20}));
    let plain = token(serde_json::json!({}));
    for ok in [&skewed, &plain] {
        assert_eq!(access::upgrade_with_token(serve.addr(), "/topic/scores", ok), 101);
        assert_eq!(access::upgrade_with_query_token(serve.addr(), "/topic/scores", ok), 101);
    }
    let figures = watch.finish();
    let after = serve.metrics();
    let reason =
        |r: &str| after.delta(&before, &format!("access_refusals_total{{reason=\"{r}\"}}"));
    assert_eq!(reason("token_not_yet_valid"), 500.0);
    assert_eq!(reason("token_issued_in_future"), 500.0);
    assert_eq!(reason("token_invalid"), 0.0);
    assert_eq!(after.delta(&before, "refusals_total{status=\"401\"}"), 1000.0);
    // --memory 16M: the RSS stays within the budget (+10 %) above where it started.
    assert!(figures.rss_peak < figures.rss_before + (16 << 10) * 11 / 10, "{figures}");
    figures.report("token_before_its_time");
}

/// 10,000 upgrades at once behind a webhook that accepts the connection and never answers:
/// at most `--max-pending-upgrades` wait (the rest get 503 at once), those get 503 when the
/// webhook's timeout or the handshake timeout passes, every one is counted, nothing stays
/// pending, and the innocent client keeps echoing.
#[test]
fn ten_thousand_upgrades_behind_a_webhook_that_never_answers() {
    let limit = raise_fd_limit();
    let upgrades = 10_000.min((limit as usize).saturating_sub(6_000));
    assert!(upgrades >= 1_000, "RLIMIT_NOFILE {limit} is too low for this test");
    let webhook = access::StalledWebhook::start();
    let url = webhook.url();
    let serve = Serve::start(&[
        "--memory",
        "256M",
        "--connect-webhook",
        &url,
        "--webhook-timeout",
        "1",
        "--webhook-in-flight",
        "16",
        "--handshake-timeout",
        "3",
        "--max-pending-upgrades",
        "1000",
        "--max-connections-per-ip",
        "100000",
    ]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    // The pending gauge, sampled through the attack.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (addr, stop) = (serve.addr(), stop.clone());
        std::thread::spawn(move || {
            let mut peak = 0.0f64;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(Scrape::of(addr).get("access_pending_upgrades"));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };
    let statuses = access::pile_up(serve.addr(), "/topic/x", upgrades, Duration::from_secs(30));
    stop.store(true, Ordering::Relaxed);
    let peak_pending = sampler.join().unwrap();
    let figures = watch.finish();
    println!("{statuses:?}");
    assert_eq!(statuses.get(&503).copied(), Some(upgrades), "{statuses:?}");
    let after = serve.wait_metrics("nothing pending", |m| m.get("access_pending_upgrades") == 0.0);
    let reason =
        |r: &str| after.delta(&before, &format!("access_refusals_total{{reason=\"{r}\"}}"));
    let waited = reason("webhook_timeout") + reason("decision_timeout");
    // Past the quarter of the pool the connections not open may hold, the oldest make room.
    let turned_away = reason("pending_full") + reason("webhook_busy") + reason("handshakes_full");
    println!(
        "{waited} waited and timed out, {turned_away} turned away at once, {peak_pending} pending at most"
    );
    assert_eq!(waited + turned_away, upgrades as f64, "every upgrade is accounted for");
    assert!(peak_pending <= 1000.0, "{peak_pending} upgrades pending at once");
    assert!(peak_pending > 0.0, "the sampler saw no pending upgrade");
    assert_eq!(after.get("connections"), 0.0);
    figures.report(&format!("stalled_webhook_{upgrades}"));
    drop(serve);
    drop(webhook);
}
