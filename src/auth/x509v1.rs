//! X.509 v1 client certificates, accepted as kube-apiserver accepts them.
//!
//! rustls (webpki) refuses any certificate older than v3 (`UnsupportedCertVersion`), both when it checks the
//! handshake signature and when it verifies a chain; Go's crypto/x509, and so kube-apiserver, accepts a v1 (or v2)
//! end-entity certificate. Such certificates are still around: `openssl x509 -req` without an extension file made
//! them until OpenSSL 3.2, and users of older clusters carry certificates made that way. Without this module their
//! connections were dropped in the handshake, with nothing logged.
//!
//! A v1 certificate has no extensions (no key usage, no basic constraints, no names to constrain), so Go checks
//! nothing more than this module does: the issuer's signature, the issuer's name, and the validity periods. The
//! issuer must be a CA of the bundle itself: Go requires every intermediate to be a v3 CA, and chains built from
//! intermediates end in v3 certificates in practice, so a v1 certificate under an intermediate is refused (401).

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{CertificateError, DigitallySignedStruct, PeerMisbehaved};
use rustls_pki_types::{CertificateDer, SubjectPublicKeyInfoDer, UnixTime};
use x509_parser::time::ASN1Time;
use x509_parser::x509::X509Version;

/// Whether `cert` parses as an X.509 certificate older than v3 (the versions rustls refuses).
pub fn is_pre_v3(cert: &[u8]) -> bool {
    x509_parser::parse_x509_certificate(cert).is_ok_and(|(_, c)| c.version().0 < X509Version::V3.0)
}

/// The TLS 1.3 CertificateVerify signature of a pre-v3 certificate, checked against its public key as rustls
/// checks it for v3 certificates.
pub fn verify_tls13_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let spki = spki_of(cert)?;
    rustls::crypto::verify_tls13_signature_with_raw_key(message, &SubjectPublicKeyInfoDer::from(spki), dss, algs)
}

/// The TLS 1.2 signature of a pre-v3 certificate. A TLS 1.2 scheme does not name the curve of an ECDSA key, so
/// every algorithm of the scheme whose key type is the certificate's is a candidate, as in rustls.
pub fn verify_tls12_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let (key_alg, key) = spki_parts(spki_of(cert)?).ok_or(bad_encoding())?;
    let candidates = algs
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .map(|(_, candidates)| *candidates)
        .ok_or(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme)?;
    let alg = candidates
        .iter()
        .find(|alg| alg.public_key_alg_id().as_ref() == key_alg)
        .ok_or(rustls::Error::InvalidCertificate(CertificateError::BadSignature))?;
    alg.verify_signature(key, message, dss.signature())
        .map(|()| HandshakeSignatureValid::assertion())
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadSignature))
}

/// Whether the pre-v3 certificate `leaf` was issued by one of `anchors` (DER CA certificates), both valid at `now`.
/// False for v3 certificates, which webpki verifies.
pub fn issued_by_anchor(
    leaf: &CertificateDer<'_>,
    anchors: &[CertificateDer<'static>],
    algs: &WebPkiSupportedAlgorithms,
    now: UnixTime,
) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else { return false };
    let Some(now) = i64::try_from(now.as_secs()).ok().and_then(|s| ASN1Time::from_timestamp(s).ok()) else {
        return false;
    };
    if cert.version().0 >= X509Version::V3.0 || !cert.validity().is_valid_at(now) {
        return false;
    }
    let Some((signed, sig_alg, signature)) = signed_parts(leaf) else { return false };
    anchors.iter().any(|anchor| {
        let Ok((_, ca)) = x509_parser::parse_x509_certificate(anchor) else { return false };
        let Some((key_alg, key)) = spki_parts(ca.public_key().raw) else { return false };
        // Raw name bytes, as Go finds a certificate's parents (and webpki its trust anchors).
        ca.subject().as_raw() == cert.issuer().as_raw()
            && ca.validity().is_valid_at(now)
            // Both identifiers must match: ECDSA P-256 and P-384 share a signature algorithm and differ by key.
            && algs
                .all
                .iter()
                .filter(|alg| alg.signature_alg_id().as_ref() == sig_alg && alg.public_key_alg_id().as_ref() == key_alg)
                .any(|alg| alg.verify_signature(key, signed, signature).is_ok())
    })
}

fn bad_encoding() -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
}

/// The SubjectPublicKeyInfo of a certificate, as DER.
fn spki_of<'a>(cert: &'a CertificateDer<'_>) -> Result<&'a [u8], rustls::Error> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| bad_encoding())?;
    Ok(parsed.tbs_certificate.subject_pki.raw)
}

/// A SubjectPublicKeyInfo's algorithm (the contents of its AlgorithmIdentifier, as rustls names algorithms) and key.
fn spki_parts(spki: &[u8]) -> Option<(&[u8], &[u8])> {
    let spki = element(spki, SEQUENCE)?.contents;
    let alg = element(spki, SEQUENCE)?;
    let key = bit_string(element(alg.rest, BIT_STRING)?.contents)?;
    Some((alg.contents, key))
}

/// What a certificate's issuer signed: the whole TBSCertificate, the signature algorithm (the contents of its
/// AlgorithmIdentifier) and the signature.
fn signed_parts(cert: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let cert = element(cert, SEQUENCE)?.contents;
    let tbs = element(cert, SEQUENCE)?;
    let alg = element(tbs.rest, SEQUENCE)?;
    let signature = bit_string(element(alg.rest, BIT_STRING)?.contents)?;
    Some((tbs.whole, alg.contents, signature))
}

const SEQUENCE: u8 = 0x30;
const BIT_STRING: u8 = 0x03;

/// One DER element.
#[derive(Debug, PartialEq)]
struct Element<'a> {
    contents: &'a [u8],
    /// Tag, length and contents.
    whole: &'a [u8],
    /// What follows it.
    rest: &'a [u8],
}

/// The DER element at the start of `input`, if it has the tag `tag`.
fn element(input: &[u8], tag: u8) -> Option<Element<'_>> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if found != tag || rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some(Element { contents: &rest[..len], whole: &input[..header + len], rest: &rest[len..] })
}

/// The bytes of a BIT STRING's contents: keys and signatures are whole bytes, without unused bits.
fn bit_string(contents: &[u8]) -> Option<&[u8]> {
    match contents.split_first()? {
        (0, bytes) => Some(bytes),
        _ => None,
    }
}

#[cfg(test)]
#[path = "x509v1_tests.rs"]
mod tests;
