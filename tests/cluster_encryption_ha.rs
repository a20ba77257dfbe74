//! The cluster key-rotation trigger against TWO real kube-apiservers (v1.37.2) on one etcd, one of them lagging
//! (docs/guides/cluster-key-rotation.md, step 4: "while any apiserver still reports another hash ... nothing
//! starts"). The second kube-apiserver runs with the first one's flags, its own port, cert dir, audit log and
//! EncryptionConfiguration file, in a UTS namespace of its own with hostname `kas-2` (the identity Lease's name is
//! derived from the hostname: k8s.io/apiserver pkg/server/config.go, `apiserver-` + base32 of a SHA-256 of the
//! hostname and "kube-apiserver"). This server reaches both through a round-robin TCP proxy (a connection to one,
//! the next to the other; TLS passes through), as behind an L4 load balancer.
//!
//! aesgcm key1 on both, key2 added second on both, then key2 first on the first instance only: for a while no
//! migration starts and every Secret in etcd stays under key1, the StorageState naming the disagreement; once the
//! second instance loads the file too, one migration rewrites every Secret under key2. Last, the second instance
//! lags again and is shut down: its Lease goes (kube-apiserver deletes it in a pre-shutdown hook) and it is no longer
//! waited for. (v1.37.2 has no flag for the identity Lease's duration, a constant 3600 s, so expiry is not shown.)
//!
//! The proxy balances connections, not requests, so every round of the trigger must reach both apiservers with
//! scrapes of its own: the test checks each round saw both, and counts the scrapes in each one's audit log.

mod common;
use base64::Engine;
use common::apiservers::sha256_label;
use common::cluster::{kube_bin_dir, Cluster, Options};
use common::free_port;
use common::secrets::*;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRETS: usize = 60;
const SECRETS_PREFIX: &str = "/registry/secrets/";
const LAST_CONFIG_INFO: &str = "apiserver_encryption_config_controller_last_config_info";
const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity=kube-apiserver";
const SERVER_USER: &str = "system:serviceaccount:migration-apiserver:migration-apiserver";
const OBSERVED: &str = "migration.k8s.io/encryption-observed";
const SECOND_HOSTNAME: &str = "kas-2";
const WAIT: Duration = Duration::from_secs(60);
const MIGRATION_WAIT: Duration = Duration::from_secs(120);
/// How long the lagging apiserver is watched holding the rotation back (the trigger runs a round every 2 s).
const LAG: Duration = Duration::from_secs(16);
const KEY1: &[u8; 32] = b"key one of the aesgcm rotation!!";
const KEY2: &[u8; 32] = b"key two of the aesgcm rotation!!";
const UNDER_KEY1: &str = "k8s:enc:aesgcm:v1:key1:";
const UNDER_KEY2: &str = "k8s:enc:aesgcm:v1:key2:";

/// The ID kube-apiserver takes on a host named `hostname` (its identity Lease's name): `apiserver-` and the
/// lower-case, unpadded base32 of the first 16 bytes of the SHA-256 of the hostname and `kube-apiserver`, each
/// with a 2-byte length prefix (k8s.io/apiserver pkg/server/config.go NewConfig).
fn apiserver_id(hostname: &str) -> String {
    let mut data = Vec::new();
    for part in [hostname.as_bytes(), b"kube-apiserver"] {
        data.extend(u16::try_from(part.len()).expect("length").to_be_bytes());
        data.extend(part);
    }
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let (mut id, mut buf, mut bits) = ("apiserver-".to_string(), 0u32, 0);
    for b in &Sha256::digest(&data)[..16] {
        buf = (buf << 8 | u32::from(*b)) & 0xfff;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            id.push(char::from(ALPHABET[(buf >> bits & 31) as usize]));
        }
    }
    id.push(char::from(ALPHABET[(buf << (5 - bits) & 31) as usize]));
    id
}

/// The second kube-apiserver: killed when dropped (the end of the test, or a panic).
struct SecondApiserver {
    child: Child,
    port: u16,
    config: PathBuf,
    /// Its pid under the cluster's pids/, for `scripts/cluster.sh down` should the test binary die before the drop.
    pid_file: PathBuf,
}

impl Drop for SecondApiserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Reaped: its pid may be reused, and `down` must not signal that process.
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

impl SecondApiserver {
    /// Shuts it down as an operator would: SIGTERM. Its pre-shutdown hook deletes its identity Lease at once; the
    /// process itself may take up to a minute to exit (it waits for the HTTP/1.1 watches it serves to end).
    fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet (it is reaped on drop).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM to the second kube-apiserver");
    }
}

/// Starts a second kube-apiserver with the first one's command line (the same etcd, certificates, flags and
/// KUBE_ENCRYPTION_CONFIG_POLL), but its own port, cert dir, audit log and a copy of the encryption config, in a
/// UTS namespace whose hostname is `hostname`; waits until it is ready.
fn start_second(c: &Cluster, hostname: &str) -> SecondApiserver {
    let cmd = std::fs::read(c.dir.join("cmds/kube-apiserver")).expect("the first kube-apiserver's command line");
    let args: Vec<String> =
        cmd.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    assert!(args.iter().any(|a| a == "KUBE_ENCRYPTION_CONFIG_POLL=1s"), "{args:?}");
    let port = free_port();
    let config = c.dir.join("encryption-config-2.yaml");
    std::fs::copy(c.dir.join("encryption-config.yaml"), &config).expect("copy the encryption config");
    let cert_dir = c.dir.join("kube-apiserver-2");
    std::fs::create_dir_all(&cert_dir).expect("cert dir");
    let audit_log = c.dir.join("logs/kube-apiserver-2-audit.log");
    let own = [
        ("--secure-port", port.to_string()),
        ("--cert-dir", cert_dir.display().to_string()),
        ("--encryption-provider-config", config.display().to_string()),
        ("--audit-log-path", audit_log.display().to_string()),
    ];
    let mut replaced = 0;
    let args: Vec<String> = args
        .into_iter()
        .map(|a| match own.iter().find(|(flag, _)| a.starts_with(&format!("{flag}="))) {
            Some((flag, value)) => {
                replaced += 1;
                format!("{flag}={value}")
            }
            None => a,
        })
        .collect();
    assert_eq!(replaced, own.len(), "{args:?}");
    let log = std::fs::File::create(c.dir.join("logs/kube-apiserver-2.log")).expect("log");
    let path = format!("{}:{}", kube_bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let child = Command::new("unshare")
        .args(["--uts", "sh", "-c", r#"hostname "$0" && exec "$@""#, hostname])
        .args(&args)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("unshare");
    // `scripts/cluster.sh down` stops every process under pids/: the second one too, should the test binary die.
    let pid_file = c.dir.join("pids/kube-apiserver-2");
    std::fs::write(&pid_file, child.id().to_string()).expect("pid file");
    let second = SecondApiserver { child, port, config, pid_file };
    let url = format!("https://127.0.0.1:{port}");
    poll_or(Duration::from_secs(90), || {
        c.kubectl_as(&c.admin(), &["--server", &url, "get", "--raw", "/readyz"], None).status.success().then_some(())
    })
    .unwrap_or_else(|| panic!("the second kube-apiserver is not ready:\n{}", tail(&c.log("kube-apiserver-2"), 30)));
    second
}

/// A round-robin TCP proxy on 127.0.0.1: each accepted connection goes to the next backend in turn (to the other
/// one when that one refuses); the bytes pass untouched. It lives as long as its runtime, held here.
struct RoundRobin {
    url: String,
    /// Connections handed to each backend.
    connections: Arc<[AtomicUsize; 2]>,
    _runtime: tokio::runtime::Runtime,
}

fn round_robin(backends: [u16; 2]) -> RoundRobin {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    let connections = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let counts = connections.clone();
    runtime.spawn(async move {
        let mut next = 0;
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else { continue };
            let first = next % 2;
            next += 1;
            let counts = counts.clone();
            tokio::spawn(async move {
                for i in [first, 1 - first] {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", backends[i])).await {
                        counts[i].fetch_add(1, Ordering::Relaxed);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        return;
                    }
                }
            });
        }
    });
    RoundRobin { url, connections, _runtime: runtime }
}

/// One kube-apiserver's `/metrics`, asked directly (not through the proxy).
fn metrics_of(c: &Cluster, port: u16) -> String {
    let url = format!("https://127.0.0.1:{port}");
    let args = ["--server", url.as_str(), "get", "--raw", "/metrics"];
    let out = c.kubectl_as(&c.admin(), &args, None);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The (apiserver_id_hash, hash) of the config a kube-apiserver reports loaded (value 1).
fn loaded(c: &Cluster, port: u16) -> Vec<(String, String)> {
    let text = metrics_of(c, port);
    let label = |labels: &str, name: &str| {
        labels.split(',').find_map(|l| l.strip_prefix(&format!("{name}=\""))).map(|v| v.trim_end_matches('"').into())
    };
    text.lines()
        .filter_map(|l| l.strip_prefix(LAST_CONFIG_INFO)?.strip_prefix('{')?.split_once('}'))
        .filter(|(_, value)| value.trim() == "1")
        .filter_map(|(labels, _)| Some((label(labels, "apiserver_id_hash")?, label(labels, "hash")?)))
        .collect()
}

/// Writes `content` as kube-apiserver `port`'s config file `path` and waits until it reports it loaded, under the
/// ID `id`; returns the hash.
fn load(c: &Cluster, port: u16, path: &Path, id: &str, content: &str) -> String {
    write_atomically(path, content);
    let hash = sha256_label(content.as_bytes());
    let want = vec![(sha256_label(id.as_bytes()), hash.clone())];
    poll(c, &format!("kube-apiserver :{port} ({id}) to report {hash}"), WAIT, || {
        (loaded(c, port) == want).then_some(())
    });
    hash
}

/// Every Secret in etcd with how it is stored: the prefix up to the key name (`k8s:enc:aesgcm:v1:key1:`), or
/// `plaintext`.
fn stored_secrets(c: &Cluster) -> Vec<(String, String)> {
    let out = c.etcdctl(&["get", "--prefix", SECRETS_PREFIX, "-w", "json"]);
    let v: Value = serde_json::from_slice(&out).expect("etcdctl JSON");
    let decode =
        |s: &Value| base64::engine::general_purpose::STANDARD.decode(s.as_str().unwrap_or("")).expect("base64");
    let encryption = |value: &[u8]| {
        let mut colons = value.iter().enumerate().filter(|(_, b)| **b == b':').map(|(i, _)| i);
        match colons.nth(4) {
            Some(end) if value.starts_with(b"k8s:enc:") => String::from_utf8_lossy(&value[..=end]).into_owned(),
            _ => "plaintext".into(),
        }
    };
    let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
    kvs.iter()
        .map(|kv| (String::from_utf8(decode(&kv["key"])).expect("key"), encryption(&decode(&kv["value"]))))
        .collect()
}

/// The stored Secrets not under `want`, and how many of the test's namespace are stored.
fn not_under(c: &Cluster, want: &str) -> (Vec<(String, String)>, usize) {
    let stored = stored_secrets(c);
    let ours = stored.iter().filter(|(k, _)| k.starts_with(&format!("{SECRETS_PREFIX}{NAMESPACE}/"))).count();
    (stored.into_iter().filter(|(_, e)| e != want).collect(), ours)
}

fn wait_all_under(c: &Cluster, want: &str) {
    poll(c, &format!("every Secret in etcd to be under {want}"), MIGRATION_WAIT, || {
        let (wrong, ours) = not_under(c, want);
        (wrong.is_empty() && ours == SECRETS).then_some(())
    });
}

/// This server's key-rotation migrations of Secrets (not the storage-version trigger's, `new storage version hash`).
fn migrations(c: &Cluster) -> Vec<Migration> {
    let args = ["get", "storageversionmigrations.migration.k8s.io", "-l", "migration.k8s.io/resource=secrets"];
    let list = c.kubectl_json(&[&args[..], &["-o", "json"]].concat());
    let items = list["items"].as_array().expect("items");
    items
        .iter()
        .map(|m| Migration {
            name: m["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            reason: annotation(m, "migration.k8s.io/reason"),
            created: m["metadata"]["creationTimestamp"].as_str().and_then(|t| t.parse().ok()).expect("created"),
        })
        .filter(|m| m.reason.starts_with("encryption key rotation"))
        .collect()
}

/// Waits until the rotation recorded on the StorageState is Done with the write key `key`.
fn rotation_done(c: &Cluster, key: &str) -> Value {
    poll(c, &format!("the rotation to {key} to be Done"), MIGRATION_WAIT, || {
        let s = storage_state(c)?;
        (annotation(&s, "migration.k8s.io/encryption-rotation").starts_with("Done:")
            && s["status"]["encryptionWriteKey"] == key
            && s["status"]["encryptionKeyRotation"] == "Finished")
            .then_some(s)
    })
}

/// Waits until the trigger's latest observation on the StorageState is `observed`.
fn observed(c: &Cluster, observed: &str) -> Value {
    poll(c, &format!("the trigger to observe: {observed}"), WAIT, || {
        storage_state(c).filter(|s| annotation(s, OBSERVED) == observed)
    })
}

/// The trigger's observation of two kube-apiservers reporting different hashes: (hash, ID) each, by hash.
fn disagreement(mut reports: [(&str, &str); 2]) -> String {
    reports.sort();
    let [(h1, id1), (h2, id2)] = reports;
    format!("the live kube-apiservers report different encryption configs: {h1} ({id1}); {h2} ({id2})")
}

/// How many `/metrics` requests of this server an audit log holds.
fn scrapes_in(audit_log: &Path) -> usize {
    let text = std::fs::read_to_string(audit_log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["requestURI"] == "/metrics" && e["user"]["username"] == SERVER_USER)
        .count()
}

/// This server's scrapes of `/metrics` so far, per kube-apiserver (from their audit logs).
fn scrapes(c: &Cluster) -> [usize; 2] {
    ["kube-apiserver-audit.log", "kube-apiserver-2-audit.log"].map(|f| scrapes_in(&c.dir.join("logs").join(f)))
}

/// [`poll_or`], failing with the StorageState, the scrapes and the trigger's lines of this server's log on time-out.
fn poll<T>(c: &Cluster, what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll_or(timeout, f).unwrap_or_else(|| {
        let log = c.log("migration-apiserver");
        let trigger: Vec<&str> = log.lines().filter(|l| l.contains("cluster key rotation")).collect();
        panic!(
            "timed out after {timeout:?} waiting for {what}\nstoragestate: {}\nscrapes of /metrics by this server \
             per kube-apiserver: {:?}\nthe trigger's log (end):\n{}",
            storage_state(c).map(|s| s.to_string()).unwrap_or_default(),
            scrapes(c),
            trigger[trigger.len().saturating_sub(20)..].join("\n")
        )
    })
}

/// The names of the identity Leases of kube-system.
fn identity_leases(c: &Cluster) -> Vec<(String, String)> {
    let list = c.kubectl_json(&["get", "leases", "-n", "kube-system", "-l", IDENTITY_LABEL, "-o", "json"]);
    let mut leases: Vec<(String, String)> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|l| {
            let hostname = l["metadata"]["labels"]["kubernetes.io/hostname"].as_str().unwrap_or_default();
            (l["metadata"]["name"].as_str().unwrap_or_default().to_string(), hostname.to_string())
        })
        .collect();
    leases.sort();
    leases
}

#[test]
fn a_lagging_kube_apiserver_holds_the_rotation_back_until_it_reads_the_new_key() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("encryption-config.yaml");
    let server_args = vec![
        format!("--cluster-encryption-provider-config={}", copy.display()),
        "--cluster-key-rotation-interval=2s".to_string(),
    ];
    let c = Cluster::up(Options { server_args, encryption_config_poll: Some("1s".into()), ..Default::default() });
    grant_secrets(&c);
    let second = start_second(&c, SECOND_HOSTNAME);
    eprintln!("two kube-apiservers up after {:?}", started.elapsed());

    // Two identities: the first one's from the machine's hostname, the second one's from its own.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname").trim().to_string();
    assert_ne!(host, SECOND_HOSTNAME);
    let (id1, id2) = (apiserver_id(&host), apiserver_id(SECOND_HOSTNAME));
    let mut want = vec![(id1.clone(), host.clone()), (id2.clone(), SECOND_HOSTNAME.to_string())];
    want.sort();
    poll(&c, "two identity Leases", WAIT, || (identity_leases(&c) == want).then_some(()));

    // This server reaches the cluster through the round-robin proxy only.
    let first_port: u16 = c.url().rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let proxy = round_robin([first_port, second.port]);
    let kubeconfig = c.dir.join("migration-apiserver.kubeconfig");
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    assert_eq!(text.matches(&c.url()).count(), 1, "{text}");
    std::fs::write(&kubeconfig, text.replace(&c.url(), &proxy.url)).expect("write kubeconfig");
    c.restart("migration-apiserver");

    // key1 on both, then in the copy: the first sight of the write key rewrites every Secret under it.
    let first_config = c.dir.join("encryption-config.yaml");
    let on_both = |content: &str| {
        let h = load(&c, first_port, &first_config, &id1, content);
        assert_eq!(load(&c, second.port, &second.config, &id2, content), h);
        write_atomically(&copy, content);
        h
    };
    let h1 = on_both(&aesgcm_config(&[("key1", KEY1)]));
    create_secrets(&c, SECRETS);
    rotation_done(&c, "aesgcm:v1:key1");
    wait_all_under(&c, UNDER_KEY1);
    observed(&c, &format!("all 2 live kube-apiservers report {h1}, the mounted copy's hash"));
    let before = migrations(&c);
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0].reason, "encryption key rotation: write key aesgcm:v1:key1 first observed");
    eprintln!("key1 everywhere after {:?}", started.elapsed());

    // key2 added second on both: a new hash, the same write key, nothing migrated.
    let h2 = on_both(&aesgcm_config(&[("key1", KEY1), ("key2", KEY2)]));
    let s = observed(&c, &format!("all 2 live kube-apiservers report {h2}, the mounted copy's hash"));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h2, "{s}");
    assert_eq!(new_migrations(&before, migrations(&c)), [], "adding a read key migrates nothing");

    // key2 first on the first kube-apiserver only (and in the copy); the second one lags with key1 first.
    let rotated = aesgcm_config(&[("key2", KEY2), ("key1", KEY1)]);
    let h3 = load(&c, first_port, &first_config, &id1, &rotated);
    write_atomically(&copy, &rotated);
    let disagree = disagreement([(&h2, &id2), (&h3, &id1)]);
    observed(&c, &disagree);
    // For a while: no migration, every Secret under key1, the write key recorded unchanged; every round sees both
    // kube-apiservers (through the proxy) and names the disagreement.
    let scraped_before = scrapes(&c);
    let (lag_start, mut checks, mut seen) = (Instant::now(), 0, std::collections::BTreeSet::new());
    while lag_start.elapsed() < LAG {
        assert_eq!(loaded(&c, second.port), [(sha256_label(id2.as_bytes()), h2.clone())], "the second one lags");
        assert_eq!(new_migrations(&before, migrations(&c)), [], "a migration while {id2} lags");
        let (wrong, ours) = not_under(&c, UNDER_KEY1);
        assert!(wrong.is_empty() && ours == SECRETS, "rewritten while {id2} lags: {wrong:?}");
        let s = storage_state(&c).expect("storagestate");
        assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h2, "{s}");
        assert_eq!(annotation(&s, "migration.k8s.io/encryption-write-key"), "aesgcm:v1:key1", "{s}");
        assert_eq!(s["status"]["encryptionWriteKey"], "aesgcm:v1:key1", "{s}");
        seen.insert(annotation(&s, OBSERVED));
        checks += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = scrapes(&c);
    let scraped = [after[0] - scraped_before[0], after[1] - scraped_before[1]];
    assert!(
        seen.len() == 1 && seen.contains(&disagree) && scraped.iter().all(|n| *n >= 2),
        "during {LAG:?} of lag the trigger observed {seen:#?}\nand scraped /metrics of each kube-apiserver \
         {scraped:?} times (proxy connections per kube-apiserver: {:?})",
        proxy.connections
    );
    let log = c.log("migration-apiserver");
    assert!(
        log.lines().any(|l| l.contains("cluster key rotation: waiting") && l.contains(&disagree)),
        "{}",
        tail(&log, 20)
    );
    eprintln!("{checks} checks over {LAG:?} of lag: nothing rewritten, scrapes {scraped:?}");

    // The second one loads it too: one migration rewrites every Secret under key2.
    let caught_up = Timestamp::from_second(Timestamp::now().as_second()).expect("time");
    assert_eq!(load(&c, second.port, &second.config, &id2, &rotated), h3);
    wait_all_under(&c, UNDER_KEY2);
    let s = rotation_done(&c, "aesgcm:v1:key2");
    assert_eq!(annotation(&s, OBSERVED), format!("all 2 live kube-apiservers report {h3}, the mounted copy's hash"));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h3, "{s}");
    assert_eq!(s["status"]["persistedEncryptionKeys"], json!(["aesgcm:v1:key2"]), "{s}");
    let migrated = new_migrations(&before, migrations(&c));
    assert_eq!(migrated.len(), 1, "{migrated:?}");
    assert_eq!(migrated[0].reason, "encryption key rotation: write key changed from aesgcm:v1:key1 to aesgcm:v1:key2");
    assert!(migrated[0].created >= caught_up, "{migrated:?} created before {caught_up}");
    assert_secrets_intact(&c, SECRETS);
    eprintln!("key2 everywhere after {:?}", started.elapsed());

    // key1 removed on the first one only: the trigger waits for the second one, until it is shut down. Its Lease
    // goes with it (kube-apiserver deletes its identity Lease on exit), and it is no longer waited for.
    let h4 = load(&c, first_port, &first_config, &id1, &aesgcm_config(&[("key2", KEY2)]));
    write_atomically(&copy, &aesgcm_config(&[("key2", KEY2)]));
    observed(&c, &disagreement([(&h3, &id2), (&h4, &id1)]));
    second.terminate();
    poll(&c, "the second identity Lease to go", WAIT, || {
        (identity_leases(&c) == [(id1.clone(), host.clone())]).then_some(())
    });
    let s = observed(&c, &format!("all 1 live kube-apiservers report {h4}, the mounted copy's hash"));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h4, "{s}");
    assert_eq!(new_migrations(&before, migrations(&c)), migrated, "removing a read key migrates nothing");
    assert_secrets_intact(&c, SECRETS);
    let connections: Vec<usize> = proxy.connections.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    eprintln!("done after {:?}; proxy connections per kube-apiserver: {connections:?}", started.elapsed());
}
