//! The options of writes, decoded and checked as kube-apiserver's handlers do: `dryRun`, `fieldValidation`,
//! `fieldManager` (or the manager a User-Agent names), and the apply-only `force`; and an apply's configuration.

use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::{FieldValidation, WriteOptions};
use axum::http::HeaderMap;
use serde_json::Value;

use super::query::QueryParams;

/// `dryRun` of a write: every value must be `All` (kube-apiserver's ValidateDryRun), else a 422 naming the
/// options kind (`CreateOptions`, `UpdateOptions`, `PatchOptions`, `DeleteOptions`).
pub(super) fn dry_run(values: &[String], options_kind: &str) -> ApiResult<bool> {
    if values.iter().any(|v| v != "All") {
        let list = serde_json::to_string(values).unwrap_or_default();
        let cause = FieldError {
            reason: crate::error::CauseType::FieldValueNotSupported,
            field: "dryRun".into(),
            message: format!("dryRun: Unsupported value: {list}: supported values: \"All\""),
        };
        return Err(ApiError::invalid(options_kind, "meta.k8s.io", "", vec![cause]));
    }
    Ok(!values.is_empty())
}

/// The options of a write, checked as kube-apiserver checks `fieldManager` (at most 128 printable characters).
pub(super) fn write_options(q: &QueryParams, options_kind: &str, headers: &HeaderMap) -> ApiResult<WriteOptions> {
    let dry_run = dry_run(&q.dry_run, options_kind)?;
    let field_validation = FieldValidation::parse(q.field_validation.as_deref())?;
    let mut errs = Vec::new();
    if q.field_manager.len() > FIELD_MANAGER_MAX_LENGTH {
        errs.push(FieldError::too_long("fieldManager", FIELD_MANAGER_MAX_LENGTH));
    }
    for (i, c) in q.field_manager.char_indices() {
        if !is_print(c) {
            let detail = format!("invalid character {} (at position {i})", go_unicode(c));
            errs.push(FieldError::invalid("fieldManager", &q.field_manager, &detail));
        }
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(options_kind, "meta.k8s.io", "", errs));
    }
    let manager = match q.field_manager.as_str() {
        // Empty when there is no User-Agent either: the field manager names that writer `unknown`.
        "" => manager_from_user_agent(
            &headers.get("user-agent").map(|v| String::from_utf8_lossy(v.as_bytes())).unwrap_or_default(),
        ),
        m => m.to_string(),
    };
    Ok(WriteOptions { dry_run, field_validation, manager })
}

const FIELD_MANAGER_MAX_LENGTH: usize = 128;
pub(super) const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// Go's `unicode.IsPrint`, near enough: no control, format or separator characters but the ASCII space.
fn is_print(c: char) -> bool {
    let format = matches!(c, '\u{AD}' | '\u{600}'..='\u{605}' | '\u{61C}' | '\u{6DD}' | '\u{70F}' | '\u{180E}'
        | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}');
    c == ' ' || !(c.is_control() || c.is_whitespace() || format)
}

/// Go's `%#U`: `U+0007`.
fn go_unicode(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// kube-apiserver's default manager: the User-Agent before its first `/`, printable characters only, at most 128
/// bytes (`kubectl-edit/v1.32 (linux/amd64) ...` -> `kubectl-edit`).
fn manager_from_user_agent(ua: &str) -> String {
    let mut out = String::new();
    for c in ua.split('/').next().unwrap_or("").chars().filter(|c| is_print(*c)) {
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX_LENGTH {
            break;
        }
        out.push(c);
    }
    out
}

/// ValidatePatchOptions: apply needs a fieldManager; only apply takes `force`.
pub(super) fn patch_options_valid(q: &QueryParams, apply: bool) -> ApiResult<()> {
    let err = match (apply, q.field_manager.is_empty(), q.force.is_some()) {
        (true, true, _) => FieldError::required_msg("fieldManager", "is required for apply patch"),
        (false, _, true) => FieldError::forbidden("force", "may not be specified for non-apply patch"),
        _ => return Ok(()),
    };
    Err(ApiError::invalid("PatchOptions", "meta.k8s.io", "", vec![err]))
}

/// An apply configuration: YAML (JSON is YAML) of one object, as kube-apiserver reads it. JSON, what kubectl, Helm
/// and Flux send, is read as JSON; YAML by a parser that bounds how far aliases may expand (an alias replays its
/// anchor: a few kilobytes can otherwise stand for billions of values).
pub(super) fn apply_config(raw: &[u8]) -> ApiResult<Value> {
    let v: Value = match serde_json::from_slice(raw) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_slice(raw).map_err(|e| {
            ApiError::bad_request(format!("error encoding patch: error converting YAML to JSON: yaml: {e}"))
        })?,
    };
    match v {
        Value::Object(_) => Ok(v),
        Value::Null => Ok(Value::Object(Default::default())),
        other => {
            let kind = match other {
                Value::Array(_) => "array",
                Value::String(_) => "string",
                Value::Number(_) => "number",
                _ => "bool",
            };
            Err(ApiError::bad_request(format!(
                "error decoding patch: json: cannot unmarshal {kind} into Go value of type map[string]interface {{}}"
            )))
        }
    }
}
