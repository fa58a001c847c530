//! Token buckets: the server's and each address's accept rates, and the TLS handshakes each
//! address may start.

/// A token bucket of `rate` tokens per second holding at most `max(rate, 1)`; rate 0 is off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    tokens: f64,
    /// Seconds (the caller's clock) of the last refill.
    at: f64,
}

impl Bucket {
    pub(crate) fn full_at(rate: f64, now: f64) -> Self {
        Self { tokens: rate.max(1.0), at: now }
    }

    fn refill(&mut self, rate: f64, now: f64) {
        self.tokens = (self.tokens + (now - self.at) * rate).min(rate.max(1.0));
        self.at = now;
    }

    pub(crate) fn full(&self, rate: f64, now: f64) -> bool {
        let mut b = *self;
        b.refill(rate, now);
        b.tokens >= rate.max(1.0)
    }

    /// Takes a token if there is one (always, when the rate is 0).
    pub(crate) fn take(&mut self, rate: f64, now: f64) -> bool {
        if rate == 0.0 {
            return true;
        }
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
