//! The one byte count that all buffer memory is drawn from.

use core::fmt;

/// The number of bytes an event loop (or a whole server) may spend on buffers.
///
/// Every consumer *draws* from the budget before it takes memory and *gives back* when it lets
/// go; a draw that would exceed the limit fails with [`BudgetExceeded`] instead of growing. A
/// [`Pool`](crate::Pool) draws its whole footprint once, at construction; other consumers (a
/// compressor's window, a staging [`RingBuffer`](crate::RingBuffer)) draw through
/// [`Pool::budget_mut`](crate::Pool::budget_mut).
///
/// ```
/// use freeboard_buf::Budget;
///
/// let mut server = Budget::new(64 << 20);
/// // One budget per event loop, carved from the server's.
/// let mut event_loop = server.split(32 << 20).unwrap();
/// assert_eq!(server.available(), 32 << 20);
///
/// event_loop.try_draw(1 << 20).unwrap(); // e.g. a deflate window
/// assert!(event_loop.try_draw(64 << 20).is_err());
/// event_loop.give_back(1 << 20);
/// assert_eq!(event_loop.drawn(), 0);
/// assert_eq!(event_loop.high_water(), 1 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    limit: usize,
    /// Invariant: `drawn <= limit`.
    drawn: usize,
    /// Invariant: `drawn <= high_water <= limit`.
    high_water: usize,
}

impl Budget {
    /// A budget of `limit` bytes, nothing drawn yet.
    pub const fn new(limit: usize) -> Self {
        Self { limit, drawn: 0, high_water: 0 }
    }

    /// The limit in bytes.
    pub const fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently drawn.
    pub const fn drawn(&self) -> usize {
        self.drawn
    }

    /// Bytes that may still be drawn.
    pub const fn available(&self) -> usize {
        self.limit - self.drawn
    }

    /// The most bytes ever drawn at once.
    pub const fn high_water(&self) -> usize {
        self.high_water
    }

    /// Draws `bytes`, or fails without drawing anything if fewer than `bytes` are available.
    pub fn try_draw(&mut self, bytes: usize) -> Result<(), BudgetExceeded> {
        if bytes > self.available() {
            return Err(BudgetExceeded { requested: bytes, available: self.available() });
        }
        self.drawn += bytes;
        self.high_water = self.high_water.max(self.drawn);
        Ok(())
    }

    /// Returns `bytes` drawn earlier. Giving back more than was drawn is a caller bug; the
    /// count saturates at zero rather than wrapping.
    pub fn give_back(&mut self, bytes: usize) {
        debug_assert!(bytes <= self.drawn, "gave back {bytes} bytes, only {} drawn", self.drawn);
        self.drawn = self.drawn.saturating_sub(bytes);
    }

    /// Draws `bytes` and returns them as a budget of their own (for example one per event
    /// loop). Hand them back with [`give_back`](Self::give_back)`(child.limit())` when the child
    /// is retired.
    pub fn split(&mut self, bytes: usize) -> Result<Budget, BudgetExceeded> {
        self.try_draw(bytes)?;
        Ok(Budget::new(bytes))
    }
}

/// A draw that the [`Budget`] could not cover.
///
/// ```
/// use freeboard_buf::{Budget, BudgetExceeded};
///
/// let mut budget = Budget::new(100);
/// assert_eq!(budget.try_draw(101), Err(BudgetExceeded { requested: 101, available: 100 }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetExceeded {
    /// Bytes asked for.
    pub requested: usize,
    /// Bytes that were available.
    pub available: usize,
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget exceeded: {} bytes requested, {} available",
            self.requested, self.available
        )
    }
}

impl core::error::Error for BudgetExceeded {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_and_give_back() {
        let mut b = Budget::new(10);
        assert!(b.try_draw(4).is_ok());
        assert!(b.try_draw(6).is_ok());
        assert_eq!(b.try_draw(1), Err(BudgetExceeded { requested: 1, available: 0 }));
        b.give_back(10);
        assert_eq!((b.drawn(), b.available(), b.high_water()), (0, 10, 10));
    }

    #[test]
    fn split_draws_from_parent() {
        let mut parent = Budget::new(10);
        let child = parent.split(7).unwrap();
        assert_eq!(child.limit(), 7);
        assert_eq!(parent.available(), 3);
        assert!(parent.split(4).is_err());
    }
}
