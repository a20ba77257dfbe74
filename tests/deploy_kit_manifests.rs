//! The deploy kit (manifests/, apiservice/, scripts/deploy.sh) rendered and checked offline: least-privilege RBAC
//! whose every rule is used by the code, the APIServices and the cert-manager alternative, and `make deploy` filling
//! the CA bundles and the serving Secret.

mod common;
use common::status::strings;
use common::*;
use std::collections::BTreeSet;
use std::path::Path;

use base64::Engine;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use serde_json::{json, Value};
use std::sync::Arc;

fn kustomize(dir: &Path) -> Vec<Value> {
    let out = std::process::Command::new("kubectl").arg("kustomize").arg(dir).output().expect("run kubectl kustomize");
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    documents(&String::from_utf8(out.stdout).expect("utf8"))
}

fn documents(text: &str) -> Vec<Value> {
    text.split("\n---\n").map(|d| serde_yaml_ng::from_str::<Value>(d).expect("YAML")).filter(|v| !v.is_null()).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The migrator's chunked LIST, of the objects' metadata.
const MIGRATOR_LIST: &str = "Request::new(&url).list_metadata(";

/// Every rule of our ClusterRole and Role, one row per (apiGroup, resource, verb), with the code that makes the
/// request: a rule that is not in this table, or a row whose rule is gone, fails the test. Rows name a source file
/// and a string that file must contain, so a rule whose user disappears fails too.
const RULES_IN_USE: &[(&str, &str, &str, &str, &str)] = &[
    // The migrator (src/scheduler/migrator.rs): chunked LIST, then one JSON merge patch per object.
    ("core.gardener.cloud", "shootstates", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("core.gardener.cloud", "shootstates", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    // storagemigration.k8s.io StorageVersionMigrations: served in two versions, so migrated like ShootStates.
    ("storagemigration.k8s.io", "storageversionmigrations", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    (
        "storagemigration.k8s.io",
        "storageversionmigrations",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    ("apps", "deployments", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("apps", "deployments", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("apps", "statefulsets", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("apps", "statefulsets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("apps", "daemonsets", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("apps", "daemonsets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("apps", "replicasets", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("apps", "replicasets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("batch", "cronjobs", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("batch", "cronjobs", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("batch", "jobs", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("batch", "jobs", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("autoscaling", "horizontalpodautoscalers", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    (
        "autoscaling",
        "horizontalpodautoscalers",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    ("policy", "poddisruptionbudgets", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    ("policy", "poddisruptionbudgets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("flowcontrol.apiserver.k8s.io", "flowschemas", "list", "src/scheduler/migrator/target.rs", MIGRATOR_LIST),
    (
        "flowcontrol.apiserver.k8s.io",
        "flowschemas",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
        "list",
        "src/scheduler/migrator/target.rs",
        MIGRATOR_LIST,
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    // A custom resource's CRD after its migration (src/scheduler/migrator/crd.rs): read, then its status updated.
    ("apiextensions.k8s.io", "customresourcedefinitions", "get", "src/scheduler/migrator/crd.rs", "self.api.get_opt("),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions/status",
        "update",
        "src/scheduler/migrator/crd.rs",
        "self.api.replace_status(",
    ),
    // Leader election among replicas (src/scheduler/election/lease.rs): one Lease in our namespace, read before
    // every write, created once, renewed with a compare-and-swap update.
    ("coordination.k8s.io", "leases", "get", "src/scheduler/election/lease.rs", "self.api.get_opt("),
    ("coordination.k8s.io", "leases", "create", "src/scheduler/election/lease.rs", "self.api.create("),
    ("coordination.k8s.io", "leases", "update", "src/scheduler/election/lease.rs", "self.api.replace("),
    // The scheduler's Events (src/scheduler/events/mod.rs): created, and a repeated one's series patched.
    ("events.k8s.io", "events", "create", "src/scheduler/events/mod.rs", "api.create("),
    ("events.k8s.io", "events", "patch", "src/scheduler/events/mod.rs", "api.patch("),
    // Cluster safety (src/server/cluster_check/): whether one of our APIServices hides a group the cluster serves
    // itself, or a group we serve is routed elsewhere (it also reads our kinds' CRDs by name: the `get` above).
    ("apiregistration.k8s.io", "apiservices", "list", "src/server/cluster_check/mod.rs", "api.list("),
    // Cluster key rotation (src/scheduler/cluster_encryption/): the kube-apiservers' identity Leases in
    // kube-system, listed and watched by label (a reflector), and /metrics (a nonResourceURL: group "", the URL as
    // the resource).
    ("coordination.k8s.io", "leases", "list", "src/scheduler/cluster_encryption/reconciler.rs", LEASE_REFLECTOR),
    ("coordination.k8s.io", "leases", "watch", "src/scheduler/cluster_encryption/reconciler.rs", LEASE_REFLECTOR),
    ("", "/metrics", "get", "src/scheduler/cluster_encryption/observe.rs", "Request::get(\"/metrics\")"),
];

/// The identity Leases' watcher, which lists and then watches them.
const LEASE_REFLECTOR: &str = "watcher(api, watcher::Config::default().labels(IDENTITY_LABEL))";

/// The merge patch the migrator sends (the patch verb, not update): kube-core's `Patch::Merge`, sent as
/// `application/merge-patch+json`.
const MIGRATOR_PATCH_TYPE: &str = "Patch::Merge(";

#[test]
fn manifests_render_least_privilege_and_every_rule_is_used() {
    let docs = kustomize(&repo().join("manifests"));
    let mut kinds: Vec<String> = docs.iter().map(|d| d["kind"].as_str().unwrap_or_default().to_string()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Namespace",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    let sa = json!({"kind": "ServiceAccount", "name": "migration-apiserver", "namespace": "migration-apiserver"});

    // No wildcard anywhere, no cluster-admin, and the rules are exactly the table.
    let mut granted = BTreeSet::new();
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role") {
        for rule in role["rules"].as_array().expect("rules") {
            for field in ["apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"] {
                assert!(!strings(&rule[field]).iter().any(|v| v.contains('*')), "wildcard in {field}: {rule}");
            }
            // Discovery needs no rule (system:discovery); /metrics is the one nonResourceURL, in the table.
            for u in strings(&rule["nonResourceURLs"]) {
                for v in strings(&rule["verbs"]) {
                    assert!(granted.insert((String::new(), u.clone(), v)), "duplicate grant in {rule}");
                }
            }
            for g in strings(&rule["apiGroups"]) {
                for r in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        assert!(granted.insert((g.clone(), r.clone(), v)), "duplicate grant in {rule}");
                    }
                }
            }
        }
    }
    let table: BTreeSet<(String, String, String)> =
        RULES_IN_USE.iter().map(|(g, r, v, _, _)| (g.to_string(), r.to_string(), v.to_string())).collect();
    assert_eq!(granted, table, "manifests/rbac.yaml and RULES_IN_USE differ");
    for (g, r, v, file, needle) in RULES_IN_USE {
        if file.is_empty() {
            continue; // planned; see the row's comment
        }
        let source = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(source.contains(needle), "{v} {r}.{g}: {file} no longer contains {needle:?}");
    }
    let migrator = std::fs::read_to_string(repo().join("src/scheduler/migrator/target.rs")).expect("migrator");
    assert!(migrator.contains(MIGRATOR_PATCH_TYPE), "the migrator's no-op write is a merge patch: verb patch");
    let leases = find(&docs, "Role", "migration-apiserver-leader-election");
    assert_eq!(leases["metadata"]["namespace"], "migration-apiserver", "a Role in our namespace, not a ClusterRole");
    // get and update only for the Lease the server uses by default (--leader-elect-resource-name).
    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    for rule in leases["rules"].as_array().expect("rules") {
        if strings(&rule["verbs"]).iter().any(|v| v == "get" || v == "update") {
            assert_eq!(strings(&rule["resourceNames"]), ["migration-apiserver"], "{rule}");
        }
    }
    assert!(help.contains("--leader-elect-resource-name") && help.contains("[default: migration-apiserver]"), "{help}");

    // Bindings: our roles, system:auth-delegator (TokenReview, SubjectAccessReview) and the ConfigMap reader in
    // kube-system; that the server asks a real kube-apiserver for nothing beyond them is checked in
    // tests/cluster_delegation.rs (delegated_authentication_and_authorization).
    for (kind, name, role_kind, role) in [
        ("ClusterRoleBinding", "migration-apiserver", "ClusterRole", "migration-apiserver"),
        ("ClusterRoleBinding", "migration-apiserver:system:auth-delegator", "ClusterRole", "system:auth-delegator"),
        (
            "RoleBinding",
            "migration-apiserver:extension-apiserver-authentication-reader",
            "Role",
            "extension-apiserver-authentication-reader",
        ),
        ("RoleBinding", "migration-apiserver-leader-election", "Role", "migration-apiserver-leader-election"),
        ("RoleBinding", "migration-apiserver-apiserver-identities", "Role", "migration-apiserver-apiserver-identities"),
    ] {
        let b = find(&docs, kind, name);
        assert_eq!(b["roleRef"], json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}));
        assert_eq!(b["subjects"], json!([sa]), "{name}");
        assert!(!b["roleRef"]["name"].as_str().unwrap_or_default().contains("admin"));
    }
    assert_eq!(
        find(&docs, "RoleBinding", "migration-apiserver:extension-apiserver-authentication-reader")["metadata"]
            ["namespace"],
        "kube-system"
    );
    let identities = find(&docs, "Role", "migration-apiserver-apiserver-identities");
    assert_eq!(identities["metadata"]["namespace"], "kube-system", "only kube-system's Leases");
    assert_eq!(
        find(&docs, "RoleBinding", "migration-apiserver-apiserver-identities")["metadata"]["namespace"],
        "kube-system"
    );

    // The Deployment: probes on the HTTPS port, resource requests, the serving Secret, our ServiceAccount.
    let d = find(&docs, "Deployment", "migration-apiserver");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "migration-apiserver");
    let c = &pod["containers"][0];
    assert_eq!(c["ports"][0], json!({"name": "https", "containerPort": 8443, "protocol": "TCP"}));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")] {
        assert_eq!(c[probe]["httpGet"], json!({"path": path, "port": "https", "scheme": "HTTPS"}), "{probe}");
    }
    assert!(c["resources"]["requests"]["cpu"].is_string() && c["resources"]["requests"]["memory"].is_string());
    let args = strings(&c["args"]);
    for flag in
        ["--bind-address=0.0.0.0", "--secure-port=8443", "--tls-cert-file=/etc/migration-apiserver/serving/tls.crt"]
    {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    let serving =
        pod["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == "serving").expect("serving volume");
    assert_eq!(serving["secret"]["secretName"], "migration-apiserver-serving");
    // Audited with the recommended policy: its ConfigMap (the file's bytes) mounted read-only, the log on stdout.
    let policy = find(&docs, "ConfigMap", "migration-apiserver-audit-policy");
    assert_eq!(policy["metadata"]["namespace"], "migration-apiserver");
    let recommended = std::fs::read_to_string(repo().join("manifests/audit/policy.yaml")).expect("policy.yaml");
    assert_eq!(policy["data"]["policy.yaml"].as_str(), Some(recommended.as_str()));
    let volume = pod["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == "audit-policy");
    assert_eq!(volume.expect("audit-policy volume")["configMap"]["name"], "migration-apiserver-audit-policy");
    let mount = c["volumeMounts"].as_array().expect("mounts").iter().find(|m| m["name"] == "audit-policy");
    let mount = mount.expect("audit-policy mount");
    assert_eq!(mount["readOnly"], true);
    let policy_flag = format!("--audit-policy-file={}/policy.yaml", mount["mountPath"].as_str().expect("mountPath"));
    for flag in [policy_flag.as_str(), "--audit-log-path=-"] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    // The flags in the Deployment exist.
    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap_or_default();
        assert!(help.contains(flag), "{flag} is not a serve flag");
    }

    let svc = find(&docs, "Service", "migration-apiserver");
    assert_eq!(svc["spec"]["ports"], json!([{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]));
    assert_eq!(svc["spec"]["selector"], d["spec"]["selector"]["matchLabels"]);
    let pdb = find(&docs, "PodDisruptionBudget", "migration-apiserver");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], d["spec"]["selector"]["matchLabels"]);
}

#[test]
fn apiservices_and_the_cert_manager_alternative() {
    let apiservices = kustomize(&repo().join("apiservice"));
    let mut names: Vec<&str> = apiservices.iter().filter_map(|a| a["metadata"]["name"].as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "v1.storagemigration.k8s.io",
            "v1alpha1.core.gardener.cloud",
            "v1alpha1.migration.k8s.io",
            "v1beta1.core.gardener.cloud",
            "v1beta1.storagemigration.k8s.io"
        ]
    );
    let certificates = kustomize(&repo().join("manifests/cert-manager"));
    let serving = find(&certificates, "Certificate", "migration-apiserver-serving");
    assert_eq!(serving["spec"]["secretName"], "migration-apiserver-serving");
    assert!(strings(&serving["spec"]["dnsNames"]).contains(&"migration-apiserver.migration-apiserver.svc".to_string()));
    let issuer = serving["spec"]["issuerRef"]["name"].as_str().expect("issuer");
    find(&certificates, "Issuer", issuer);
    let webhooks = kustomize(&repo().join("manifests/webhooks"));
    let configurations =
        webhooks.iter().filter(|w| w["kind"].as_str().unwrap_or_default().ends_with("WebhookConfiguration"));
    for a in apiservices.iter().chain(configurations) {
        // cert-manager's CA injector fills caBundle from this Certificate.
        assert_eq!(
            a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "migration-apiserver/migration-apiserver-serving",
            "{a}"
        );
    }
    for a in &apiservices {
        let name = a["metadata"]["name"].as_str().expect("name");
        assert_eq!(
            format!("{}.{}", a["spec"]["version"].as_str().expect("v"), a["spec"]["group"].as_str().expect("g")),
            name
        );
        assert_eq!(
            a["spec"]["service"],
            json!({"namespace": "migration-apiserver", "name": "migration-apiserver", "port": 443})
        );
        assert!(a["spec"].get("insecureSkipTLSVerify").is_none());
    }
    // The webhook callers' RBAC covers exactly the two webhook paths, POST.
    let caller = kustomize(&repo().join("manifests/webhook-caller"));
    let role = find(&caller, "ClusterRole", "migration-apiserver:webhook-caller");
    assert_eq!(role["rules"], json!([{"nonResourceURLs": ["/validate", "/mutate"], "verbs": ["post"]}]));
}

#[test]
fn make_deploy_fills_ca_bundles_and_the_serving_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let out = std::process::Command::new(BIN)
        .args(["certs", "--cert-dir"])
        .arg(&certs)
        .args(["--service-namespace", "migration-apiserver"])
        .output()
        .expect("certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ca = std::fs::read_to_string(certs.join("ca.crt")).expect("ca");
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let serving = std::fs::read_to_string(certs.join("apiserver.crt")).expect("serving");
    let render = |form: &str, image: &str| {
        let out = std::process::Command::new("bash")
            .arg(repo().join("scripts/deploy.sh"))
            .env("CERT_DIR", &certs)
            .env("FORM", form)
            .env("IMAGE", image)
            .env("DRY_RUN", "1")
            // Rendered without a cluster (tests/storagemigration_safety.rs asks the cluster stand-in).
            .env("IN_TREE_GROUPS", "register")
            .env("OFFLINE", "1")
            .env("MIGRATION_APISERVER", BIN)
            .output()
            .expect("deploy.sh");
        assert!(out.status.success(), "deploy.sh FORM={form}: {}", String::from_utf8_lossy(&out.stderr));
        documents(&String::from_utf8(out.stdout).expect("utf8"))
    };

    let docs = render("aggregated", "registry.example.com/migration-apiserver:v1");
    let apiservices: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "APIService").collect();
    assert_eq!(apiservices.len(), 5);
    for a in &apiservices {
        assert_eq!(a["spec"]["caBundle"], ca_bundle.as_str(), "{}", a["metadata"]["name"]);
    }
    let secret = find(&docs, "Secret", "migration-apiserver-serving");
    assert_eq!(
        (secret["type"].as_str(), secret["metadata"]["namespace"].as_str()),
        (Some("kubernetes.io/tls"), Some("migration-apiserver"))
    );
    let tls_crt = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["tls.crt"].as_str().expect("tls.crt").replace(char::is_whitespace, ""))
        .expect("b64");
    assert_eq!(String::from_utf8(tls_crt).expect("utf8"), serving);
    let d = find(&docs, "Deployment", "migration-apiserver");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "registry.example.com/migration-apiserver:v1");
    assert!(!docs.iter().any(|d| d["kind"] == "CustomResourceDefinition"), "one form at a time");
    // Both forms install the roles for people (tests/roles.rs checks what they grant).
    for role in ["migration-apiserver:aggregate-to-view", "migration-apiserver:aggregate-to-edit"] {
        find(&docs, "ClusterRole", role);
    }

    // The serving certificate made by `make certs` is valid for the in-cluster name the aggregator dials.
    let roots = {
        let mut r = RootCertStore::empty();
        r.add(CertificateDer::from_pem_slice(ca.as_bytes()).expect("pem")).expect("root");
        Arc::new(r)
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let verifier = rustls::client::WebPkiServerVerifier::builder(roots).build().expect("verifier");
    let cert = CertificateDer::from_pem_slice(serving.as_bytes()).expect("pem");
    let name = ServerName::try_from("migration-apiserver.migration-apiserver.svc").expect("name");
    rustls::client::danger::ServerCertVerifier::verify_server_cert(
        verifier.as_ref(),
        &cert,
        &[],
        &name,
        &[],
        rustls::pki_types::UnixTime::now(),
    )
    .expect("serving certificate valid for migration-apiserver.migration-apiserver.svc");

    let docs = render("crds", "");
    assert!(!docs.iter().any(|d| d["kind"] == "APIService"), "one form at a time");
    assert_eq!(docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").count(), 4);
    // The CRD form's objects are the committed manifests' (deploy-check writes them with the same generator).
    let committed = |dir: &str| -> Vec<Value> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(repo().join(dir)).expect("dir") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.ends_with(".yaml") && name != "kustomization.yaml" {
                out.extend(documents(&std::fs::read_to_string(&path).expect("read")));
            }
        }
        out
    };
    for want in committed("manifests/crds").into_iter().chain(committed("manifests/webhooks")) {
        let (kind, name) = (want["kind"].as_str().expect("kind"), want["metadata"]["name"].as_str().expect("name"));
        let mut got = find(&docs, kind, name).clone();
        // The rendering adds the CA and puts objects in their namespace.
        if let Some(hooks) = got["webhooks"].as_array_mut() {
            for h in hooks {
                h["clientConfig"].as_object_mut().map(|c| c.remove("caBundle"));
            }
        }
        assert_eq!(got["spec"], want["spec"], "{kind} {name}");
        assert_eq!(got["webhooks"], want["webhooks"], "{kind} {name}");
    }
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        find(&docs, kind, "migration-apiserver");
    }
    // Every webhook of every configuration gets the CA.
    let configurations: Vec<&Value> =
        docs.iter().filter(|d| d["kind"].as_str().unwrap_or_default().ends_with("WebhookConfiguration")).collect();
    for w in &configurations {
        for hook in w["webhooks"].as_array().expect("webhooks") {
            assert_eq!(hook["clientConfig"]["caBundle"], ca_bundle.as_str(), "{}", w["metadata"]["name"]);
        }
    }
    // The CA bundle's ConfigMap is local only (kustomize drops it); the one ConfigMap applied is the audit policy's,
    // which manifests/ has had since the Deployment audits (issue 37).
    let config_maps: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "ConfigMap").collect();
    assert_eq!(config_maps.len(), 1, "{config_maps:?}");
    assert_eq!(config_maps[0]["metadata"]["name"], "migration-apiserver-audit-policy");
    find(&docs, "ClusterRoleBinding", "migration-apiserver:webhook-caller");
    for role in ["migration-apiserver:aggregate-to-view", "migration-apiserver:aggregate-to-edit"] {
        find(&docs, "ClusterRole", role);
    }
    let d = find(&docs, "Deployment", "migration-apiserver");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "migration-apiserver:dev");
}
