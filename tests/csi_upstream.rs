//! csi-translation-lib's own tests (the `*_test.go` files of `plugins/` and `translate_test.go`), re-expressed as
//! tables in `tests/csi_upstream/`: one module per upstream file, its header naming the file and the commit it
//! follows. Every case runs twice — through `migration-apiserver translate` (the real binary, stdin to stdout) and
//! through the CSITranslation API of a running server — and both must give what upstream expects.
//!
//! How a Go case becomes a row (why a row may not look like its original):
//! - Upstream calls a plugin's method; we call the library's entry points, as the command and the API do. The
//!   plugin is then chosen by the volume source, the StorageClass's provisioner or the CSI driver, so inputs carry
//!   the provisioner or driver that selects the plugin the Go test called, and a case without any source gets the
//!   entry point's error (`could not find in-tree plugin translation logic for "<name>"`) rather than the plugin's.
//! - The entry point gives inline volumes `volumeMode: Filesystem`, so expected inline PVs have it.
//! - Objects are JSON as Go encodes them: zero values and empty maps are absent.
//! - A nil object (`pv: nil`) has no JSON form: those cases are left out.
//! - Where upstream only asks for an error, the row asks for the exact message the upstream source produces.
//! - A helper the Go test calls directly (`getAwsRegionFromZones`, `getDiskName`, `addTopology`, ...) is reached
//!   through the translation that calls it, with the header of the table saying which.

mod common;
#[path = "csi_upstream/mod.rs"]
mod tables;

use common::requests::post;
use common::{translate_cli, Server, BIN};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use tables::{Case, Failure, Input, Outcome};

const TRANSLATIONS: &str = "/apis/migration.k8s.io/v1alpha1/csitranslations";

// ---------------------------------------------------------------------------------------------------------------
// the two ways in

/// `migration-apiserver translate <args>` with `doc` as JSON on stdin.
fn translate_command(args: &[&str], doc: Option<&Value>) -> Outcome {
    let input = doc.map(|d| serde_json::to_vec(d).expect("json")).unwrap_or_default();
    let out = translate_cli(args, &input);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(if doc.is_some() {
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("translate printed no JSON ({e}): {stdout}"))
        } else {
            Value::from(stdout.strip_suffix('\n').unwrap_or(&stdout))
        });
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let message = stderr.strip_prefix("error: ").unwrap_or_else(|| panic!("not the command's error: {stderr}"));
    Err(Failure::Message(message.strip_suffix('\n').unwrap_or(message).to_string()))
}

pub fn cli(input: &Input) -> Outcome {
    match input {
        Input::PvToCsi(v) | Input::StorageClass(v) => translate_command(&[], Some(v)),
        Input::PvToInTree(v) => translate_command(&["--to-intree"], Some(v)),
        Input::RoundTrip(v) => translate_command(&["--to-intree"], Some(&translate_command(&[], Some(v))?)),
        Input::Inline(v, "") => translate_command(&[], Some(v)),
        Input::Inline(v, ns) => translate_command(&["--pod-namespace", ns], Some(v)),
        Input::Repair { driver, handle, node } => {
            translate_command(&["--repair-volume-handle", handle, "--driver", driver, "--node-id", node], None)
        }
    }
}

/// Creates a CSITranslation with `spec`; the status's result (`field`) or error.
async fn create(c: &kube::Client, spec: Value, field: &str) -> Outcome {
    let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation", "spec": spec});
    let r = post(c, TRANSLATIONS, &body).await;
    if r.status == 422 {
        let causes = r.json()["details"]["causes"].as_array().cloned().unwrap_or_default();
        return Err(Failure::Invalid(causes.iter().map(|c| c["field"].as_str().unwrap_or("").to_string()).collect()));
    }
    let status = r.ok(201)["status"].clone();
    match status.get("error").and_then(Value::as_str) {
        Some(e) => Err(Failure::Message(e.to_string())),
        None => Ok(status.get(field).cloned().unwrap_or_else(|| panic!("no status.{field}: {status}"))),
    }
}

pub async fn api(c: &kube::Client, input: &Input) -> Outcome {
    match input {
        Input::PvToCsi(v) => create(c, json!({"persistentVolume": v}), "persistentVolume").await,
        Input::PvToInTree(v) => {
            create(c, json!({"persistentVolume": v, "direction": "ToInTree"}), "persistentVolume").await
        }
        Input::RoundTrip(v) => {
            let csi = create(c, json!({"persistentVolume": v}), "persistentVolume").await?;
            create(c, json!({"persistentVolume": csi, "direction": "ToInTree"}), "persistentVolume").await
        }
        Input::Inline(v, ns) => create(c, json!({"inlineVolume": v, "podNamespace": ns}), "persistentVolume").await,
        Input::StorageClass(v) => create(c, json!({"storageClass": v}), "storageClass").await,
        Input::Repair { driver, handle, node } => {
            let spec = json!({"repairVolumeHandle": {"driverName": driver, "volumeHandle": handle, "nodeID": node}});
            create(c, spec, "volumeHandle").await
        }
    }
}

/// Runs every case of `table` through the command and the API; fails listing every case that did not pass.
async fn run(table: &str, cases: Vec<Case>) {
    assert!(!cases.is_empty(), "{table}: no cases");
    let server = Server::start(&["--disable-scheduler"]);
    let client = server.client().await;
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(e) = case.expect.check(&cli(&case.input), false) {
            failures.push(format!("{}: translate: {e}", case.name));
        }
        if let Err(e) = case.expect.check(&api(&client, &case.input).await, true) {
            failures.push(format!("{}: API: {e}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{table} (upstream {}): {} of {} checks failed:\n{}",
        tables::UPSTREAM_COMMIT,
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------------------
// one test per upstream file

#[tokio::test]
async fn plugins_gce_pd_test() {
    run("plugins/gce_pd_test.go", tables::gce_pd::cases()).await;
}

#[tokio::test]
async fn plugins_aws_ebs_test() {
    run("plugins/aws_ebs_test.go", tables::aws_ebs::cases()).await;
}

#[tokio::test]
async fn plugins_azure_disk_test() {
    run("plugins/azure_disk_test.go", tables::azure_disk::cases()).await;
}

#[tokio::test]
async fn plugins_azure_file_test() {
    run("plugins/azure_file_test.go", tables::azure_file::cases()).await;
}

#[tokio::test]
async fn plugins_openstack_cinder_test() {
    run("plugins/openstack_cinder_test.go", tables::openstack_cinder::cases()).await;
}

#[tokio::test]
async fn plugins_vsphere_volume_test() {
    run("plugins/vsphere_volume_test.go", tables::vsphere_volume::cases()).await;
}

#[tokio::test]
async fn plugins_portworx_test() {
    run("plugins/portworx_test.go", tables::portworx::cases()).await;
}

#[tokio::test]
async fn plugins_in_tree_volume_test() {
    run("plugins/in_tree_volume_test.go", tables::in_tree_volume::cases()).await;
}

#[tokio::test]
async fn translate_test() {
    run("translate_test.go", tables::translate::cases()).await;
}

/// translate_test.go TestTranslateInTreeInlineVolumeToCSINameUniqueness: for every driver, inline volumes of two
/// freshly generated sources get PVs of different names (the name is the unique part of the staging path).
#[tokio::test]
async fn translate_test_inline_volume_names_are_unique() {
    let server = Server::start(&["--disable-scheduler"]);
    let client = server.client().await;
    let drivers = tables::translate::UNIQUE_SOURCE_DRIVERS;
    assert_eq!(drivers.len(), 7, "every plugin");
    for driver in drivers {
        let (a, b) = (tables::translate::unique_volume(driver), tables::translate::unique_volume(driver));
        let name = |o: Outcome| match o {
            Ok(pv) => pv["metadata"]["name"].as_str().unwrap_or_else(|| panic!("{driver}: no name: {pv}")).to_string(),
            Err(e) => panic!("{driver}: {e:?}"),
        };
        let (a, b) = (Input::Inline(a, ""), Input::Inline(b, ""));
        let (cli_a, cli_b) = (name(cli(&a)), name(cli(&b)));
        assert_ne!(cli_a, cli_b, "{driver}: translate: PV name not unique per volume");
        let (api_a, api_b) = (name(api(&client, &a).await), name(api(&client, &b).await));
        assert_ne!(api_a, api_b, "{driver}: API: PV name not unique per volume");
        assert_eq!(cli_a, api_a, "{driver}: the command and the API agree");
    }
}

/// translate_test.go TestPluginNameMappings: the in-tree plugin and the CSI driver map to each other. The API
/// names both in its status; the command's PV names the driver, and the driver's handles repair (a driver without
/// a plugin cannot).
#[tokio::test]
async fn translate_test_plugin_name_mappings() {
    let server = Server::start(&["--disable-scheduler"]);
    let client = server.client().await;
    for (plugin, driver, source) in tables::translate::PLUGIN_NAMES {
        let input = Input::PvToCsi(tables::pv(json!({"name": "p"}), source()));
        let out = cli(&input).unwrap_or_else(|e| panic!("{plugin}: {e:?}"));
        assert_eq!(out["spec"]["csi"]["driver"], *driver, "{plugin}");
        let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation",
            "spec": {"persistentVolume": tables::pv(json!({"name": "p"}), source())}});
        let status = post(&client, TRANSLATIONS, &body).await.ok(201)["status"].clone();
        assert_eq!((&status["inTreePluginName"], &status["driverName"]), (&json!(plugin), &json!(driver)));
        let repair = Input::Repair { driver, handle: "h/h/h/h/h/h".into(), node: "n/n/n/n/n/n".into() };
        assert!(cli(&repair).is_ok() && api(&client, &repair).await.is_ok(), "{driver} is a migrated driver");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// how RepairVolumeHandle is exposed (ours, not upstream's; the tables above use it): the command's flags, the
// API's validation and schema

#[tokio::test]
async fn repair_volume_handle_through_the_command_and_the_api() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("translate").args(args).stdin(Stdio::null()).output().expect("run translate");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let handle = "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d";
    let node = "projects/p/zones/europe-west1-b/instances/n";
    // A line on stdout, nothing read from stdin.
    let (code, out, err) =
        run(&["--repair-volume-handle", handle, "--driver", "pd.csi.storage.gke.io", "--node-id", node]);
    assert_eq!((code, out.as_str()), (Some(0), "projects/p/zones/europe-west1-b/disks/d\n"), "{err}");
    // The node ID is optional: the library takes it as "" (GCE then says the node handle is short).
    let (code, _, err) = run(&["--repair-volume-handle", handle, "--driver", "pd.csi.storage.gke.io"]);
    assert_eq!(code, Some(1));
    assert_eq!(err, "error: node handle has wrong number of elements; got 1, wanted 6 or more\n");
    // Usage errors: the driver is required, the translation flags do not combine with a repair, the repair flags
    // need one.
    for args in [
        &["--repair-volume-handle", handle][..],
        &["--repair-volume-handle", handle, "--driver", "ebs.csi.aws.com", "--to-intree"],
        &["--repair-volume-handle", handle, "--driver", "ebs.csi.aws.com", "--pod-namespace", "ns"],
        &["--driver", "ebs.csi.aws.com"],
        &["--node-id", node],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }

    // The API: one object per request, and a repair has no direction but ToCSI.
    let server = Server::start(&["--disable-scheduler"]);
    let client = server.client().await;
    let repair = json!({"driverName": "pd.csi.storage.gke.io", "volumeHandle": handle, "nodeID": node});
    for (spec, field) in [
        (
            json!({"repairVolumeHandle": repair, "storageClass": {"provisioner": "kubernetes.io/gce-pd"}}),
            "spec.repairVolumeHandle",
        ),
        (json!({"repairVolumeHandle": repair, "direction": "ToInTree"}), "spec.direction"),
    ] {
        let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation", "spec": spec});
        let status = post(&client, TRANSLATIONS, &body).await.status_err(422, "Invalid");
        let causes = status["details"]["causes"].as_array().cloned().unwrap_or_default();
        assert!(causes.iter().any(|c| c["field"] == field), "{field}: {status}");
    }
    // A repair names the plugin and the driver, like a translation.
    let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation", "spec": {"repairVolumeHandle": repair}});
    let status = post(&client, TRANSLATIONS, &body).await.ok(201)["status"].clone();
    assert_eq!(
        status,
        json!({"inTreePluginName": "kubernetes.io/gce-pd", "driverName": "pd.csi.storage.gke.io",
            "volumeHandle": "projects/p/zones/europe-west1-b/disks/d"})
    );
    // The schema the server publishes (what kubectl explain reads) has the new fields.
    let explain = server.kubectl_ok(&["explain", "csitranslation.spec.repairVolumeHandle"]);
    for field in ["driverName", "volumeHandle", "nodeID", "RepairVolumeHandle"] {
        assert!(explain.contains(field), "{field} missing: {explain}");
    }
    let explain = server.kubectl_ok(&["explain", "csitranslation.status.volumeHandle"]);
    assert!(explain.contains("repaired volume handle"), "{explain}");
}
