//! ShootStates of 100 KiB, encrypted at rest and not.

use super::*;
use anyhow::{bail, Context};
use base64::Engine;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

// ShootState with a 100 KiB body, encrypted at rest against identity (issue 3).

pub(super) const SHOOTSTATES_V1BETA1: &str = "/apis/core.gardener.cloud/v1beta1";
pub(super) const SHOOTSTATE_KEYS: &str = "/registry/core.gardener.cloud/shootstates/";
/// The most ShootStates one CREATE step writes (10^4 x 100 KiB = 1 GiB on disk).
pub(super) const SHOOTSTATE_CREATE_LIMIT: u64 = 10_000;

/// CREATE and GET of 100 KiB ShootStates on a server without encryption (identity), on one whose
/// EncryptionConfiguration has aesgcm as its first provider, and on one with a KMS v2 provider (the test plugin);
/// afterwards `storage inspect` checks how the values were stored.
pub(super) async fn encryption_rows(bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-enc-{}", std::process::id()));
    let config = match encryption_config(&dir) {
        Ok(c) => c,
        Err(e) => return vec![Row::failed("ShootState 100 KiB, aesgcm".into(), e)],
    };
    let config_arg = config.to_string_lossy().into_owned();
    let mut creates = Vec::new();
    let mut gets = Vec::new();
    let aesgcm = ["--encryption-provider-config", config_arg.as_str()];
    for (label, extra, expected) in [("identity", &[][..], "identity"), ("aesgcm", &aesgcm[..], "aesgcm:v1:key1")] {
        let (c, g) = (format!("ShootState CREATE 100 KiB, {label}"), format!("ShootState GET 100 KiB, {label}"));
        eprintln!("bench: ShootState 100 KiB, {label} ({conns} connections, {duration:?} each)");
        match shootstate_rows(bin, extra, label, expected, conns, duration, run).await {
            Ok((create, get)) => {
                creates.push(create);
                gets.push(get);
            }
            Err(e) => creates.push(Row::failed(format!("{c} / {g}"), e)),
        }
    }
    // KMS v2 against aesgcm (issue 39): the plugin is off the request path once the seed is cached.
    match kms_shootstate_rows(bin, conns, duration, run, &dir).await {
        Ok((create, get)) => {
            creates.push(create);
            gets.push(get);
        }
        Err(e) => creates.push(Row::failed("ShootState CREATE / GET 100 KiB, kms v2".into(), e)),
    }
    let _ = std::fs::remove_dir_all(&dir);
    for rows in [&mut creates, &mut gets] {
        if let [identity, aesgcm, ..] = &mut rows[..] {
            let ratio = ratio_note(aesgcm, identity, "identity's");
            aesgcm.notes = format!("{ratio}; {}", aesgcm.notes);
        }
        if let [_, aesgcm, kms] = &mut rows[..] {
            let ratio = ratio_note(kms, aesgcm, "aesgcm's");
            kms.target = Goal::MinRatio(0.8).show(kms.rps_v.zip(aesgcm.rps_v).map(|(k, a)| k / a));
            kms.notes = format!("{ratio}; {}", kms.notes);
        }
    }
    creates.into_iter().chain(gets).collect()
}

/// A kube-apiserver EncryptionConfiguration for ShootStates: aesgcm with a fresh random key first, identity second.
pub(super) fn encryption_config(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut key = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [shootstates.core.gardener.cloud]\n  providers:\n  - aesgcm:\n      keys:\n      \
         - name: key1\n        secret: {}\n  - identity: {{}}\n",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let path = dir.join("encryption-config.yaml");
    std::fs::write(&path, yaml)?;
    Ok(path)
}

/// `expected`: how `storage inspect` labels every stored value afterwards (`identity`, `aesgcm:v1:key1`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn shootstate_rows(
    bin: &Path,
    extra: &[&str],
    label: &str,
    expected: &str,
    conns: usize,
    duration: Duration,
    run: &str,
) -> anyhow::Result<(Row, Row)> {
    // A short watch history: the ring would otherwise hold up to 10^5 events of 100 KiB in memory.
    let mut args = vec!["--disable-scheduler", "--watch-history", "1000"];
    args.extend_from_slice(extra);
    let (mut server, target) = ServerProcess::start(bin, &args).await?;
    let pid = Some(server.child.id());
    let ns = "bench";
    let coll = format!("{SHOOTSTATES_V1BETA1}/namespaces/{ns}/shootstates");
    let template = Arc::new(Template::new(&big_shoot_state(ns, "s-@N@")));
    let size = template.render(&format!("{run}-0000000")).len();

    let (t, c, r) = (template.clone(), coll.clone(), run.to_string());
    let make: MakeReq = Arc::new(move |i| Req::post(c.clone(), t.render(&format!("{r}-{i:07}"))));
    let load = run_load(&target, pid, conns, Some(duration), SHOOTSTATE_CREATE_LIMIT, make).await;
    let note = format!("{:.0} KiB per object", size as f64 / 1024.0);
    let mut create = load.row(&format!("ShootState CREATE 100 KiB, {label}"), conns, Goal::None, &note);
    let created = load.stats.ok;

    let name = format!("s-{run}-get");
    let body = target.call_ok(&Req::post(coll.clone(), template.render(&format!("{run}-get")))).await?;
    let stored: Value = serde_json::from_slice(&body)?;
    let get = Req::get(format!("{coll}/{name}"));
    let probe = target.call_ok(&get).await?;
    let read: Value = serde_json::from_slice(&probe)?;
    if read["spec"] != stored["spec"] {
        bail!("GET {name} does not return the spec that was written");
    }
    let load = run_load(&target, pid, conns, Some(duration), u64::MAX, Arc::new(move |_| get.clone())).await;
    let note = format!("{:.0} KiB per response", probe.len() as f64 / 1024.0);
    let get = load.row(&format!("ShootState GET 100 KiB, {label}"), conns, Goal::None, &note);

    // How the values were stored, read from the store file by `storage inspect` (the server must be stopped).
    server.stop().await?;
    let items = stored_shootstates(bin, &server.data_dir())?;
    let matching = items.iter().filter(|e| e["encryption"] == expected).count();
    if matching != items.len() || items.len() as u64 != created + 1 {
        bail!(
            "storage inspect: {matching} of {} stored ShootStates are {expected}, {} were created",
            items.len(),
            created + 1
        );
    }
    create.notes += &format!("; storage inspect: all {} stored as {expected}", thousands(items.len() as f64));
    Ok((create, get))
}

/// What `storage inspect` reports of the stored ShootStates (key, encryption, apiVersion, ...) of a stopped server.
pub(super) fn stored_shootstates(bin: &Path, data_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let inspect = Command::new(bin).args(["storage", "inspect", "-o", "json", "--data-dir"]).arg(data_dir).output()?;
    if !inspect.status.success() {
        bail!("storage inspect: {}", String::from_utf8_lossy(&inspect.stderr));
    }
    let all: Value = serde_json::from_slice(&inspect.stdout).context("storage inspect -o json")?;
    let items = all["items"].as_array().context("storage inspect -o json has no items")?;
    let ours = |e: &&Value| e["key"].as_str().is_some_and(|k| k.starts_with(SHOOTSTATE_KEYS));
    Ok(items.iter().filter(ours).cloned().collect())
}

/// A ShootState of about 100 KiB, mostly the certificates and keys of its `gardener` secrets, as real ones are.
pub(super) fn big_shoot_state(ns: &str, name: &str) -> Value {
    big_shoot_state_seeded(ns, name, 0x9e37_79b9_7f4a_7c15)
}

/// [`big_shoot_state`] with certificates and keys drawn from `seed` (not 0): objects of different seeds differ
/// throughout, as real ones do.
pub(super) fn big_shoot_state_seeded(ns: &str, name: &str, seed: u64) -> Value {
    let mut rng = seed;
    let mut random_b64 = |len: usize| {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let object = |gardener: Vec<Value>| {
        json!({
            "apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
            "metadata": {"name": name, "namespace": ns, "labels": {"shoot.gardener.cloud/name": "bench"}},
            "spec": {
                "gardener": gardener,
                "extensions": [
                    {"kind": "Infrastructure", "purpose": "aws", "state": {"vpc": {"id": "vpc-0a1b2c3d", "cidr": "10.250.0.0/16"}}},
                    {"kind": "Worker", "state": {"machineDeployments": {"pool-a": {"replicas": 3}}}},
                ],
            },
        })
    };
    // The object's size as JSON, kept up to date as secrets are added (each adds itself and a comma after the first).
    let mut size = object(Vec::new()).to_string().len();
    let mut gardener = Vec::new();
    for k in 0.. {
        if size >= 100 * 1024 {
            break;
        }
        let secret = json!({
            "name": format!("secret-{k}"), "type": "secret",
            "labels": {"managed-by": "secrets-manager", "manager-identity": "gardenlet"},
            "data": {"ca.crt": random_b64(900), "ca.key": random_b64(1200)},
        });
        size += secret.to_string().len() + usize::from(k > 0);
        gardener.push(secret);
    }
    object(gardener)
}
