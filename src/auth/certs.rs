//! Development certificates: a self-signed CA, a serving certificate and an admin client
//! certificate, generated on first start, plus an admin kubeconfig.
//!
//! Existing files are always reused and never overwritten, except `admin.kubeconfig`, which is
//! rewritten on every start so that its server address follows the current `--secure-port`.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::{GeneralName, ParsedExtension};

use super::{Error, Result};

pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
pub const SERVING_CERT_FILE: &str = "apiserver.crt";
pub const SERVING_KEY_FILE: &str = "apiserver.key";
pub const ADMIN_CERT_FILE: &str = "admin.crt";
pub const ADMIN_KEY_FILE: &str = "admin.key";
pub const ADMIN_KUBECONFIG_FILE: &str = "admin.kubeconfig";

/// Common name of the generated admin client certificate.
pub const ADMIN_USER: &str = "migration-admin";
/// Group (certificate organization) of the generated admin client certificate.
pub const ADMIN_GROUP: &str = "system:masters";
/// Name of the cluster, user and context in the generated kubeconfig.
pub const KUBECONFIG_NAME: &str = "migration-apiserver";

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// Certificates are back-dated a little to tolerate clock skew between machines.
const BACKDATE: Duration = Duration::from_secs(60 * 60);

/// Where and for which names the development certificates are generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCertOptions {
    pub cert_dir: PathBuf,
    /// The Service name; the serving certificate covers `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`
    /// and `<svc>.<ns>.svc.cluster.local` for every namespace.
    pub service_name: String,
    pub namespaces: Vec<String>,
    /// Additional subject alternative names; IP addresses become IP SANs, anything else DNS SANs.
    pub extra_sans: Vec<String>,
    /// The server address written into `admin.kubeconfig`, e.g. `https://127.0.0.1:8443`.
    pub kubeconfig_server: String,
}

impl Default for DevCertOptions {
    fn default() -> Self {
        DevCertOptions {
            cert_dir: PathBuf::from("apiserver.local.config/certificates"),
            service_name: "migration-apiserver".to_string(),
            namespaces: vec!["migration-apiserver".to_string(), "kube-system".to_string(), "default".to_string()],
            extra_sans: Vec::new(),
            kubeconfig_server: "https://127.0.0.1:8443".to_string(),
        }
    }
}

impl DevCertOptions {
    /// All subject alternative names the serving certificate should carry, deduplicated, in a
    /// stable order.
    pub fn serving_sans(&self) -> Vec<String> {
        let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        let svc = &self.service_name;
        if !svc.is_empty() {
            sans.push(svc.clone());
            for ns in &self.namespaces {
                sans.push(format!("{svc}.{ns}"));
                sans.push(format!("{svc}.{ns}.svc"));
                sans.push(format!("{svc}.{ns}.svc.cluster.local"));
            }
        }
        sans.extend(self.extra_sans.iter().map(|s| s.trim().to_string()));
        let mut seen = std::collections::HashSet::new();
        sans.retain(|s| !s.is_empty() && seen.insert(s.clone()));
        sans
    }
}

/// Paths of the development certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCerts {
    pub ca_cert_path: PathBuf,
    pub ca_key_path: PathBuf,
    pub serving_cert_path: PathBuf,
    pub serving_key_path: PathBuf,
    pub admin_cert_path: PathBuf,
    pub admin_key_path: PathBuf,
    pub admin_kubeconfig_path: PathBuf,
    /// The CA that client certificates are verified against (the dev CA).
    pub client_ca_path: PathBuf,
}

impl DevCerts {
    fn in_dir(dir: &Path) -> Self {
        DevCerts {
            ca_cert_path: dir.join(CA_CERT_FILE),
            ca_key_path: dir.join(CA_KEY_FILE),
            serving_cert_path: dir.join(SERVING_CERT_FILE),
            serving_key_path: dir.join(SERVING_KEY_FILE),
            admin_cert_path: dir.join(ADMIN_CERT_FILE),
            admin_key_path: dir.join(ADMIN_KEY_FILE),
            admin_kubeconfig_path: dir.join(ADMIN_KUBECONFIG_FILE),
            client_ca_path: dir.join(CA_CERT_FILE),
        }
    }
}

/// Makes sure the development CA, serving certificate and admin client certificate exist in
/// `opts.cert_dir`, generating whatever is missing, and (re)writes `admin.kubeconfig`.
///
/// Existing certificate and key files are never overwritten. Half of a pair (a certificate
/// without its key or vice versa), or issued certificates without their CA, are reported as
/// errors instead of being silently replaced.
pub fn ensure_dev_certs(opts: &DevCertOptions) -> Result<DevCerts> {
    let dir = &opts.cert_dir;
    create_private_dir(dir)?;
    let paths = DevCerts::in_dir(dir);

    let ca_state = pair_state(&paths.ca_cert_path, &paths.ca_key_path)?;
    let serving_state = pair_state(&paths.serving_cert_path, &paths.serving_key_path)?;
    let admin_state = pair_state(&paths.admin_cert_path, &paths.admin_key_path)?;

    // The CA is loaded lazily: with every issued certificate present, its key is not needed
    // (and may legitimately have been removed).
    let mut ca: Option<CertAuthority> = None;
    match ca_state {
        PairState::Present => {}
        PairState::Missing => {
            if serving_state == PairState::Present || admin_state == PairState::Present {
                return Err(Error::file(
                    &paths.ca_cert_path,
                    "missing, but certificates issued by it exist; remove the certificate \
                     directory to regenerate everything",
                ));
            }
            let generated = CertAuthority::generate("migration-apiserver-ca")?;
            write_new_file(&paths.ca_key_path, generated.key_pem().as_bytes(), true)?;
            write_new_file(&paths.ca_cert_path, generated.cert_pem().as_bytes(), false)?;
            tracing::info!(path = %paths.ca_cert_path.display(), "generated development CA");
            ca = Some(generated);
        }
        PairState::CertOnly if serving_state == PairState::Present && admin_state == PairState::Present => {}
        PairState::CertOnly | PairState::KeyOnly => {
            return Err(incomplete_pair(&paths.ca_cert_path, &paths.ca_key_path))
        }
    }

    match serving_state {
        PairState::Present => {
            check_serving_cert(&paths.serving_cert_path, &opts.serving_sans());
        }
        PairState::Missing => {
            let ca_ref = loaded_ca(&mut ca, &paths)?;
            let (cert_pem, key_pem) = issue_serving_cert(ca_ref, &opts.serving_sans())?;
            write_new_file(&paths.serving_key_path, key_pem.as_bytes(), true)?;
            write_new_file(&paths.serving_cert_path, cert_pem.as_bytes(), false)?;
            tracing::info!(path = %paths.serving_cert_path.display(), "generated serving certificate");
        }
        _ => return Err(incomplete_pair(&paths.serving_cert_path, &paths.serving_key_path)),
    }

    match admin_state {
        PairState::Present => {}
        PairState::Missing => {
            let ca_ref = loaded_ca(&mut ca, &paths)?;
            let (cert_pem, key_pem) = issue_client_cert(ca_ref, ADMIN_USER, &[ADMIN_GROUP])?;
            write_new_file(&paths.admin_key_path, key_pem.as_bytes(), true)?;
            write_new_file(&paths.admin_cert_path, cert_pem.as_bytes(), false)?;
            tracing::info!(path = %paths.admin_cert_path.display(), "generated admin client certificate");
        }
        _ => return Err(incomplete_pair(&paths.admin_cert_path, &paths.admin_key_path)),
    }

    let ca_pem = read_to_string(&paths.ca_cert_path)?;
    let admin_cert_pem = read_to_string(&paths.admin_cert_path)?;
    let admin_key_pem = read_to_string(&paths.admin_key_path)?;
    write_kubeconfig(&paths.admin_kubeconfig_path, &opts.kubeconfig_server, &ca_pem, &admin_cert_pem, &admin_key_pem)?;
    Ok(paths)
}

/// The CA, loaded from its files on first use.
fn loaded_ca<'a>(slot: &'a mut Option<CertAuthority>, paths: &DevCerts) -> Result<&'a CertAuthority> {
    let ca = match slot.take() {
        Some(ca) => ca,
        None => CertAuthority::load(&paths.ca_cert_path, &paths.ca_key_path)?,
    };
    Ok(slot.insert(ca))
}

/// Writes (replacing atomically) a kubeconfig with one cluster, user and context named
/// `migration-apiserver`, all credentials embedded as base64 data. The file is mode 0600 since
/// it contains a private key.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    client_cert_pem: &str,
    client_key_pem: &str,
) -> Result<()> {
    let yaml = kubeconfig_yaml(server, ca_pem, client_cert_pem, client_key_pem);
    write_replace_file(path, yaml.as_bytes(), true)
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    // serde_json strings are valid YAML double-quoted scalars, which makes quoting safe for any
    // server string.
    let server = serde_json::Value::String(server.to_string()).to_string();
    let name = KUBECONFIG_NAME;
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {name}\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority-data: {ca}\n\
         users:\n\
         - name: {name}-admin\n  \
           user:\n    \
             client-certificate-data: {cert}\n    \
             client-key-data: {key}\n\
         contexts:\n\
         - name: {name}\n  \
           context:\n    \
             cluster: {name}\n    \
             user: {name}-admin\n\
         current-context: {name}\n\
         preferences: {{}}\n",
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
    )
}

/// A certificate authority able to issue certificates: its certificate plus signing key.
pub struct CertAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
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
const ORG_NAME_OID_TLV: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x0a];

/// Placeholder attribute type `0.39.127.<i>`: DER `06 03 27 7f <i>`, the same length as the
/// organizationName OID so that it can be replaced in place.
fn placeholder_oid(i: usize) -> Vec<u64> {
    vec![0, 39, 127, i as u64]
}

fn placeholder_oid_tlv(i: usize) -> [u8; 5] {
    [0x06, 0x03, 0x27, 0x7f, i as u8]
}

/// Total length (header + content) of the DER TLV at the start of `buf`.
fn der_tlv_len(buf: &[u8]) -> Option<usize> {
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

fn der_header(tag: u8, len: usize) -> Vec<u8> {
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
fn subslice_offset(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

impl CertAuthority {
    fn issue_der(
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

    fn issue(&self, params: CertificateParams, validity: Duration) -> Result<(String, String)> {
        let (der, key) = self.issue_der(params, validity)?;
        Ok((pem_encode_cert(&der), key.serialize_pem()))
    }

    /// Replaces the placeholder attribute types 1..=`count` in the subject of `der` by
    /// organizationName and signs the certificate again.
    fn resign_placeholder_organizations(&self, der: &[u8], count: usize) -> Result<CertificateDer<'static>> {
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

fn set_validity(params: &mut CertificateParams, validity: Duration) -> Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| Error::Invalid(format!("system clock before 1970: {e}")))?;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + now.saturating_sub(BACKDATE);
    params.not_after = epoch + now + validity;
    Ok(())
}

fn random_serial() -> SerialNumber {
    let mut bytes = *uuid::Uuid::new_v4().as_bytes();
    // A positive, non-zero 128-bit serial (RFC 5280 allows up to 20 octets).
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

fn distinguished_name_from_x509(name: &x509_parser::x509::X509Name<'_>) -> Result<DistinguishedName> {
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

fn pem_encode_cert(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Warns when a reused serving certificate does not cover a requested name or is about to
/// expire. Never fails: an operator-provided certificate is the operator's choice.
fn check_serving_cert(path: &Path, wanted_sans: &[String]) {
    let Ok(der) = CertificateDer::from_pem_file(path) else {
        tracing::warn!(path = %path.display(), "cannot parse the existing serving certificate");
        return;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        tracing::warn!(path = %path.display(), "cannot parse the existing serving certificate");
        return;
    };
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push(d.to_ascii_lowercase()),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    ips.extend(ip);
                }
                _ => {}
            }
        }
    }
    let missing: Vec<&String> = wanted_sans
        .iter()
        .filter(|s| match s.parse::<IpAddr>() {
            Ok(ip) => !ips.contains(&ip),
            Err(_) => !dns.contains(&s.to_ascii_lowercase()),
        })
        .collect();
    if !missing.is_empty() {
        tracing::warn!(path = %path.display(), ?missing,
            "the existing serving certificate does not cover these names; delete it to regenerate");
    }
    let not_after = cert.validity().not_after.timestamp();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    if not_after < now + 30 * DAY.as_secs() as i64 {
        tracing::warn!(path = %path.display(), "the serving certificate expires within 30 days (or has expired)");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PairState {
    Present,
    Missing,
    CertOnly,
    KeyOnly,
}

fn pair_state(cert: &Path, key: &Path) -> Result<PairState> {
    Ok(match (exists(cert)?, exists(key)?) {
        (true, true) => PairState::Present,
        (false, false) => PairState::Missing,
        (true, false) => PairState::CertOnly,
        (false, true) => PairState::KeyOnly,
    })
}

fn incomplete_pair(cert: &Path, key: &Path) -> Error {
    Error::Invalid(format!(
        "only one of {} and {} exists; provide both or remove the other to regenerate",
        cert.display(),
        key.display()
    ))
}

fn exists(path: &Path) -> Result<bool> {
    path.try_exists().map_err(|e| Error::io(path, e))
}

fn read_to_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

fn create_private_dir(dir: &Path) -> Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(|e| Error::io(dir, e))
}

fn open_options(private: bool) -> fs::OpenOptions {
    let mut options = fs::OpenOptions::new();
    options.write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    options
}

/// Creates `path` with `contents`, failing if it already exists (never overwrites). The content
/// is written to a temporary file first so that a crash never leaves a truncated file behind.
fn write_new_file(path: &Path, contents: &[u8], private: bool) -> Result<()> {
    let tmp = write_temp(path, contents, private)?;
    // hard_link fails when the destination exists, unlike rename.
    let linked = fs::hard_link(&tmp, path).map_err(|e| Error::io(path, e));
    let _ = fs::remove_file(&tmp);
    linked
}

/// Atomically replaces `path` with `contents`.
fn write_replace_file(path: &Path, contents: &[u8], private: bool) -> Result<()> {
    let tmp = write_temp(path, contents, private)?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

fn write_temp(path: &Path, contents: &[u8], private: bool) -> Result<PathBuf> {
    let file_name = path.file_name().ok_or_else(|| Error::file(path, "not a file path"))?.to_string_lossy();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut options = open_options(private);
        options.create_new(true);
        let mut file = options.open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(Error::io(path, e))
        }
    }
}

#[cfg(test)]
#[path = "certs_tests.rs"]
mod tests;
