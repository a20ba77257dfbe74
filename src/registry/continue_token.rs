//! List continuation tokens, in kube-apiserver's format: base64 of {"v":"meta.k8s.io/v1","rv":R,"start":"<key>\u0000"}.

use crate::error::ApiError;
use base64::Engine;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct Wire {
    v: String,
    rv: i64,
    start: String,
}

/// Where a chunked list resumes: after `start` (relative to the list prefix), read at `revision` (None: latest,
/// an "inconsistent" continuation as handed out after a 410).
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct ContinueToken {
    pub revision: Option<u64>,
    pub start: String,
}

impl ContinueToken {
    pub fn encode(&self) -> String {
        let w = Wire {
            v: "meta.k8s.io/v1".into(),
            rv: self.revision.map(|r| r as i64).unwrap_or(-1),
            start: format!("{}\u{0}", self.start),
        };
        base64::engine::general_purpose::URL_SAFE.encode(serde_json::to_vec(&w).unwrap_or_default())
    }

    pub fn decode(token: &str) -> Result<Self, ApiError> {
        let invalid = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
        let raw = base64::engine::general_purpose::URL_SAFE
            .decode(token)
            .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
            .map_err(|_| invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
        let w: Wire = serde_json::from_slice(&raw).map_err(|_| invalid("invalid JSON"))?;
        if w.v != "meta.k8s.io/v1" {
            return Err(invalid("server does not recognize this encoded key"));
        }
        let start = w.start.strip_suffix('\u{0}').unwrap_or(&w.start).to_string();
        if start.is_empty() || start.contains("..") || start.starts_with('/') {
            return Err(invalid("continue key may not be empty or reference a parent path"));
        }
        let revision = match w.rv {
            -1 => None,
            r if r > 0 => Some(r as u64),
            _ => return Err(invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")),
        };
        Ok(ContinueToken { revision, start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_garbage() {
        let t = ContinueToken { revision: Some(42), start: "ns/name".into() };
        assert_eq!(ContinueToken::decode(&t.encode()).unwrap(), t);
        let i = ContinueToken { revision: None, start: "x".into() };
        assert_eq!(ContinueToken::decode(&i.encode()).unwrap(), i);
        assert_eq!(ContinueToken::decode("!!!").unwrap_err().code, 400);
        let evil = base64::engine::general_purpose::URL_SAFE
            .encode(br#"{"v":"meta.k8s.io/v1","rv":3,"start":"../secrets\u0000"}"#);
        assert_eq!(ContinueToken::decode(&evil).unwrap_err().code, 400);
    }
}
