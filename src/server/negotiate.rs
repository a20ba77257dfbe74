//! Accept-header negotiation, as kube-apiserver does it: JSON, Table (meta.k8s.io v1/v1beta1) and
//! PartialObjectMetadata(List), and YAML and protobuf for the kinds served as kube-apiserver serves its built-in
//! kinds. Anything else alone is 406.

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
    /// The object itself in YAML (`application/yaml`), for the same kinds.
    Yaml,
}

/// The media type of YAML answers and bodies.
pub const YAML: &str = "application/yaml";

/// The forms a kind is served in besides JSON: kube-apiserver's built-in kinds also in YAML and protobuf.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forms {
    pub yaml: bool,
    pub protobuf: bool,
}

impl Forms {
    /// What kube-apiserver serves a built-in kind in.
    pub const BUILT_IN: Forms = Forms { yaml: true, protobuf: true };
    /// What a watch of such a kind is served in: YAML has no streaming form (kube-apiserver's YAML serializer has
    /// no stream serializer, so a watch passes it over).
    pub fn streaming(self) -> Forms {
        Forms { yaml: false, ..self }
    }
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
    negotiate_for(accept, tables, Forms::default())
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

/// As [`negotiate`], for a kind also served in `forms`. Table and PartialObjectMetadata are served as JSON (Table
/// as kube-apiserver's `AllowsMediaTypeTransform` allows it, which also allows it in YAML).
pub fn negotiate_for(accept: Option<&str>, tables: bool, forms: Forms) -> Result<Output, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else { return Ok(Output::Json) };
    for m in by_preference(accept) {
        let other = match m.essence {
            PROTOBUF if forms.protobuf => Some(Output::Protobuf),
            YAML if forms.yaml => Some(Output::Yaml),
            _ => None,
        };
        if let Some(other) = other {
            if m.param("as").is_none() {
                return Ok(other);
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
    if forms.yaml {
        supported.push(YAML);
    }
    if forms.protobuf {
        supported.push(PROTOBUF);
    }
    Err(ApiError::not_acceptable(&supported))
}

/// The form of an error answer to a request for a kind served in `forms`: kube-apiserver negotiates errors as
/// objects without conversions (Table entries do not count), and answers JSON when nothing fits.
pub fn error_output(accept: Option<&str>, forms: Forms) -> Output {
    negotiate_for(accept, false, forms).unwrap_or(Output::Json)
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
    fn yaml_and_protobuf_for_built_in_kinds() {
        let built_in = Forms::BUILT_IN;
        let typed_client = "application/vnd.kubernetes.protobuf,application/json";
        assert_eq!(negotiate_for(Some(typed_client), true, built_in).unwrap(), Output::Protobuf);
        assert_eq!(negotiate_for(Some(typed_client), true, Forms::default()).unwrap(), Output::Json);
        let wildcard_first = "*/*, application/vnd.kubernetes.protobuf";
        assert_eq!(negotiate_for(Some(wildcard_first), false, built_in).unwrap(), Output::Protobuf);
        let q = "application/vnd.kubernetes.protobuf;q=0.5, application/json";
        assert_eq!(negotiate_for(Some(q), false, built_in).unwrap(), Output::Json);
        // Table is JSON only: a protobuf Table entry is passed over.
        let table = "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io";
        assert_eq!(negotiate_for(Some(table), true, built_in).unwrap(), Output::Table("v1"));
        assert_eq!(error_output(Some(typed_client), built_in), Output::Protobuf);
        let table_first =
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/vnd.kubernetes.protobuf;q=0.9,application/json";
        assert_eq!(error_output(Some(table_first), built_in), Output::Json);
        assert_eq!(error_output(None, built_in), Output::Json);
        assert_eq!(error_output(Some("text/plain"), built_in), Output::Json);
        let e = negotiate_for(Some("text/plain"), true, built_in).unwrap_err();
        assert!(e.message.ends_with(", application/yaml, application/vnd.kubernetes.protobuf"), "{}", e.message);
        // YAML for objects and lists, not for watches.
        assert_eq!(negotiate_for(Some("application/yaml"), true, built_in).unwrap(), Output::Yaml);
        assert_eq!(negotiate_for(Some("application/yaml"), true, built_in.streaming()).unwrap_err().code, 406);
        assert_eq!(negotiate_for(Some("application/yaml"), true, Forms::default()).unwrap_err().code, 406);
    }
}
