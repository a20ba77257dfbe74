//! Issues X.509 v1 client certificates. No tool at hand writes them any more (rcgen writes v3 only, and
//! `openssl x509 -req` writes v3 since OpenSSL 3.2, which a fresh Debian has), so the TBSCertificate is written here
//! in DER by hand and signed with rcgen's key. Shared by the integration tests and the unit tests of
//! `auth::x509v1` (through `#[path]`).

use base64::Engine as _;
use rcgen::{KeyPair, PublicKeyData as _, SigningKey as _};

/// ecdsa-with-SHA256, the contents of its AlgorithmIdentifier (the CAs here have P-256 keys).
const ECDSA_WITH_SHA256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const OID_CN: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];

pub struct V1Cert {
    pub der: Vec<u8>,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A v1 certificate of a new P-256 key for user `cn` in groups `orgs`, issued by the CA `ca_cert_der` with its key
/// `ca_key_pem`, valid between the Unix times `not_before` and `not_after` (before 2050: UTCTime).
pub fn issue_v1(
    ca_cert_der: &[u8],
    ca_key_pem: &str,
    cn: &str,
    orgs: &[&str],
    not_before: i64,
    not_after: i64,
) -> V1Cert {
    let ca_key = KeyPair::from_pem(ca_key_pem).expect("CA key");
    assert_eq!(ca_key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256, "the CA key must be P-256");
    let (_, ca) = x509_parser::parse_x509_certificate(ca_cert_der).expect("CA certificate");
    let key = KeyPair::generate().expect("key");

    let mut subject = Vec::new();
    for o in orgs {
        subject.extend(tlv(0x31, &tlv(0x30, &[OID_O, &tlv(0x0c, o.as_bytes())].concat())));
    }
    subject.extend(tlv(0x31, &tlv(0x30, &[OID_CN, &tlv(0x0c, cn.as_bytes())].concat())));
    let alg = tlv(0x30, ECDSA_WITH_SHA256);
    let mut serial = uuid::Uuid::new_v4().as_bytes()[..8].to_vec();
    serial[0] = (serial[0] & 0x7f) | 0x01;
    // No [0] version field: that is what makes it v1.
    let tbs = tlv(
        0x30,
        &[
            tlv(0x02, &serial),
            alg.clone(),
            ca.subject().as_raw().to_vec(),
            tlv(0x30, &[utc_time(not_before), utc_time(not_after)].concat()),
            tlv(0x30, &subject),
            key.subject_public_key_info(),
        ]
        .concat(),
    );
    let signature = ca_key.sign(&tbs).expect("sign");
    let der = tlv(0x30, &[tbs, alg, tlv(0x03, &[&[0u8][..], &signature].concat())].concat());
    V1Cert { cert_pem: pem(&der), der, key_pem: key.serialize_pem() }
}

/// `cert` with the last byte of its signature changed: the issuer's signature no longer verifies.
pub fn tampered(cert: &V1Cert) -> V1Cert {
    let mut der = cert.der.clone();
    if let Some(last) = der.last_mut() {
        *last ^= 0x01;
    }
    V1Cert { cert_pem: pem(&der), der, key_pem: cert.key_pem.clone() }
}

fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> =
        b64.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).expect("base64 is ASCII")).collect();
    format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"))
}

fn utc_time(unix: i64) -> Vec<u8> {
    let t = chrono::DateTime::from_timestamp(unix, 0).expect("time");
    tlv(0x17, t.format("%y%m%d%H%M%SZ").to_string().as_bytes())
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}
