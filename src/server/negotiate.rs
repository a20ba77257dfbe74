//! Accept-header negotiation, as kube-apiserver does it: JSON, Table (meta.k8s.io v1/v1beta1) and
//! PartialObjectMetadata(List). Anything else alone is 406.

use crate::error::ApiError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Json,
    /// `as=Table`, with the meta.k8s.io version asked for.
    Table(&'static str),
    /// `as=PartialObjectMetadata` / `PartialObjectMetadataList`.
    Metadata(&'static str),
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
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else { return Ok(Output::Json) };
    for m in parse_accept(accept) {
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
    Err(ApiError::not_acceptable(&["application/json", "application/json;as=Table;v=v1;g=meta.k8s.io"]))
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
}
