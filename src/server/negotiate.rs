//! Accept-header negotiation, as kube-apiserver does it: JSON, Table (meta.k8s.io v1/v1beta1) and
//! PartialObjectMetadata(List), and protobuf for the kinds that have it. Anything else alone is 406.

use super::protobuf::PROTOBUF;
use crate::error::ApiError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Json,
    /// `as=Table`, with the meta.k8s.io version asked for.
    Table(&'static str),
    /// `as=PartialObjectMetadata` / `PartialObjectMetadataList`.
    Metadata(&'static str),
    /// The object itself in protobuf (`application/vnd.kubernetes.protobuf`), for kinds that have that form.
    Protobuf,
}

pub struct MediaType<'a> {
    pub essence: &'a str,
    pub params: Vec<(&'a str, &'a str)>,
}

impl<'a> MediaType<'a> {
    pub fn param(&self, k: &str) -> Option<&'a str> {
        self.params.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| *v)
    }
}

/// The entries of an Accept header, in order.
pub fn parse_accept(accept: &str) -> Vec<MediaType<'_>> {
    accept
        .split(',')
        .filter_map(|entry| {
            let mut parts = entry.split(';').map(str::trim);
            let essence = parts.next().filter(|e| !e.is_empty())?;
            let params =
                parts.filter_map(|p| p.split_once('=')).map(|(k, v)| (k.trim(), v.trim().trim_matches('"'))).collect();
            Some(MediaType { essence, params })
        })
        .collect()
}

fn meta_version(m: &MediaType) -> Option<&'static str> {
    if m.param("g") != Some("meta.k8s.io") {
        return None;
    }
    match m.param("v") {
        Some("v1") => Some("v1"),
        Some("v1beta1") => Some("v1beta1"),
        _ => None,
    }
}

/// Chooses the output for a get/list/watch. `tables` is false where Table does not apply (writes).
pub fn negotiate(accept: Option<&str>, tables: bool) -> Result<Output, ApiError> {
    negotiate_for(accept, tables, false)
}

/// The entries of an Accept header in the order kube-apiserver tries them (goautoneg's): by quality, then concrete
/// types before wildcards; otherwise as written.
fn by_preference(accept: &str) -> Vec<MediaType<'_>> {
    let mut entries = parse_accept(accept);
    let quality = |m: &MediaType| m.param("q").and_then(|q| q.parse::<f64>().ok()).unwrap_or(1.0);
    let wildcards = |m: &MediaType| {
        let (kind, sub) = m.essence.split_once('/').unwrap_or((m.essence, ""));
        (kind == "*", sub == "*")
    };
    entries.sort_by(|a, b| quality(b).total_cmp(&quality(a)).then_with(|| wildcards(a).cmp(&wildcards(b))));
    entries
}

/// As [`negotiate`], for a kind that also has a protobuf form when `protobuf` is true. As kube-apiserver's
/// `AllowsMediaTypeTransform`, Table is JSON only; PartialObjectMetadata is served as JSON here.
pub fn negotiate_for(accept: Option<&str>, tables: bool, protobuf: bool) -> Result<Output, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else { return Ok(Output::Json) };
    for m in by_preference(accept) {
        if protobuf && m.essence == PROTOBUF {
            if m.param("as").is_none() {
                return Ok(Output::Protobuf);
            }
            continue;
        }
        let json = matches!(m.essence, "application/json" | "*/*" | "application/*");
        if !json {
            continue;
        }
        match m.param("as") {
            None => return Ok(Output::Json),
            Some("Table") if tables => {
                if let Some(v) = meta_version(&m) {
                    return Ok(Output::Table(v));
                }
            }
            Some("PartialObjectMetadata") | Some("PartialObjectMetadataList") if tables => {
                if let Some(v) = meta_version(&m) {
                    return Ok(Output::Metadata(v));
                }
            }
            _ => {}
        }
    }
    let mut supported = vec!["application/json", "application/json;as=Table;v=v1;g=meta.k8s.io"];
    if protobuf {
        supported.push(PROTOBUF);
    }
    Err(ApiError::not_acceptable(&supported))
}

/// Whether an error answer to a request for a kind with a protobuf form is a protobuf Status: kube-apiserver
/// negotiates errors as objects without conversions, so only a protobuf entry preferred to every JSON one counts.
pub fn errors_in_protobuf(accept: Option<&str>) -> bool {
    negotiate_for(accept, false, true) == Ok(Output::Protobuf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_accept_headers() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(negotiate(Some(kubectl), true).unwrap(), Output::Table("v1"));
        assert_eq!(negotiate(Some(kubectl), false).unwrap(), Output::Json);
        let gc = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(negotiate(Some(gc), true).unwrap(), Output::Metadata("v1"));
        assert_eq!(negotiate(None, true).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("*/*"), true).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("application/vnd.kubernetes.protobuf"), true).unwrap_err().code, 406);
        assert_eq!(negotiate(Some("application/json;as=Table;v=v2;g=meta.k8s.io"), true).unwrap_err().code, 406);
    }

    #[test]
    fn protobuf_for_kinds_that_have_it() {
        let typed_client = "application/vnd.kubernetes.protobuf,application/json";
        assert_eq!(negotiate_for(Some(typed_client), true, true).unwrap(), Output::Protobuf);
        assert_eq!(negotiate_for(Some(typed_client), true, false).unwrap(), Output::Json);
        assert_eq!(
            negotiate_for(Some("*/*, application/vnd.kubernetes.protobuf"), false, true).unwrap(),
            Output::Protobuf
        );
        let q = "application/vnd.kubernetes.protobuf;q=0.5, application/json";
        assert_eq!(negotiate_for(Some(q), false, true).unwrap(), Output::Json);
        // Table is JSON only: a protobuf Table entry is passed over.
        let table = "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io";
        assert_eq!(negotiate_for(Some(table), true, true).unwrap(), Output::Table("v1"));
        assert!(errors_in_protobuf(Some(typed_client)));
        assert!(!errors_in_protobuf(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/vnd.kubernetes.protobuf;q=0.9,application/json"
        )));
        assert!(!errors_in_protobuf(None));
        let e = negotiate_for(Some("text/plain"), true, true).unwrap_err();
        assert!(e.message.ends_with(", application/vnd.kubernetes.protobuf"), "{}", e.message);
    }
}
