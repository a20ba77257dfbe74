//! Operations: shutdown with watches open and a write in flight, a port or data directory already in use, log
//! colour, X.509 v1 client certificates, and the 413 of an oversized body while the client is still sending.

mod common;
#[path = "operations/raw.rs"]
mod raw;
#[path = "operations/v1cert.rs"]
mod v1cert;

use common::{etcd_backend_selected, eventually, free_port, kubectl_with, Server, BIN};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tokio::time::timeout;

const SVM_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";
const LIMIT: usize = 3 * 1024 * 1024;

fn svm(name: &str) -> String {
    serde_json::json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    })
    .to_string()
}

fn signal(s: &Server, sig: &str) {
    let pid = s.pid().expect("the server runs");
    let status = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().expect("kill");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Runs `cmd` (a server expected to fail at start) until it exits; stdout and stderr go to files in `dir`.
fn run_to_exit(cmd: &mut Command, dir: &Path) -> Output {
    let (out, err) = (dir.join("run.out"), dir.join("run.err"));
    let file = |p: &Path| std::fs::File::create(p).expect("output file");
    let mut child = cmd.stdout(file(&out)).stderr(file(&err)).stdin(Stdio::null()).spawn().expect("spawn");
    let read = |p: &Path| std::fs::read(p).unwrap_or_default();
    let status = eventually("the server to exit", Duration::from_secs(30), || child.try_wait().expect("wait"));
    Output { status, stdout: read(&out), stderr: read(&err) }
}

#[tokio::test]
async fn shutdown_ends_open_watches_at_once_and_lets_in_flight_writes_finish() {
    let mut s = Server::start(&[]);
    let ca = s.cert_dir().join("ca.crt");
    let (cert, key) = raw::admin(&s.cert_dir());
    let me = Some((cert.as_str(), key.as_str()));

    // A watch (raw, so that a clean end can be told from a reset connection).
    let (mut wr, mut ww) = raw::connect(s.port, &ca, me, raw::TLS13).await;
    let get = "GET /apis/migration.k8s.io/v1alpha1/storagestates?watch=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    raw::send(&mut ww, get.as_bytes()).await.expect("send the watch");
    let watch = timeout(Duration::from_secs(20), raw::read_head(&mut wr)).await.expect("watch head").expect("head");
    assert_eq!((watch.status, watch.header("transfer-encoding")), (200, Some("chunked")), "{watch:?}");

    // A create in flight: hyper answers `100 Continue` when the handler starts reading the body, so the request is
    // in the server's hands before the signal, and its body comes after it.
    let body = svm("in-flight");
    let (mut cr, mut cw) = raw::connect(s.port, &ca, me, raw::TLS13).await;
    let head = format!(
        "POST {SVM_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    raw::send(&mut cw, head.as_bytes()).await.expect("send the head");
    let cont = timeout(Duration::from_secs(20), raw::read_head(&mut cr)).await.expect("100 Continue").expect("head");
    assert_eq!(cont.status, 100, "{cont:?}");

    let signalled = Instant::now();
    signal(&s, "TERM");
    // The watch ends at once, cleanly: the last chunk, not a reset.
    let rest = timeout(Duration::from_secs(5), raw::read_body(&mut wr, &watch)).await;
    let rest = rest.expect("the watch did not end within 5 s of SIGTERM");
    rest.expect("the watch did not end cleanly");
    // The write finishes.
    raw::send(&mut cw, body.as_bytes()).await.expect("send the body");
    let created = timeout(Duration::from_secs(5), raw::read_head(&mut cr)).await.expect("an answer").expect("head");
    assert_eq!(created.status, 201, "{created:?}\n{}", s.log());
    let obj: Value = serde_json::from_slice(&raw::read_body(&mut cr, &created).await.expect("body")).expect("json");
    assert_eq!(obj["metadata"]["name"], "in-flight");
    // And the process is gone, well within 5 s.
    let status = s.wait_exit(Duration::from_secs(5).saturating_sub(signalled.elapsed()));
    let status = status.unwrap_or_else(|| panic!("still running 5 s after SIGTERM:\n{}", s.log()));
    assert!(status.success(), "{status}\n{}", s.log());

    // The write was stored.
    s.restart();
    s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io", "in-flight"]);

    // Ctrl-C (SIGINT) with kubectl's watch open: the same.
    let cache = s.dir.join("kube-cache");
    let mut kubectl = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .arg("--cache-dir")
        .arg(&cache)
        .args(["get", "storageversionmigrations.migration.k8s.io", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl");
    let stdout = kubectl.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = |what: &'static str| {
        eventually(what, Duration::from_secs(30), || rx.try_recv().ok().filter(|l| l.ends_with(what)))
    };
    line("/in-flight");
    // Its watch is open once an object created after its list shows up in it.
    s.kubectl_stdin(&["create", "-f", "-"], &svm("after-list"));
    line("/after-list");
    let signalled = Instant::now();
    signal(&s, "INT");
    let status = s.wait_exit(Duration::from_secs(5));
    let status = status.unwrap_or_else(|| panic!("still running 5 s after SIGINT:\n{}", s.log()));
    assert!(status.success(), "{status}\n{}", s.log());
    let left = Duration::from_secs(5).saturating_sub(signalled.elapsed());
    eventually("kubectl's watch to end", left, || kubectl.try_wait().expect("wait"));
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let mut s = Server::start(&[]);
    let (cert, key) = raw::admin(&s.cert_dir());
    // A request that holds the shutdown: its body never comes.
    let (mut r, mut w) = raw::connect(s.port, &s.cert_dir().join("ca.crt"), Some((&cert, &key)), raw::TLS13).await;
    let head = format!(
        "POST {SVM_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    );
    raw::send(&mut w, head.as_bytes()).await.expect("send the head");
    let cont = timeout(Duration::from_secs(20), raw::read_head(&mut r)).await.expect("100 Continue").expect("head");
    assert_eq!(cont.status, 100, "{cont:?}");
    signal(&s, "TERM");
    eventually("the shutdown to begin", Duration::from_secs(10), || {
        s.log().contains("no longer accepting connections").then_some(())
    });
    signal(&s, "TERM");
    let status = s.wait_exit(Duration::from_secs(5)).unwrap_or_else(|| panic!("still running:\n{}", s.log()));
    // 1: not the graceful exit (0), which would have waited for the request.
    assert_eq!(status.code(), Some(1), "{}", s.log());
    assert!(s.log().contains("second signal: exiting at once"), "{}", s.log());
}

#[test]
fn a_port_in_use_is_named() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run_to_exit(
        Command::new(BIN)
            .args(["serve", "--secure-port", &port.to_string(), "--disable-scheduler"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--cert-dir")
            .arg(dir.path().join("certs")),
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let want = format!("failed to listen on 127.0.0.1:{port}: address already in use");
    assert!(stderr.contains(&want), "{stderr}");
    // Nothing was created on the way.
    assert!(!dir.path().join("data").exists() && !dir.path().join("certs").exists());
}

#[test]
fn a_second_server_on_the_same_data_dir_says_it_is_in_use() {
    if etcd_backend_selected() {
        eprintln!("skipped: this is about the embedded store's directory");
        return;
    }
    let s = Server::start(&[]);
    let kubeconfig = std::fs::read(s.kubeconfig()).expect("kubeconfig");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run_to_exit(
        Command::new(BIN)
            .args(["serve", "--secure-port", &free_port().to_string(), "--disable-scheduler"])
            .arg("--data-dir")
            .arg(s.data_dir())
            .arg("--cert-dir")
            .arg(s.cert_dir()),
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let want = format!("the data directory {} is in use by another process", s.data_dir().display());
    assert!(stderr.contains(&want), "{stderr}");
    // The running server is untouched: the shared certificate directory's kubeconfig still points at it.
    assert_eq!(std::fs::read(s.kubeconfig()).expect("kubeconfig"), kubeconfig);
    s.kubectl_ok(&["get", "--raw", "/readyz"]);
}

#[test]
fn log_colour_only_on_a_terminal() {
    // stderr a file, as in these tests, under systemd or in a pod: no escape codes.
    let s = Server::start(&[]);
    let log = s.log();
    assert!(log.contains("INFO") && !log.contains('\x1b'), "{log:?}");
    drop(s);

    // stderr a terminal: `script` (util-linux, in every Debian) gives the server one.
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cmd = format!(
        "exec {BIN} serve --secure-port {port} --data-dir {} --cert-dir {} --disable-scheduler",
        dir.path().join("data").display(),
        dir.path().join("certs").display()
    );
    let out = dir.path().join("tty.out");
    let mut script = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux)");
    let tty = eventually("the server's log on the terminal", Duration::from_secs(30), || {
        std::fs::read_to_string(&out).ok().filter(|o| o.contains("serving"))
    });
    // The terminal goes away with `script`, and the server with it (SIGHUP).
    let _ = script.kill();
    let _ = script.wait();
    assert!(tty.contains("\x1b["), "no colour on a terminal: {tty:?}");
    eventually("the server on the terminal to stop", Duration::from_secs(10), || {
        std::net::TcpListener::bind(("127.0.0.1", port)).ok()
    });
}

/// The status of `GET path` on a new connection with the client certificate `client` over TLS `versions`.
async fn get_status(
    s: &Server,
    client: (&str, &str),
    versions: &[&'static rustls::SupportedProtocolVersion],
    path: &str,
) -> u16 {
    let (mut r, mut w) = raw::connect(s.port, &s.cert_dir().join("ca.crt"), Some(client), versions).await;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    raw::send(&mut w, req.as_bytes()).await.expect("send");
    let head = timeout(Duration::from_secs(20), raw::read_head(&mut r)).await.expect("an answer in 20 s");
    head.unwrap_or_else(|e| panic!("no answer ({e}):\n{}", s.log())).status
}

#[tokio::test]
async fn v1_client_certificates_are_accepted_as_kube_apiserver_accepts_them() {
    let s = Server::start(&[]);
    let certs = s.cert_dir();
    let ca_pem = std::fs::read(certs.join("ca.crt")).expect("ca.crt");
    let ca_der = rustls::pki_types::pem::PemObject::from_pem_slice(&ca_pem)
        .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
        .expect("CA PEM");
    let ca_key = std::fs::read_to_string(certs.join("ca.key")).expect("ca.key");
    let now = chrono::Utc::now().timestamp();
    let issue = |cn: &str, orgs: &[&str]| v1cert::issue_v1(&ca_der, &ca_key, cn, orgs, now - 60, now + 3600);
    let admin = issue("v1-admin", &["system:masters"]);
    let (_, parsed) = x509_parser::parse_x509_certificate(&admin.der).expect("parses");
    assert_eq!(parsed.version(), x509_parser::x509::X509Version::V1, "the test needs a v1 certificate");

    // kubectl (Go's TLS 1.3, as kube-apiserver's own clients): a member of system:masters may list...
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = |name: &str, cert: &v1cert::V1Cert| {
        let (crt, key) = (dir.path().join(format!("{name}.crt")), dir.path().join(format!("{name}.key")));
        std::fs::write(&crt, &cert.cert_pem).expect("write");
        std::fs::write(&key, &cert.key_pem).expect("write");
        let path = dir.path().join(format!("{name}.kubeconfig"));
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            s.url(),
            certs.join("ca.crt").display(),
            crt.display(),
            key.display()
        );
        std::fs::write(&path, config).expect("write");
        path
    };
    let out = kubectl_with(&kubeconfig("admin", &admin), &["get", "storageversionmigrations.migration.k8s.io"], None);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), s.log());
    // ... and anyone else is who the certificate says: the 403 names the user.
    let viewer = issue("v1-viewer", &[]);
    let out = kubectl_with(&kubeconfig("viewer", &viewer), &["get", "storageversionmigrations"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("User \"v1-viewer\" cannot list"), "{stderr}");

    // TLS 1.2 (the handshake signature is checked another way) and TLS 1.3, from rustls.
    let me = (admin.cert_pem.as_str(), admin.key_pem.as_str());
    assert_eq!(get_status(&s, me, raw::TLS12, SVM_PATH).await, 200);
    assert_eq!(get_status(&s, me, raw::TLS13, SVM_PATH).await, 200);

    // Refused like any certificate kube-apiserver refuses: 401, not a failed handshake.
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "migration-apiserver-ca");
    let other_key = rcgen::KeyPair::generate().expect("key");
    let other_ca = params.self_signed(&other_key).expect("other CA");
    let strays = [
        ("another CA of the same name", {
            v1cert::issue_v1(
                other_ca.der(),
                &other_key.serialize_pem(),
                "intruder",
                &["system:masters"],
                now - 60,
                now + 3600,
            )
        }),
        ("expired", v1cert::issue_v1(&ca_der, &ca_key, "v1-admin", &["system:masters"], now - 7200, now - 3600)),
        ("tampered", v1cert::tampered(&issue("v1-admin", &["system:masters"]))),
    ];
    for (what, cert) in &strays {
        let code = get_status(&s, (&cert.cert_pem, &cert.key_pem), raw::TLS13, SVM_PATH).await;
        assert_eq!(code, 401, "{what}");
    }
    assert!(!s.log().contains("client certificate refused"), "{}", s.log());

    // A client that does not hold the certificate's key fails the handshake, and the log says why and who.
    let wrong_key = (admin.cert_pem.as_str(), viewer.key_pem.as_str());
    let (mut r, mut w) = raw::connect(s.port, &certs.join("ca.crt"), Some(wrong_key), raw::TLS13).await;
    let _ = raw::send(&mut w, b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
    assert!(raw::read_head(&mut r).await.is_err(), "a connection with a key that does not match its certificate");
    let line = eventually("the refusal in the log", Duration::from_secs(10), || {
        s.log().lines().find(|l| l.contains("client certificate refused")).map(str::to_string)
    });
    assert!(line.contains("WARN") && line.contains("remote=127.0.0.1:"), "{line}");
}

/// Sends `n` bytes of body (blanks) in 64 KiB pieces, as chunks when `chunked`.
async fn send_body(w: &mut raw::Writer, n: usize, chunked: bool) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let piece = vec![b' '; 64 * 1024];
    for _ in 0..n.div_ceil(piece.len()) {
        if chunked {
            w.write_all(format!("{:x}\r\n", piece.len()).as_bytes()).await?;
            w.write_all(&piece).await?;
            w.write_all(b"\r\n").await?;
        } else {
            w.write_all(&piece).await?;
        }
    }
    w.flush().await
}

#[tokio::test]
async fn an_oversized_body_gets_its_413_while_the_client_is_still_sending() {
    let s = Server::start(&[]);
    let ca = s.cert_dir().join("ca.crt");
    let (cert, key) = raw::admin(&s.cert_dir());
    // A declared length over the limit, and a body of unknown length that grows past it.
    for chunked in [false, true] {
        let (mut r, mut w) = raw::connect(s.port, &ca, Some((&cert, &key)), raw::TLS13).await;
        let framing =
            if chunked { "Transfer-Encoding: chunked".to_string() } else { format!("Content-Length: {}", 64 << 20) };
        let head = format!(
            "POST {SVM_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
        );
        raw::send(&mut w, head.as_bytes()).await.expect("send the head");
        // Past the limit, then the client pauses with its body unfinished: the answer does not wait for the rest.
        let sent = timeout(Duration::from_secs(20), send_body(&mut w, LIMIT + (1 << 20), chunked)).await;
        sent.expect("the body's first 4 MiB not taken in 20 s").expect("send");
        let answer = timeout(Duration::from_secs(20), raw::read_head(&mut r)).await;
        let answer = answer.unwrap_or_else(|_| panic!("no answer while the body is unfinished (chunked: {chunked})"));
        let answer = answer.expect("head");
        assert_eq!(answer.status, 413, "{answer:?}");
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let status: Value =
            serde_json::from_slice(&raw::read_body(&mut r, &answer).await.expect("body")).expect("json");
        assert_eq!(
            (&status["kind"], &status["status"], &status["reason"], &status["code"]),
            (&"Status".into(), &"Failure".into(), &"RequestEntityTooLarge".into(), &413.into()),
            "{status}"
        );
        assert_eq!(status["message"], format!("Request entity too large: limit is {LIMIT}"));
        // The server reads on and discards: the client can send more without its connection being reset (or its
        // writes blocking on a connection nobody reads).
        let more = timeout(Duration::from_secs(20), send_body(&mut w, 8 << 20, chunked)).await;
        more.expect("8 MiB more not taken in 20 s").expect("no reset while the server discards");
    }
}
