use super::*;
use crate::auth::certs::{issue_client_cert, CertAuthority};
use crate::auth::trust::CaBundle;
use rustls_pki_types::pem::PemObject;

#[allow(dead_code)]
#[path = "../../tests/operations/v1cert.rs"]
mod v1cert;

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn v1(ca: &CertAuthority, not_before: i64, not_after: i64) -> CertificateDer<'static> {
    CertificateDer::from(v1cert::issue_v1(ca.cert_der(), &ca.key_pem(), "v1-user", &["dev"], not_before, not_after).der)
}

fn accepted(ca: &CertAuthority, leaf: &CertificateDer<'_>) -> bool {
    let algs = crate::auth::crypto_provider().signature_verification_algorithms;
    issued_by_anchor(leaf, &[ca.cert_der().clone()], &algs, UnixTime::now())
}

#[test]
fn a_v1_certificate_of_the_ca_is_accepted_and_read_like_any_other() {
    let ca = CertAuthority::generate("ca").expect("ca");
    let leaf = v1(&ca, now() - 60, now() + 3600);
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf).expect("parses");
    assert_eq!(parsed.version(), X509Version::V1);
    assert!(is_pre_v3(&leaf));
    assert!(accepted(&ca, &leaf));
    // Through the bundle, as the authenticator verifies chains (webpki alone refuses it).
    let bundle = CaBundle::from_pem(ca.cert_pem().as_bytes()).expect("bundle");
    assert!(bundle.verifies(std::slice::from_ref(&leaf)));
}

#[test]
fn a_v1_certificate_is_refused_when_anything_is_wrong() {
    let ca = CertAuthority::generate("ca").expect("ca");
    let other = CertAuthority::generate("ca").expect("other ca of the same name");
    let good = v1cert::issue_v1(ca.cert_der(), &ca.key_pem(), "v1-user", &["dev"], now() - 60, now() + 3600);
    // Another CA of the same name: the signature does not verify.
    assert!(!accepted(&other, &CertificateDer::from(good.der.clone())));
    // A signature changed in transit.
    assert!(!accepted(&ca, &CertificateDer::from(v1cert::tampered(&good).der)));
    // Outside its validity period.
    assert!(!accepted(&ca, &v1(&ca, now() - 7200, now() - 3600)));
    assert!(!accepted(&ca, &v1(&ca, now() + 3600, now() + 7200)));
    // Not a certificate.
    assert!(!accepted(&ca, &CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01])));
    assert!(!is_pre_v3(&[0x30, 0x00]));
}

#[test]
fn v3_certificates_are_left_to_webpki() {
    let ca = CertAuthority::generate("ca").expect("ca");
    let (pem, _) = issue_client_cert(&ca, "alice", &["dev"]).expect("issue");
    let leaf = CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem");
    assert!(!is_pre_v3(&leaf));
    assert!(!accepted(&ca, &leaf));
    let bundle = CaBundle::from_pem(ca.cert_pem().as_bytes()).expect("bundle");
    assert!(bundle.verifies(&[leaf]));
}

#[test]
fn der_elements() {
    // Short and long lengths; another tag; truncated input.
    let e = element(&[0x02, 0x01, 0x05, 0xff], 0x02).expect("element");
    assert_eq!(e, Element { contents: &[0x05], whole: &[0x02, 0x01, 0x05], rest: &[0xff] });
    assert_eq!(element(&[0x02, 0x01, 0x05], 0x04), None);
    let long = [&[0x04, 0x81, 0x80][..], &[7u8; 0x80]].concat();
    assert_eq!(element(&long, 0x04).map(|e| (e.contents.len(), e.rest.len())), Some((0x80, 0)));
    assert_eq!(element(&[0x04, 0x05, 0x00], 0x04), None);
    assert_eq!(element(&[0x04, 0x80], 0x04), None);
    assert_eq!(bit_string(&[0x00, 0xaa]), Some(&[0xaa][..]));
    assert_eq!(bit_string(&[0x01, 0xaa]), None);
}
