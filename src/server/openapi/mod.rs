//! OpenAPI v3 (per group-version, with hash-addressed URLs) and v2 documents, generated from the Rust types of the
//! kinds. They carry `x-kubernetes-group-version-kind` so `kubectl explain` finds the schemas, and advertise exactly
//! the patch types served (no strategic merge, no apply) so `kubectl apply` chooses JSON merge patch.

use crate::registry::strategy::{KindInfo, Strategy, Subresource};
use http::StaticDoc;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Kubernetes' schema habits: `$schema` dropped, and an optional reference (schemars' `anyOf [ref, null]`) written
/// as `allOf [ref]`, the form kube-openapi emits and `kubectl explain` follows.
fn strip_schema_keys(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("$schema");
            // Doc comments wrap lines; Kubernetes descriptions are paragraphs.
            if let Some(Value::String(d)) = m.get_mut("description") {
                *d = d
                    .split("\n\n")
                    .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("\n\n");
            }
            if let Some(Value::Array(any)) = m.get("anyOf") {
                let is_null =
                    |x: &Value| x.get("enum") == Some(&json!([null])) || x.get("type") == Some(&json!("null"));
                if any.len() == 2 && any.iter().any(is_null) {
                    if let Some(other) = any.iter().find(|x| !is_null(x)).cloned() {
                        m.remove("anyOf");
                        match other {
                            Value::Object(o) if o.contains_key("$ref") => {
                                m.insert("allOf".into(), json!([Value::Object(o)]));
                            }
                            Value::Object(o) => {
                                for (k, x) in o {
                                    m.entry(k).or_insert(x);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            for (_, x) in m.iter_mut() {
                strip_schema_keys(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_schema_keys),
        _ => {}
    }
}

fn rewrite_refs(v: &mut Value, from: &str, to: &str) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(rest) = r.strip_prefix(from) {
                    *r = format!("{to}{rest}");
                }
            }
            m.remove("nullable");
            for (_, x) in m.iter_mut() {
                rewrite_refs(x, from, to);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, from, to)),
        _ => {}
    }
}

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn list_name(kind_schema: &str) -> String {
    format!("{kind_schema}List")
}

/// The descriptions of every kind's apiVersion and kind, as kube-openapi gives them.
pub(super) const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
pub(super) const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// Schemas for one group-version: each kind (apiVersion/kind properties, GVK extension) and its List.
fn schemas_for(kinds: &[&Arc<dyn Strategy>], group: &str, version: &str) -> Map<String, Value> {
    let mut out = Map::new();
    for k in kinds {
        let i = k.info();
        let (name, defs) = k.schemas();
        for (n, mut s) in defs {
            strip_schema_keys(&mut s);
            out.entry(n).or_insert(s);
        }
        let gvk = json!([{"group": group, "version": version, "kind": i.kind}]);
        if let Some(Value::Object(s)) = out.get_mut(&name) {
            let props = s.entry("properties").or_insert_with(|| json!({}));
            props["apiVersion"] = json!({"type": "string", "description": API_VERSION_DESCRIPTION});
            props["kind"] = json!({"type": "string", "description": KIND_DESCRIPTION});
            s.insert("x-kubernetes-group-version-kind".into(), gvk);
        }
        if i.create_only {
            // Never listed: no List kind.
            continue;
        }
        out.insert(
            list_name(&name),
            json!({
                "description": format!("{} is a list of {}.", i.list_kind, i.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                    "metadata": {"$ref": format!("#/components/schemas/{META}.ListMeta"), "description": "Standard list metadata."},
                    "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{name}")}, "description": format!("List of {}.", i.plural)},
                },
                "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": i.list_kind}],
            }),
        );
    }
    out
}

fn param(name: &str, location: &str, description: &str, schema_type: &str) -> Value {
    json!({"name": name, "in": location, "description": description, "schema": {"type": schema_type, "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        param("dryRun", "query", "When present, indicates that modifications should not be persisted. Valid values are: - All: all dry run stages will be processed", "string"),
        param("fieldManager", "query", "fieldManager is a name associated with the actor or entity that is making these changes.", "string"),
        param("fieldValidation", "query", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn (default) - Strict", "string"),
    ]
}

/// A PATCH's parameters: a write's, and `force` for apply.
fn patch_params() -> Vec<Value> {
    let mut params = write_params();
    params.push(param("force", "query", "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.", "boolean"));
    params
}

fn list_params() -> Vec<Value> {
    vec![
        param("allowWatchBookmarks", "query", "allowWatchBookmarks requests watch events with type \"BOOKMARK\".", "boolean"),
        param("continue", "query", "The continue option should be set when retrieving more results from the server.", "string"),
        param("fieldSelector", "query", "A selector to restrict the list of returned objects by their fields (metadata.name, metadata.namespace).", "string"),
        param("labelSelector", "query", "A selector to restrict the list of returned objects by their labels.", "string"),
        param("limit", "query", "limit is a maximum number of responses to return for a list call.", "integer"),
        param("resourceVersion", "query", "resourceVersion sets a constraint on what resource versions a request may be served from.", "string"),
        param("resourceVersionMatch", "query", "resourceVersionMatch determines how resourceVersion is applied to list calls.", "string"),
        param("sendInitialEvents", "query", "`sendInitialEvents=true` may be set together with `watch=true`.", "boolean"),
        param("timeoutSeconds", "query", "Timeout for the list/watch call.", "integer"),
        param("watch", "query", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.", "boolean"),
    ]
}

fn response(schema_ref: &str) -> Value {
    json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema_ref}")}}}, "description": "OK"})
}

fn op(action: &str, id: String, desc: String, gvk: &Value, ok: &str, params: Vec<Value>, body: Option<Value>) -> Value {
    let mut o = json!({
        "description": desc, "operationId": id, "tags": [gvk["group"].as_str().unwrap_or_default()],
        "parameters": params,
        "responses": {"200": response(ok), "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
    });
    if action == "post" {
        o["responses"]["201"] = response(ok);
        o["responses"]["202"] = response(ok);
    }
    if let Some(b) = body {
        o["requestBody"] = b;
    }
    o
}

fn camel(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// Where a group-version is served: `api/<v>` for the core group, `apis/<g>/<v>` for the others (also the key of
/// its v3 document).
fn group_version_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The v3 document of one group-version.
pub fn v3_document(kinds: &[Arc<dyn Strategy>], group: &str, version: &str) -> Value {
    let selected: Vec<&Arc<dyn Strategy>> =
        kinds.iter().filter(|k| k.info().group == group && k.info().versions.contains(&version)).collect();
    let mut paths = Map::new();
    // kube-openapi names the core group "Core" in operation IDs (readCoreV1Namespace).
    let group_id = if group.is_empty() { "Core".to_string() } else { group.split('.').map(camel).collect() };
    let gv = GroupVersion {
        group,
        version,
        id: format!("{group_id}{}", camel(version)),
        path: group_version_path(group, version),
    };
    for k in &selected {
        kind_paths(&mut paths, k, &gv);
    }
    let mut schemas = schemas_for(&selected, group, version);
    schemas.insert(
        format!("{META}.Patch"),
        json!({"description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.", "type": "object"}),
    );
    json!({
        "openapi": "3.0.0",
        "info": {"title": "migration-apiserver", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// What a group-version's paths and operation IDs are made of.
struct GroupVersion<'a> {
    group: &'a str,
    version: &'a str,
    /// `CoreV1`, `MigrationK8sIoV1alpha1`: the middle of operation IDs.
    id: String,
    /// `api/v1`, `apis/<group>/<version>`.
    path: String,
}

/// The parameters of a kind's object paths and of its collection paths: the name (objects only), the namespace
/// (a namespaced kind) and `pretty`.
fn path_params(i: &KindInfo) -> (Vec<Value>, Vec<Value>) {
    let mut object_params = vec![
        json!({"name": "name", "in": "path", "required": true, "description": format!("name of the {}", i.kind), "schema": {"type": "string", "uniqueItems": true}}),
    ];
    let mut collection_params = vec![];
    if i.namespaced {
        let nsp = json!({"name": "namespace", "in": "path", "required": true, "description": "object name and auth scope, such as for teams and projects", "schema": {"type": "string", "uniqueItems": true}});
        object_params.push(nsp.clone());
        collection_params.push(nsp);
    }
    collection_params.push(param("pretty", "query", "If 'true', then the output is pretty printed.", "string"));
    object_params.push(param("pretty", "query", "If 'true', then the output is pretty printed.", "string"));
    (object_params, collection_params)
}

/// The request body of a PATCH, in each patch type.
fn patch_body() -> Value {
    json!({"content": {
        "application/json-patch+json": {"schema": {"$ref": format!("#/components/schemas/{META}.Patch")}},
        "application/merge-patch+json": {"schema": {"$ref": format!("#/components/schemas/{META}.Patch")}},
        "application/apply-patch+yaml": {"schema": {"$ref": format!("#/components/schemas/{META}.Patch")}},
    }, "required": true})
}

/// The paths of one kind: its collection, its objects and their status, and for a namespaced kind the list across
/// namespaces.
fn kind_paths(paths: &mut Map<String, Value>, k: &Arc<dyn Strategy>, gv: &GroupVersion<'_>) {
    let (group, version, gv_id, gv_path) = (gv.group, gv.version, &gv.id, &gv.path);
    let i = k.info();
    let (name, _) = k.schemas();
    let list = list_name(&name);
    let gvk = json!({"group": group, "version": version, "kind": i.kind});
    let ns_seg = if i.namespaced { "/namespaces/{namespace}" } else { "" };
    let base = format!("/{gv_path}{ns_seg}/{}", i.plural);
    let scope = if i.namespaced { "Namespaced" } else { "" };
    let body = || json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}}, "required": true});
    let patch_body = patch_body();
    let (ns_params, coll_params) = path_params(i);
    let k_ = i.kind;
    if i.create_only {
        // A virtual resource: only POST on the collection, as kube-apiserver documents TokenReview.
        paths.insert(
            base.clone(),
            json!({
                "post": op("post", format!("create{gv_id}{scope}{k_}"), format!("create a {k_}"), &gvk, &name, write_params(), Some(body())),
                "parameters": coll_params,
            }),
        );
        return;
    }
    paths.insert(
        base.clone(),
        json!({
            "get": op("list", format!("list{gv_id}{scope}{k_}"), format!("list or watch objects of kind {k_}"), &gvk, &list, list_params(), None),
            "post": op("post", format!("create{gv_id}{scope}{k_}"), format!("create a {k_}"), &gvk, &name, write_params(), Some(body())),
            "delete": op("deletecollection", format!("deleteCollection{gv_id}{scope}{k_}"), format!("delete collection of {k_}"), &gvk, &format!("{META}.Status"), list_params(), None),
            "parameters": coll_params,
        }),
    );
    paths.insert(
        format!("{base}/{{name}}"),
        json!({
            "get": op("get", format!("read{gv_id}{scope}{k_}"), format!("read the specified {k_}"), &gvk, &name, vec![], None),
            "put": op("put", format!("replace{gv_id}{scope}{k_}"), format!("replace the specified {k_}"), &gvk, &name, write_params(), Some(body())),
            "patch": op("patch", format!("patch{gv_id}{scope}{k_}"), format!("partially update the specified {k_}"), &gvk, &name, patch_params(), Some(patch_body.clone())),
            "delete": op("delete", format!("delete{gv_id}{scope}{k_}"), format!("delete a {k_}"), &gvk, &format!("{META}.Status"), vec![param("dryRun", "query", "When present, indicates that modifications should not be persisted.", "string"), param("propagationPolicy", "query", "Whether and how garbage collection will be performed.", "string")], None),
            "parameters": ns_params.clone(),
        }),
    );
    if k.serves(Subresource::Status) {
        paths.insert(
            format!("{base}/{{name}}/status"),
            json!({
                "get": op("get", format!("read{gv_id}{scope}{k_}Status"), format!("read status of the specified {k_}"), &gvk, &name, vec![], None),
                "put": op("put", format!("replace{gv_id}{scope}{k_}Status"), format!("replace status of the specified {k_}"), &gvk, &name, write_params(), Some(body())),
                "patch": op("patch", format!("patch{gv_id}{scope}{k_}Status"), format!("partially update status of the specified {k_}"), &gvk, &name, patch_params(), Some(patch_body)),
                "parameters": ns_params,
            }),
        );
    }
    if i.namespaced {
        paths.insert(
            format!("/{gv_path}/{}", i.plural),
            json!({"get": op("list", format!("list{gv_id}{k_}ForAllNamespaces"), format!("list or watch objects of kind {k_}"), &gvk, &list, list_params(), None)}),
        );
    }
}

/// The swagger 2.0 document of every group-version (served as JSON only).
pub fn v2_document(kinds: &[Arc<dyn Strategy>]) -> Value {
    let mut paths = Map::new();
    let mut definitions = Map::new();
    let mut gvs = Vec::new();
    for k in kinds {
        for v in k.info().versions {
            let gv = (k.info().group, *v);
            if !gvs.contains(&gv) {
                gvs.push(gv);
            }
        }
    }
    for (g, v) in gvs {
        let mut doc = v3_document(kinds, g, v);
        rewrite_refs(&mut doc, "#/components/schemas/", "#/definitions/");
        if let Some(Value::Object(p)) = doc.get_mut("paths").map(Value::take) {
            for (path, mut item) in p {
                for (key, o) in item.as_object_mut().into_iter().flat_map(|ops| ops.iter_mut()) {
                    match o {
                        // The path's own parameters ({namespace}, {name}) are swagger 2.0 parameters too: with a v3
                        // `schema` kube-apiserver's aggregated /openapi/v2 refuses the whole document ("contains an
                        // invalid ParametersItem") and answers 503 to protobuf clients, kubectl among them.
                        Value::Array(params) if key == "parameters" => v2_parameters(params),
                        Value::Object(o) => v2_operation(o),
                        _ => {}
                    }
                }
                paths.insert(path, item);
            }
        }
        if let Some(Value::Object(s)) = doc.pointer_mut("/components/schemas").map(Value::take) {
            for (n, schema) in s {
                add_definition(&mut definitions, n, schema);
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "migration-apiserver", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": definitions,
    })
}

/// A v3 operation as v2 writes it: body parameters instead of requestBody, and responses with a schema.
fn v2_operation(o: &mut Map<String, Value>) {
    if let Some(rb) = o.remove("requestBody") {
        let schema = rb["content"].as_object().and_then(|c| c.values().next()).map(|c| c["schema"].clone());
        if let Some(Value::Array(params)) = o.get_mut("parameters") {
            params.push(json!({"name": "body", "in": "body", "required": true, "schema": schema}));
        }
    }
    if let Some(Value::Object(rs)) = o.get_mut("responses") {
        for (_, r) in rs.iter_mut() {
            if let Some(s) = r.pointer("/content/application~1json/schema").cloned() {
                *r = json!({"description": "OK", "schema": s});
            }
        }
    }
    if let Some(Value::Array(params)) = o.get_mut("parameters") {
        v2_parameters(params);
    }
}

/// Non-body parameters as swagger 2.0 has them: the type on the parameter, no `schema`.
fn v2_parameters(params: &mut [Value]) {
    for p in params.iter_mut() {
        if let Some(t) = p.get("schema").and_then(|s| s.get("type")).cloned() {
            if let Some(po) = p.as_object_mut() {
                po.remove("schema");
                po.insert("type".into(), t);
            }
        }
    }
}

/// Adds a schema to the v2 definitions; when two versions share a schema name, their GVK lists are merged.
fn add_definition(definitions: &mut Map<String, Value>, name: String, schema: Value) {
    let Some(existing) = definitions.get_mut(&name) else {
        definitions.insert(name, schema);
        return;
    };
    if let (Some(Value::Array(gvk)), Some(Value::Array(new_gvk))) =
        (existing.get_mut("x-kubernetes-group-version-kind"), schema.get("x-kubernetes-group-version-kind"))
    {
        for g in new_gvk {
            if !gvk.contains(g) {
                gvk.push(g.clone());
            }
        }
    }
}

/// All documents, prepared once, each with its ETag and gzip form (see [`http`]).
pub struct OpenApi {
    pub v2: StaticDoc,
    /// The swagger 2.0 document as protobuf (gnostic `openapi.v2.Document`), for kubectl (see [`proto`]).
    pub v2_protobuf: StaticDoc,
    /// `apis/<g>/<v>` -> (document, upper-case hex SHA-512 of it).
    pub v3: BTreeMap<String, (StaticDoc, String)>,
    pub v3_root: StaticDoc,
}

/// kube-openapi's ETag: the upper-case hex SHA-512 of the JSON form.
fn hash(body: &[u8]) -> String {
    format!("{:X}", Sha512::digest(body))
}

impl OpenApi {
    pub fn build(kinds: &[Arc<dyn Strategy>]) -> OpenApi {
        let built = chrono::Utc::now();
        let mut v3 = BTreeMap::new();
        let mut root = Map::new();
        for k in kinds {
            for v in k.info().versions {
                let key = group_version_path(k.info().group, v);
                if v3.contains_key(&key) {
                    continue;
                }
                let body = serde_json::to_vec(&v3_document(kinds, k.info().group, v)).unwrap_or_default();
                let hash = hash(&body);
                root.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}));
                v3.insert(key, (StaticDoc::new(body, &hash, built, false), hash));
            }
        }
        let v2 = v2_document(kinds);
        let v2_json = serde_json::to_vec(&v2).unwrap_or_default();
        let v2_hash = hash(&v2_json);
        let root = serde_json::to_vec(&json!({"paths": root})).unwrap_or_default();
        OpenApi {
            v2_protobuf: StaticDoc::new(proto::document(&v2), &v2_hash, built, true),
            v2: StaticDoc::new(v2_json, &v2_hash, built, true),
            v3,
            v3_root: StaticDoc::new(root.clone(), &hash(&root), built, false),
        }
    }
}

pub mod http;
pub mod proto;
