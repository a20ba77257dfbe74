//! One error type for the whole request path; every error leaves the server as a `Status` object.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::storage::{CorruptValue, StorageError};

/// A field-level problem, as kube-apiserver reports it in `details.causes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub reason: CauseType,
    pub field: String,
    /// The full message, e.g. `spec.resource.resource: Required value` (Go's `field.Error.Error()`): the field path,
    /// then [`body`](Self::body).
    pub message: String,
}

/// A cause's reason, as apimachinery's `metav1.CauseType` names it (serialised by its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CauseType {
    FieldValueRequired,
    FieldValueInvalid,
    FieldValueNotSupported,
    FieldValueDuplicate,
    FieldValueForbidden,
    FieldValueTooLong,
    /// A server-side apply conflict with another manager.
    FieldManagerConflict,
    /// A read at a resourceVersion the store has not reached.
    ResourceVersionTooLarge,
    /// A stored object that cannot be read.
    UnexpectedServerResponse,
}

impl CauseType {
    pub fn as_str(self) -> &'static str {
        match self {
            CauseType::FieldValueRequired => "FieldValueRequired",
            CauseType::FieldValueInvalid => "FieldValueInvalid",
            CauseType::FieldValueNotSupported => "FieldValueNotSupported",
            CauseType::FieldValueDuplicate => "FieldValueDuplicate",
            CauseType::FieldValueForbidden => "FieldValueForbidden",
            CauseType::FieldValueTooLong => "FieldValueTooLong",
            CauseType::FieldManagerConflict => "FieldManagerConflict",
            CauseType::ResourceVersionTooLarge => "ResourceVersionTooLarge",
            CauseType::UnexpectedServerResponse => "UnexpectedServerResponse",
        }
    }
}

impl std::fmt::Display for CauseType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for CauseType {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Go's `%q`, as kube-apiserver quotes names and bad values in its messages.
fn quote(v: &str) -> String {
    crate::gostr::quote(v)
}

impl FieldError {
    /// The message without its leading field path (Go's `field.Error.ErrorBody()`): what kube-apiserver sends as a
    /// cause's `message`, next to the path in `field`, so that a client printing `<field>: <message>` (kubectl)
    /// names the field once. A message that does not start with the path is all body.
    pub fn body(&self) -> &str {
        self.message.strip_prefix(self.field.as_str()).and_then(|m| m.strip_prefix(": ")).unwrap_or(&self.message)
    }
    pub fn required(field: impl Into<String>) -> Self {
        let field = field.into();
        FieldError { reason: CauseType::FieldValueRequired, message: format!("{field}: Required value"), field }
    }
    pub fn required_msg(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        FieldError {
            reason: CauseType::FieldValueRequired,
            message: format!("{field}: Required value: {detail}"),
            field,
        }
    }
    /// `field: Invalid value: "value": detail`
    pub fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        let field = field.into();
        FieldError {
            reason: CauseType::FieldValueInvalid,
            message: format!("{field}: Invalid value: {}: {detail}", quote(value)),
            field,
        }
    }
    /// Invalid for a non-string value (rendered as Go renders it: bare numbers, objects as JSON).
    pub fn invalid_value(field: impl Into<String>, value: &serde_json::Value, detail: &str) -> Self {
        let field = field.into();
        let v = match value {
            serde_json::Value::String(s) => quote(s),
            other => other.to_string(),
        };
        FieldError {
            reason: CauseType::FieldValueInvalid,
            message: format!("{field}: Invalid value: {v}: {detail}"),
            field,
        }
    }
    /// Invalid for a value already rendered as Go renders it (e.g. a struct as its `encoding/json` text, in the
    /// struct's field order, which a `serde_json::Value` would sort).
    pub fn invalid_rendered(field: impl Into<String>, rendered: &str, detail: &str) -> Self {
        let field = field.into();
        FieldError {
            reason: CauseType::FieldValueInvalid,
            message: format!("{field}: Invalid value: {rendered}: {detail}"),
            field,
        }
    }
    pub fn not_supported(field: impl Into<String>, value: &str, allowed: &[&str]) -> Self {
        let field = field.into();
        let list: Vec<String> = allowed.iter().map(|a| quote(a)).collect();
        FieldError {
            reason: CauseType::FieldValueNotSupported,
            message: format!("{field}: Unsupported value: {}: supported values: {}", quote(value), list.join(", ")),
            field,
        }
    }
    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        let field = field.into();
        FieldError {
            reason: CauseType::FieldValueDuplicate,
            message: format!("{field}: Duplicate value: {}", quote(value)),
            field,
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        FieldError { reason: CauseType::FieldValueForbidden, message: format!("{field}: Forbidden: {detail}"), field }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        let field = field.into();
        FieldError {
            reason: CauseType::FieldValueTooLong,
            message: format!("{field}: Too long: may not be more than {max} bytes"),
            field,
        }
    }
    /// `field: Invalid value: ...: field is immutable`
    pub fn immutable(field: impl Into<String>, value: &serde_json::Value) -> Self {
        Self::invalid_value(field, value, "field is immutable")
    }
}

/// The identity of the object an error is about (`details` in the Status).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Details {
    pub name: String,
    pub group: String,
    /// The resource (plural), as kube-apiserver puts it in `details.kind`.
    pub kind: String,
    pub causes: Vec<FieldError>,
    pub retry_after_seconds: Option<u64>,
}

/// Why a request failed, as kube-apiserver's `metav1.StatusReason`: each reason has its HTTP code. Callers compare
/// reasons, not codes (409 is both `Conflict` and `AlreadyExists`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusReason {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    NotAcceptable,
    AlreadyExists,
    Conflict,
    Expired,
    RequestEntityTooLarge,
    UnsupportedMediaType,
    Invalid,
    TooManyRequests,
    InternalError,
    /// Stored objects that cannot be read (KEP-3926); on the wire `StorageReadError`.
    StoreReadError,
    ServiceUnavailable,
    Timeout,
}

impl StatusReason {
    const ALL: [StatusReason; 17] = [
        StatusReason::BadRequest,
        StatusReason::Unauthorized,
        StatusReason::Forbidden,
        StatusReason::NotFound,
        StatusReason::MethodNotAllowed,
        StatusReason::NotAcceptable,
        StatusReason::AlreadyExists,
        StatusReason::Conflict,
        StatusReason::Expired,
        StatusReason::RequestEntityTooLarge,
        StatusReason::UnsupportedMediaType,
        StatusReason::Invalid,
        StatusReason::TooManyRequests,
        StatusReason::InternalError,
        StatusReason::StoreReadError,
        StatusReason::ServiceUnavailable,
        StatusReason::Timeout,
    ];

    /// The reason of another server's answer, as client-go's `errors.ReasonForError` and `Is*` helpers read it:
    /// the `Status` reason when it is one of these, else the reason its HTTP code stands for (409 reads as
    /// `Conflict`); `None` when neither says.
    pub fn of_answer(reason: &str, code: u16) -> Option<Self> {
        let named = Self::ALL.into_iter().find(|r| r.as_str() == reason);
        let by_code = || {
            let generic = |r: &StatusReason| !matches!(r, StatusReason::AlreadyExists | StatusReason::StoreReadError);
            Self::ALL.into_iter().filter(generic).find(|r| r.code() == code)
        };
        named.or_else(by_code)
    }

    /// The reason as the `Status` carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusReason::BadRequest => "BadRequest",
            StatusReason::Unauthorized => "Unauthorized",
            StatusReason::Forbidden => "Forbidden",
            StatusReason::NotFound => "NotFound",
            StatusReason::MethodNotAllowed => "MethodNotAllowed",
            StatusReason::NotAcceptable => "NotAcceptable",
            StatusReason::AlreadyExists => "AlreadyExists",
            StatusReason::Conflict => "Conflict",
            StatusReason::Expired => "Expired",
            StatusReason::RequestEntityTooLarge => "RequestEntityTooLarge",
            StatusReason::UnsupportedMediaType => "UnsupportedMediaType",
            StatusReason::Invalid => "Invalid",
            StatusReason::TooManyRequests => "TooManyRequests",
            StatusReason::InternalError => "InternalError",
            StatusReason::StoreReadError => "StorageReadError",
            StatusReason::ServiceUnavailable => "ServiceUnavailable",
            StatusReason::Timeout => "Timeout",
        }
    }

    /// The HTTP code kube-apiserver answers this reason with.
    pub fn code(self) -> u16 {
        match self {
            StatusReason::BadRequest => 400,
            StatusReason::Unauthorized => 401,
            StatusReason::Forbidden => 403,
            StatusReason::NotFound => 404,
            StatusReason::MethodNotAllowed => 405,
            StatusReason::NotAcceptable => 406,
            StatusReason::AlreadyExists | StatusReason::Conflict => 409,
            StatusReason::Expired => 410,
            StatusReason::RequestEntityTooLarge => 413,
            StatusReason::UnsupportedMediaType => 415,
            StatusReason::Invalid => 422,
            StatusReason::TooManyRequests => 429,
            StatusReason::InternalError | StatusReason::StoreReadError => 500,
            StatusReason::ServiceUnavailable => 503,
            StatusReason::Timeout => 504,
        }
    }
}

impl std::fmt::Display for StatusReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP code: always `reason.code()`.
    pub code: u16,
    pub reason: StatusReason,
    pub message: String,
    pub details: Option<Box<Details>>,
    /// For a 410 on an expired continue token: the inconsistent continuation (`metadata.continue`).
    pub continue_token: Option<Box<str>>,
    /// The stored values that could not be read, when that is what failed: a list gathers them from its items
    /// into one [`store_read_error`](Self::store_read_error).
    pub unreadable: Vec<CorruptValue>,
}

/// `<resource>.<group>` (just `<resource>` for the core group), as in kube-apiserver's messages.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub fn new(reason: StatusReason, message: impl Into<String>) -> Self {
        let code = reason.code();
        ApiError { code, reason, message: message.into(), details: None, continue_token: None, unreadable: Vec::new() }
    }
    fn with(mut self, group: &str, resource: &str, name: &str) -> Self {
        self.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: resource.to_string(),
            ..Default::default()
        }));
        self
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusReason::BadRequest, message)
    }
    pub fn unauthorized() -> Self {
        Self::new(StatusReason::Unauthorized, "Unauthorized")
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusReason::Forbidden, message)
    }
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(StatusReason::NotFound, format!("{} {} not found", qualified(resource, group), quote(name)))
            .with(group, resource, name)
    }
    pub fn path_not_found() -> Self {
        Self::new(StatusReason::NotFound, "the server could not find the requested resource")
    }
    pub fn method_not_allowed(verb: &str, group: &str, resource: &str) -> Self {
        Self::new(
            StatusReason::MethodNotAllowed,
            format!("{verb} is not supported on resources of kind {}", quote(&qualified(resource, group))),
        )
    }
    pub fn not_acceptable(supported: &[&str]) -> Self {
        Self::new(
            StatusReason::NotAcceptable,
            format!("only the following media types are accepted: {}", supported.join(", ")),
        )
    }
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(StatusReason::AlreadyExists, format!("{} {} already exists", qualified(resource, group), quote(name)))
            .with(group, resource, name)
    }
    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict_msg(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn conflict_msg(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            StatusReason::Conflict,
            format!("Operation cannot be fulfilled on {} {}: {why}", qualified(resource, group), quote(name)),
        )
        .with(group, resource, name)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusReason::Expired, message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusReason::RequestEntityTooLarge, message)
    }
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(StatusReason::UnsupportedMediaType, format!("the body of the request was in an unknown format - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json (got {})", quote(content_type)))
    }
    /// 422 with one cause per invalid field, as kube-apiserver's `NewInvalid`: the message is `<Kind>.<group>
    /// "<name>" is invalid: ` and the full messages (field path included) of the causes, each once, in brackets when
    /// there are several (Go's `ErrorList.ToAggregate()`); each cause carries its path in `field` and the rest in
    /// `message` (see [`Status`](Self::status)).
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<FieldError>) -> Self {
        let mut msgs: Vec<&str> = Vec::with_capacity(causes.len());
        for c in &causes {
            if !msgs.contains(&c.message.as_str()) {
                msgs.push(&c.message);
            }
        }
        let qualified_kind = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        let message = match msgs.as_slice() {
            [] => format!("{qualified_kind} {} is invalid", quote(name)),
            [one] => format!("{qualified_kind} {} is invalid: {one}", quote(name)),
            many => format!("{qualified_kind} {} is invalid: [{}]", quote(name), many.join(", ")),
        };
        let mut e = Self::new(StatusReason::Invalid, message);
        e.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
            causes,
            retry_after_seconds: None,
        }));
        e
    }
    /// A list or watch that met stored objects it cannot read (KEP-3926, as kube-apiserver 1.32+ answers): a 500
    /// `StorageReadError` whose causes name each object's storage key, so that it can be found and removed with
    /// `ignoreStoreReadErrorWithClusterBreakingPotential`. `prefix` is where they were read.
    pub fn store_read_error(resource: &str, prefix: &str, values: &[CorruptValue]) -> Self {
        let causes = values
            .iter()
            .map(|v| FieldError {
                reason: CauseType::UnexpectedServerResponse,
                field: v.key.clone(),
                message: v.message.clone(),
            })
            .collect();
        let mut e =
            Self::new(StatusReason::StoreReadError, format!("failed to read one or more {resource} from the storage"));
        e.details = Some(Box::new(Details {
            name: prefix.to_string(),
            kind: resource.to_string(),
            causes,
            ..Default::default()
        }));
        e.unreadable = values.to_vec();
        e
    }

    /// One stored object that cannot be read, as kube-apiserver answers a GET of it: a 500 naming its key.
    pub fn corrupt_object(value: CorruptValue) -> Self {
        let mut e = Self::internal(format!(
            "StorageError: corrupt object, Code: 6, Key: {}, ResourceVersion: 0, AdditionalErrorMsg: {}",
            value.key, value.message
        ));
        e.unreadable = vec![value];
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusReason::InternalError, format!("Internal error occurred: {}", message.into()))
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusReason::Timeout, message)
    }
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusReason::ServiceUnavailable, message);
        e.details = Some(Box::new(Details { retry_after_seconds: Some(1), ..Default::default() }));
        e
    }

    /// The `Status` object kube-apiserver would send.
    pub fn status(&self) -> serde_json::Value {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status, StatusCause, StatusDetails};
        // Empty strings are left out, as Go's `omitempty` leaves them out.
        let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let details = self.details.as_ref().map(|d| StatusDetails {
            name: text(&d.name),
            group: text(&d.group),
            kind: text(&d.kind),
            causes: (!d.causes.is_empty()).then(|| {
                d.causes
                    .iter()
                    .map(|c| StatusCause {
                        field: text(&c.field),
                        message: Some(c.body().to_string()),
                        reason: Some(c.reason.to_string()),
                    })
                    .collect()
            }),
            retry_after_seconds: d.retry_after_seconds.map(|r| i32::try_from(r).unwrap_or(i32::MAX)),
            uid: None,
        });
        let status = Status {
            code: Some(i32::from(self.code)),
            details,
            message: Some(self.message.clone()),
            metadata: ListMeta { continue_: self.continue_token.as_deref().map(str::to_string), ..Default::default() },
            reason: Some(self.reason.as_str().to_string()),
            status: Some("Failure".into()),
        };
        serde_json::to_value(&status).unwrap_or_default()
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Expired { requested, oldest } => ApiError::gone(format!(
                "The resourceVersion for the provided list is too old (requested {requested}, oldest available {oldest})."
            )),
            StorageError::TooLarge { size, limit } => {
                ApiError::too_large(format!("object is too large: {size} bytes exceeds the limit of {limit} bytes"))
            }
            StorageError::Unavailable(m) => ApiError::service_unavailable(m),
            StorageError::Corrupt(mut values) if values.len() == 1 => ApiError::corrupt_object(values.remove(0)),
            StorageError::Corrupt(values) => ApiError::store_read_error("objects", "", &values),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry = self.details.as_ref().and_then(|d| d.retry_after_seconds);
        let body = serde_json::to_vec(&self.status()).unwrap_or_default();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        if let Some(r) = retry {
            if let Ok(v) = HeaderValue::from_str(&r.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// As client-go's `IsNotFound`/`IsConflict`/...: a reason it knows wins; otherwise the code's reason.
    #[test]
    fn another_servers_answer_is_read_by_reason_then_code() {
        let of = StatusReason::of_answer;
        assert_eq!(of("AlreadyExists", 409), Some(StatusReason::AlreadyExists));
        assert_eq!(of("Conflict", 409), Some(StatusReason::Conflict));
        assert_eq!(of("", 409), Some(StatusReason::Conflict));
        assert_eq!(of("Failed to parse error data", 404), Some(StatusReason::NotFound));
        assert_eq!(of("NotFound", 500), Some(StatusReason::NotFound));
        assert_eq!(of("StorageReadError", 500), Some(StatusReason::StoreReadError));
        assert_eq!(of("", 500), Some(StatusReason::InternalError));
        assert_eq!(of("", 418), None);
        for r in StatusReason::ALL {
            assert_eq!(of(r.as_str(), r.code()), Some(r));
        }
    }

    #[test]
    fn conflict_message_matches_kube() {
        let e = ApiError::conflict("migration.k8s.io", "storagestates", "pods");
        assert_eq!(e.code, 409);
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on storagestates.migration.k8s.io \"pods\": the object has been modified; please apply your changes to the latest version and try again"
        );
    }

    #[test]
    fn invalid_lists_every_cause() {
        let e = ApiError::invalid(
            "StorageState",
            "migration.k8s.io",
            "x",
            vec![
                FieldError::required("spec.resource.resource"),
                FieldError::invalid("metadata.name", "x", "must be y"),
            ],
        );
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "StorageState.migration.k8s.io \"x\" is invalid: [spec.resource.resource: Required value, metadata.name: \
             Invalid value: \"x\": must be y]"
        );
        // Each cause names its field once: the path in `field`, the rest in `message` (Go's ErrorBody).
        assert_eq!(
            e.status()["details"]["causes"],
            serde_json::json!([
                {"reason": "FieldValueRequired", "field": "spec.resource.resource", "message": "Required value"},
                {"reason": "FieldValueInvalid", "field": "metadata.name", "message": "Invalid value: \"x\": must be y"},
            ])
        );
    }

    /// As Go's `ErrorList.ToAggregate`: one message once, however many causes carry it; the core group has no
    /// `.<group>` suffix.
    #[test]
    fn invalid_message_is_the_deduplicated_aggregate() {
        let twice = vec![FieldError::required("spec.x"), FieldError::required("spec.x")];
        let e = ApiError::invalid("Namespace", "", "n", twice);
        assert_eq!(e.message, "Namespace \"n\" is invalid: spec.x: Required value");
        assert_eq!(e.status()["details"]["causes"].as_array().map(Vec::len), Some(2));
        // A cause whose message does not start with its field (a storage key and why it cannot be read) is sent whole.
        let unreadable = FieldError {
            reason: CauseType::UnexpectedServerResponse,
            field: "/registry/k".into(),
            message: "bad data".into(),
        };
        assert_eq!(unreadable.body(), "bad data");
    }
}
