//! The REST surface under /apis: parse the request (path, query, media types, body), call the registry, render
//! the result. Thin by design: every decision about objects is the registry's or the kind's.

use super::negotiate::{error_output, negotiate_for, Forms, Output, YAML};
use super::protobuf::{self, ProtoKind, PROTOBUF};
use super::query::QueryParams;
use super::render::{object_response, raw_table_list, render_list, render_one, render_raw_list};
use super::watch::watch;
use super::write_options::{apply_config, dry_run, patch_options_valid, write_options, APPLY_PATCH};
use super::AppState;
use crate::auth::authn::UserInfo;
use crate::auth::authz::{Decision, RequestAttributes};
use crate::error::{ApiError, ApiResult, StatusReason};
use crate::registry::{decode::parse_json, DeleteOptions, PatchType, Subresource};
use crate::request_info::RequestInfo;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;

/// kube-apiserver's limit on request bodies.
pub const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;

/// What a request was about, for metrics (set as a response extension).
#[derive(Clone, Debug, Default)]
pub struct RequestLabels {
    pub verb: &'static str,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: &'static str,
}

/// A parsed `/apis/<g>/<v>/[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`.
struct Target {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
}

/// A namespace or name from the path must be a valid path segment (kube-apiserver's IsValidPathSegmentName), so
/// that it names one storage key: `.` and `..` would name another place, `/` and `%` another segment.
fn check_path_segment(what: &str, segment: Option<&str>) -> ApiResult<()> {
    let Some(segment) = segment else { return Ok(()) };
    let mut problems: Vec<String> =
        [".", ".."].iter().filter(|bad| segment == **bad).map(|bad| format!("may not be '{bad}'")).collect();
    problems
        .extend(["/", "%"].iter().filter(|bad| segment.contains(**bad)).map(|bad| format!("may not contain '{bad}'")));
    match problems.is_empty() {
        true => Ok(()),
        false => Err(ApiError::bad_request(format!("{what} parameter invalid: {segment:?}: {}", problems.join(";")))),
    }
}

/// The resource a request names, from its [`RequestInfo`]; `None` when the path is not a served resource path
/// (discovery, or a form the REST handlers do not serve).
fn target(info: &RequestInfo) -> Option<Target> {
    if !info.is_served_form() {
        return None;
    }
    // /<prefix>/[<group>/]<version>/namespaces/<ns>/<parts>: the parts start two segments after the version.
    let before_parts = if info.api_group.is_empty() { 2 } else { 3 };
    let segments = info.path.trim_matches('/').split('/').count();
    let namespaced = segments == before_parts + 2 + info.parts.len();
    let part = |i: usize| info.parts.get(i).cloned();
    Some(Target {
        group: info.api_group.clone(),
        version: info.api_version.clone(),
        namespace: namespaced.then(|| info.namespace.clone()),
        resource: info.resource.clone(),
        name: part(1),
        subresource: part(2),
    })
}

#[cfg(test)]
fn parse_target(path: &str) -> Option<Target> {
    target(&RequestInfo::parse(&Method::GET, path, None))
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// How much of an oversized body is read and discarded so the client, still sending, gets to see the 413.
const MAX_DRAIN: usize = 32 * 1024 * 1024;
/// How long at most that goes on.
const MAX_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads and discards the rest of a body, up to [`MAX_DRAIN`] and [`MAX_DRAIN_TIME`], never buffered, in the
/// background: the 413 is answered at once, while the client may still be sending, and the connection closes (with
/// the unread rest) only after the client had the time to read it. Closing at once would reset the connection
/// under a client still sending, which would then never see the answer.
fn drain(mut body: Body, mut seen: usize) {
    tokio::spawn(tokio::time::timeout(MAX_DRAIN_TIME, async move {
        while seen < MAX_DRAIN {
            match body.frame().await {
                Some(Ok(f)) => seen += f.data_ref().map(|d| d.len()).unwrap_or(0),
                _ => return,
            }
        }
    }));
}

/// Reads the body, refusing more than [`MAX_REQUEST_BODY`] with 413 without buffering more than that.
pub(crate) async fn read_body(body: Body, headers: &HeaderMap) -> ApiResult<Bytes> {
    let too_large = || ApiError::too_large(format!("Request entity too large: limit is {MAX_REQUEST_BODY}"));
    let declared = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_REQUEST_BODY) {
        drain(body, 0);
        return Err(too_large());
    }
    let mut body = body;
    // A body that comes in one piece (most do) is kept as it is, without a copy.
    let mut first: Option<Bytes> = None;
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("error reading request body: {e}")))?;
        let Ok(d) = frame.into_data() else { continue };
        let len = first.as_ref().map_or(0, Bytes::len) + buf.len() + d.len();
        if len > MAX_REQUEST_BODY {
            drain(body, len);
            return Err(too_large());
        }
        match first.take() {
            None if buf.is_empty() => first = Some(d),
            earlier => {
                buf.extend_from_slice(&earlier.unwrap_or_default());
                buf.extend_from_slice(&d);
            }
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

pub async fn handle(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut labels = RequestLabels::default();
    let user = parts.extensions.get::<UserInfo>();
    let parsed;
    let info = match parts.extensions.get::<RequestInfo>() {
        Some(info) => info,
        None => {
            parsed = RequestInfo::parse(&parts.method, parts.uri.path(), parts.uri.query());
            &parsed
        }
    };
    let request = Incoming { method: &parts.method, path: parts.uri.path(), query: parts.uri.query(), user, info };
    let result = dispatch(&st, &request, &parts.headers, body, &mut labels).await;
    let mut resp = result.unwrap_or_else(|e| error_response(&st, info, &parts.headers, e));
    resp.extensions_mut().insert(labels);
    resp
}

/// The forms besides JSON that `info`'s kind is served in: kube-apiserver's built-in kinds (the core Namespace, the
/// one with a protobuf form) also in YAML and protobuf; ours, as custom resources here, in JSON only.
fn forms_of(info: &crate::registry::strategy::KindInfo) -> Forms {
    if ProtoKind::of(info).is_some() {
        Forms::BUILT_IN
    } else {
        Forms::default()
    }
}

/// An error as a Status: for a kind served in YAML and protobuf, in the form the client prefers (kube-apiserver's
/// `ErrorNegotiated`), else in JSON.
fn error_response(st: &AppState, info: &RequestInfo, headers: &HeaderMap, e: ApiError) -> Response {
    let forms = st
        .registry
        .resource(&info.api_group, &info.api_version, &info.resource)
        .map_or_else(Forms::default, |res| forms_of(res.strategy.info()));
    let accept = headers.get("accept").and_then(|v| v.to_str().ok());
    let (body, content_type) = match error_output(accept, forms) {
        Output::Protobuf => (protobuf::encode_status(&e.status()), PROTOBUF),
        Output::Yaml => match serde_saphyr::to_string(&e.status()) {
            Ok(text) => (text.into_bytes(), YAML),
            Err(_) => return e.into_response(),
        },
        _ => return e.into_response(),
    };
    let mut resp = e.into_response();
    *resp.body_mut() = Body::from(body);
    resp.headers_mut().insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static(content_type));
    resp
}

/// What the REST handlers read of a request besides its headers and body.
struct Incoming<'a> {
    method: &'a Method,
    path: &'a str,
    query: Option<&'a str>,
    /// Who sent it (set by authentication; absent only for public paths, which never reach here).
    user: Option<&'a UserInfo>,
    /// What it is about, as parsed once for the whole request.
    info: &'a RequestInfo,
}

async fn dispatch(
    st: &Arc<AppState>,
    request: &Incoming<'_>,
    headers: &HeaderMap,
    body: Body,
    labels: &mut RequestLabels,
) -> ApiResult<Response> {
    let (method, path, query) = (request.method, request.path, request.query);
    let Some(t) = target(request.info) else {
        return super::discovery_response(st, method, path, headers);
    };
    let res = st.registry.resource(&t.group, &t.version, &t.resource).ok_or_else(ApiError::path_not_found)?.clone();
    check_path_segment("Namespace", t.namespace.as_deref())?;
    check_path_segment("Name", t.name.as_deref())?;
    let info = res.strategy.info();
    // A namespaced kind is reachable by name only inside a namespace; a cluster-scoped one never inside one.
    if (info.namespaced && t.name.is_some() && t.namespace.is_none()) || (!info.namespaced && t.namespace.is_some()) {
        return Err(ApiError::path_not_found());
    }
    let subresource = match t.subresource.as_deref().map(Subresource::parse) {
        None => Subresource::Main,
        Some(Some(sub @ Subresource::Status)) if res.strategy.serves(sub) => sub,
        Some(_) => return Err(ApiError::path_not_found()),
    };
    let q = QueryParams::parse(query)?;
    let ns = t.namespace.as_deref();
    // Standalone, the namespaces are this server's: a create brings its namespace into being.
    super::namespaces::before(st, &res, method, headers, ns, !q.dry_run.is_empty()).await?;
    let accept = headers.get("accept").and_then(|v| v.to_str().ok());
    labels.group = t.group.clone();
    labels.version = t.version.clone();
    labels.resource = t.resource.clone();
    labels.subresource = t.subresource.clone().unwrap_or_default();
    labels.scope = if t.name.is_some() {
        "resource"
    } else if ns.is_some() {
        "namespace"
    } else {
        "cluster"
    };
    let v = t.version.as_str();
    // Built-in kinds (the core Namespace) answer in YAML and protobuf too when asked; ours only in JSON.
    let forms = forms_of(info);
    let negotiate = |tables: bool| negotiate_for(accept, tables, forms);
    let method_not_allowed = |verb: &str| ApiError::method_not_allowed(verb, info.group, info.plural);
    if info.create_only && !(method == Method::POST && t.name.is_none()) {
        // A virtual resource: nothing to read, change or delete.
        return Err(method_not_allowed(&kube_verb(method, t.name.is_some(), q.watch)));
    }
    match (method.clone(), t.name.as_deref()) {
        (Method::GET, Some(name)) => {
            labels.verb = if q.watch { "WATCH" } else { "GET" };
            if q.watch {
                // A watch on one object: the collection watch pinned by name.
                let pinned = QueryParams { field_selector: format!("metadata.name={name}"), ..q };
                return watch(st, &res, ns, v, &pinned, accept).await;
            }
            let out = negotiate(true)?;
            let obj = res.get(ns, name, v).await?;
            render_one(&res, obj, out, &q)
        }
        (Method::GET, None) => {
            if q.watch {
                labels.verb = "WATCH";
                return watch(st, &res, ns, v, &q, accept).await;
            }
            labels.verb = "LIST";
            let out = negotiate(true)?;
            let params = q.list_params(res.strategy.field_labels())?;
            if out == Output::Json {
                if let Some(list) = res.list_raw(ns, v, &params).await? {
                    return Ok(render_raw_list(&res, v, list));
                }
            }
            if let Output::Table(mv) = out {
                if params.label_selector.is_empty() && params.field_selector.is_empty() && res.serves_stored_form() {
                    return raw_table_list(&res, ns, v, &params, mv, &q).await;
                }
            }
            let list = res.list(ns, v, &params).await?;
            render_list(&res, v, list, out, &q)
        }
        (Method::POST, None) => {
            labels.verb = "POST";
            let out = negotiate(false)?;
            let (obj, dups) = object_body(body, headers, &res, v).await?;
            let opts = write_options(&q, "CreateOptions", headers)?;
            let w = res.create(ns, v, obj, &dups, &opts).await?;
            object_response(&res, StatusCode::CREATED, &w.object, out, &w.warnings)
        }
        (Method::PUT, Some(name)) => {
            labels.verb = "PUT";
            let out = negotiate(false)?;
            let (obj, dups) = object_body(body, headers, &res, v).await?;
            let w =
                res.update(ns, name, v, obj, dups, subresource, &write_options(&q, "UpdateOptions", headers)?).await?;
            let code = if w.created { StatusCode::CREATED } else { StatusCode::OK };
            object_response(&res, code, &w.object, out, &w.warnings)
        }
        (Method::PATCH, Some(name)) => {
            labels.verb = "PATCH";
            let out = negotiate(false)?;
            let ct = content_type(headers);
            let pt = match ct.as_str() {
                "application/json-patch+json" => Some(PatchType::Json),
                "application/merge-patch+json" => Some(PatchType::Merge),
                APPLY_PATCH => None,
                _ => {
                    return Err(ApiError::new(
                        StatusReason::UnsupportedMediaType,
                        format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, {APPLY_PATCH} (got {ct:?})"),
                    ))
                }
            };
            let mut opts = write_options(&q, "PatchOptions", headers)?;
            patch_options_valid(&q, pt.is_none())?;
            let raw = read_body(body, headers).await?;
            let w = match pt {
                Some(pt) => {
                    let (patch, _) = parse_json(&raw)?;
                    res.patch(ns, name, v, pt, patch, subresource, &opts).await?
                }
                None => {
                    opts.manager = q.field_manager.clone();
                    res.apply(ns, name, v, apply_config(&raw)?, q.force == Some(true), subresource, &opts).await?
                }
            };
            let code = if w.created { StatusCode::CREATED } else { StatusCode::OK };
            object_response(&res, code, &w.object, out, &w.warnings)
        }
        (Method::DELETE, Some(name)) => {
            labels.verb = "DELETE";
            if subresource == Subresource::Status {
                return Err(method_not_allowed("delete"));
            }
            // Answers of kinds without a protobuf form stay JSON whatever is asked, as they always were.
            let out = if forms == Forms::default() { Output::Json } else { negotiate(false)? };
            let opts = delete_options(body, headers, &q).await?;
            if opts.ignore_store_read_error {
                authorize_unsafe_delete(st, request).await?;
            }
            let obj = res.delete(ns, name, v, &opts).await?;
            super::namespaces::deleted(st, &res, std::slice::from_ref(&obj), &opts);
            object_response(&res, StatusCode::OK, &obj, out, &[])
        }
        (Method::DELETE, None) => {
            labels.verb = "DELETECOLLECTION";
            let out = if forms == Forms::default() { Output::Json } else { negotiate(false)? };
            let opts = delete_options(body, headers, &q).await?;
            let list = res.delete_collection(ns, v, &q.list_params(res.strategy.field_labels())?, &opts).await?;
            super::namespaces::deleted(st, &res, &list.items, &opts);
            render_list(&res, v, list, out, &q)
        }
        (m, _) => {
            labels.verb = "UNKNOWN";
            Err(method_not_allowed(&m.to_string().to_lowercase()))
        }
    }
}

/// The verb a user must also be allowed for a delete with `ignoreStoreReadErrorWithClusterBreakingPotential`, as
/// kube-apiserver asks it: the same resource, name and namespace.
const UNSAFE_DELETE_VERB: &str = "unsafe-delete-ignore-read-errors";

async fn authorize_unsafe_delete(st: &AppState, request: &Incoming<'_>) -> ApiResult<()> {
    let Some(user) = request.user else { return Err(ApiError::unauthorized()) };
    let mut attrs = RequestAttributes::from_info(request.info);
    attrs.verb = UNSAFE_DELETE_VERB.into();
    let why = match st.authz.authorize(user, &attrs).await {
        Ok(Decision::Allow) => return Ok(()),
        Ok(Decision::Deny { reason }) => format!("not permitted to do {UNSAFE_DELETE_VERB:?}, reason: {reason}"),
        Err(e) => format!("error while checking permission for {UNSAFE_DELETE_VERB:?}, {e}"),
    };
    // As kube-apiserver's admission answers it: `<resource>.<group> "<name>" is forbidden: <why>`.
    let info = request.info;
    let resource = crate::error::qualified(&info.resource, &info.api_group);
    let mut e = ApiError::forbidden(format!("{resource} {:?} is forbidden: {why}", info.name));
    e.details = Some(Box::new(crate::error::Details {
        name: info.name.clone(),
        group: info.api_group.clone(),
        kind: info.resource.clone(),
        ..Default::default()
    }));
    Err(e)
}

/// The Kubernetes verb of a request, as authorization and error messages name it.
fn kube_verb(method: &Method, named: bool, watch: bool) -> String {
    match (method.as_str(), named) {
        ("GET", _) if watch => "watch".into(),
        ("GET", true) => "get".into(),
        ("GET", false) => "list".into(),
        ("POST", _) => "create".into(),
        ("PUT", _) => "update".into(),
        ("PATCH", _) => "patch".into(),
        ("DELETE", true) => "delete".into(),
        ("DELETE", false) => "deletecollection".into(),
        (m, _) => m.to_lowercase(),
    }
}

/// The object of a create or update of `res`'s kind in `version`: JSON, or YAML or protobuf for a built-in kind (as
/// the JSON it would have been, without duplicate fields: neither reports them).
async fn object_body(
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

async fn delete_options(body: Body, headers: &HeaderMap, q: &QueryParams) -> ApiResult<DeleteOptions> {
    let raw = read_body(body, headers).await?;
    let mut opts = DeleteOptions { dry_run: dry_run(&q.dry_run, "DeleteOptions")?, ..Default::default() };
    opts.propagation_policy = q.propagation_policy.clone();
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
            opts.propagation_policy = Some(p.to_string());
        }
        if let Some(unsafe_delete) = v.get(IGNORE_READ_ERROR).and_then(Value::as_bool) {
            opts.ignore_store_read_error = unsafe_delete;
        }
        opts.uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_string);
        opts.resource_version = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_string);
    }
    if let Some(p) = opts.propagation_policy.as_deref() {
        if !matches!(p, "Orphan" | "Background" | "Foreground") {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                vec![crate::error::FieldError::not_supported(
                    "propagationPolicy",
                    p,
                    &["Background", "Foreground", "Orphan"],
                )],
            ));
        }
    }
    Ok(opts)
}

/// The DeleteOptions field (and query parameter) of the unsafe delete of an unreadable object.
const IGNORE_READ_ERROR: &str = "ignoreStoreReadErrorWithClusterBreakingPotential";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let t = parse_target("/apis/g/v1/namespaces/ns/things/a/status").unwrap();
        assert_eq!(
            (t.namespace.as_deref(), t.resource.as_str(), t.name.as_deref(), t.subresource.as_deref()),
            (Some("ns"), "things", Some("a"), Some("status"))
        );
        let t = parse_target("/apis/g/v1/things").unwrap();
        assert_eq!((t.namespace, t.name), (None, None));
        // A cluster-scoped resource literally named "namespaces" would be /apis/g/v/namespaces/<name>.
        let t = parse_target("/apis/g/v1/namespaces/x").unwrap();
        assert_eq!((t.resource.as_str(), t.name.as_deref()), ("namespaces", Some("x")));
        assert!(parse_target("/apis/g/v1").is_none());
        assert!(parse_target("/apis/g/v1/a/b/c/d").is_none());
        assert!(parse_target("/apis/g//x").is_none());
    }
}
