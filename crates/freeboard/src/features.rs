//! The optional parts of freeboard (Cargo features) and the error a setting that needs a part
//! left out of the build gets: it is refused, naming the feature, never ignored. The checks
//! live with what they read (`ServerConfig::validate`, `Router::check_features`, the
//! clients); this module names nothing of the crate, so everything may name it.

use std::fmt;

/// wss:// for the server and the clients (rustls).
pub(crate) const TLS: bool = cfg!(feature = "tls");
/// permessage-deflate (zlib-rs).
pub(crate) const DEFLATE: bool = cfg!(feature = "deflate");

/// A setting that needs an optional part of freeboard this build was compiled without.
///
/// ```
/// use freeboard::MissingFeature;
///
/// let missing = MissingFeature { setting: "tls", feature: "tls" };
/// assert!(missing.to_string().contains("features = [\"tls\"]"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingFeature {
    /// The setting, by its TOML key (`tls`, `compression`) or the client's
    /// (`wss://`, `compression`).
    pub setting: &'static str,
    /// The Cargo feature of the `freeboard` crate that builds it.
    pub feature: &'static str,
}

impl fmt::Display for MissingFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { setting, feature } = self;
        write!(
            f,
            "{setting} needs freeboard's `{feature}` feature, which this build leaves out \
             (in Cargo.toml: freeboard = {{ features = [\"{feature}\"] }})"
        )
    }
}

impl std::error::Error for MissingFeature {}
