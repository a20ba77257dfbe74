//! Request bodies of the REST surface: the object of a create or update (JSON, or YAML and protobuf for a built-in
//! kind) and DeleteOptions, checked as kube-apiserver's decoders check them.

use super::{content_type, read_body};
use crate::error::{ApiError, ApiResult, StatusReason};
use crate::registry::{decode::parse_json, DeleteOptions};
use crate::server::negotiate::YAML;
use crate::server::protobuf::{self, ProtoKind, PROTOBUF};
use crate::server::query::QueryParams;
use crate::server::write_options::dry_run;
use axum::body::Body;
use axum::http::HeaderMap;
use kube::api::PropagationPolicy;
use serde_json::Value;

/// The object of a create or update of `res`'s kind in `version`: JSON, or YAML or protobuf for a built-in kind (as
/// the JSON it would have been, without duplicate fields: neither reports them).
pub(super) async fn object_body(
    body: Body,
    headers: &HeaderMap,
    res: &crate::registry::Resource,
    version: &str,
) -> ApiResult<(Value, Vec<String>)> {
    let info = res.strategy.info();
    let Some(kind) = ProtoKind::of(info) else { return json_body(body, headers, info.kind).await };
    let ct = content_type(headers);
    match ct.as_str() {
        PROTOBUF => {
            let raw = read_body(body, headers).await?;
            Ok((protobuf::decode_object(kind, info, version, &raw)?, Vec::new()))
        }
        YAML => {
            let raw = read_body(body, headers).await?;
            json_object(&yaml_to_json(&raw, info.kind)?, info.kind).map(|(value, _)| (value, Vec::new()))
        }
        "" | "application/json" | "*/*" => json_body(body, headers, info.kind).await,
        // kube-apiserver's NegotiateInputSerializer: the media types the kind is read in, without the one given.
        _ => Err(ApiError::new(
            StatusReason::UnsupportedMediaType,
            format!("the body of the request was in an unknown format - accepted media types include: application/json, {YAML}, {PROTOBUF}"),
        )),
    }
}

/// A YAML body as JSON text, as kube-apiserver's YAML serializer reads one (sigs.k8s.io/yaml's YAMLToJSON), with
/// alias expansion bounded as for apply configurations.
fn yaml_to_json(raw: &[u8], kind: &str) -> ApiResult<Vec<u8>> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let value: Value = serde_saphyr::from_slice(raw).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): error converting YAML to JSON: yaml: {e} ({})",
            protobuf::summarize(raw)
        ))
    })?;
    serde_json::to_vec(&value).map_err(|e| ApiError::internal(e.to_string()))
}

/// The JSON object of a create or update of `kind`. apiVersion and kind must be strings (or null), as kube-apiserver's
/// decoder reads them before anything else; its 400 quotes the start of the body.
async fn json_body(body: Body, headers: &HeaderMap, kind: &str) -> ApiResult<(Value, Vec<String>)> {
    let ct = content_type(headers);
    if !(ct.is_empty() || ct == "application/json" || ct == "*/*") {
        return Err(ApiError::unsupported_media_type(&ct));
    }
    json_object(&read_body(body, headers).await?, kind)
}

/// A JSON body as the object of a create or update of `kind`.
fn json_object(raw: &[u8], kind: &str) -> ApiResult<(Value, Vec<String>)> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let (value, dups) = parse_json(raw)?;
    for field in ["apiVersion", "kind"] {
        let Some(v) = value.get(field).filter(|v| !(v.is_string() || v.is_null())) else { continue };
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse \
             error: json: cannot unmarshal {} into Go struct field .{field} of type string ({})",
            go_json_type(v),
            summarize(raw)
        )));
    }
    Ok((value, dups))
}

/// How Go's encoding/json names a JSON value's type in its unmarshal errors.
fn go_json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The start of a body as kube-apiserver quotes it in decode errors: 30 bytes of an object's text, " ..." after.
fn summarize(body: &[u8]) -> String {
    const MAX: usize = 30;
    let head = String::from_utf8_lossy(&body[..body.len().min(MAX)]).into_owned();
    if body.len() > MAX {
        format!("{head} ...")
    } else {
        head
    }
}

pub(super) async fn delete_options(body: Body, headers: &HeaderMap, q: &QueryParams) -> ApiResult<DeleteOptions> {
    let raw = read_body(body, headers).await?;
    let mut opts = DeleteOptions { dry_run: dry_run(&q.dry_run, "DeleteOptions")?, ..Default::default() };
    let mut policy = q.propagation_policy.clone();
    opts.ignore_store_read_error = q.ignore_store_read_error_with_cluster_breaking_potential;
    if !raw.iter().all(u8::is_ascii_whitespace) {
        // kube-apiserver reads DeleteOptions in each of its media types, for every resource.
        let v = match content_type(headers).as_str() {
            PROTOBUF => protobuf::decode_delete_options(&raw)?,
            _ => parse_json(&raw)?.0,
        };
        if let Some(d) = v.get("dryRun").and_then(Value::as_array) {
            let values: Vec<String> = d.iter().map(|x| x.as_str().unwrap_or_default().to_string()).collect();
            opts.dry_run |= dry_run(&values, "DeleteOptions")?;
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_string());
        }
        if let Some(unsafe_delete) = v.get(IGNORE_READ_ERROR).and_then(Value::as_bool) {
            opts.ignore_store_read_error = unsafe_delete;
        }
        opts.uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_string);
        opts.resource_version = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_string);
    }
    opts.propagation_policy = policy.as_deref().map(propagation_policy).transpose()?;
    Ok(opts)
}

/// DeleteOptions' propagationPolicy; another value is refused as kube-apiserver refuses it.
fn propagation_policy(policy: &str) -> ApiResult<PropagationPolicy> {
    match policy {
        "Orphan" => Ok(PropagationPolicy::Orphan),
        "Background" => Ok(PropagationPolicy::Background),
        "Foreground" => Ok(PropagationPolicy::Foreground),
        _ => Err(ApiError::invalid(
            "DeleteOptions",
            "meta.k8s.io",
            "",
            vec![crate::error::FieldError::not_supported(
                "propagationPolicy",
                policy,
                &["Background", "Foreground", "Orphan"],
            )],
        )),
    }
}

/// The DeleteOptions field (and query parameter) of the unsafe delete of an unreadable object.
const IGNORE_READ_ERROR: &str = "ignoreStoreReadErrorWithClusterBreakingPotential";
