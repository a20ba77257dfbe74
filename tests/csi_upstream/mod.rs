//! The tables derived from csi-translation-lib's tests, the form of their cases, and JSON builders for the objects
//! the Go tests build as structs.

pub mod aws_ebs;
pub mod azure_disk;
pub mod azure_file;
pub mod gce_pd;
pub mod in_tree_volume;
pub mod openstack_cinder;
pub mod portworx;
pub mod translate;
pub mod vsphere_volume;

use serde_json::{json, Value};

/// The commit of kubernetes/csi-translation-lib (the staging mirror of kubernetes/kubernetes
/// `staging/src/k8s.io/csi-translation-lib`) every table follows. After an upstream change, diff the test files
/// named in the tables' headers from here to the new commit.
pub const UPSTREAM_COMMIT: &str = "83cf1e337910ea773d78dcb905d57e8305b3f65d";

/// One upstream test case.
pub struct Case {
    /// `<Go test function>/<case name>`.
    pub name: String,
    pub input: Input,
    pub expect: Expect,
}

/// What is given to the library's entry points (`translate` and the CSITranslation API), as upstream's
/// `translate.go` exposes them.
pub enum Input {
    /// An in-tree PersistentVolume to CSI.
    PvToCsi(Value),
    /// A CSI PersistentVolume back to in-tree.
    PvToInTree(Value),
    /// An in-tree PersistentVolume to CSI and the result back: the outcome is the final PersistentVolume.
    RoundTrip(Value),
    /// A pod's inline volume and the pod's namespace ("" for none).
    Inline(Value, &'static str),
    /// A StorageClass (its provisioner picks the plugin).
    StorageClass(Value),
    /// RepairVolumeHandle(driverName, volumeHandle, nodeID); the outcome is the handle as a JSON string.
    Repair { driver: &'static str, handle: String, node: String },
}

/// How a translation ended.
#[derive(Debug, PartialEq)]
pub enum Failure {
    /// The library's error: the command's message, the API's `status.error`.
    Message(String),
    /// The API refused the request (422) naming these fields.
    Invalid(Vec<String>),
}

pub type Outcome = Result<Value, Failure>;

/// What upstream expects of a case.
pub enum Expect {
    /// The whole result.
    Result(Value),
    /// Parts of the result, by JSON pointer; null: absent.
    Parts(Vec<(String, Value)>),
    /// A property of the result that upstream checks with code.
    Check(&'static str, fn(&Value) -> bool),
    /// The library's error message, exactly.
    Error(String),
    /// `failed to translate topology. PV:<the PV>. Error:<this>`: upstream prints the PV struct (`%+v`), we print
    /// it as JSON (see the README); the PV must parse as one.
    TopologyError(String),
    /// A PersistentVolume without a CSI source back to in-tree: the library's error from the command; the API
    /// refuses such a request (422) on this field before the library sees it.
    Invalid { message: &'static str, field: &'static str },
}

impl Expect {
    /// Why `outcome` is not what is expected, if it is not.
    pub fn check(&self, outcome: &Outcome, api: bool) -> Result<(), String> {
        let got = || format!("{outcome:?}");
        match (self, outcome) {
            (Expect::Result(want), Ok(v)) if v == want => Ok(()),
            (Expect::Result(want), _) => Err(format!("want {want}, got {}", got())),
            (Expect::Parts(parts), Ok(v)) => {
                let wrong: Vec<String> = parts
                    .iter()
                    .filter(|(p, want)| v.pointer(p).unwrap_or(&Value::Null) != want)
                    .map(|(p, want)| format!("{p}: want {want}, got {}", v.pointer(p).unwrap_or(&Value::Null)))
                    .collect();
                if wrong.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{} in {v}", wrong.join("; ")))
                }
            }
            (Expect::Check(what, f), Ok(v)) if f(v) => {
                let _ = what;
                Ok(())
            }
            (Expect::Check(what, _), _) => Err(format!("want {what}, got {}", got())),
            (Expect::Error(want), Err(Failure::Message(m))) if m == want => Ok(()),
            (Expect::Error(want), _) => Err(format!("want error {want:?}, got {}", got())),
            (Expect::TopologyError(want), Err(Failure::Message(m))) if topology_error_is(m, want) => Ok(()),
            (Expect::TopologyError(want), _) => {
                Err(format!("want \"failed to translate topology. PV:<PV>. Error:{want}\", got {}", got()))
            }
            (Expect::Invalid { field, .. }, Err(Failure::Invalid(fields)))
                if api && fields.iter().any(|f| f == field) =>
            {
                Ok(())
            }
            (Expect::Invalid { message, .. }, Err(Failure::Message(m))) if !api && m == message => Ok(()),
            (Expect::Invalid { message, field }, _) => {
                let want = if api { format!("422 on {field}") } else { format!("error {message:?}") };
                Err(format!("want {want}, got {}", got()))
            }
            (_, _) => Err(format!("want a result, got {}", got())),
        }
    }
}

fn topology_error_is(message: &str, want: &str) -> bool {
    let Some(rest) = message.strip_prefix("failed to translate topology. PV:") else { return false };
    let Some(pv) = rest.strip_suffix(&format!(". Error:{want}")) else { return false };
    serde_json::from_str::<Value>(pv).is_ok_and(|v| v["kind"] == "PersistentVolume")
}

pub fn case(name: impl Into<String>, input: Input, expect: Expect) -> Case {
    Case { name: name.into(), input, expect }
}

/// `Expect::Parts` from (JSON pointer, value) pairs.
pub fn parts<P: Into<String>>(pairs: Vec<(P, Value)>) -> Expect {
    Expect::Parts(pairs.into_iter().map(|(p, v)| (p.into(), v)).collect())
}

/// `Expect::Error`.
pub fn error(message: impl Into<String>) -> Expect {
    Expect::Error(message.into())
}

// -------------------------------------------------------------------------------------------------------------
// builders: what the Go tests write as structs, as the JSON Go encodes them (zero values absent)

/// A PersistentVolume.
pub fn pv(metadata: Value, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata, "spec": spec})
}

/// A StorageClass of `provisioner`; a null `parameters` or `allowed_topologies` is absent (as Go's empty map).
pub fn sc(provisioner: &str, parameters: Value, allowed_topologies: Value) -> Value {
    let mut sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {},
        "provisioner": provisioner});
    if !parameters.is_null() {
        sc["parameters"] = parameters;
    }
    if !allowed_topologies.is_null() {
        sc["allowedTopologies"] = allowed_topologies;
    }
    sc
}

/// `generateToplogySelectors(key, values)`: one term, one expression.
pub fn selectors(key: &str, values: &[&str]) -> Value {
    json!([{"matchLabelExpressions": [{"key": key, "values": values}]}])
}

/// A node selector requirement `key In values`.
pub fn req(key: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": "In", "values": values})
}

/// A required node affinity of one term per entry, each entry the term's expressions.
pub fn affinity(terms: Vec<Vec<Value>>) -> Value {
    let terms: Vec<Value> = terms.into_iter().map(|t| json!({"matchExpressions": t})).collect();
    json!({"required": {"nodeSelectorTerms": terms}})
}

/// A label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.to_string(), Value::from(*v))).collect())
}

/// A JSON pointer to a label (`/` in the key escaped).
pub fn label_pointer(key: &str) -> String {
    format!("/metadata/labels/{}", key.replace('~', "~0").replace('/', "~1"))
}

pub const GA_ZONE: &str = "topology.kubernetes.io/zone";
pub const GA_REGION: &str = "topology.kubernetes.io/region";
pub const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
pub const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
pub const FILESYSTEM: &str = "Filesystem";
