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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenConfig;

    const SECRET: &str = "a secret of at least thirty-two bytes!";

    fn verifier() -> Arc<TokenVerifier> {
        let config = TokenConfig { jwt_secret: Some(SECRET.into()), ..TokenConfig::default() };
        Arc::new(TokenVerifier::from_config(&config).unwrap().unwrap())
    }

    #[test]
    fn a_jwt_grants_the_topics_of_its_publish_claim() {
        let gate = PublishGate::tokens(verifier());
        let token = freeboard_test::hs256_jwt(
            SECRET,
            r#"{"exp":4102444800,"publish":["scores","news:*"]}"#,
        );
        let grant = gate.authorize(Some(&token)).unwrap();
        assert!(grant.may_publish("scores") && grant.may_publish("news:eu"));
        assert!(!grant.may_publish("chat"));
        let missing = gate.authorize(None).err().unwrap();
        assert_eq!((missing.status, missing.reason), (401, "token_missing"));
        let forged = gate.authorize(Some("a.b.c")).err().unwrap();
        assert_eq!((forged.status, forged.reason), (401, "token_invalid"));
    }

    #[test]
    fn without_a_verifier_only_the_publish_token_is_accepted() {
        let gate = PublishGate::only_publish_token("the webhook decides connections");
        let none = gate.authorize(None).err().unwrap();
        assert_eq!(none.status, 401);
        assert_eq!(none.why, "the webhook decides connections");
        let other = gate.authorize(Some("anything")).err().unwrap();
        assert_eq!(other.status, 403);
    }
}
