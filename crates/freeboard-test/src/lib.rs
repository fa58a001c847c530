//! Test helpers for freeboard.
