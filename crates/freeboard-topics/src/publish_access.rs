//! Who may publish over HTTP (`POST /topic/NAME`) when the service controls access: a server
//! whose subscribers need a token does not take publications from anyone.

use std::sync::Arc;
use std::time::SystemTime;

use freeboard::{PublishAccess, PublishGrant, PublishRefusal};

use crate::token::{Grant, TokenVerifier};

/// The credentials a `POST` may carry besides the publish token (which the runtime checks
/// first): a JWT whose `publish` claim grants the topic, when the service verifies tokens.
/// Without a verifier (a connect webhook alone, or anonymous publishing turned off) nothing
/// but the publish token is accepted: the webhook decides connections, and a publish is not
/// one.
#[derive(Debug, Clone)]
pub struct PublishGate {
    verifier: Option<Arc<TokenVerifier>>,
    /// Why only the publish token is accepted, when there is no verifier.
    only_token: &'static str,
}

impl PublishGate {
    /// Accepts the JWTs `verifier` accepts (their `publish` claim decides the topics).
    pub fn tokens(verifier: Arc<TokenVerifier>) -> Self {
        Self { verifier: Some(verifier), only_token: "" }
    }

    /// Accepts nothing but the publish token; `why` says so to the publisher.
    pub fn only_publish_token(why: &'static str) -> Self {
        Self { verifier: None, only_token: why }
    }
}

impl PublishAccess for PublishGate {
    fn authorize(&self, bearer: Option<&str>) -> Result<Box<dyn PublishGrant>, PublishRefusal> {
        let Some(verifier) = &self.verifier else {
            let status = if bearer.is_some() { 403 } else { 401 };
            let reason = if bearer.is_some() { "token_invalid" } else { "token_missing" };
            return Err(PublishRefusal { status, reason, why: self.only_token.to_owned() });
        };
        let Some(token) = bearer else {
            return Err(PublishRefusal {
                status: 401,
                reason: "token_missing",
                why: "a bearer token is required: the publish token, or a JWT whose publish \
                      claim grants the topic"
                    .to_owned(),
            });
        };
        match verifier.verify(token, SystemTime::now()) {
            Ok(grant) => Ok(Box::new(grant)),
            Err(e) => Err(PublishRefusal { status: 401, reason: e.label(), why: e.to_string() }),
        }
    }
}

impl PublishGrant for Grant {
    fn may_publish(&self, topic: &str) -> bool {
        Grant::may_publish(self, topic)
    }
}
