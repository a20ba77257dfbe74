//! Serving the OpenAPI documents as kube-apiserver does (kube-openapi's handler and handler3 over Go's
//! `http.ServeContent`): an ETag (quoted upper-case hex SHA-512 of the JSON), Last-Modified, 304 on If-None-Match or
//! If-Modified-Since, `Vary: Accept`; /openapi/v2 also as protobuf and gzip-compressed when asked; /openapi/v3 hash
//! URLs immutable for a year. Clients cache on these: kubectl keeps the documents in its HTTP cache and asks again
//! only with If-None-Match, or not at all for a hash URL.

use super::proto;
use crate::server::negotiate::{parse_accept, MediaType};
use crate::server::AppState;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use std::io::Write;
use std::sync::Arc;

/// What /openapi/v2 answers for protobuf requests: the current spelling, whatever spelling the client asked with.
pub const V2_PROTOBUF_CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// Below this size a gzip-compressed answer is not worth it (the default of the gzip handler kube-openapi uses).
const GZIP_MIN_SIZE: usize = 1400;

/// One prepared document.
pub struct StaticDoc {
    pub body: bytes::Bytes,
    /// The body gzip-compressed, for the documents served compressed when asked.
    gzip: Option<bytes::Bytes>,
    /// Quoted, as sent in the ETag header.
    pub etag: String,
    last_modified: DateTime<Utc>,
}

impl StaticDoc {
    /// `hash` is the unquoted ETag: the JSON form's, shared by the protobuf form (the `Vary: Accept` tells them
    /// apart), as kube-openapi does.
    pub fn new(body: Vec<u8>, hash: &str, built: DateTime<Utc>, compress: bool) -> StaticDoc {
        let gzip = (compress && body.len() >= GZIP_MIN_SIZE).then(|| gzip(&body).into());
        StaticDoc { body: body.into(), gzip, etag: format!("\"{hash}\""), last_modified: built }
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

/// HTTP dates as Go's `http.TimeFormat`.
fn http_date(t: DateTime<Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Go's `checkPreconditions` for a GET: If-None-Match (weak comparison, `*`), else If-Modified-Since at second
/// precision.
fn not_modified(doc: &StaticDoc, headers: &HeaderMap) -> bool {
    if let Some(inm) = header_str(headers, header::IF_NONE_MATCH) {
        return inm.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == doc.etag);
    }
    header_str(headers, header::IF_MODIFIED_SINCE)
        .and_then(|s| DateTime::parse_from_rfc2822(&s.replace(" GMT", " +0000")).ok())
        .is_some_and(|since| doc.last_modified.timestamp() <= since.timestamp())
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    header_str(headers, header::ACCEPT_ENCODING).is_some_and(|v| {
        v.split(',').any(|e| {
            let mut parts = e.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let q = parts.find_map(|p| p.strip_prefix("q=")).and_then(|q| q.parse::<f32>().ok()).unwrap_or(1.0);
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && q > 0.0
        })
    })
}

/// `http.ServeContent` for a whole document: 200 with the body (gzip-compressed when the document has that form
/// and the client accepts it), or 304.
fn serve(doc: &StaticDoc, content_type: &str, headers: &HeaderMap, mut extra: HeaderMap) -> Response {
    extra.insert(header::ETAG, value(&doc.etag));
    if not_modified(doc, headers) {
        // As Go's writeNotModified: no Content-Type, and no Last-Modified when there is an ETag.
        return (StatusCode::NOT_MODIFIED, extra).into_response();
    }
    extra.insert(header::CONTENT_TYPE, value(content_type));
    extra.insert(header::LAST_MODIFIED, value(&http_date(doc.last_modified)));
    extra.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    match &doc.gzip {
        Some(gz) if accepts_gzip(headers) => {
            extra.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            (extra, gz.clone()).into_response()
        }
        _ => (extra, doc.body.clone()).into_response(),
    }
}

fn value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn vary(values: &[&'static str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(header::VARY, HeaderValue::from_static(v));
    }
    h
}

/// The Accept clauses in goautoneg's order: by quality, then the more specific first; an empty header is `*/*`.
fn accept_clauses(headers: &HeaderMap) -> Vec<MediaType<'_>> {
    let accept = header_str(headers, header::ACCEPT).filter(|a| !a.trim().is_empty()).unwrap_or("*/*");
    let q = |m: &MediaType| m.param("q").and_then(|q| q.parse::<f32>().ok()).unwrap_or(1.0);
    let wildcards = |m: &MediaType| m.essence.split('/').filter(|p| *p == "*").count();
    let mut clauses: Vec<MediaType> = parse_accept(accept).into_iter().filter(|m| q(m) > 0.0).collect();
    clauses.sort_by(|a, b| q(b).total_cmp(&q(a)).then(wildcards(a).cmp(&wildcards(b))));
    clauses
}

/// Whether an Accept clause admits `application/<subtype>`.
fn admits(clause: &MediaType, subtype: &str) -> bool {
    let (t, s) = clause.essence.split_once('/').unwrap_or((clause.essence, ""));
    (t == "*" || t.eq_ignore_ascii_case("application")) && (s == "*" || s.eq_ignore_ascii_case(subtype))
}

/// GET /openapi/v2: JSON or protobuf as the Accept header's first admissible clause says; 406 (no body) otherwise.
pub async fn openapi_v2(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let o = &st.openapi;
    let extra = || vary(&["Accept", "Accept-Encoding"]);
    for clause in accept_clauses(&headers) {
        if admits(&clause, "json") {
            return serve(&o.v2, "application/json", &headers, extra());
        }
        if proto::MEDIA_TYPES.iter().any(|m| admits(&clause, m.trim_start_matches("application/"))) {
            return serve(&o.v2_protobuf, V2_PROTOBUF_CONTENT_TYPE, &headers, extra());
        }
    }
    (StatusCode::NOT_ACCEPTABLE, extra()).into_response()
}

/// GET /openapi/v3: the group versions with their hash URLs.
pub async fn openapi_v3_root(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    serve(&st.openapi.v3_root, "application/json", &headers, HeaderMap::new())
}

/// GET /openapi/v3/<gv>[?hash=H]: a stale hash is redirected to the current one; the current hash is immutable.
pub async fn openapi_v3(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(gv): axum::extract::Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    headers: HeaderMap,
) -> Response {
    let Some((doc, hash)) = st.openapi.v3.get(&gv) else {
        return crate::error::ApiError::path_not_found().into_response();
    };
    let mut extra = vary(&["Accept"]);
    if !accept_clauses(&headers).iter().any(|c| admits(c, "json")) {
        return (StatusCode::NOT_ACCEPTABLE, extra).into_response();
    }
    let asked = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "hash")
        .map(|(_, v)| v.into_owned())
        .filter(|h| !h.is_empty());
    if let Some(h) = asked {
        if &h != hash {
            let location = format!("/openapi/v3/{gv}?hash={hash}");
            extra.insert(header::ETAG, value(&doc.etag));
            extra.insert(header::LOCATION, value(&location));
            extra.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
            let body = format!("<a href=\"{location}\">Moved Permanently</a>.\n\n");
            return (StatusCode::MOVED_PERMANENTLY, extra, body).into_response();
        }
        extra.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
        // A year from the request, in Go's time.RFC1123 of a UTC time.
        let expires = (Utc::now() + chrono::Months::new(12)).format("%a, %d %b %Y %H:%M:%S UTC").to_string();
        extra.insert(header::EXPIRES, value(&expires));
    }
    serve(doc, "application/json", &headers, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn doc() -> StaticDoc {
        let built = DateTime::parse_from_rfc3339("2026-11-25T10:00:00Z").unwrap().with_timezone(&Utc);
        StaticDoc::new(vec![b'x'; 2000], "AB12", built, true)
    }

    #[test]
    fn conditional_requests() {
        let d = doc();
        assert!(not_modified(&d, &headers(&[("if-none-match", "\"AB12\"")])));
        assert!(not_modified(&d, &headers(&[("if-none-match", "\"x\", W/\"AB12\"")])));
        assert!(not_modified(&d, &headers(&[("if-none-match", "*")])));
        assert!(!not_modified(&d, &headers(&[("if-none-match", "\"AB13\"")])));
        // If-None-Match decides alone when present.
        let later = "Wed, 25 Nov 2026 11:00:00 GMT";
        assert!(!not_modified(&d, &headers(&[("if-none-match", "\"old\""), ("if-modified-since", later)])));
        assert!(not_modified(&d, &headers(&[("if-modified-since", later)])));
        assert!(not_modified(&d, &headers(&[("if-modified-since", "Wed, 25 Nov 2026 10:00:00 GMT")])));
        assert!(!not_modified(&d, &headers(&[("if-modified-since", "Wed, 25 Nov 2026 09:59:59 GMT")])));
        assert!(!not_modified(&d, &headers(&[("if-modified-since", "yesterday")])));
    }

    #[test]
    fn gzip_when_accepted() {
        assert!(accepts_gzip(&headers(&[("accept-encoding", "gzip")])));
        assert!(accepts_gzip(&headers(&[("accept-encoding", "deflate, gzip;q=0.5")])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "gzip;q=0")])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "br")])));
        assert!(!accepts_gzip(&HeaderMap::new()));
        let d = doc();
        let r = serve(&d, "application/json", &headers(&[("accept-encoding", "gzip")]), HeaderMap::new());
        assert_eq!(r.headers()["content-encoding"], "gzip");
        assert!(StaticDoc::new(vec![b'x'; 10], "A", Utc::now(), true).gzip.is_none(), "too small to compress");
    }

    #[test]
    fn accept_order_as_goautoneg() {
        let h = headers(&[("accept", "*/*;q=0.5, application/json;q=0.5, text/plain")]);
        let order: Vec<&str> = accept_clauses(&h).iter().map(|m| m.essence).collect();
        assert_eq!(order, ["text/plain", "application/json", "*/*"]);
        assert_eq!(accept_clauses(&HeaderMap::new())[0].essence, "*/*");
    }
}
