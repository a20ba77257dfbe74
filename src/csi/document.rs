//! Translation of documents as `migration-apiserver translate` reads them: YAML (one or more documents) or JSON, the
//! kind recognised from the document, the result in the input's format. Text in, text out: no I/O here.

use super::{
    is_inline_migratable, translate_csi_pv_to_in_tree, translate_in_tree_inline_volume_to_csi,
    translate_in_tree_pv_to_csi, translate_in_tree_storage_class_to_csi,
};
use super::{Result, TranslationError};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// CSI -> in-tree (PersistentVolumes only) instead of in-tree -> CSI.
    pub to_in_tree: bool,
    /// Namespace of the pod of an inline volume (Azure File's secret); a Pod's own namespace otherwise.
    pub pod_namespace: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

/// JSON when the text starts like JSON, else YAML.
pub fn detect(text: &str) -> Format {
    let start = text.trim_start();
    if start.starts_with("{") || start.starts_with("[") {
        Format::Json
    } else {
        Format::Yaml
    }
}

/// Translates every document of `text`; the output has the same format (YAML documents separated by `---`).
pub fn translate_text(text: &str, opts: &Options) -> Result<String> {
    match detect(text) {
        Format::Json => {
            let doc: Value =
                serde_json::from_str(text).map_err(|e| TranslationError::new(format!("invalid JSON: {e}")))?;
            let out = translate_value(doc, opts)?;
            let mut s = serde_json::to_string_pretty(&out).map_err(|e| TranslationError::new(e.to_string()))?;
            s.push('\n');
            Ok(s)
        }
        Format::Yaml => {
            let mut docs = Vec::new();
            for d in serde_yaml_ng::Deserializer::from_str(text) {
                let v = Value::deserialize(d).map_err(|e| TranslationError::new(format!("invalid YAML: {e}")))?;
                if !v.is_null() {
                    docs.push(v);
                }
            }
            if docs.is_empty() {
                return Err(TranslationError::new("no document on input"));
            }
            let mut out = Vec::with_capacity(docs.len());
            for d in docs {
                out.push(
                    serde_yaml_ng::to_string(&translate_value(d, opts)?)
                        .map_err(|e| TranslationError::new(e.to_string()))?,
                );
            }
            Ok(out.join("---\n"))
        }
    }
}

fn typed<T: DeserializeOwned>(v: Value, what: &str) -> Result<T> {
    serde_json::from_value(v).map_err(|e| TranslationError::new(format!("invalid {what}: {e}")))
}

fn to_value<T: serde::Serialize>(t: &T) -> Result<Value> {
    serde_json::to_value(t).map_err(|e| TranslationError::new(e.to_string()))
}

/// Whether a kind-less document is a pod's volume: it has a name, as every pod volume has. One without an in-tree
/// source is still the library's to judge (`could not find in-tree plugin translation logic for "<name>"`), as it
/// is through the API.
fn looks_like_volume(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.contains_key("name"))
}

/// Translates one document: a PersistentVolume (either way), a StorageClass (to CSI, by its provisioner), a Pod (its
/// in-tree inline volumes, to a List of PersistentVolumes), a pod's inline Volume (no kind), or a List of those.
pub fn translate_value(doc: Value, opts: &Options) -> Result<Value> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let only_to_csi = |what: &str| {
        if opts.to_in_tree {
            Err(TranslationError::new(format!(
                "{what} cannot be translated to in-tree: only PersistentVolumes translate from CSI back to in-tree"
            )))
        } else {
            Ok(())
        }
    };
    match kind.as_str() {
        "PersistentVolume" => {
            let pv: PersistentVolume = typed(doc, "PersistentVolume")?;
            let out = if opts.to_in_tree { translate_csi_pv_to_in_tree(&pv) } else { translate_in_tree_pv_to_csi(&pv) };
            to_value(&out?)
        }
        "StorageClass" => {
            only_to_csi("a StorageClass")?;
            let sc: StorageClass = typed(doc, "StorageClass")?;
            to_value(&translate_in_tree_storage_class_to_csi(&sc.provisioner, &sc)?)
        }
        "Pod" => {
            only_to_csi("a Pod")?;
            let pod: Pod = typed(doc, "Pod")?;
            let namespace = opts.pod_namespace.clone().or(pod.metadata.namespace.clone()).unwrap_or_default();
            let mut items = Vec::new();
            for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).filter(|v| is_inline_migratable(v)) {
                let pv = translate_in_tree_inline_volume_to_csi(v, &namespace)
                    .map_err(|e| TranslationError::new(format!("volume {:?}: {}", v.name, e.0)))?;
                items.push(to_value(&pv)?);
            }
            if items.is_empty() {
                return Err(TranslationError::new(format!(
                    "pod {:?} has no in-tree volume with migration logic",
                    pod.metadata.name.unwrap_or_default()
                )));
            }
            Ok(json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}))
        }
        "List" => {
            let items = doc.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            let items = items.into_iter().map(|i| translate_value(i, opts)).collect::<Result<Vec<_>>>()?;
            Ok(json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}))
        }
        "" if looks_like_volume(&doc) => {
            only_to_csi("an inline volume")?;
            let v: Volume = typed(doc, "Volume")?;
            let pv = translate_in_tree_inline_volume_to_csi(&v, opts.pod_namespace.as_deref().unwrap_or_default())?;
            to_value(&pv)
        }
        "" => Err(TranslationError::new(
            "the document has no kind: expected a PersistentVolume, a StorageClass, a Pod or a pod's inline volume \
             (name and volume source)",
        )),
        other => Err(TranslationError::new(format!(
            "cannot translate a {other}: expected a PersistentVolume, a StorageClass, a Pod or a pod's inline volume"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip() {
        let pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv1\nspec:\n  awsElasticBlockStore:\n    volumeID: aws://us-east-1a/vol-1\n";
        let out = translate_text(pv, &Options::default()).unwrap();
        assert!(out.contains("driver: ebs.csi.aws.com") && out.contains("volumeHandle: vol-1"), "{out}");
        let back = translate_text(&out, &Options { to_in_tree: true, ..Default::default() }).unwrap();
        assert!(back.contains("awsElasticBlockStore") && back.contains("volumeID: vol-1"), "{back}");
        let json = translate_text(r#"{"name":"v","gcePersistentDisk":{"pdName":"d"}}"#, &Options::default()).unwrap();
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["spec"]["csi"]["volumeHandle"], "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d");
        assert!(translate_text("kind: ConfigMap\n", &Options::default())
            .unwrap_err()
            .to_string()
            .contains("ConfigMap"));
    }
}
