//! The plain HTTP requests a loop keeps across reads, in its side tables by slot: how a
//! response is sent ([`Reply`]), a request whose body is still arriving ([`PlainRequest`]),
//! a publish whose answer waits for other loops' reports ([`AwaitingPublish`]); and the
//! lines and reasons the loop's HTTP answers share. A leaf: the loop and its HTTP files
//! name these, and these name none of them.

use std::sync::Arc;

use freeboard_proto::http::Chunked;

use crate::handler::PublishGrant;
use crate::receipt::Receipt;
use crate::topics::Reach;

/// The `Retry-After` line of a 503 for a shortage that passes (memory, upgrade slots).
pub(super) const RETRY_SOON: &str = "Retry-After: 1\r\n";
/// The most seconds [`retry_soon_jittered`] spreads refused upgrades over.
pub(super) const RETRY_SPREAD: u64 = 5;

/// The `Retry-After` line of a 503 refusing an upgrade: 1 to [`RETRY_SPREAD`] seconds, drawn
/// for each, so that subscribers refused together in a reconnect storm do not all come back
/// in the same second.
pub(super) fn retry_soon_jittered() -> String {
    format!("Retry-After: {}\r\n", 1 + jitter(RETRY_SPREAD))
}

/// A number in `0..n` (0 if `n` is 0), different from call to call: each of the standard
/// library's random hasher states has keys of its own. For spreading retries, not for secrets.
pub(super) fn jitter(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish().checked_rem(n).unwrap_or(0)
}
/// The reason a request is refused when the pool cannot hold what it needs.
pub(super) const BUDGET_EXHAUSTED: &str = "server memory budget exhausted";

/// How a response is sent: kept alive or not, with or without its body (`HEAD`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reply {
    pub(super) keep_alive: bool,
    pub(super) head_only: bool,
}

/// A plain request whose body is still arriving: what its response needs, kept beside the
/// session (in the loop's side table) so that the connection's slot stays small.
#[derive(Debug, Default)]
pub(super) struct PlainRequest {
    pub(super) reply: Reply,
    /// `Access-Control-Allow-Origin` and `Vary` lines for a browser's cross-origin publish.
    pub(super) cors: String,
    /// A `Transfer-Encoding: chunked` body's decoder.
    pub(super) chunked: Option<Chunked>,
    /// The topics the publisher's credential grants, when [`PublishAccess`] let it through
    /// (a batch's topics are checked once its body is read).
    pub(super) grant: Option<Grant>,
}

/// What [`PublishAccess`] granted a `POST`.
///
/// [`PublishAccess`]: crate::PublishAccess
pub(super) struct Grant(pub(super) Box<dyn PublishGrant>);

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grant")
    }
}

/// What a publish reached so far: its messages, this loop's subscribers, the other loops.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PublishAnswer {
    pub(super) messages: u32,
    pub(super) local: Reach,
    pub(super) other_loops: u32,
    pub(super) other_loops_dropped: u32,
    /// With a backplane: messages it took, messages it could not, and messages it took while
    /// it was not connected (`"redis_queued"`, `"redis_lost"` and `"redis_connected"` in the
    /// answer, the backplane `freeboard serve` has).
    pub(super) backplane: Option<(u32, u32, u32)>,
}

impl PublishAnswer {
    /// `n` publications the backplane was to acknowledge as durable and did not: they count
    /// as lost (`"redis_lost"`, 503), whatever became of them.
    pub(super) fn unacknowledged(&mut self, n: u32) {
        if let Some((_, lost, _)) = &mut self.backplane {
            *lost += n;
        }
    }

    /// The answer's status: 200 when every place the publication had to go took it; 202
    /// when it was taken but its fate is not known yet (queued for a backplane that is not
    /// connected, or other loops that did not report in time); 503 when it was not taken
    /// where it had to go (the backplane's queue was full, or no loop with subscribers could
    /// take it).
    pub(super) fn status(&self, complete: bool) -> u16 {
        let (queued, lost, unconnected) = self.backplane.unwrap_or_default();
        let took_here = self.local.delivered + self.local.dropped > 0 || self.other_loops > 0;
        let none_took = self.other_loops_dropped > 0 && !took_here && queued == 0;
        if lost > 0 || none_took {
            503
        } else if unconnected > 0 || !complete {
            202
        } else {
            200
        }
    }

    /// The JSON answer, with the other loops' `remote` (delivered, dropped) counts added.
    pub(super) fn json(&self, remote: (u64, u64), complete: bool) -> String {
        let redis = self.backplane.map_or(String::new(), |(queued, lost, unconnected)| {
            let connected = unconnected == 0;
            format!(
                ",\"redis_queued\":{queued},\"redis_lost\":{lost},\"redis_connected\":{connected}"
            )
        });
        format!(
            "{{\"messages\":{},\"delivered\":{},\"dropped\":{},\"other_loops\":{},\"other_loops_dropped\":{}{redis},\"complete\":{complete}}}\n",
            self.messages,
            self.local.delivered + remote.0,
            self.local.dropped + remote.1,
            self.other_loops,
            self.other_loops_dropped,
        )
    }
}

/// A publish whose answer waits for other loops' reports.
pub(super) struct AwaitingPublish {
    /// The serial of the connection that asked (a slot is reused once it closes).
    pub(super) serial: u64,
    pub(super) answer: PublishAnswer,
    pub(super) receipt: Arc<Receipt>,
    pub(super) reply: Reply,
    pub(super) cors: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(local: u64, other_loops: u32, dropped: u32, redis: Option<(u32, u32, u32)>) -> u16 {
        let reach = Reach { delivered: local, dropped: 0 };
        let answer = PublishAnswer {
            messages: 1,
            local: reach,
            other_loops,
            other_loops_dropped: dropped,
            backplane: redis,
        };
        answer.status(true)
    }

    #[test]
    fn the_status_says_what_became_of_a_publication() {
        assert_eq!(answer(0, 0, 0, None), 200, "nobody listens: taken, delivered to none");
        assert_eq!(answer(3, 1, 0, None), 200);
        assert_eq!(answer(3, 1, 0, Some((1, 0, 0))), 200, "queued to a connected Redis");
        assert_eq!(answer(3, 1, 0, Some((1, 0, 1))), 202, "queued while Redis is down");
        assert_eq!(answer(3, 1, 0, Some((0, 1, 0))), 503, "Redis's queue was full");
        assert_eq!(answer(0, 0, 2, None), 503, "no loop with subscribers took it");
        assert_eq!(answer(0, 1, 1, None), 200, "one loop of two took it (counted)");
        let reach = Reach { delivered: 1, dropped: 0 };
        let waiting =
            PublishAnswer { messages: 1, local: reach, other_loops: 1, ..Default::default() };
        assert_eq!(waiting.status(false), 202, "other loops did not report in time");
    }
}

/// A presence listing asked for: which topic, the count or a page.
#[derive(Debug, Clone)]
pub(super) struct Listing {
    /// The topic, as the path names it (checked before the decision).
    pub(super) topic: String,
    /// `/presence/count` rather than `/presence`.
    pub(super) count: bool,
}

impl Listing {
    /// The listing `target` asks for under the route `prefix`, and the target its handler
    /// decides (the topic's own: `{prefix}{topic}` and the query); `None` if it asks for none.
    pub(super) fn of(prefix: &str, target: &str) -> Option<(Self, String)> {
        let (path, query) = target.split_once('?').map_or((target, None), |(p, q)| (p, Some(q)));
        let rest = path.strip_prefix(prefix)?;
        let (topic, count) = match rest.strip_suffix("/presence/count") {
            Some(topic) => (topic, true),
            None => (rest.strip_suffix("/presence")?, false),
        };
        let decided = match query {
            Some(query) => format!("{prefix}{topic}?{query}"),
            None => format!("{prefix}{topic}"),
        };
        Some((Self { topic: topic.to_owned(), count }, decided))
    }
}
