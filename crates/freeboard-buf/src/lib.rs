//! Bounded memory for freeboard (placeholder until the crate lands).
#![no_std]
#![forbid(unsafe_code)]
