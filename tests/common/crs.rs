//! Custom resources in a real cluster's kube-apiserver, the objects the migration suites migrate there: a CRD served
//! in v1 and v2 (the same schema, no conversion) and stored in v1 at first, its objects, how etcd holds them, and the
//! switch of its storage version to v2 that makes every stored object stale.

use super::cluster::Cluster;
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// The kit's ServiceAccount, as which the cluster's own server reaches kube-apiserver.
pub const SERVER_USER: &str = "system:serviceaccount:migration-apiserver:migration-apiserver";

/// A custom resource `<plural>.<group>`, served in v1 and v2, stored in v1 until [`Cr::store_in_v2`].
#[derive(Clone, Debug)]
pub struct Cr {
    pub group: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    /// None: cluster-scoped.
    pub namespace: Option<&'static str>,
}

impl Cr {
    /// `<plural>.<group>`: the CRD's name, the StorageState's, and the migrations' label.
    pub fn name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    pub fn crd(&self) -> Value {
        let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer"}, "color": {"type": "string"}}}}}});
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": self.name()},
            "spec": {
                "group": self.group,
                "scope": if self.namespace.is_some() { "Namespaced" } else { "Cluster" },
                "names": {"plural": self.plural, "singular": self.kind.to_lowercase(), "kind": self.kind,
                    "listKind": format!("{}List", self.kind)},
                "conversion": {"strategy": "None"},
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "schema": schema},
                    {"name": "v2", "served": true, "storage": false, "schema": schema},
                ],
            },
        })
    }

    pub fn resource(&self, version: &str) -> ApiResource {
        ApiResource {
            group: self.group.into(),
            version: version.into(),
            api_version: format!("{}/{version}", self.group),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    /// The objects in `version`, in the resource's namespace (if any).
    pub fn api(&self, client: &kube::Client, version: &str) -> Api<DynamicObject> {
        let ar = self.resource(version);
        match self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        }
    }

    /// The collection's path in `version` (all namespaces).
    pub fn path(&self, version: &str) -> String {
        format!("/apis/{}/{version}/{}", self.group, self.plural)
    }

    /// Creates the namespace (if any) and the CRD, and waits until it is Established.
    pub fn install(&self, c: &Cluster) {
        if let Some(ns) = self.namespace {
            c.kubectl_ok(&["create", "namespace", ns]);
        }
        c.kubectl_ok_stdin(&["create", "-f", "-"], &self.crd().to_string());
        c.kubectl_ok(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{}", self.name())]);
    }

    /// What docs/install/before-you-install.md and docs/operations/troubleshooting.md say to do for a resource
    /// outside the shipped ClusterRole: grant the server's ServiceAccount `list` and `patch` on it (here a
    /// ClusterRole and ClusterRoleBinding of its own beside the kit's). Waits until kube-apiserver's authorizer
    /// answers yes to both.
    pub fn grant(&self, c: &Cluster) {
        let role = format!("migrate-{}", self.name());
        let role_object = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [self.group], "resources": [self.plural], "verbs": ["list", "patch"]}]});
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "migration-apiserver", "namespace": "migration-apiserver"}]});
        // Two objects in a stream, not a `kind: List`: kubectl validates a List with /openapi/v2, which
        // kube-apiserver answers with 503 as protobuf while this server's APIServices are registered (the path-level
        // parameters of this server's /openapi/v2 keep OpenAPI v3's `schema` form, which kube-apiserver's
        // aggregated spec then fails to convert: "contains an invalid ParametersItem" in its log).
        c.kubectl_ok_stdin(&["apply", "-f", "-"], &format!("{role_object}\n{binding}\n"));
        // A SubjectAccessReview rather than `kubectl auth can-i`, which needs the resource in discovery; with
        // --validate=false, since kubectl looks for a SubjectAccessReview's fieldValidation support in /openapi/v2
        // too (its v3 spec does not show it), which fails as above.
        for verb in ["list", "patch"] {
            let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": SERVER_USER, "groups": ["system:serviceaccounts", "system:authenticated"],
                    "resourceAttributes": {"group": self.group, "resource": self.plural, "verb": verb,
                        "namespace": if verb == "patch" { self.namespace.unwrap_or_default() } else { "" }}}});
            super::eventually(&format!("{SERVER_USER} may {verb} {}", self.name()), Duration::from_secs(30), || {
                let args = ["create", "--validate=false", "-f", "-", "-o", "json"];
                let out = c.kubectl_ok_stdin(&args, &review.to_string());
                let answer: Value = serde_json::from_str(&out).expect("a SubjectAccessReview");
                (answer["status"]["allowed"] == true).then_some(())
            });
        }
    }

    /// Creates `n` objects `<kind>-<i:05>` in v1, 32 requests at a time.
    pub async fn create(&self, client: &kube::Client, n: usize) {
        self.create_range(client, 0..n).await
    }

    /// Creates the objects `<kind>-<i:05>` for `i` in `range` in v1 (`spec.size` = i), 32 requests at a time.
    pub async fn create_range(&self, client: &kube::Client, range: std::ops::Range<usize>) {
        let (api, ar) = (self.api(client, "v1"), self.resource("v1"));
        let prefix = self.kind.to_lowercase();
        futures::stream::iter(range)
            .map(|i| {
                let (api, ar, prefix) = (api.clone(), ar.clone(), prefix.clone());
                async move {
                    let obj = DynamicObject::new(&format!("{prefix}-{i:05}"), &ar)
                        .data(json!({"spec": {"size": i, "color": "blue"}}));
                    api.create(&PostParams::default(), &obj).await
                }
            })
            .buffer_unordered(32)
            .try_for_each(|_| async { Ok(()) })
            .await
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.name()));
    }

    /// Every object of the resource as kube-apiserver stored it in etcd (JSON, for custom resources): key ->
    /// the stored object.
    pub fn stored_objects(&self, c: &Cluster) -> BTreeMap<String, Value> {
        let prefix = format!("/registry/{}/{}/", self.group, self.plural);
        let out = c.etcdctl(&["get", "--prefix", &prefix, "-w", "json"]);
        let answer: Value = serde_json::from_slice(&out).expect("etcdctl -w json");
        let b64 =
            |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().expect("base64")).expect("base64");
        let kvs = answer["kvs"].as_array().cloned().unwrap_or_default();
        kvs.iter()
            .map(|kv| {
                let key = String::from_utf8(b64(&kv["key"])).expect("key");
                let value = b64(&kv["value"]);
                let obj: Value = serde_json::from_slice(&value).unwrap_or_else(|e| {
                    panic!("{key} is not stored as JSON ({e}): {}", String::from_utf8_lossy(&value))
                });
                (key, obj)
            })
            .collect()
    }

    /// Every stored object's apiVersion: key -> apiVersion.
    pub fn stored(&self, c: &Cluster) -> BTreeMap<String, String> {
        let objects = self.stored_objects(c);
        objects
            .into_iter()
            .map(|(key, obj)| {
                let api_version = obj["apiVersion"].as_str().unwrap_or_else(|| panic!("{key}: {obj}")).to_string();
                (key, api_version)
            })
            .collect()
    }

    /// How many stored objects are in each apiVersion.
    pub fn stored_counts(&self, c: &Cluster) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for v in self.stored(c).into_values() {
            *counts.entry(v).or_default() += 1;
        }
        counts
    }

    /// The storageVersionHash kube-apiserver's discovery publishes for the resource.
    pub fn discovery_hash(&self, c: &Cluster) -> Option<String> {
        let out = c.kubectl(&["get", "--raw", &format!("/apis/{}/v2", self.group)]);
        let list: Value = serde_json::from_slice(&out.stdout).ok()?;
        let r = list["resources"].as_array()?.iter().find(|r| r["name"] == self.plural)?;
        r["storageVersionHash"].as_str().map(str::to_string)
    }

    /// Makes `version` (v1 or v2) the storage version (both stay served), as a user edits the CRD; returns the new
    /// storageVersionHash once discovery publishes it in place of `before`.
    pub fn store_in(&self, c: &Cluster, version: &str, before: &str) -> String {
        let patch = json!([
            {"op": "test", "path": "/spec/versions/0/name", "value": "v1"},
            {"op": "replace", "path": "/spec/versions/0/storage", "value": version == "v1"},
            {"op": "replace", "path": "/spec/versions/1/storage", "value": version == "v2"},
        ]);
        c.kubectl_ok(&["patch", "crd", &self.name(), "--type=json", "-p", &patch.to_string()]);
        super::eventually("discovery to publish the new storage version hash", Duration::from_secs(30), || {
            self.discovery_hash(c).filter(|h| h != before)
        })
    }

    /// Waits until kube-apiserver writes the resource in `version`: a probe object, created and deleted again, is
    /// stored so (discovery may publish a new storage version before every writer uses it).
    pub async fn written_in(&self, c: &Cluster, client: &kube::Client, version: &str) {
        let api = self.api(client, version);
        let probe = format!("{}-probe", self.kind.to_lowercase());
        let want = format!("{}/{version}", self.group);
        let what = format!("kube-apiserver to store {} in {version}", self.name());
        super::eventually_async(&what, Duration::from_secs(60), || async {
            let object = DynamicObject::new(&probe, &self.resource(version)).data(json!({"spec": {}}));
            api.create(&PostParams::default(), &object).await.expect("create the probe");
            let stored = self.stored(c).into_iter().find(|(k, _)| k.ends_with(&format!("/{probe}"))).map(|(_, v)| v);
            api.delete(&probe, &Default::default()).await.expect("delete the probe");
            (stored.as_deref() == Some(want.as_str())).then_some(())
        })
        .await
    }

    /// [`Cr::install`], `n` objects created in v1, then v2 made the storage version: every object is stale. Returns
    /// once kube-apiserver writes the resource in v2, so that a migration started now rewrites every object into v2.
    pub async fn install_stale(&self, c: &Cluster, client: &kube::Client, n: usize) {
        self.install(c);
        self.create(client, n).await;
        let before = super::eventually("the v1 storage version hash in discovery", Duration::from_secs(30), || {
            self.discovery_hash(c)
        });
        self.store_in(c, "v2", &before);
        self.written_in(c, client, "v2").await;
        let counts = self.stored_counts(c);
        assert_eq!(counts, BTreeMap::from([(format!("{}/v1", self.group), n)]), "{}", self.name());
    }

    /// The name of the `i`-th object [`Cr::create`] makes.
    pub fn object_name(&self, i: usize) -> String {
        format!("{}-{i:05}", self.kind.to_lowercase())
    }

    /// Makes kube-apiserver refuse every write (an UPDATE, which a patch is) of the object `name` with a
    /// ValidatingAdmissionPolicy and its binding: 422 Invalid, or with `reason` (e.g. `Forbidden`) its code.
    /// Returns once a server-side dry run of a write of it is refused so.
    pub async fn refuse_writes(&self, c: &Cluster, name: &str, reason: Option<&str>) {
        let policy = format!("refuse-{}-{name}", self.plural);
        let mut validation = json!({"expression": format!("object.metadata.name != '{name}'"),
            "message": format!("{name} is refused by the test's policy")});
        if let Some(reason) = reason {
            validation["reason"] = json!(reason);
        }
        let vap = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [self.group], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": [self.plural]}]},
                "validations": [validation]}});
        let binding = json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy}, "spec": {"policyName": policy, "validationActions": ["Deny"]}});
        c.kubectl_ok_stdin(&["create", "-f", "-"], &format!("{vap}\n{binding}\n"));
        let code = match reason {
            Some("Forbidden") => 403,
            Some(other) => panic!("no code known for reason {other}"),
            None => 422,
        };
        let api = self.api(&c.client().await, "v2");
        let write = Patch::Merge(json!({"metadata": {"annotations": {"probe": "refused?"}}}));
        let params = PatchParams { dry_run: true, ..Default::default() };
        super::eventually_async("kube-apiserver to enforce the policy", Duration::from_secs(60), || async {
            match api.patch(name, &params, &write).await {
                Err(kube::Error::Api(s)) if s.code == code && s.message.contains("refused by the test's policy") => {
                    Some(())
                }
                _ => None,
            }
        })
        .await;
    }

    pub fn crd_json(&self, c: &Cluster) -> Value {
        c.kubectl_json(&["get", "crd", &self.name(), "-o", "json"])
    }
}
