//! The LED-controller study: 2 clients each sending 960 B frames at 60 FPS to a device with a
//! 400 KiB memory budget, for buffer (chunk) sizes of 1 to 16 KiB.
//!
//! - [`simulation`]: 24 compressed hours of the device's allocation pattern through
//!   freeboard's chunk pool and through a TLSF heap.
//! - [`soak`]: the same traffic over real sockets through `freeboard serve`, sampled as it runs.

pub mod simulation;
pub mod soak;
