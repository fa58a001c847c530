//! Bearer tokens verified as JWTs whose claims list the topics a connection may subscribe and
//! publish to (the `topic-service` feature).

use std::path::Path;
use std::time::{Duration, SystemTime};

use freeboard_proto::handshake::Request;
use freeboard_proto::http;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::Error;
use crate::config::TokenConfig;

/// Verifies bearer tokens as JWTs: HS256 with a shared secret, RS256 and ES256 with the keys
/// of a JWKS document. The algorithm a token names must match the kind of key it is checked
/// with (no `alg` confusion: an RS256 public key is never used as an HMAC secret), `exp` is
/// required, `nbf` and `iat` are checked when present, and `iss` / `aud` when configured.
/// The time claims allow for a [`leeway`](Self::leeway) of clock skew with the issuer.
///
/// Signature checks are the crypto crates' (`hmac`'s comparison is constant-time), so a
/// token's bytes cannot be guessed one at a time from response times.
pub struct TokenVerifier {
    secret: Option<DecodingKey>,
    /// `(kid, algorithm, key)` from the JWKS.
    keys: Vec<(Option<String>, Algorithm, DecodingKey)>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: Duration,
    /// Claims a grant keeps for the subscriber's presence entry.
    presence_claims: Vec<String>,
}

impl std::fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenVerifier")
            .field("hs256", &self.secret.is_some())
            .field("jwks_keys", &self.keys.len())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .finish()
    }
}

/// What a verified token allows: its subject, its expiry, and the topics it may subscribe to
/// and publish on (claims `subscribe` and `publish`, lists of names or patterns: `scores`,
/// `user-42.*` for every name that starts with `user-42.`, `*` for all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The `sub` claim.
    pub subject: Option<String>,
    /// When the grant lapses: the `exp` claim plus the verifier's leeway (the connection is
    /// closed with [`TOKEN_EXPIRED`](freeboard::auth::TOKEN_EXPIRED) then).
    pub expires: SystemTime,
    /// The `subscribe` claim.
    pub subscribe: Vec<String>,
    /// The `publish` claim.
    pub publish: Vec<String>,
    /// The claims the verifier keeps for presence
    /// ([`TokenVerifier::presence_claims`]), as a JSON object; `None` if it keeps none or the
    /// token has none of them.
    pub presence_claims: Option<String>,
}

impl Grant {
    /// Whether the grant lets its holder subscribe to `topic`.
    pub fn may_subscribe(&self, topic: &str) -> bool {
        self.subscribe.iter().any(|p| matches_pattern(p, topic))
    }

    /// Whether the grant lets its holder publish on `topic`.
    pub fn may_publish(&self, topic: &str) -> bool {
        self.publish.iter().any(|p| matches_pattern(p, topic))
    }
}

/// Why a token was not accepted. Each maps to the status an upgrade is refused with
/// ([`status`](Self::status)) and a metric label ([`label`](Self::label)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// No token in `Authorization: Bearer` or the `access_token` query parameter (401).
    Missing,
    /// Malformed, wrongly signed, an unknown key or algorithm, a wrong issuer or audience (401).
    Invalid,
    /// `exp` has passed, by more than the leeway (401).
    Expired,
    /// `nbf` is still ahead, by more than the leeway (401).
    NotYetValid,
    /// `iat` is ahead, by more than the leeway: the token says it was issued in the future
    /// (401).
    IssuedInFuture,
    /// Valid, but it does not grant the topic asked for (403).
    NotGranted,
}

impl TokenError {
    /// The HTTP status an upgrade is refused with.
    pub fn status(self) -> u16 {
        match self {
            Self::NotGranted => 403,
            _ => 401,
        }
    }

    /// The `reason` label of `freeboard_access_refusals_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "token_missing",
            Self::Invalid => "token_invalid",
            Self::Expired => "token_expired",
            Self::NotYetValid => "token_not_yet_valid",
            Self::IssuedInFuture => "token_issued_in_future",
            Self::NotGranted => "topic_not_granted",
        }
    }
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Missing => {
                "a bearer token is required (Authorization: Bearer, or ?access_token=)"
            }
            Self::Invalid => "invalid token",
            Self::Expired => "token expired",
            Self::NotYetValid => "token not valid yet",
            Self::IssuedInFuture => "token issued in the future",
            Self::NotGranted => "the token does not grant this topic",
        })
    }
}

impl std::error::Error for TokenError {}

#[derive(Deserialize)]
struct Claims {
    exp: u64,
    #[serde(default)]
    nbf: Option<u64>,
    #[serde(default)]
    iat: Option<u64>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    /// Every other claim, for the ones presence shows.
    #[serde(flatten)]
    other: serde_json::Map<String, serde_json::Value>,
}

impl TokenVerifier {
    /// A verifier of HS256 tokens signed with `secret`.
    pub fn hs256(secret: &[u8]) -> Self {
        Self {
            secret: Some(DecodingKey::from_secret(secret)),
            keys: Vec::new(),
            issuer: None,
            audience: None,
            leeway: Duration::ZERO,
            presence_claims: Vec::new(),
        }
    }

    /// A verifier of RS256 and ES256 tokens signed by the keys of a JWKS document (RFC 7517
    /// `{"keys":[…]}`); a token picks its key by `kid`, or uses the only key of its kind.
    /// Keys of other types (HMAC `oct` keys among them) are refused.
    pub fn jwks(json: &str) -> Result<Self, Error> {
        let set: JwkSet = serde_json::from_str(json).map_err(|e| Error::Jwks(e.to_string()))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            use jsonwebtoken::jwk::AlgorithmParameters as P;
            let algorithm = match &jwk.algorithm {
                P::RSA(_) => Algorithm::RS256,
                P::EllipticCurve(ec) if ec.curve == jsonwebtoken::jwk::EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                _ => return Err(Error::Jwks("only RSA and P-256 keys are supported".into())),
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| Error::Jwks(e.to_string()))?;
            keys.push((jwk.common.key_id.clone(), algorithm, key));
        }
        if keys.is_empty() {
            return Err(Error::Jwks("the key set is empty".into()));
        }
        let (issuer, audience, leeway) = (None, None, Duration::ZERO);
        Ok(Self { secret: None, keys, issuer, audience, leeway, presence_claims: Vec::new() })
    }

    /// A verifier from the configuration: an HS256 secret, a JWKS file (read now), or both (a
    /// token's `alg` says which it is checked with), with the issuer, audience and leeway it
    /// requires. `None` when neither a secret nor a key set is set.
    pub fn from_config(config: &TokenConfig) -> Result<Option<Self>, Error> {
        Ok(Self::keys(config.jwt_secret.as_deref(), config.jwks_file.as_deref())?.map(|mut v| {
            v = v.leeway(config.jwt_leeway);
            if let Some(issuer) = &config.jwt_issuer {
                v = v.issuer(issuer);
            }
            if let Some(audience) = &config.jwt_audience {
                v = v.audience(audience);
            }
            v
        }))
    }

    /// A verifier of an HS256 secret, a JWKS file, or both.
    fn keys(secret: Option<&str>, jwks_file: Option<&Path>) -> Result<Option<Self>, Error> {
        let mut verifier = match jwks_file {
            Some(path) => {
                let json = std::fs::read_to_string(path)
                    .map_err(|e| Error::Jwks(format!("{}: {e}", path.display())))?;
                Some(Self::jwks(&json)?)
            }
            None => None,
        };
        if let Some(secret) = secret {
            if secret.len() < 32 {
                return Err(Error::JwtSecret);
            }
            let key = DecodingKey::from_secret(secret.as_bytes());
            match &mut verifier {
                Some(v) => v.secret = Some(key),
                None => verifier = Some(Self::hs256(secret.as_bytes())),
            }
        }
        Ok(verifier)
    }

    /// Keeps the token's claims named in `names` (those present) in the [`Grant`], as a JSON
    /// object for the subscriber's presence entry ([`Grant::presence_claims`]).
    pub fn presence_claims(mut self, names: &[String]) -> Self {
        self.presence_claims = names.to_vec();
        self
    }

    /// Requires `iss` to be `issuer`.
    pub fn issuer(mut self, issuer: &str) -> Self {
        self.issuer = Some(issuer.to_owned());
        self
    }

    /// Requires `aud` to contain `audience`.
    pub fn audience(mut self, audience: &str) -> Self {
        self.audience = Some(audience.to_owned());
        self
    }

    /// Allows `leeway` of clock skew with the issuer: a token is accepted up to `leeway` past
    /// its `exp` (and its grant lapses then), and up to `leeway` before its `nbf` or `iat`.
    /// Default zero ([`TopicsConfig::jwt_leeway`](crate::TokenConfig::jwt_leeway),
    /// what `freeboard serve` uses, defaults to 30 s).
    pub fn leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway;
        self
    }

    /// Verifies `token` at `now`: its signature, `exp` (required), `nbf` and `iat` if
    /// present, each with the leeway, and the issuer and audience if configured.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Grant, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Invalid)?;
        let key = match header.alg {
            Algorithm::HS256 => self.secret.as_ref(),
            alg @ (Algorithm::RS256 | Algorithm::ES256) => {
                let mut candidates = self.keys.iter().filter(|(_, a, _)| *a == alg);
                match &header.kid {
                    Some(kid) => candidates.find(|(id, _, _)| id.as_deref() == Some(kid.as_str())),
                    None => {
                        let first = candidates.next();
                        first.filter(|_| candidates.next().is_none())
                    }
                }
                .map(|(_, _, key)| key)
            }
            _ => None,
        }
        .ok_or(TokenError::Invalid)?;
        let mut validation = Validation::new(header.alg);
        // `exp`, `nbf` and `iat` are checked below against `now` (the caller's clock, so
        // tests need no sleeping); the library's checks would read the system clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims = ["exp".to_owned()].into();
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
        }
        if let Some(audience) = &self.audience {
            validation.set_audience(&[audience]);
            validation.validate_aud = true;
        }
        let data = jsonwebtoken::decode::<Claims>(token, key, &validation)
            .map_err(|_| TokenError::Invalid)?;
        let claims = data.claims;
        let expires = unix_time(claims.exp) + self.leeway;
        if expires <= now {
            return Err(TokenError::Expired);
        }
        // RFC 7519 §4.1.5: "The "nbf" (not before) claim identifies the time before which
        // the JWT MUST NOT be accepted for processing", with "some small leeway" for skew.
        if claims.nbf.is_some_and(|nbf| unix_time(nbf) > now + self.leeway) {
            return Err(TokenError::NotYetValid);
        }
        // §4.1.6 `iat` is when the token was issued: one from the future (beyond the skew)
        // was minted wrongly or to outlive its issuer's rules, and is refused.
        if claims.iat.is_some_and(|iat| unix_time(iat) > now + self.leeway) {
            return Err(TokenError::IssuedInFuture);
        }
        let mut shown = serde_json::Map::new();
        for name in &self.presence_claims {
            if let Some(value) = claims.other.get(name) {
                shown.insert(name.clone(), value.clone());
            }
        }
        let presence_claims =
            (!shown.is_empty()).then(|| serde_json::Value::Object(shown).to_string());
        Ok(Grant {
            subject: claims.sub,
            expires,
            subscribe: claims.subscribe,
            publish: claims.publish,
            presence_claims,
        })
    }
}

/// The time `secs` seconds after the Unix epoch, capped at 2106 (`u32::MAX` seconds): an
/// `exp` of `u64::MAX`, validly signed or not, cannot overflow a clock.
pub(crate) fn unix_time(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs.min(u64::from(u32::MAX)))
}

/// The bearer token of an upgrade request: `Authorization: Bearer TOKEN`, else the
/// `access_token` query parameter (RFC 6750 §2.3), which is what browsers can send — they
/// cannot set headers on a WebSocket.
pub fn bearer_token<'b>(request: &Request<'_, 'b>) -> Option<&'b str> {
    // An `Authorization` header of another scheme is not overridden by the query.
    let token = match request.header("authorization") {
        Some(_) => http::bearer_token(request.headers()),
        None => http::query_value(request.path(), "access_token"),
    };
    token.filter(|t| !t.is_empty())
}

/// `pattern` is a topic name, a prefix ending in `*`, or `*`.
fn matches_pattern(pattern: &str, topic: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => topic.starts_with(prefix),
        None => pattern == topic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_exp_is_the_far_future_not_an_overflow() {
        let verifier = TokenVerifier::hs256(b"0123456789abcdef0123456789abcdef");
        let claims = serde_json::json!({"exp": u64::MAX, "subscribe": ["a"]});
        let key = jsonwebtoken::EncodingKey::from_secret(b"0123456789abcdef0123456789abcdef");
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        let grant = verifier.verify(&token, SystemTime::now()).unwrap();
        assert_eq!(grant.expires, unix_time(u64::from(u32::MAX)));
        // Wrong key, expired, missing exp: refused, never a panic.
        let other = TokenVerifier::hs256(b"another secret of 32 bytes or more!");
        assert_eq!(other.verify(&token, SystemTime::now()), Err(TokenError::Invalid));
        let old = serde_json::json!({"exp": 1, "subscribe": ["a"]});
        let old = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &old, &key).unwrap();
        assert_eq!(verifier.verify(&old, SystemTime::now()), Err(TokenError::Expired));
        let none = serde_json::json!({"subscribe": ["a"]});
        let none = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &none, &key).unwrap();
        assert_eq!(verifier.verify(&none, SystemTime::now()), Err(TokenError::Invalid));
    }

    /// `exp`, `nbf` and `iat` on either side of their limits, without a leeway and with 30 s.
    #[test]
    fn time_claims_with_and_without_leeway() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let key = jsonwebtoken::EncodingKey::from_secret(secret);
        let t = 1_700_000_000u64;
        let now = unix_time(t);
        let token = |claims: serde_json::Value| {
            jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
        };
        let strict = TokenVerifier::hs256(secret);
        let skew = Duration::from_secs(30);
        let lenient = TokenVerifier::hs256(secret).leeway(skew);
        let check = |verifier: &TokenVerifier, claims: serde_json::Value| {
            verifier.verify(&token(claims), now).map(|grant| grant.expires)
        };
        use TokenError::{Expired, IssuedInFuture, NotYetValid};
        use serde_json::json;
        // exp: refused from `exp` on; with a leeway, until `exp + leeway`, and the grant
        // lapses then.
        assert_eq!(check(&strict, json!({"exp": t + 1})), Ok(unix_time(t + 1)));
        assert_eq!(check(&strict, json!({"exp": t})), Err(Expired));
        assert_eq!(check(&strict, json!({"exp": t - 10})), Err(Expired));
        assert_eq!(check(&lenient, json!({"exp": t - 10})), Ok(unix_time(t + 20)));
        assert_eq!(check(&lenient, json!({"exp": t - 30})), Err(Expired));
        // nbf: accepted from `nbf` on; with a leeway, from `nbf - leeway`.
        let exp = t + 3600;
        assert_eq!(check(&strict, json!({"exp": exp, "nbf": t})), Ok(unix_time(exp)));
        assert_eq!(check(&strict, json!({"exp": exp, "nbf": t - 60})), Ok(unix_time(exp)));
        assert_eq!(check(&strict, json!({"exp": exp, "nbf": t + 1})), Err(NotYetValid));
        assert_eq!(check(&lenient, json!({"exp": exp, "nbf": t + 30})), Ok(unix_time(exp + 30)));
        assert_eq!(check(&lenient, json!({"exp": exp, "nbf": t + 31})), Err(NotYetValid));
        assert_eq!(check(&lenient, json!({"exp": exp, "nbf": t + 3600})), Err(NotYetValid));
        // iat: a token issued in the future, beyond the leeway, is refused.
        assert_eq!(check(&strict, json!({"exp": exp, "iat": t})), Ok(unix_time(exp)));
        assert_eq!(check(&strict, json!({"exp": exp, "iat": t - 600})), Ok(unix_time(exp)));
        assert_eq!(check(&strict, json!({"exp": exp, "iat": t + 1})), Err(IssuedInFuture));
        assert_eq!(check(&lenient, json!({"exp": exp, "iat": t + 30})), Ok(unix_time(exp + 30)));
        assert_eq!(check(&lenient, json!({"exp": exp, "iat": t + 31})), Err(IssuedInFuture));
        // `exp` is checked first, then `nbf`, then `iat`.
        let all = json!({"exp": t - 60, "nbf": t + 60, "iat": t + 60});
        assert_eq!(check(&lenient, all), Err(Expired));
        let both = json!({"exp": exp, "nbf": t + 60, "iat": t + 60});
        assert_eq!(check(&lenient, both), Err(NotYetValid));
        // A time claim that is not a NumericDate of whole seconds is not a valid token.
        assert_eq!(check(&strict, json!({"exp": exp, "nbf": "soon"})), Err(TokenError::Invalid));
        assert_eq!(check(&strict, json!({"exp": exp, "iat": -1})), Err(TokenError::Invalid));
        // Each refusal is a 401 with its own counter label.
        for (error, label) in [
            (Expired, "token_expired"),
            (NotYetValid, "token_not_yet_valid"),
            (IssuedInFuture, "token_issued_in_future"),
        ] {
            assert_eq!((error.status(), error.label()), (401, label));
            assert!(freeboard::metrics::ACCESS_REFUSAL_REASONS.contains(&label), "{label}");
        }
    }

    #[test]
    fn patterns() {
        assert!(matches_pattern("*", "x"));
        assert!(matches_pattern("user-42.*", "user-42.inbox"));
        assert!(!matches_pattern("user-42.*", "user-43.inbox"));
        assert!(matches_pattern("scores", "scores"));
        assert!(!matches_pattern("scores", "scores2"));
    }
}
