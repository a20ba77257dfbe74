//! The REST surface under /apis: parse the request (path, query, media types, body), call the registry, render
//! the result. Thin by design: every decision about objects is the registry's or the kind's.

use super::negotiate::{error_output, negotiate_for, Forms, Output, YAML};
use super::protobuf::{self, ProtoKind, PROTOBUF};
use super::query::QueryParams;
use super::render::{
    object_response, parsed_list, protobuf_list, raw_table_list, render_list, render_one, render_raw_list,
};
use super::watch::watch;
use super::write_options::{apply_config, patch_options_valid, write_options, APPLY_PATCH};
use super::AppState;
use crate::auth::authn::UserInfo;
use crate::auth::authz::{Decision, RequestAttributes};
use crate::error::{ApiError, ApiResult, StatusReason};
use crate::registry::{decode::parse_json, PatchType, Resource, Subresource, WriteOptions};
use crate::request_info::RequestInfo;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use body::{delete_options, object_body};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::sync::Arc;

mod body;

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
    labels.describe(&t);
    let accept = headers.get("accept").and_then(|v| v.to_str().ok());
    // Built-in kinds (the core Namespace) answer in YAML and protobuf too when asked; ours only in JSON.
    let call = Call { st, res, ns, v: &t.version, q, headers, accept, forms: forms_of(info), subresource };
    if info.create_only && !(method == Method::POST && t.name.is_none()) {
        // A virtual resource: nothing to read, change or delete.
        return Err(call.method_not_allowed(&kube_verb(method, t.name.is_some(), call.q.watch)));
    }
    match (method.clone(), t.name.as_deref()) {
        (Method::GET, Some(name)) => {
            labels.verb = if call.q.watch { "WATCH" } else { "GET" };
            call.get(name).await
        }
        (Method::GET, None) if call.q.watch => {
            labels.verb = "WATCH";
            watch(st, &call.res, ns, call.v, &call.q, accept).await
        }
        (Method::GET, None) => {
            labels.verb = "LIST";
            call.list().await
        }
        (Method::POST, None) => {
            labels.verb = "POST";
            call.create(request.user, body).await
        }
        (Method::PUT, Some(name)) => {
            labels.verb = "PUT";
            call.update(name, body).await
        }
        (Method::PATCH, Some(name)) => {
            labels.verb = "PATCH";
            call.patch(name, body).await
        }
        (Method::DELETE, Some(name)) => {
            labels.verb = "DELETE";
            call.delete(request, name, body).await
        }
        (Method::DELETE, None) => {
            labels.verb = "DELETECOLLECTION";
            call.delete_collection(body).await
        }
        (m, _) => {
            labels.verb = "UNKNOWN";
            Err(call.method_not_allowed(&m.to_string().to_lowercase()))
        }
    }
}

impl RequestLabels {
    /// The labels of a request answered before any handler (rejected above an in-flight limit), from what its
    /// path and method say, as upstream's `RecordDroppedRequest` labels it: a non-resource request has only its
    /// method as verb.
    pub fn of_request(info: &RequestInfo) -> Self {
        if !info.is_resource_request {
            return RequestLabels::default();
        }
        let verb = match info.verb.as_str() {
            "get" => "GET",
            "list" => "LIST",
            "watch" => "WATCH",
            "create" => "POST",
            "update" => "PUT",
            "patch" => "PATCH",
            "delete" => "DELETE",
            "deletecollection" => "DELETECOLLECTION",
            _ => "UNKNOWN",
        };
        let scope = if !info.name.is_empty() {
            "resource"
        } else if !info.namespace.is_empty() {
            "namespace"
        } else {
            "cluster"
        };
        RequestLabels {
            verb,
            group: info.api_group.clone(),
            version: info.api_version.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            scope,
        }
    }

    /// The labels a request's target gives; the verb is set where the request is told apart.
    fn describe(&mut self, t: &Target) {
        self.group = t.group.clone();
        self.version = t.version.clone();
        self.resource = t.resource.clone();
        self.subresource = t.subresource.clone().unwrap_or_default();
        self.scope = if t.name.is_some() {
            "resource"
        } else if t.namespace.is_some() {
            "namespace"
        } else {
            "cluster"
        };
    }
}

/// A request on a served resource, its target resolved and its query parsed: what each verb's handler needs.
struct Call<'a> {
    st: &'a Arc<AppState>,
    res: Arc<Resource>,
    ns: Option<&'a str>,
    /// The version of the path.
    v: &'a str,
    q: QueryParams,
    headers: &'a HeaderMap,
    accept: Option<&'a str>,
    /// The forms the kind is served in besides JSON.
    forms: Forms,
    /// The subresource the request is on.
    subresource: Subresource,
}

impl Call<'_> {
    fn negotiate(&self, tables: bool) -> ApiResult<Output> {
        negotiate_for(self.accept, tables, self.forms)
    }

    /// A delete's answer form: kinds without a protobuf form stay JSON whatever is asked, as they always were.
    fn negotiate_delete(&self) -> ApiResult<Output> {
        if self.forms == Forms::default() {
            Ok(Output::Json)
        } else {
            self.negotiate(false)
        }
    }

    fn method_not_allowed(&self, verb: &str) -> ApiError {
        let info = self.res.strategy.info();
        ApiError::method_not_allowed(verb, info.group, info.plural)
    }

    fn write_options(&self, options_kind: &str) -> ApiResult<WriteOptions> {
        write_options(&self.q, options_kind, self.headers)
    }

    async fn get(self, name: &str) -> ApiResult<Response> {
        let (res, ns, v) = (&self.res, self.ns, self.v);
        if self.q.watch {
            // A watch on one object: the collection watch pinned by name.
            let pinned = QueryParams { field_selector: format!("metadata.name={name}"), ..self.q };
            return watch(self.st, res, ns, v, &pinned, self.accept).await;
        }
        let out = self.negotiate(true)?;
        let obj = res.get(ns, name, v).await?;
        render_one(res, obj, out, &self.q)
    }

    async fn list(self) -> ApiResult<Response> {
        let (res, ns, v, q) = (&self.res, self.ns, self.v, &self.q);
        let out = self.negotiate(true)?;
        let params = q.list_params(res.strategy.field_labels())?;
        // Every list answer is written as its objects are read, from their stored bytes where it can be.
        let unselected = params.label_selector.is_empty() && params.field_selector.is_empty();
        match out {
            Output::Json => match res.list_raw(ns, v, &params).await? {
                Some((list, rest)) => Ok(render_raw_list(res, v, list, rest)),
                None => parsed_list(res, ns, v, &params, out, q).await,
            },
            Output::Table(mv) if unselected && res.serves_stored_form() => {
                raw_table_list(res, ns, v, &params, mv, q).await
            }
            Output::Table(_) | Output::Metadata(_) => parsed_list(res, ns, v, &params, out, q).await,
            Output::Protobuf => protobuf_list(res, ns, v, &params).await,
            // YAML only for kinds with a protobuf form (the Namespace), whose lists are small: written whole.
            Output::Yaml => render_list(res, v, res.list(ns, v, &params).await?, out, q),
        }
    }

    async fn create(self, user: Option<&UserInfo>, body: Body) -> ApiResult<Response> {
        let (res, ns, v) = (&self.res, self.ns, self.v);
        let out = self.negotiate(false)?;
        let (obj, dups) = object_body(body, self.headers, res, v).await?;
        let opts = self.write_options("CreateOptions")?;
        let mut w = res.create(ns, v, obj, &dups, &opts).await?;
        // A self review's answer is about the user, which only this layer knows.
        super::self_review::answer(self.st, user, res.strategy.info(), &mut w.object).await?;
        object_response(res, StatusCode::CREATED, &w.object, out, &w.warnings)
    }

    async fn update(self, name: &str, body: Body) -> ApiResult<Response> {
        let (res, ns, v, subresource) = (&self.res, self.ns, self.v, self.subresource);
        let out = self.negotiate(false)?;
        let (obj, dups) = object_body(body, self.headers, res, v).await?;
        let w = res.update(ns, name, v, obj, dups, subresource, &self.write_options("UpdateOptions")?).await?;
        let code = if w.created { StatusCode::CREATED } else { StatusCode::OK };
        object_response(res, code, &w.object, out, &w.warnings)
    }

    async fn patch(self, name: &str, body: Body) -> ApiResult<Response> {
        let (res, ns, v, subresource, q) = (&self.res, self.ns, self.v, self.subresource, &self.q);
        let out = self.negotiate(false)?;
        let pt = patch_type(self.headers)?;
        let mut opts = self.write_options("PatchOptions")?;
        patch_options_valid(q, pt.is_none())?;
        let raw = read_body(body, self.headers).await?;
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
        object_response(res, code, &w.object, out, &w.warnings)
    }

    async fn delete(self, request: &Incoming<'_>, name: &str, body: Body) -> ApiResult<Response> {
        let (res, ns, v) = (&self.res, self.ns, self.v);
        if self.subresource == Subresource::Status {
            return Err(self.method_not_allowed("delete"));
        }
        let out = self.negotiate_delete()?;
        let opts = delete_options(body, self.headers, &self.q).await?;
        if opts.ignore_store_read_error {
            authorize_unsafe_delete(self.st, request).await?;
        }
        let obj = res.delete(ns, name, v, &opts).await?;
        super::namespaces::deleted(self.st, res, std::slice::from_ref(&obj), &opts);
        object_response(res, StatusCode::OK, &obj, out, &[])
    }

    async fn delete_collection(self, body: Body) -> ApiResult<Response> {
        let (res, ns, v, q) = (&self.res, self.ns, self.v, &self.q);
        let out = self.negotiate_delete()?;
        let opts = delete_options(body, self.headers, q).await?;
        let list = res.delete_collection(ns, v, &q.list_params(res.strategy.field_labels())?, &opts).await?;
        super::namespaces::deleted(self.st, res, &list.items, &opts);
        render_list(res, v, list, out, q)
    }
}

/// A PATCH's type from its content type: JSON patch, merge patch, or (`None`) server-side apply.
fn patch_type(headers: &HeaderMap) -> ApiResult<Option<PatchType>> {
    let ct = content_type(headers);
    match ct.as_str() {
        "application/json-patch+json" => Ok(Some(PatchType::Json)),
        "application/merge-patch+json" => Ok(Some(PatchType::Merge)),
        APPLY_PATCH => Ok(None),
        _ => Err(ApiError::new(
            StatusReason::UnsupportedMediaType,
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, {APPLY_PATCH} (got {ct:?})"),
        )),
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
