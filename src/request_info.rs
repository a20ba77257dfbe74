//! What a request is about, parsed once from its method, path and query: kube-apiserver's `RequestInfo`
//! (k8s.io/apiserver `endpoints/request`). Authorization, REST dispatch and metrics all read this one parse, so they
//! never disagree about a path. It depends on nothing else of the crate.

use axum::http::Method;

/// A parsed request, as `RequestInfoFactory.NewRequestInfo` parses it for the `/api` and `/apis` prefixes: a
/// resource request is `/apis/<group>/<version>/[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]` (or
/// `/api/<version>/...`); anything shorter or elsewhere is a non-resource request with the lower-case method as verb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub path: String,
    /// get, list, watch, create, update, patch, delete, deletecollection (or `watch`/`proxy` from the deprecated
    /// path forms) for resource requests; the lower-case HTTP method for others.
    pub verb: String,
    pub is_resource_request: bool,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The path segments from the resource on (`<resource>/<name>/<subresource>/...`), empty ones kept: more than
    /// three, or an empty one, names nothing that is served.
    pub parts: Vec<String>,
    /// The verb came from the path (`/apis/<g>/<v>/watch/...`, `/proxy/...`), not the method.
    pub verb_in_path: bool,
}

impl RequestInfo {
    pub fn parse(method: &Method, path: &str, query: Option<&str>) -> Self {
        let mut info =
            RequestInfo { path: path.to_string(), verb: method.as_str().to_ascii_lowercase(), ..Default::default() };
        // As Go's strings.Split(strings.Trim(path, "/"), "/"): empty segments are kept.
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        if segments.len() < 3 {
            return info;
        }
        let rest = match segments[0] {
            "api" => &segments[1..],
            "apis" if segments.len() >= 4 => {
                info.api_group = segments[1].to_string();
                &segments[2..]
            }
            _ => return info,
        };
        info.api_version = rest[0].to_string();
        let mut parts = &rest[1..];
        let verb = if matches!(parts[0], "watch" | "proxy") {
            // The deprecated /watch/ and /proxy/ path forms name their verb.
            if parts.len() < 2 {
                return RequestInfo { api_group: String::new(), api_version: String::new(), ..info };
            }
            info.verb_in_path = true;
            let verb = parts[0];
            parts = &parts[1..];
            verb
        } else {
            match *method {
                Method::POST => "create",
                Method::GET | Method::HEAD => "get",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "",
            }
        };
        info.is_resource_request = true;
        info.verb = verb.to_string();
        if parts[0] == "namespaces" && parts.len() > 1 {
            info.namespace = parts[1].to_string();
            // /namespaces/<ns>/<resource>...: the resource is namespaced; /namespaces/<ns>[/status|/finalize] is
            // the namespace itself.
            if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
                parts = &parts[2..];
            }
        }
        info.parts = parts.iter().map(|p| p.to_string()).collect();
        if parts.len() >= 3 && info.verb != "proxy" {
            info.subresource = parts[2].to_string();
        }
        if parts.len() >= 2 {
            info.name = parts[1].to_string();
        }
        info.resource = parts[0].to_string();
        if info.name.is_empty() && info.verb == "get" {
            let mut watch = false;
            for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
                match key.as_ref() {
                    "watch" if !watch => watch = query_bool(&value),
                    "fieldSelector" => {
                        if let Some(name) = exact_name(&value) {
                            info.name = name;
                        }
                    }
                    _ => {}
                }
            }
            info.verb = if watch { "watch" } else { "list" }.into();
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".into();
        }
        info
    }

    /// Whether the path names a resource the way the REST handlers serve it: no verb in the path, one to three
    /// segments from the resource on, and no empty segment (an empty namespace or name is not a default).
    pub fn is_served_form(&self) -> bool {
        self.is_resource_request
            && !self.verb_in_path
            && (1..=3).contains(&self.parts.len())
            && self.path.trim_matches('/').split('/').all(|s| !s.is_empty())
    }
}

/// A boolean query parameter as kube-apiserver's parameter codec converts it: false only for "", "0" and "false"
/// (any case), true for anything else.
pub fn query_bool(value: &str) -> bool {
    !(value.is_empty() || value == "0" || value.eq_ignore_ascii_case("false"))
}

/// The name a field selector pins (`metadata.name=<n>` or `==`), if it is a valid path segment: a list or watch of
/// one object is authorized as that object, as in kube-apiserver.
fn exact_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let term = term.trim();
        let value = term.strip_prefix("metadata.name==").or_else(|| term.strip_prefix("metadata.name="))?;
        let valid = !value.is_empty() && value != "." && value != ".." && !value.contains(['/', '%']);
        valid.then(|| value.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str) -> RequestInfo {
        RequestInfo::parse(&method, path, None)
    }

    /// The cases the REST handlers' own parser and the authorizer's once disagreed on: empty segments, and
    /// `/namespaces/<ns>` with and without what follows.
    #[test]
    fn one_parse_for_empty_segments_and_namespaces() {
        let shoots = "/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates";
        let i = info(Method::GET, &format!("{shoots}/a/status"));
        assert_eq!(
            (i.namespace.as_str(), i.resource.as_str(), i.name.as_str(), i.subresource.as_str(), i.verb.as_str()),
            ("garden", "shootstates", "a", "status", "get")
        );
        assert!(i.is_served_form());
        // A cluster-scoped resource literally named "namespaces" would be /apis/g/v/namespaces/<name>.
        let i = info(Method::GET, "/apis/g/v1/namespaces/x");
        assert_eq!((i.namespace.as_str(), i.resource.as_str(), i.name.as_str()), ("x", "namespaces", "x"));
        assert!(i.is_served_form());
        // /namespaces/<ns>/status is the namespace's own subresource, not a resource "status".
        let i = info(Method::PUT, "/api/v1/namespaces/x/status");
        assert_eq!((i.resource.as_str(), i.name.as_str(), i.subresource.as_str()), ("namespaces", "x", "status"));
        // An empty namespace is no namespace the REST handlers serve; the authorizer sees a cluster-wide list.
        let i = info(Method::GET, "/apis/core.gardener.cloud/v1beta1/namespaces//shootstates");
        assert_eq!((i.namespace.as_str(), i.resource.as_str(), i.verb.as_str()), ("", "shootstates", "list"));
        assert!(!i.is_served_form());
        // Empty segments are kept, as Go's split keeps them: they name nothing served.
        let i = info(Method::GET, "/apis/g//x");
        assert_eq!((i.api_group.as_str(), i.api_version.as_str(), i.resource.as_str()), ("g", "", "x"));
        assert!(!info(Method::GET, "/apis/g/v1/things//status").is_served_form());
        assert!(!info(Method::GET, "/apis/g/v1/a/b/c/d").is_served_form());
        // Too short: discovery, not a resource.
        assert!(!info(Method::GET, "/apis/g/v1").is_resource_request);
        assert!(!info(Method::GET, "/api/v1").is_resource_request);
        assert!(!info(Method::GET, "/apis").is_resource_request);
        // The deprecated watch path is understood (for authorization) but not served.
        let i = info(Method::GET, "/apis/g/v1/watch/things");
        assert_eq!((i.verb.as_str(), i.resource.as_str()), ("watch", "things"));
        assert!(!i.is_served_form());
        // Trailing slashes are trimmed, as Go's strings.Trim does.
        let i = info(Method::GET, "/apis/g/v1/things/");
        assert_eq!((i.resource.as_str(), i.verb.as_str()), ("things", "list"));
        assert!(i.is_served_form());
    }
}
