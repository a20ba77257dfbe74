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
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use super::{Error, Result};

mod authority;
pub use authority::*;

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
mod tests;
