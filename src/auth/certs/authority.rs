//! The certificate authority: issuing serving and client certificates (client certificates with any number of groups).

use super::*;
use crate::auth::{Error, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::ParsedExtension;

/// A certificate authority able to issue certificates: its certificate plus signing key.
pub struct CertAuthority {
    pub(super) cert_pem: String,
    pub(super) cert_der: CertificateDer<'static>,
    pub(super) issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority").field("issuer", &self.issuer).finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// A new self-signed CA (ECDSA P-256, valid for 10 years).
    pub fn generate(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params, CA_VALIDITY)?;
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Ok(CertAuthority { cert_pem: cert.pem(), cert_der: cert.der().clone(), issuer: Issuer::new(params, key) })
    }

    /// Loads a CA from PEM files (the key must be PKCS#8, `-----BEGIN PRIVATE KEY-----`).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self> {
        let cert_pem = read_to_string(cert_path)?;
        let key_pem = read_to_string(key_path)?;
        Self::from_pem(&cert_pem, &key_pem)
            .map_err(|e| Error::file(cert_path, format!("loading CA with key {}: {e}", key_path.display())))
    }

    /// A CA from its PEM certificate and PEM (PKCS#8) private key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| Error::Invalid(format!("invalid CA certificate PEM: {e}")))?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| Error::Invalid(format!("invalid CA key (PKCS#8 PEM expected): {e}")))?;
        let (_, x509) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|e| Error::Invalid(format!("invalid CA certificate: {e}")))?;
        if x509.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
            return Err(Error::Invalid("CA private key does not match the CA certificate".into()));
        }
        if !x509.is_ca() {
            return Err(Error::Invalid("certificate is not a CA".into()));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name_from_x509(x509.subject())?;
        params.key_identifier_method = x509
            .iter_extensions()
            .find_map(|ext| match ext.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => Some(KeyIdMethod::PreSpecified(id.0.to_vec())),
                _ => None,
            })
            .unwrap_or(KeyIdMethod::Sha256);
        let cert_pem = pem_encode_cert(&cert_der);
        let cert_der = cert_der.into_owned();
        Ok(CertAuthority { cert_pem, cert_der, issuer: Issuer::new(params, key) })
    }

    /// The CA certificate, PEM encoded.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER encoded.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The CA private key, PKCS#8 PEM encoded.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }
}

/// Issues a serving certificate (server-auth, valid for one year) for the given names, which
/// become IP SANs when they parse as IP addresses and DNS SANs otherwise. Returns
/// `(cert_pem, key_pem)`.
pub fn issue_serving_cert(ca: &CertAuthority, sans: &[String]) -> Result<(String, String)> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let cn = sans.iter().find(|s| s.parse::<IpAddr>().is_err());
    params.distinguished_name.push(DnType::CommonName, cn.map(String::as_str).unwrap_or("migration-apiserver"));
    params.subject_alt_names =
        sans.iter()
            .map(|s| -> Result<SanType> {
                Ok(match s.parse::<IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => SanType::DnsName(s.clone().try_into().map_err(|e| {
                        Error::Invalid(format!("invalid DNS name {s:?} for the serving certificate: {e}"))
                    })?),
                })
            })
            .collect::<Result<_>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    ca.issue(params, LEAF_VALIDITY)
}

/// Issues a client certificate (client-auth, valid for one year) with subject CN = `cn` (the user
/// name) and one O (organization) attribute per group, which is how Kubernetes maps client
/// certificates to users and groups. Returns `(cert_pem, key_pem)`.
pub fn issue_client_cert<S: AsRef<str>>(ca: &CertAuthority, cn: &str, groups: &[S]) -> Result<(String, String)> {
    if groups.len() > MAX_CLIENT_CERT_GROUPS {
        return Err(Error::Invalid(format!("at most {MAX_CLIENT_CERT_GROUPS} groups per client certificate")));
    }
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    // rcgen keeps one value per attribute type, so the second and later groups are written under
    // placeholder attribute types and turned into organizationName afterwards (see
    // `CertAuthority::resign_placeholder_organizations`).
    for (i, group) in groups.iter().enumerate() {
        let ty = match i {
            0 => DnType::OrganizationName,
            _ => DnType::CustomDnType(placeholder_oid(i)),
        };
        params.distinguished_name.push(ty, DnValue::Utf8String(group.as_ref().to_string()));
    }
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let (cert_der, key) = ca.issue_der(params, LEAF_VALIDITY)?;
    let cert_der =
        if groups.len() > 1 { ca.resign_placeholder_organizations(&cert_der, groups.len() - 1)? } else { cert_der };
    Ok((pem_encode_cert(&cert_der), key.serialize_pem()))
}

/// The most groups [`issue_client_cert`] can encode (one placeholder OID arc per extra group).
pub const MAX_CLIENT_CERT_GROUPS: usize = 128;

/// The organizationName attribute type OID (2.5.4.10), DER encoded.
pub(super) const ORG_NAME_OID_TLV: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x0a];

/// Placeholder attribute type `0.39.127.<i>`: DER `06 03 27 7f <i>`, the same length as the
/// organizationName OID so that it can be replaced in place.
pub(super) fn placeholder_oid(i: usize) -> Vec<u64> {
    vec![0, 39, 127, i as u64]
}

pub(super) fn placeholder_oid_tlv(i: usize) -> [u8; 5] {
    [0x06, 0x03, 0x27, 0x7f, i as u8]
}

/// Total length (header + content) of the DER TLV at the start of `buf`.
pub(super) fn der_tlv_len(buf: &[u8]) -> Option<usize> {
    let first = *buf.get(1)?;
    if first < 0x80 {
        return Some(2 + first as usize);
    }
    let n = (first & 0x7f) as usize;
    if n == 0 || n > 4 {
        return None;
    }
    let len = buf.get(2..2 + n)?.iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
    Some(2 + n + len)
}

pub(super) fn der_header(tag: u8, len: usize) -> Vec<u8> {
    let mut out = vec![tag];
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out
}

/// Offset of `inner` within `outer`, when `inner` is a sub-slice of it.
pub(super) fn subslice_offset(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

impl CertAuthority {
    pub(super) fn issue_der(
        &self,
        mut params: CertificateParams,
        validity: Duration,
    ) -> Result<(CertificateDer<'static>, KeyPair)> {
        let key = KeyPair::generate()?;
        set_validity(&mut params, validity)?;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        params.is_ca = IsCa::ExplicitNoCa;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.der().clone(), key))
    }

    pub(super) fn issue(&self, params: CertificateParams, validity: Duration) -> Result<(String, String)> {
        let (der, key) = self.issue_der(params, validity)?;
        Ok((pem_encode_cert(&der), key.serialize_pem()))
    }

    /// Replaces the placeholder attribute types 1..=`count` in the subject of `der` by
    /// organizationName and signs the certificate again.
    pub(super) fn resign_placeholder_organizations(&self, der: &[u8], count: usize) -> Result<CertificateDer<'static>> {
        let malformed = || Error::Invalid("unexpected structure of a generated certificate".into());
        let (_, x509) = x509_parser::parse_x509_certificate(der).map_err(|_| malformed())?;
        let tbs_raw = x509.tbs_certificate.as_ref();
        let tbs_start = subslice_offset(der, tbs_raw).ok_or_else(malformed)?;
        let subject_raw = x509.subject().as_raw();
        let subject_start = subslice_offset(tbs_raw, subject_raw).ok_or_else(malformed)?;
        let mut tbs = tbs_raw.to_vec();
        let subject = &mut tbs[subject_start..subject_start + subject_raw.len()];
        for i in 1..=count {
            let pattern = placeholder_oid_tlv(i);
            let pos = subject.windows(pattern.len()).position(|w| w == pattern).ok_or_else(malformed)?;
            subject[pos..pos + pattern.len()].copy_from_slice(&ORG_NAME_OID_TLV);
        }
        // Outer structure: SEQUENCE { tbsCertificate, signatureAlgorithm, signatureValue }.
        let after_tbs = der.get(tbs_start + tbs_raw.len()..).ok_or_else(malformed)?;
        let alg_len = der_tlv_len(after_tbs).ok_or_else(malformed)?;
        let algorithm = after_tbs.get(..alg_len).ok_or_else(malformed)?;
        let signature = rcgen::SigningKey::sign(self.issuer.key(), &tbs)?;

        let mut bit_string = der_header(0x03, signature.len() + 1);
        bit_string.push(0); // no unused bits
        bit_string.extend_from_slice(&signature);
        let content_len = tbs.len() + algorithm.len() + bit_string.len();
        let mut out = der_header(0x30, content_len);
        out.extend_from_slice(&tbs);
        out.extend_from_slice(algorithm);
        out.extend_from_slice(&bit_string);
        Ok(CertificateDer::from(out))
    }
}

pub(super) fn set_validity(params: &mut CertificateParams, validity: Duration) -> Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| Error::Invalid(format!("system clock before 1970: {e}")))?;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + now.saturating_sub(BACKDATE);
    params.not_after = epoch + now + validity;
    Ok(())
}

pub(super) fn random_serial() -> SerialNumber {
    let mut bytes = *uuid::Uuid::new_v4().as_bytes();
    // A positive, non-zero 128-bit serial (RFC 5280 allows up to 20 octets).
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

pub(super) fn distinguished_name_from_x509(name: &x509_parser::x509::X509Name<'_>) -> Result<DistinguishedName> {
    let mut dn = DistinguishedName::new();
    for attr in name.iter_attributes() {
        let oid: Vec<u64> = attr
            .attr_type()
            .iter()
            .ok_or_else(|| Error::Invalid("CA subject has an unsupported attribute OID".into()))?
            .collect();
        let data = attr.attr_value().data;
        let text = std::str::from_utf8(data).map_err(|_| Error::Invalid("CA subject is not valid UTF-8".into()))?;
        let value = match attr.attr_value().header.tag() {
            Tag::Utf8String => DnValue::Utf8String(text.to_string()),
            Tag::PrintableString => {
                DnValue::PrintableString(text.try_into().map_err(|e| Error::Invalid(format!("CA subject: {e}")))?)
            }
            Tag::Ia5String => {
                DnValue::Ia5String(text.try_into().map_err(|e| Error::Invalid(format!("CA subject: {e}")))?)
            }
            other => return Err(Error::Invalid(format!("CA subject uses unsupported string type {other}"))),
        };
        let ty = DnType::from_oid(&oid);
        if dn.get(&ty).is_some() {
            // rcgen holds one value per attribute type and could not reproduce this subject
            // byte for byte, which certificate chains require.
            return Err(Error::Invalid(
                "CA subject repeats an attribute type; such a CA cannot be used to issue certificates".into(),
            ));
        }
        dn.push(ty, value);
    }
    Ok(dn)
}

pub(super) fn pem_encode_cert(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}
