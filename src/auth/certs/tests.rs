//! Tests of [`super`] (certs.rs), in a file of their own to keep that one readable.

use super::*;
use rcgen::KeyPair;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::{ServerName, UnixTime};
use std::sync::Arc;

fn options(dir: &Path) -> DevCertOptions {
    DevCertOptions {
        cert_dir: dir.join("certs"),
        extra_sans: vec!["migration.example.com".into(), "10.1.2.3".into()],
        kubeconfig_server: "https://127.0.0.1:1234".into(),
        ..DevCertOptions::default()
    }
}

fn roots(ca_pem: &[u8]) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("CA PEM")).expect("CA cert");
    }
    Arc::new(roots)
}

fn verify_server(ca_pem: &[u8], cert_pem: &[u8], name: &str) -> Result<(), rustls::Error> {
    let verifier =
        WebPkiServerVerifier::builder_with_provider(roots(ca_pem), Arc::new(rustls::crypto::ring::default_provider()))
            .build()
            .expect("verifier");
    let cert = CertificateDer::from_pem_slice(cert_pem).expect("cert PEM");
    let name = ServerName::try_from(name.to_string()).expect("server name");
    verifier.verify_server_cert(&cert, &[], &name, &[], UnixTime::now()).map(|_| ())
}

fn verify_client(ca_pem: &[u8], cert_pem: &[u8]) -> Result<(), rustls::Error> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(ca_pem), Arc::new(rustls::crypto::ring::default_provider()))
            .build()
            .expect("verifier");
    let cert = CertificateDer::from_pem_slice(cert_pem).expect("cert PEM");
    verifier.verify_client_cert(&cert, &[], UnixTime::now()).map(|_| ())
}

fn subject_values(cert_pem: &[u8]) -> (Vec<String>, Vec<String>) {
    let der = CertificateDer::from_pem_slice(cert_pem).expect("cert PEM");
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("parse");
    let cn = cert.subject().iter_common_name().map(|a| a.as_str().expect("str").to_string()).collect();
    let o = cert.subject().iter_organization().map(|a| a.as_str().expect("str").to_string()).collect();
    (cn, o)
}

#[test]
fn generates_all_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = options(tmp.path());
    let certs = ensure_dev_certs(&opts).expect("ensure_dev_certs");
    for path in [
        &certs.ca_cert_path,
        &certs.ca_key_path,
        &certs.serving_cert_path,
        &certs.serving_key_path,
        &certs.admin_cert_path,
        &certs.admin_key_path,
        &certs.admin_kubeconfig_path,
    ] {
        assert!(path.is_file(), "{} missing", path.display());
    }
    assert_eq!(certs.client_ca_path, certs.ca_cert_path);

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for path in [&certs.ca_key_path, &certs.serving_key_path, &certs.admin_key_path, &certs.admin_kubeconfig_path] {
            let mode = fs::metadata(path).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
    }
    // No temporary files left behind.
    let leftovers: Vec<_> = fs::read_dir(&opts.cert_dir)
        .expect("read_dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let kubeconfig = fs::read_to_string(&certs.admin_kubeconfig_path).expect("kubeconfig");
    assert!(kubeconfig.contains("server: \"https://127.0.0.1:1234\""));
    assert!(kubeconfig.contains("current-context: migration-apiserver"));
    assert!(kubeconfig.contains("certificate-authority-data: "));
    assert!(kubeconfig.contains("client-certificate-data: "));
    assert!(kubeconfig.contains("client-key-data: "));
}

#[test]
fn serving_cert_covers_service_names_and_chains_to_ca() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = ensure_dev_certs(&options(tmp.path())).expect("ensure_dev_certs");
    let ca = fs::read(&certs.ca_cert_path).expect("ca");
    let serving = fs::read(&certs.serving_cert_path).expect("serving");
    for name in [
        "localhost",
        "127.0.0.1",
        "::1",
        "migration-apiserver",
        "migration-apiserver.kube-system",
        "migration-apiserver.migration-apiserver.svc",
        "migration-apiserver.default.svc.cluster.local",
        "migration.example.com",
        "10.1.2.3",
    ] {
        verify_server(&ca, &serving, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(verify_server(&ca, &serving, "example.com").is_err());
    assert!(verify_server(&ca, &serving, "10.0.0.1").is_err());
    // A serving certificate is no client certificate.
    assert!(verify_client(&ca, &serving).is_err());
    // Another CA does not verify it.
    let other = CertAuthority::generate("other").expect("other CA");
    assert!(verify_server(other.cert_pem().as_bytes(), &serving, "localhost").is_err());
}

#[test]
fn admin_cert_is_a_client_cert_for_system_masters() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = ensure_dev_certs(&options(tmp.path())).expect("ensure_dev_certs");
    let ca = fs::read(&certs.ca_cert_path).expect("ca");
    let admin = fs::read(&certs.admin_cert_path).expect("admin");
    verify_client(&ca, &admin).expect("admin cert verifies as client cert");
    assert_eq!(subject_values(&admin), (vec![ADMIN_USER.to_string()], vec![ADMIN_GROUP.to_string()]));
}

#[test]
fn existing_files_are_reused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut opts = options(tmp.path());
    let certs = ensure_dev_certs(&opts).expect("first");
    let read_all = || {
        [
            &certs.ca_cert_path,
            &certs.ca_key_path,
            &certs.serving_cert_path,
            &certs.serving_key_path,
            &certs.admin_cert_path,
            &certs.admin_key_path,
        ]
        .map(|p| fs::read(p).expect("read"))
    };
    let before = read_all();
    opts.kubeconfig_server = "https://127.0.0.1:9999".into();
    opts.extra_sans.push("new-name.example.com".into());
    let again = ensure_dev_certs(&opts).expect("second");
    assert_eq!(again, certs);
    assert_eq!(read_all(), before, "certificates were regenerated");
    let kubeconfig = fs::read_to_string(&certs.admin_kubeconfig_path).expect("kubeconfig");
    assert!(kubeconfig.contains("https://127.0.0.1:9999"));
    assert!(!kubeconfig.contains("https://127.0.0.1:1234"));

    // A missing admin pair is re-issued by the existing CA; the rest is kept.
    fs::remove_file(&certs.admin_cert_path).expect("rm");
    fs::remove_file(&certs.admin_key_path).expect("rm");
    ensure_dev_certs(&opts).expect("third");
    let after = read_all();
    assert_eq!(after[..4], before[..4]);
    assert_ne!(after[4], before[4]);
    verify_client(&after[0], &after[4]).expect("re-issued admin cert chains to the old CA");
}

#[test]
fn incomplete_pairs_are_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = options(tmp.path());
    let certs = ensure_dev_certs(&opts).expect("first");
    fs::remove_file(&certs.serving_key_path).expect("rm");
    let err = ensure_dev_certs(&opts).expect_err("half a pair");
    assert!(err.to_string().contains("apiserver.key"), "{err}");
    assert!(certs.serving_cert_path.exists(), "must not be deleted");

    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = options(tmp.path());
    let certs = ensure_dev_certs(&opts).expect("first");
    fs::remove_file(&certs.ca_cert_path).expect("rm");
    fs::remove_file(&certs.ca_key_path).expect("rm");
    let err = ensure_dev_certs(&opts).expect_err("issued certs without CA");
    assert!(err.to_string().contains("ca.crt"), "{err}");
}

#[test]
fn ca_key_not_needed_when_everything_is_issued() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = options(tmp.path());
    let certs = ensure_dev_certs(&opts).expect("first");
    fs::remove_file(&certs.ca_key_path).expect("rm");
    ensure_dev_certs(&opts).expect("works without ca.key");
    fs::remove_file(&certs.admin_key_path).expect("rm");
    fs::remove_file(&certs.admin_cert_path).expect("rm");
    assert!(ensure_dev_certs(&opts).is_err(), "cannot issue without ca.key");
}

#[test]
fn loaded_ca_issues_chaining_certs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = ensure_dev_certs(&options(tmp.path())).expect("ensure_dev_certs");
    let ca = CertAuthority::load(&certs.ca_cert_path, &certs.ca_key_path).expect("load");
    assert_eq!(ca.cert_pem(), fs::read_to_string(&certs.ca_cert_path).expect("read"));
    let (cert, _key) = issue_client_cert(&ca, "alice", &["dev"]).expect("issue");
    verify_client(ca.cert_pem().as_bytes(), cert.as_bytes()).expect("chains");

    let other = CertAuthority::generate("other").expect("other");
    assert!(CertAuthority::from_pem(ca.cert_pem(), &other.key_pem()).is_err());
}

#[test]
fn client_cert_groups() {
    let ca = CertAuthority::generate("test-ca").expect("ca");
    for groups in [vec![], vec!["one"], vec!["one", "two"], vec!["system:masters", "b", "c", "d", "e"]] {
        let (cert, key) = issue_client_cert(&ca, "bob", &groups).expect("issue");
        verify_client(ca.cert_pem().as_bytes(), cert.as_bytes()).unwrap_or_else(|e| panic!("{groups:?}: {e}"));
        assert!(KeyPair::from_pem(&key).is_ok());
        let (cn, o) = subject_values(cert.as_bytes());
        assert_eq!(cn, vec!["bob"]);
        assert_eq!(o, groups);
    }
    let too_many: Vec<String> = (0..=MAX_CLIENT_CERT_GROUPS).map(|i| i.to_string()).collect();
    assert!(issue_client_cert(&ca, "bob", &too_many).is_err());
}

#[test]
fn serving_sans_are_deduplicated() {
    let opts = DevCertOptions {
        extra_sans: vec!["localhost".into(), " 127.0.0.1 ".into(), "".into()],
        namespaces: vec!["a".into()],
        ..DevCertOptions::default()
    };
    assert_eq!(
        opts.serving_sans(),
        vec![
            "localhost",
            "127.0.0.1",
            "::1",
            "migration-apiserver",
            "migration-apiserver.a",
            "migration-apiserver.a.svc",
            "migration-apiserver.a.svc.cluster.local",
        ]
    );
}
