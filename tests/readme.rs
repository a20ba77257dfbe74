//! The docs' walk-throughs, run as written: the README's kubectl walk-through and its backup and restore, and the key
//! rotation and the KMS v2 rotation of docs/guides/key-rotation.md. Their `client` blocks run with bash in a directory laid out as the repository is
//! after `make run` (`certs/`, `data/`, `target/release/migration-apiserver`), their `server` blocks as `make run` runs
//! the server (the Makefile's recipe, checked below), with default flags and the scheduler on. Also: the metrics
//! table of docs/operations/metrics.md is what `/metrics` serves.

mod common;
use common::requests::HeldUpload;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A walk-through's blocks in order: ("client" | "server", text), marked `<!-- <walkthrough>: client -->` in `file`.
fn blocks(file: &str, walkthrough: &str) -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut out = Vec::new();
    let mut rest = readme.as_str();
    let marker = format!("<!-- {walkthrough}: ");
    while let Some(i) = rest.find(&marker) {
        rest = &rest[i + marker.len()..];
        let kind = rest[..rest.find(" -->").expect("marker end")].to_string();
        let start = rest.find("```sh\n").expect("a sh block after the marker") + "```sh\n".len();
        let end = start + rest[start..].find("\n```").expect("block end");
        out.push((kind, rest[start..end].to_string()));
        rest = &rest[end..];
    }
    out
}

/// A server as `make run ARGS=...` starts it, in `dir`.
struct MakeRun {
    dir: PathBuf,
    port: u16,
    /// `make run`'s DATA_DIR (./data unless a block sets it).
    data_dir: String,
    child: Option<Child>,
}

impl MakeRun {
    fn start(&mut self, args: &[String]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("server.log")).expect("log");
        // The Makefile's recipe: `$(BIN) serve --secure-port $(PORT) --data-dir $(DATA_DIR) --cert-dir $(CERT_DIR)
        // $(ARGS)` with DATA_DIR=./data (or the block's) and CERT_DIR=./certs; PORT is free one here (the kubeconfig
        // names it).
        let child = Command::new(BIN)
            .current_dir(&self.dir)
            .args([
                "serve",
                "--secure-port",
                &self.port.to_string(),
                "--data-dir",
                &self.data_dir,
                "--cert-dir",
                "./certs",
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the server");
        self.child = Some(child);
        let kubeconfig = self.dir.join("certs/admin.kubeconfig");
        eventually("the server to be ready", Duration::from_secs(30), || {
            (kubeconfig.exists() && kubectl_with(&kubeconfig, &["get", "--raw", "/readyz"], None).status.success())
                .then_some(())
        });
    }

    /// Ctrl-C.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-INT").arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            kill9_child(Some(c));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for MakeRun {
    fn drop(&mut self) {
        kill9_child(self.child.take());
    }
}

/// `make run ARGS='a b'` -> ["a", "b"].
fn make_run_args(line: &str) -> Vec<String> {
    let line = line.trim();
    assert!(line.starts_with("make run"), "a server block runs `make run`: {line}");
    match line.split_once("ARGS=") {
        Some((_, args)) => args.trim_matches(['\'', '"']).split_whitespace().map(str::to_string).collect(),
        None => Vec::new(),
    }
}

/// The DATA_DIR a `make run DATA_DIR=<dir>` line sets; ./data, the Makefile's default, otherwise.
fn make_run_data_dir(line: &str) -> String {
    let set = line.split_whitespace().find_map(|w| w.strip_prefix("DATA_DIR="));
    set.unwrap_or("./data").to_string()
}

/// The second terminal: one bash session, so that what a block exports holds in the next, fed block by block.
struct Terminal {
    child: Child,
    out: PathBuf,
    blocks: usize,
}

impl Terminal {
    fn open(dir: &Path) -> Terminal {
        let out = dir.join("terminal.out");
        let file = std::fs::File::create(&out).expect("terminal output");
        let child = Command::new("bash")
            .args(["-eo", "pipefail"])
            .current_dir(dir)
            // kubectl's discovery cache stays in this walk-through's directory.
            .env("HOME", dir)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(file.try_clone().expect("dup"))
            .stderr(file)
            .spawn()
            .expect("bash");
        Terminal { child, out, blocks: 0 }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Types `block` and waits until it has run; returns the whole terminal output so far.
    fn run(&mut self, block: &str) -> String {
        use std::io::Write;
        self.blocks += 1;
        let marker = format!("-- block {} done --", self.blocks);
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{block}\necho '{marker}'").expect("type the block");
        stdin.flush().expect("flush");
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let out = self.output();
            if out.contains(&marker) {
                return out;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the walk-through's block failed ({status}):\n{block}\n--- terminal\n{out}");
            }
            assert!(Instant::now() < deadline, "the block did not finish in 240 s:\n{block}\n--- terminal\n{out}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_makefile_runs_the_server_as_this_test_does() {
    let makefile = std::fs::read_to_string(repo().join("Makefile")).expect("Makefile");
    let recipe = makefile.split("\nrun: build\n").nth(1).and_then(|r| r.lines().next()).expect("run recipe");
    assert_eq!(
        recipe.trim(),
        "$(BIN) serve --secure-port $(PORT) --data-dir $(DATA_DIR) --cert-dir $(CERT_DIR) $(ARGS)"
    );
    assert!(makefile.contains("DATA_DIR ?= ./data") && makefile.contains("CERT_DIR ?= ./certs"));
}

#[test]
fn the_walkthrough_works_as_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let blocks = blocks("README.md", "walkthrough");
    assert_eq!(blocks.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["client", "server", "client", "client"]);
    // The set-up's `make run` serves before the first block.
    let (outputs, mut server) = run_walkthrough(&dir, &blocks, true);
    let log = server.log();
    // First block: discovery, explain, the chunked list of the 200 ShootStates.
    assert!(outputs[0].contains("storageversionmigrations"), "{}", outputs[0]);
    assert!(outputs[0].lines().any(|l| l.trim() == "201"), "{}", outputs[0]);
    // The watch showed a migration of ShootStates moving, then its end.
    let svm_lines: Vec<&str> = outputs[1].lines().filter(|l| l.contains(" shootstates.v")).collect();
    let running: std::collections::BTreeSet<&str> = svm_lines
        .iter()
        .filter(|l| l.contains(" Running ") && l.contains('%'))
        .map(|l| l.split_whitespace().nth(3).unwrap_or_default())
        .collect();
    assert!(running.len() >= 3, "MIGRATED should move at least three times while Running:\n{}\n{log}", outputs[1]);
    assert!(
        svm_lines.iter().any(|l| l.contains(" Succeeded ") && l.contains(" 200 ") && l.contains("100%")),
        "{}",
        outputs[1]
    );
    // The scheduler noticed the changed hash; `migrate` requested a migration and `--wait` followed it to its end.
    assert!(
        outputs[1].contains("storageversionmigration.migration.k8s.io/shootstates.core.gardener.cloud-"),
        "{}",
        outputs[1]
    );
    assert!(outputs[1].contains(" created"), "{}", outputs[1]);
    // The StorageState: persisted is [current]; every ShootState is stored as v1alpha1.
    let kubeconfig = dir.join("certs/admin.kubeconfig");
    let get = |path: &str| {
        let out = kubectl_with(&kubeconfig, &["get", "ss", "shootstates.core.gardener.cloud", "-o", path], None);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let current = get("jsonpath={.status.currentStorageVersionHash}");
    assert!(!current.is_empty());
    // After the restart the scheduler noticed the new hash: its trigger requested a migration to it (the reason
    // depends on whether the first start's migration of the then still arriving ShootStates ended before Ctrl-C:
    // "changed storage version hash" when it did, "new storage version hash" while the persisted hashes still hold
    // "Unknown"), or, when `migrate` created its migration before the trigger decided, the trigger reported the
    // hash and left the resource to that migration, which covers it (the README explains it: one supersedes the other).
    // The second run's log follows the first run's "shutting down" (read before this run stops). Not "serving":
    // the scheduler runs in-process and may request its migration before that line is written.
    let restarted = log.rsplit("cli::serve: shutting down").next().unwrap_or_default();
    let requested =
        format!("storage version migration requested resource=shootstates.core.gardener.cloud hash={current}");
    let reported = format!("current=\"{current}\"");
    let noticed = restarted.lines().any(|l| {
        l.contains(&requested) || (l.contains("trigger: new storage version reported") && l.contains(&reported))
    });
    assert!(noticed, "{requested}, or the report of {current}\n{log}");
    assert_eq!(get("jsonpath={.status.persistedStorageVersionHashes}"), format!("[\"{current}\"]"));
    // The in-tree migration: the live count while it ran, Succeeded beside the count of verified objects, then
    // Running False (kubectl wait's condition).
    let in_tree = &outputs[2];
    let counting = in_tree
        .lines()
        .any(|l| l.contains("The migration is running, ") && l.contains("/200 objects not yet migrated"));
    assert!(counting, "{in_tree}\n{log}");
    assert!(
        in_tree.lines().any(|l| l.contains("200 objects verified migrated") && l.contains("Migration completed")),
        "{in_tree}"
    );
    assert!(in_tree.contains("shootstates-in-tree condition met"), "{in_tree}");
    server.stop();
    let inspect = Command::new(BIN)
        .args(["storage", "inspect", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--prefix", "/registry/core.gardener.cloud/shootstates/", "-o", "json"])
        .output()
        .expect("inspect");
    let entries: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("inspect json");
    let entries = entries["items"].as_array().expect("items");
    assert_eq!(entries.len(), 200);
    assert!(entries.iter().all(|e| e["apiVersion"] == "core.gardener.cloud/v1alpha1"), "{entries:?}");
}

/// Runs a walk-through's blocks in a directory laid out as the repository is after `make run`; the server is started
/// with `make run`'s defaults first when `started`, and by the server blocks. Returns the outputs of the client
/// blocks, and the server (still running).
fn run_walkthrough(dir: &Path, blocks: &[(String, String)], started: bool) -> (Vec<String>, MakeRun) {
    // The release binary `make run` built, here the test build of the same code.
    std::fs::create_dir_all(dir.join("target/release")).expect("target dir");
    std::os::unix::fs::symlink(
        Path::new(BIN).canonicalize().expect("binary"),
        dir.join("target/release/migration-apiserver"),
    )
    .expect("symlink");
    let mut server = MakeRun { dir: dir.to_path_buf(), port: free_port(), data_dir: "./data".into(), child: None };
    if started {
        server.start(&[]);
    }
    let mut terminal = Terminal::open(dir);
    let mut outputs = Vec::new();
    for (kind, text) in blocks {
        match kind.as_str() {
            "server" => {
                server.stop();
                server.data_dir = make_run_data_dir(text);
                server.start(&make_run_args(text));
            }
            _ => {
                let before = terminal.output().len();
                outputs.push(terminal.run(text)[before..].to_string());
            }
        }
    }
    (outputs, server)
}

/// docs/guides/key-rotation.md's "Rotating a key": key1, objects, key2 first while serving, the rotation seen to its end, key1 removed.
#[test]
fn the_key_rotation_walkthrough_works_as_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let blocks = blocks("docs/guides/key-rotation.md", "rotation");
    assert_eq!(blocks.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["client", "server", "client"]);
    let (outputs, mut server) = run_walkthrough(tmp.path(), &blocks, false);
    let log = server.log();
    let out = &outputs[1];
    // The watch showed the rotation's migration of ShootStates to its end.
    assert!(
        out.lines().any(|l| l.contains(" shootstates.v") && l.contains(" Succeeded ") && l.contains(" 100 ")),
        "{out}\n{log}"
    );
    // The StorageState: key2 writes, and, last, is the only key in use.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("shootstates.core.gardener.cloud "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let last = rows.last().unwrap_or_else(|| panic!("no StorageState row:\n{out}"));
    assert!(last.windows(3).any(|w| w == ["aesgcm:v1:key2", "aesgcm:v1:key2", "Finished"]), "{out}");
    assert!(rows.iter().all(|r| r.contains(&"aesgcm:v1:key2")), "{out}");
    // The rotation was the trigger's, and the reload dropping key1 was accepted (the last command waited for it).
    assert!(log.contains("key rotation: migration requested"), "{log}");
    server.stop();
    let shoots = shootstate_summary(&tmp.path().join("data"));
    assert_eq!(shoots.len(), 1, "{shoots:?}");
    assert_eq!((&shoots[0]["key"], &shoots[0]["values"]), (&serde_json::json!("key2"), &serde_json::json!(100)));
}

/// The ShootStates' rows of `storage inspect --summary -o json` of the stopped store in `data`.
fn shootstate_summary(data: &Path) -> Vec<serde_json::Value> {
    let inspect = Command::new(BIN)
        .args(["storage", "inspect", "--summary", "-o", "json", "--data-dir"])
        .arg(data)
        .output()
        .expect("inspect");
    let summary: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("inspect json");
    let rows = summary["items"].as_array().expect("items").iter();
    rows.filter(|r| r["resource"] == "shootstates.core.gardener.cloud").cloned().collect()
}

/// docs/guides/key-rotation.md's KMS v2 rotation: the test plugin, ShootStates under key-1, the plugin rotated to
/// key-2, the StorageState to Finished under key-2, and the stopped store with key-2's values only.
#[test]
fn the_kms_rotation_walkthrough_works_as_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // The plugin runs in the walk-through's terminal; whatever happens here, it goes with the test.
    struct PluginGone(PathBuf);
    impl Drop for PluginGone {
        fn drop(&mut self) {
            let _ = Command::new("pkill").arg("-f").arg(format!("unix://{}", self.0.display())).status();
        }
    }
    let _plugin = PluginGone(tmp.path().join("kms.sock"));
    let blocks = blocks("docs/guides/key-rotation.md", "kms");
    assert_eq!(blocks.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["client", "server", "client"]);
    let (outputs, mut server) = run_walkthrough(tmp.path(), &blocks, false);
    let log = server.log();
    let hash = |key_id: &str| {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(key_id.as_bytes()))
    };
    let out = &outputs[1];
    // The counts printed at the end: every ShootState under key-2.
    let counts = format!("[{{\"key\":\"kms:v2:my-kms:{}\",\"values\":100}}]", hash("key-2"));
    assert!(out.contains(&counts), "{out}\n{log}");
    assert!(log.contains("key rotation: migration requested"), "{log}");
    server.stop();
    let shoots = shootstate_summary(&tmp.path().join("data"));
    assert_eq!(
        shoots,
        [serde_json::json!({"resource": "shootstates.core.gardener.cloud", "provider": "kms", "key": "my-kms",
            "keyIdHash": hash("key-2"), "values": 100})]
    );
}

/// README's "Backups": objects, a snapshot with kubectl, ls and verify, an accident, a restore into a new directory
/// and the server started on it, with the deleted object back at its resourceVersion.
#[test]
fn the_backups_walkthrough_works_as_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let blocks = blocks("README.md", "backups");
    assert_eq!(blocks.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["client", "server", "client"]);
    let (outputs, mut server) = run_walkthrough(tmp.path(), &blocks, true);
    let rows =
        |out: &str| -> Vec<String> { out.lines().filter(|l| l.starts_with("shoot-")).map(str::to_string).collect() };
    let before = rows(&outputs[0]);
    assert_eq!(before.len(), 3, "{}", outputs[0]);
    // The snapshot's JSON, the listing, the verification and the restore.
    let created = outputs[0].lines().find(|l| l.starts_with("{\"name\":\"snapshot-")).expect("the snapshot's JSON");
    let snapshot: serde_json::Value = serde_json::from_str(created).expect("JSON");
    assert!(snapshot["checksum"].as_str().is_some_and(|c| c.starts_with("sha256:")), "{snapshot}");
    assert!(outputs[0].contains(snapshot["name"].as_str().expect("name")), "ls lists it: {}", outputs[0]);
    assert!(outputs[0].contains("shootstate.core.gardener.cloud \"shoot-2\" deleted"), "{}", outputs[0]);
    assert!(outputs[0].contains("restored revision"), "{}", outputs[0]);
    // After the restore: the same three objects with the same resourceVersions.
    assert_eq!(rows(&outputs[1]), before, "{}\n{}", outputs[1], server.log());
    server.stop();
}

/// While alice's upload (a token user, counted) holds the one mutating seat, her second write is refused with 429.
fn refuse_one_write(server: &MakeRun, kubeconfig: &Path) {
    let url = format!("https://127.0.0.1:{}/apis/migration.k8s.io/v1alpha1/storagestates", server.port);
    let ca = server.dir.join("certs/ca.crt");
    let held = HeldUpload::start(&url, &ca, "alice-token");
    eventually("the upload to hold the mutating seat", Duration::from_secs(30), || {
        let out = kubectl_with(kubeconfig, &["get", "--raw", "/metrics"], None);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.contains("apiserver_current_inflight_requests{request_kind=\"mutating\"} 1").then_some(())
    });
    let state = |name: &str| {
        serde_json::json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
            "metadata": {"name": format!("{name}.example.com")},
            "spec": {"resource": {"group": "example.com", "resource": name}}})
    };
    let refused = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(&ca)
        .args(["-H", "Authorization: Bearer alice-token", "-H", "Content-Type: application/json", "-d"])
        .arg(state("refused").to_string())
        .arg(&url)
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&refused.stdout), "429", "{}", String::from_utf8_lossy(&refused.stderr));
    assert_eq!(held.finish(&state("uploaded")), "201");
}

/// The table of metrics in docs/operations/metrics.md is what `/metrics` serves: the same families with the same types and label names,
/// no more, no less, in the text format 0.0.4 (every sample named as its family, histograms' with their suffixes).
#[test]
fn the_readme_lists_exactly_the_metrics_served() {
    use std::collections::{BTreeMap, BTreeSet};
    let readme =
        std::fs::read_to_string(repo().join("docs/operations/metrics.md")).expect("docs/operations/metrics.md");
    let table =
        readme.split("<!-- metrics -->").nth(1).and_then(|t| t.split("<!-- /metrics -->").next()).expect("table");
    let mut listed_labels = BTreeMap::new();
    let listed: BTreeSet<(String, String)> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`').to_string();
            let labels: BTreeSet<String> =
                cells[3].split(',').map(|l| l.trim().to_string()).filter(|l| !l.is_empty() && l != "none").collect();
            listed_labels.insert(name.clone(), labels);
            (name, cells[2].to_string())
        })
        .collect();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server =
        MakeRun { dir: tmp.path().to_path_buf(), port: free_port(), data_dir: "./data".into(), child: None };
    // Auditing on, with the recommended policy, to a log that refuses every write (/dev/full, never rotated): the
    // audit families all have series (apiserver_audit_error_total once the scheduler's requests fail to be logged).
    let policy = repo().join("manifests/audit/policy.yaml");
    let audit = ["--audit-policy-file", policy.to_str().expect("utf-8"), "--audit-log-path", "/dev/full"];
    // One mutating request in flight at a time, and a user it counts (system:masters is never limited): a second
    // write while the first is held gets 429, so that apiserver_request_terminations_total has a series.
    let tokens = tmp.path().join("tokens.csv");
    std::fs::write(&tokens, "alice-token,alice,uid-alice,\"devs\"\n").expect("tokens");
    let limits = ["--max-mutating-requests-inflight", "1", "--authorization-mode", "AlwaysAllow", "--token-auth-file"];
    let args: Vec<String> = audit
        .iter()
        .chain(&["--audit-log-maxsize", "0"])
        .chain(&limits)
        .map(|a| a.to_string())
        .chain([tokens.display().to_string()])
        .collect();
    server.start(&args);
    let kubeconfig = tmp.path().join("certs/admin.kubeconfig");
    refuse_one_write(&server, &kubeconfig);
    // A family is served once it has series (as client_golang's): once the scheduler's first migrations have
    // migrated objects and ended, every one has.
    let text = eventually("the first migrations' metrics", Duration::from_secs(30), || {
        let out = kubectl_with(&kubeconfig, &["get", "--raw", "/metrics"], None);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let families = [
            "storage_migrator_core_migrator_migrations{",
            "storage_migrator_core_migrator_migrated_objects{",
            "apiserver_audit_error_total{",
        ];
        families.iter().all(|f| text.contains(f)).then_some(text)
    });
    let served: BTreeSet<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let mut parts = l.split_whitespace();
            (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string())
        })
        .collect();
    assert_eq!(listed, served, "docs/operations/metrics.md's table and /metrics differ:\n{text}");
    for (family, kind) in &served {
        let suffixes: &[&str] = if kind == "histogram" { &["_bucket", "_sum", "_count"] } else { &[""] };
        let samples: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                suffixes
                    .iter()
                    .any(|s| l.starts_with(&format!("{family}{s}{{")) || l.starts_with(&format!("{family}{s} ")))
            })
            .collect();
        for sample in &samples {
            let labels: BTreeSet<String> = label_names(sample).into_iter().filter(|l| l != "le").collect();
            assert_eq!(
                &labels, &listed_labels[family],
                "labels of {family} in docs/operations/metrics.md and in: {sample}"
            );
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| served.contains(&(f.to_string(), "histogram".to_string())));
        let family = family.unwrap_or(name);
        assert!(served.iter().any(|(f, _)| f == family), "a sample of no family (OpenMetrics' _total?): {line}");
    }
}

/// The label names of a sample line of the text format (`name{a="x",b="y\\"z"} 1`).
fn label_names(sample: &str) -> Vec<String> {
    let Some((_, rest)) = sample.split_once('{') else { return Vec::new() };
    let (mut names, mut name, mut in_value, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in rest.chars() {
        match (in_value, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_value = false,
            (true, false, _) => {}
            (false, _, '"') => in_value = true,
            (false, _, '=') => names.push(std::mem::take(&mut name)),
            (false, _, '}') => break,
            (false, _, ',') => {}
            (false, _, c) => name.push(c),
        }
    }
    names
}
