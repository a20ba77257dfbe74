//! The alerts of manifests/monitoring: the rules file and the PrometheusRule hold the same groups, promtool checks
//! them and runs their unit tests (rules_test.yaml), and a real Prometheus (Debian's `prometheus`, started here on a
//! free port) scrapes a server over TLS with a client certificate and fires the shipped alert when a migration fails.

mod common;

use common::*;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/monitoring")
}

fn yaml(file: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(monitoring().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// promtool with `args`, run in manifests/monitoring; fails the test when promtool is missing or says no.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(monitoring())
        .output()
        .expect("promtool (Debian's prometheus package; scripts/install-test-deps.sh installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_prometheusrule_holds_the_groups_of_the_rules_file() {
    let rules = yaml("rules.yaml");
    let rule = yaml("prometheusrule.yaml");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert!(rule["metadata"]["name"].is_string(), "{rule}");
    assert_eq!(rule["spec"]["groups"], rules["groups"]);
    assert_eq!(rule["spec"].as_object().map(|o| o.len()), Some(1), "spec holds groups only: {rule}");
}

/// Where an alert's runbook is: its `## <Alert>` section of docs/operations/runbooks.md on the repository's web page.
fn runbook_url(alert: &str) -> String {
    format!("{}/blob/main/docs/operations/runbooks.md#{}", env!("CARGO_PKG_REPOSITORY"), alert.to_lowercase())
}

#[test]
fn every_alert_names_its_metric_and_has_a_runbook_in_the_docs() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations/runbooks.md");
    let runbooks = std::fs::read_to_string(&path).expect("docs/operations/runbooks.md");
    let rules = yaml("rules.yaml");
    let groups = rules["groups"].as_array().expect("groups");
    for rule in groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()) {
        let alert = rule["alert"].as_str().expect("alert rule");
        let expr = rule["expr"].as_str().expect("expr");
        let description = rule["annotations"]["description"].as_str().expect("description");
        let metric = description.split("(metric ").nth(1).and_then(|m| m.split([')', '{']).next()).expect("metric");
        assert!(expr.contains(metric), "{alert}: its description names {metric}, which its expression does not read");
        assert_eq!(rule["annotations"]["runbook_url"], runbook_url(alert), "{alert}");
        assert!(runbooks.contains(&format!("\n## {alert}\n")), "docs/operations/runbooks.md has no `## {alert}`");
    }
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let check = promtool(&["check", "rules", "rules.yaml"]);
    assert!(check.contains("SUCCESS"), "{check}");
    let test = promtool(&["test", "rules", "rules_test.yaml"]);
    assert!(test.contains("SUCCESS"), "{test}");
}

/// A Prometheus server of its own: config and data in a temporary directory, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `server` every second over TLS with its CA and admin client certificate, and evaluates the shipped
    /// rules file every second.
    fn start(server: &Server) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = server.cert_dir();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: migration-apiserver\n    scheme: https\n    tls_config:\n      \
             ca_file: {ca}\n      cert_file: {cert}\n      key_file: {key}\n    static_configs:\n      \
             - targets: ['127.0.0.1:{port}']\n",
            rules = monitoring().join("rules.yaml").display(),
            ca = certs.join("ca.crt").display(),
            cert = certs.join("admin.crt").display(),
            key = certs.join("admin.key").display(),
            port = server.port,
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's prometheus package; scripts/install-test-deps.sh installs it)");
        Prometheus { child, port, _dir: dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET `path` of Prometheus' HTTP API as JSON; `None` while it does not answer.
    fn get(&self, path: &str) -> Option<serde_json::Value> {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(conn, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut response = String::new();
        conn.read_to_string(&mut response).ok()?;
        let (_, body) = response.split_once("\r\n\r\n")?;
        serde_json::from_str(body).ok()
    }
}

/// The shipped StorageVersionMigrationFailed alert fires, seen through Prometheus' `/api/v1/alerts`, after a
/// migration of a resource the target does not serve has failed.
#[test]
fn a_failed_migration_fires_its_alert_in_a_real_prometheus() {
    // A scheduler flag runs the embedded scheduler (the test servers run without one otherwise).
    let server = Server::start(&["--discovery-interval", "10m"]);
    let prometheus = Prometheus::start(&server);
    // Prometheus scrapes the server with the client certificate: the target is up.
    eventually("Prometheus to scrape the server", Duration::from_secs(60), || {
        let targets = prometheus.get("/api/v1/targets")?;
        let up = targets["data"]["activeTargets"].as_array()?.iter().any(|t| t["health"] == "up");
        up.then_some(())
    });
    let manifest = "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  name: widgets\n\
                    spec:\n  resource:\n    group: example.com\n    version: v1\n    resource: widgets\n";
    assert!(server.kubectl_stdin(&["create", "-f", "-"], manifest).status.success());
    let resource = "example.com/v1, Resource=widgets";
    let alert = eventually("StorageVersionMigrationFailed to fire", Duration::from_secs(60), || {
        let alerts = prometheus.get("/api/v1/alerts")?;
        alerts["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|a| {
                a["labels"]["alertname"] == "StorageVersionMigrationFailed"
                    && a["labels"]["resource"] == resource
                    && a["state"] == "firing"
            })
            .cloned()
    });
    assert_eq!(alert["labels"]["status"], "Failed", "{alert}");
    assert_eq!(alert["labels"]["severity"], "warning", "{alert}");
    assert_eq!(alert["annotations"]["runbook_url"], runbook_url("StorageVersionMigrationFailed"), "{alert}");
    // Only that resource failed: the scheduler's own migrations at start-up succeeded and fire nothing.
    let alerts = prometheus.get("/api/v1/alerts").expect("alerts");
    let failed: Vec<_> = alerts["data"]["alerts"]
        .as_array()
        .map(|a| a.iter().filter(|a| a["labels"]["alertname"] == "StorageVersionMigrationFailed").collect())
        .unwrap_or_default();
    assert_eq!(failed.len(), 1, "{alerts}\n{}", prometheus.log());
}

/// `/metrics` answers in the text format 0.0.4 even to a scraper that prefers OpenMetrics (as kube-apiserver's
/// handler, which does not offer it), counters without OpenMetrics' `_total`, and a dry run counted with
/// `dry_run="All"` as kube-apiserver counts it.
#[tokio::test]
async fn metrics_are_the_text_format_whatever_the_accept_header() {
    let server = Server::start(&[]);
    let client = server.client().await;
    let state = serde_json::json!({
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageState",
        "metadata": {"name": "pods"},
        "spec": {"resource": {"resource": "pods"}},
    });
    let create = http::Request::post("/apis/migration.k8s.io/v1alpha1/storagestates?dryRun=All")
        .header("content-type", "application/json")
        .body(state.to_string().into_bytes())
        .expect("request");
    client.request_text(create).await.expect("dry-run create");
    let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let scrape = http::Request::get("/metrics")
        .header("accept", prometheus_accept)
        .body(kube::client::Body::empty())
        .expect("request");
    let response = client.send(scrape).await.expect("/metrics");
    assert_eq!(response.status(), 200);
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
    assert_eq!(content_type.as_deref(), Some("text/plain; version=0.0.4; charset=utf-8"));
    let body = http_body_util::BodyExt::collect(response.into_body()).await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(!text.contains("# EOF") && !text.contains("_created"), "{text}");
    assert!(text.contains("# TYPE apiserver_request_total counter\n"), "{text}");
    let dry_run = text.lines().find(|l| {
        l.starts_with("apiserver_request_total{") && l.contains("dry_run=\"All\"") && l.contains("verb=\"POST\"")
    });
    assert!(dry_run.is_some_and(|l| l.contains("code=\"201\"") && l.ends_with(" 1")), "{text}");
    // The serving certificate's expiry is the notAfter of the certificate the server presents.
    let pem = std::fs::read(server.cert_dir().join("apiserver.crt")).expect("serving certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("pem");
    let not_after = pem.parse_x509().expect("certificate").validity().not_after.timestamp();
    let expiry = text
        .lines()
        .find_map(|l| l.strip_prefix("migration_apiserver_serving_certificate_expiration_timestamp_seconds "))
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(expiry, Some(not_after as f64), "{text}");
}

/// The shipped EncryptionConfigReloadFailed alert fires in a real Prometheus once a malformed encryption provider
/// config is written while the server reloads it automatically.
#[test]
fn a_failed_encryption_config_reload_fires_its_alert_in_a_real_prometheus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("encryption.yaml");
    let config = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
                  [\"shootstates.core.gardener.cloud\"]\n  providers:\n  - identity: {}\n";
    std::fs::write(&path, config).expect("write");
    let file = path.display().to_string();
    let server =
        Server::start(&["--encryption-provider-config", &file, "--encryption-provider-config-automatic-reload"]);
    let prometheus = Prometheus::start(&server);
    eventually("Prometheus to scrape the server", Duration::from_secs(60), || {
        let targets = prometheus.get("/api/v1/targets")?;
        let up = targets["data"]["activeTargets"].as_array()?.iter().any(|t| t["health"] == "up");
        up.then_some(())
    });
    let tmp = dir.path().join("encryption.tmp");
    std::fs::write(&tmp, "kind: EncryptionConfiguration\nresources: [not closed\n").expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    let alert = eventually("EncryptionConfigReloadFailed to fire", Duration::from_secs(60), || {
        let alerts = prometheus.get("/api/v1/alerts")?;
        alerts["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == "EncryptionConfigReloadFailed" && a["state"] == "firing")
            .cloned()
    });
    assert_eq!(alert["labels"]["status"], "failure", "{alert}");
    assert_eq!(alert["labels"]["severity"], "warning", "{alert}");
    let id_hash = alert["labels"]["apiserver_id_hash"].as_str().unwrap_or_default();
    assert!(id_hash.starts_with("sha256:") && id_hash.len() == 7 + 64, "{alert}");
    assert_eq!(alert["annotations"]["runbook_url"], runbook_url("EncryptionConfigReloadFailed"), "{alert}");
}
