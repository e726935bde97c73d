//! TLS material of the endpoint: PEM files (re-read when they change), or a self-signed
//! certificate made at start; and the protocol versions, cipher suites and key-exchange groups
//! it offers (`--tls-min-version`, `--tls-cipher-suites`, `--tls-curve-preferences`, upstream's
//! names and numbers; the webhook server's `--webhook-tls-*` take the same values).

use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, CipherSuite, NamedGroup, ServerConfig, SupportedProtocolVersion};

use crate::error::Error;

/// PEM files for TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// How the endpoint speaks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Tls {
    /// HTTPS with a certificate generated in memory at start (upstream's behaviour without
    /// `--tls-cert-file`): encrypts, but clients cannot verify it.
    #[default]
    SelfSigned,
    /// HTTPS with `--tls-cert-file` and `--tls-private-key-file`, re-read when they change.
    Files(TlsFiles),
    /// Plain HTTP: for tests and for embedding behind a proxy that terminates TLS; no flag of
    /// the binaries selects it.
    Plain,
}

/// The oldest TLS version the endpoint accepts (`--tls-min-version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinVersion {
    /// `VersionTLS12` (the default): TLS 1.2 and 1.3.
    #[default]
    Tls12,
    /// `VersionTLS13`: TLS 1.3 only.
    Tls13,
}

/// `--tls-min-version`, `--tls-cipher-suites` and `--tls-curve-preferences`, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsOptions {
    /// The oldest version offered.
    pub min_version: MinVersion,
    /// Upstream names of the suites offered, deduplicated; empty: every suite of the ring
    /// provider. TLS 1.3 suites stay all on unless the list names one (upstream, on Go, cannot
    /// restrict TLS 1.3 suites at all).
    pub cipher_suites: Vec<&'static str>,
    /// Go's names of the key-exchange groups offered (`X25519`, `CurveP256`, `CurveP384`),
    /// deduplicated; empty: every group of the ring provider. The order is rustls' own, as Go
    /// ignores the order given.
    pub curves: Vec<&'static str>,
}

/// The flags a set of TLS options comes from, for error messages: the endpoint's or the
/// webhook server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsFlagNames {
    /// `--tls-min-version` or its webhook twin.
    pub min_version: &'static str,
    /// `--tls-cipher-suites` or its webhook twin.
    pub cipher_suites: &'static str,
    /// `--tls-curve-preferences` or its webhook twin.
    pub curve_preferences: &'static str,
}

/// The `--secure-port` endpoint's TLS flags.
pub const SERVING_FLAGS: TlsFlagNames = TlsFlagNames {
    min_version: "--tls-min-version",
    cipher_suites: "--tls-cipher-suites",
    curve_preferences: "--tls-curve-preferences",
};

/// The webhook server's TLS flags (cloud-provider 1.36, KEP-2699).
pub const WEBHOOK_FLAGS: TlsFlagNames = TlsFlagNames {
    min_version: "--webhook-tls-min-version",
    cipher_suites: "--webhook-tls-cipher-suites",
    curve_preferences: "--webhook-tls-curve-preferences",
};

/// Go's `crypto/tls` CurveIDs (upstream's flag takes the numbers; Go's constant names are
/// accepted too). A CurveID is the TLS NamedGroup code point.
const GO_CURVES: [(u16, &str); 7] = [
    (23, "CurveP256"),
    (24, "CurveP384"),
    (25, "CurveP521"),
    (29, "X25519"),
    (4587, "SecP256r1MLKEM768"),
    (4588, "X25519MLKEM768"),
    (4589, "SecP384r1MLKEM1024"),
];

/// `--tls-curve-preferences`, read: the groups to offer and the known ones this build cannot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CurvePreferences {
    /// Go's names of the groups offered, in rustls' order; empty: every group.
    pub offered: Vec<&'static str>,
    /// Go's names of listed groups the ring provider does not implement (P-521 and the
    /// post-quantum hybrids): left out, with a warning, when others remain.
    pub unavailable: Vec<&'static str>,
}

/// Whether the ring provider implements the group with this code point.
fn ring_has(code: u16) -> bool {
    rustls::crypto::ring::default_provider().kx_groups.iter().any(|g| u16::from(g.name()) == code)
}

/// Parse a curve-preferences flag: comma-separated Go CurveID numbers (upstream's form) or
/// Go's constant names. An unknown entry is refused, naming it; known groups rustls cannot
/// provide are dropped and reported in [`CurvePreferences::unavailable`], and refused when
/// nothing else is left.
pub fn parse_curve_preferences(flag: &'static str, value: &str) -> Result<CurvePreferences, Error> {
    let mut wanted: Vec<(u16, &'static str)> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let found = GO_CURVES.iter().find(|(code, name)| entry.parse::<u16>().ok() == Some(*code) || *name == entry);
        let Some(&(code, name)) = found else {
            let known: Vec<String> = GO_CURVES.iter().map(|(c, n)| format!("{c} ({n})")).collect();
            return Err(Error::InvalidFlag {
                flag,
                message: format!("{} is not a Go crypto/tls CurveID; known: {}", quoted(entry), known.join(", ")),
            });
        };
        if !wanted.iter().any(|(c, _)| *c == code) {
            wanted.push((code, name));
        }
    }
    let (available, unavailable): (Vec<_>, Vec<_>) = wanted.into_iter().partition(|(code, _)| ring_has(*code));
    let unavailable: Vec<&'static str> = unavailable.into_iter().map(|(_, n)| n).collect();
    if available.is_empty() && !unavailable.is_empty() {
        return Err(Error::InvalidFlag {
            flag,
            message: format!(
                "{} not available: rustls (ring) implements only X25519 (29), CurveP256 (23) and CurveP384 (24)",
                unavailable.join(", ")
            ),
        });
    }
    // rustls' preference order, as Go applies its own order to the set given.
    let offered = rustls::crypto::ring::default_provider()
        .kx_groups
        .iter()
        .filter_map(|g| available.iter().find(|(code, _)| *code == u16::from(g.name())).map(|(_, n)| *n))
        .collect();
    Ok(CurvePreferences { offered, unavailable })
}

static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// Upstream's suite names (component-base) that the ring provider implements. Go spells the
/// ChaCha20 suites with and without `_SHA256`; both are accepted.
const PROVIDED_SUITES: [(&str, CipherSuite); 11] = [
    ("TLS_AES_128_GCM_SHA256", CipherSuite::TLS13_AES_128_GCM_SHA256),
    ("TLS_AES_256_GCM_SHA384", CipherSuite::TLS13_AES_256_GCM_SHA384),
    ("TLS_CHACHA20_POLY1305_SHA256", CipherSuite::TLS13_CHACHA20_POLY1305_SHA256),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
];

/// Upstream's other suite names: CBC, RC4, 3DES and static-RSA key exchange, which rustls
/// does not implement.
const UNAVAILABLE_SUITES: [&str; 16] = [
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_RC4_128_SHA",
];

/// A user-supplied value quoted in an error, cut short.
fn quoted(value: &str) -> String {
    let cut: String = value.chars().take(64).collect();
    if cut.len() < value.len() { format!("{cut:?}...") } else { format!("{cut:?}") }
}

fn available_names() -> String {
    PROVIDED_SUITES.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
}

/// Parse `--tls-min-version` (upstream's `VersionTLS12`, `VersionTLS13`; empty: TLS 1.2).
/// TLS 1.0 and 1.1 are refused, not raised silently.
pub fn parse_min_version(value: &str) -> Result<MinVersion, Error> {
    parse_min_version_of(SERVING_FLAGS.min_version, value)
}

/// [`parse_min_version`] for the flag `flag`.
pub fn parse_min_version_of(flag: &'static str, value: &str) -> Result<MinVersion, Error> {
    match value.trim() {
        "" | "VersionTLS12" => Ok(MinVersion::Tls12),
        "VersionTLS13" => Ok(MinVersion::Tls13),
        old @ ("VersionTLS10" | "VersionTLS11") => Err(Error::InvalidFlag {
            flag,
            message: format!("{old} is refused: TLS 1.0 and 1.1 are not offered; use VersionTLS12 or VersionTLS13"),
        }),
        other => Err(Error::InvalidFlag {
            flag,
            message: format!("{} is not a TLS version; use VersionTLS12 or VersionTLS13", quoted(other)),
        }),
    }
}

/// Parse `--tls-cipher-suites` (comma-separated upstream names). A name rustls cannot
/// provide, or no name at all, is refused with the name.
pub fn parse_cipher_suites(value: &str) -> Result<Vec<&'static str>, Error> {
    parse_cipher_suites_of(SERVING_FLAGS.cipher_suites, value)
}

/// [`parse_cipher_suites`] for the flag `flag`.
pub fn parse_cipher_suites_of(flag: &'static str, value: &str) -> Result<Vec<&'static str>, Error> {
    let mut names: Vec<&'static str> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, _)) = PROVIDED_SUITES.iter().find(|(name, _)| *name == entry) else {
            let why = if UNAVAILABLE_SUITES.contains(&entry) {
                "is not available: rustls implements only ECDHE key exchange with AES-GCM or ChaCha20-Poly1305"
            } else {
                "is not a cipher suite name"
            };
            return Err(Error::InvalidFlag {
                flag,
                message: format!("{} {why}; available: {}", quoted(entry), available_names()),
            });
        };
        if !names.contains(name) {
            names.push(name);
        }
    }
    Ok(names)
}

impl TlsOptions {
    /// Check `--tls-min-version` and `--tls-cipher-suites` as given (empty: the defaults).
    pub fn from_flags(min_version: &str, cipher_suites: &str) -> Result<Self, Error> {
        Self::parse(SERVING_FLAGS, min_version, cipher_suites, "")
    }

    /// Check one server's three TLS flags, named by `flags` in errors (empty: the defaults).
    pub fn parse(flags: TlsFlagNames, min_version: &str, cipher_suites: &str, curves: &str) -> Result<Self, Error> {
        Ok(Self {
            min_version: parse_min_version_of(flags.min_version, min_version)?,
            cipher_suites: parse_cipher_suites_of(flags.cipher_suites, cipher_suites)?,
            curves: parse_curve_preferences(flags.curve_preferences, curves)?.offered,
        })
    }

    /// The protocol versions offered.
    pub fn versions(&self) -> &'static [&'static SupportedProtocolVersion] {
        match self.min_version {
            MinVersion::Tls12 => rustls::DEFAULT_VERSIONS,
            MinVersion::Tls13 => TLS13_ONLY,
        }
    }

    /// The ring provider with only the chosen suites and key-exchange groups.
    pub fn provider(&self) -> CryptoProvider {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.curves.is_empty() {
            let wanted: Vec<NamedGroup> = GO_CURVES
                .iter()
                .filter(|(_, name)| self.curves.contains(name))
                .map(|(code, _)| NamedGroup::from(*code))
                .collect();
            provider.kx_groups.retain(|g| wanted.contains(&g.name()));
        }
        if !self.cipher_suites.is_empty() {
            let wanted: Vec<CipherSuite> = PROVIDED_SUITES
                .iter()
                .filter(|(name, _)| self.cipher_suites.contains(name))
                .map(|(_, suite)| *suite)
                .collect();
            let tls13_named = provider
                .cipher_suites
                .iter()
                .any(|s| s.version() == &rustls::version::TLS13 && wanted.contains(&s.suite()));
            provider
                .cipher_suites
                .retain(|s| wanted.contains(&s.suite()) || (!tls13_named && s.version() == &rustls::version::TLS13));
        }
        provider
    }
}

/// Names the self-signed certificate is made for, as upstream's: `localhost` and the loopback
/// addresses, plus the bind address when it is a specific one.
pub fn self_signed_names(bind: IpAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if !bind.is_unspecified() && !bind.is_loopback() {
        names.push(bind.to_string());
    }
    names
}

/// A server's TLS configuration and, for certificate files, what re-reads them.
pub struct ServerTls {
    /// The rustls configuration.
    pub config: ServerConfig,
    /// Present for [`Tls::Files`]: call [`CertReloader::reload`] every few seconds.
    pub reloader: Option<Arc<CertReloader>>,
}

/// The server configuration for `tls` with `options`, or `None` for plain HTTP. Fails at start
/// on unreadable or unusable files; errors name the flag and never quote file content.
pub fn server_config(tls: &Tls, options: &TlsOptions, bind: IpAddr) -> Result<Option<ServerTls>, Error> {
    let provider = Arc::new(options.provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(options.versions())
        .map_err(|e| Error::InvalidFlag { flag: "--tls-cipher-suites", message: e.to_string() })?
        .with_no_client_auth();
    let (mut config, reloader) = match tls {
        Tls::Plain => return Ok(None),
        Tls::Files(files) => {
            let reloader = Arc::new(CertReloader::load(files.clone(), provider)?);
            (builder.with_cert_resolver(reloader.clone()), Some(reloader))
        }
        Tls::SelfSigned => {
            let made = rcgen::generate_simple_self_signed(self_signed_names(bind)).map_err(|e| Error::Serve {
                address: bind.to_string(),
                message: format!("generating a self-signed certificate: {e}"),
            })?;
            let fingerprint = ring::digest::digest(&ring::digest::SHA256, made.cert.der());
            let hex: String = fingerprint.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            tracing::info!(sha256 = %hex, "generated a self-signed serving certificate (no --tls-cert-file given)");
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
            let config = builder
                .with_single_cert(vec![made.cert.der().clone()], key)
                .map_err(|e| Error::InvalidFlag { flag: "--tls-private-key-file", message: e.to_string() })?;
            (config, None)
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(ServerTls { config, reloader }))
}

/// Load a rustls server configuration from PEM files (default versions and suites).
pub fn load_tls(files: &TlsFiles) -> Result<ServerConfig, Error> {
    server_config(&Tls::Files(files.clone()), &TlsOptions::default(), IpAddr::from([127, 0, 0, 1]))?
        .map(|s| s.config)
        .ok_or_else(|| Error::InvalidFlag { flag: "--tls-cert-file", message: "no TLS configuration".into() })
}

/// Largest certificate or key file read (a chain of a few certificates is a few KiB).
pub const MAX_PEM_BYTES: u64 = 1 << 20;

fn read_bounded(path: &Path) -> Result<Vec<u8>, Error> {
    let io = |source| Error::Io { path: path.display().to_string(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(Error::Io {
            path: path.display().to_string(),
            source: std::io::Error::other(format!("larger than {MAX_PEM_BYTES} bytes")),
        });
    }
    Ok(bytes)
}

/// A certificate chain and key from PEM bytes, checked to belong together.
fn parse_pair(cert_pem: &[u8], key_pem: &[u8], provider: &CryptoProvider) -> Result<CertifiedKey, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| Error::InvalidFlag { flag: "--tls-cert-file", message: "not a PEM certificate".into() })?;
    if certs.is_empty() {
        return Err(Error::InvalidFlag { flag: "--tls-cert-file", message: "no certificate in the file".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| Error::InvalidFlag {
        flag: "--tls-private-key-file",
        message: "no PEM private key in the file".into(),
    })?;
    // rustls' messages name the problem (unsupported key, mismatch), never key material.
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| Error::InvalidFlag { flag: "--tls-private-key-file", message: e.to_string() })
}

fn read_pair(files: &TlsFiles) -> Result<(Vec<u8>, Vec<u8>), Error> {
    Ok((read_bounded(&files.cert)?, read_bounded(&files.key)?))
}

/// What one [`CertReloader::reload`] did.
#[derive(Debug)]
pub enum Reload {
    /// The files hold what is served.
    Unchanged,
    /// New files were loaded: new connections get the new certificate.
    Replaced,
    /// The new files are unusable: the previous certificate stays. Log this one.
    Rejected(Error),
    /// The same unusable files as last time: already reported, stay quiet.
    StillRejected,
}

/// What the reloader has seen, by SHA-256 of the files' bytes (kept in memory only).
#[derive(Debug, Default)]
struct Seen {
    loaded: Vec<u8>,
    rejected: Option<Vec<u8>>,
}

/// Serves the certificate from [`TlsFiles`] and re-reads them on [`CertReloader::reload`]:
/// Secret volume and cert-manager rotations reach new connections without a restart.
pub struct CertReloader {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertReloader").field("files", &self.files).finish_non_exhaustive()
    }
}

fn digest(cert: &[u8], key: &[u8]) -> Vec<u8> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(&(cert.len() as u64).to_be_bytes());
    ctx.update(cert);
    ctx.update(key);
    ctx.finish().as_ref().to_vec()
}

impl CertReloader {
    /// Load the files now; unusable files fail start-up.
    pub fn load(files: TlsFiles, provider: Arc<CryptoProvider>) -> Result<Self, Error> {
        let (cert, key) = read_pair(&files)?;
        let pair = parse_pair(&cert, &key, &provider)?;
        let seen = Seen { loaded: digest(&cert, &key), rejected: None };
        Ok(Self { files, provider, current: RwLock::new(Arc::new(pair)), seen: Mutex::new(seen) })
    }

    /// Re-read the files (blocking I/O of two small files); swap the certificate when they
    /// changed and form a usable pair, keep the current one otherwise.
    pub fn reload(&self) -> Reload {
        let (fingerprint, outcome) = match read_pair(&self.files) {
            Ok((cert, key)) => {
                let fingerprint = digest(&cert, &key);
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                if fingerprint == seen.loaded {
                    seen.rejected = None;
                    return Reload::Unchanged;
                }
                (fingerprint, parse_pair(&cert, &key, &self.provider))
            }
            // A file missing mid-rotation: the error's text (path and reason) identifies it.
            Err(e) => (digest(e.to_string().as_bytes(), b""), Err(e)),
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(pair) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
                *seen = Seen { loaded: fingerprint, rejected: None };
                Reload::Replaced
            }
            Err(_) if seen.rejected.as_ref() == Some(&fingerprint) => Reload::StillRejected,
            Err(e) => {
                seen.rejected = Some(fingerprint);
                Reload::Rejected(e)
            }
        }
    }

    /// The files it reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The certificate chain served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ccm-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A certificate for `name` and its key, as PEM.
    pub(crate) fn pem_pair(name: &str) -> (String, String, Vec<u8>) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (made.cert.pem(), made.signing_key.serialize_pem(), made.cert.der().to_vec())
    }

    fn flag_of(e: Error) -> (&'static str, String) {
        match e {
            Error::InvalidFlag { flag, message } => (flag, message),
            other => panic!("not an InvalidFlag: {other:?}"),
        }
    }

    #[test]
    fn the_self_signed_certificate_names_localhost_loopback_and_a_specific_bind_address() {
        let options = TlsOptions::default();
        assert_eq!(self_signed_names("0.0.0.0".parse().unwrap()), ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(self_signed_names("10.0.0.5".parse().unwrap()), ["localhost", "127.0.0.1", "::1", "10.0.0.5"]);
        assert!(server_config(&Tls::SelfSigned, &options, "0.0.0.0".parse().unwrap()).unwrap().is_some());
        assert!(server_config(&Tls::Plain, &options, "0.0.0.0".parse().unwrap()).unwrap().is_none());
    }

    #[test]
    fn unusable_tls_files_fail_at_start_naming_the_flag_not_the_content() {
        let dir = temp_dir("unusable");
        let cert = dir.join("c.pem");
        let key = dir.join("k.pem");
        std::fs::write(&cert, "SECRET-TOKEN-12345").unwrap();
        std::fs::write(&key, "SECRET-TOKEN-12345").unwrap();
        let files = TlsFiles { cert: cert.clone(), key: key.clone() };
        let e = server_config(&Tls::Files(files), &TlsOptions::default(), "0.0.0.0".parse().unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--tls-"), "{e}");
        assert!(!e.contains("SECRET-TOKEN"), "{e}");
        // A certificate with another certificate's key.
        let (a_cert, _, _) = pem_pair("a.test");
        let (_, b_key, _) = pem_pair("b.test");
        std::fs::write(&cert, a_cert).unwrap();
        std::fs::write(&key, &b_key).unwrap();
        let e = load_tls(&TlsFiles { cert: cert.clone(), key: key.clone() }).unwrap_err();
        let (flag, message) = flag_of(e);
        assert_eq!(flag, "--tls-private-key-file", "{message}");
        assert!(!message.contains(b_key.lines().nth(1).unwrap()), "{message}");
        let missing = TlsFiles { cert: dir.join("none.pem"), key };
        assert!(matches!(load_tls(&missing), Err(Error::Io { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn min_version_takes_upstreams_names_and_refuses_tls_1_0_and_1_1_naming_flag_and_value() {
        assert_eq!(parse_min_version("").unwrap(), MinVersion::Tls12);
        assert_eq!(parse_min_version("VersionTLS12").unwrap(), MinVersion::Tls12);
        assert_eq!(parse_min_version("VersionTLS13").unwrap(), MinVersion::Tls13);
        for old in ["VersionTLS10", "VersionTLS11"] {
            let (flag, message) = flag_of(parse_min_version(old).unwrap_err());
            assert_eq!(flag, "--tls-min-version");
            assert!(message.contains(old), "{message}");
        }
        let (flag, message) = flag_of(parse_min_version("TLS1.3").unwrap_err());
        assert_eq!(flag, "--tls-min-version");
        assert!(message.contains("\"TLS1.3\""), "{message}");
        assert_eq!(TlsOptions::from_flags("VersionTLS13", "").unwrap().versions(), [&rustls::version::TLS13]);
        assert_eq!(TlsOptions::default().versions().len(), 2);
    }

    #[test]
    fn cipher_suites_map_upstreams_names_and_refuse_what_rustls_cannot_provide() {
        let options =
            TlsOptions::from_flags("", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305")
                .unwrap();
        let offered: Vec<CipherSuite> = options.provider().cipher_suites.iter().map(|s| s.suite()).collect();
        // The two named TLS 1.2 suites, and TLS 1.3's (none named).
        assert!(offered.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        assert!(offered.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256));
        assert!(!offered.contains(&CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256));
        assert!(!offered.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384));
        assert_eq!(offered.len(), 5, "{offered:?}");
        // Naming a TLS 1.3 suite restricts TLS 1.3 too.
        let options = TlsOptions::from_flags("", "TLS_AES_256_GCM_SHA384").unwrap();
        let offered: Vec<CipherSuite> = options.provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(offered, [CipherSuite::TLS13_AES_256_GCM_SHA384]);
        assert_eq!(TlsOptions::from_flags("", "").unwrap().provider().cipher_suites.len(), 9);

        for (value, names) in [
            ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_AES_128_CBC_SHA", "TLS_RSA_WITH_AES_128_CBC_SHA"),
            ("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"),
            ("NOT_A_SUITE", "NOT_A_SUITE"),
        ] {
            let (flag, message) = flag_of(TlsOptions::from_flags("", value).unwrap_err());
            assert_eq!(flag, "--tls-cipher-suites");
            assert!(message.contains(names), "{message}");
        }
        let (_, message) = flag_of(parse_cipher_suites("TLS_RSA_WITH_RC4_128_SHA").unwrap_err());
        assert!(message.contains("not available"), "{message}");
        // Every offered configuration builds.
        for min in ["VersionTLS12", "VersionTLS13"] {
            for suites in ["", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"] {
                let options = TlsOptions::from_flags(min, suites).unwrap();
                assert!(server_config(&Tls::SelfSigned, &options, "127.0.0.1".parse().unwrap()).unwrap().is_some());
            }
        }
    }

    #[test]
    fn curve_preferences_take_go_curve_ids_or_names_and_refuse_unknown_ones_naming_them() {
        let named = |value: &str| parse_curve_preferences("--tls-curve-preferences", value).unwrap();
        assert_eq!(named(""), CurvePreferences::default());
        // Upstream's form: numbers; the order given does not matter, rustls' is used.
        assert_eq!(named("24,23").offered, ["CurveP256", "CurveP384"]);
        assert_eq!(named("29").offered, ["X25519"]);
        assert_eq!(named("CurveP384, X25519,29").offered, ["X25519", "CurveP384"]);
        // Known to Go but not to ring: dropped with a report while others remain.
        let p = named("23,25,4588");
        assert_eq!((p.offered, p.unavailable), (vec!["CurveP256"], vec!["CurveP521", "X25519MLKEM768"]));
        for (value, culprit) in [("23,99", "\"99\""), ("P-256", "\"P-256\""), ("x25519", "\"x25519\"")] {
            let (flag, message) =
                flag_of(parse_curve_preferences("--webhook-tls-curve-preferences", value).unwrap_err());
            assert_eq!(flag, "--webhook-tls-curve-preferences");
            assert!(message.contains(culprit) && message.contains("29 (X25519)"), "{message}");
        }
        let (_, message) = flag_of(parse_curve_preferences("--tls-curve-preferences", "25").unwrap_err());
        assert!(message.contains("CurveP521 not available"), "{message}");
        // The provider offers exactly the chosen groups; every choice builds a server.
        let options = TlsOptions::parse(SERVING_FLAGS, "", "", "23").unwrap();
        let groups: Vec<NamedGroup> = options.provider().kx_groups.iter().map(|g| g.name()).collect();
        assert_eq!(groups, [NamedGroup::secp256r1]);
        assert_eq!(TlsOptions::default().provider().kx_groups.len(), 3);
        for curves in ["29", "24", "23,24,29"] {
            let options = TlsOptions::parse(SERVING_FLAGS, "VersionTLS12", "", curves).unwrap();
            assert!(server_config(&Tls::SelfSigned, &options, "127.0.0.1".parse().unwrap()).unwrap().is_some());
        }
        let (flag, _) = flag_of(TlsOptions::parse(WEBHOOK_FLAGS, "VersionTLS11", "", "").unwrap_err());
        assert_eq!(flag, "--webhook-tls-min-version");
        let (flag, _) = flag_of(TlsOptions::parse(WEBHOOK_FLAGS, "", "TLS_RSA_WITH_RC4_128_SHA", "").unwrap_err());
        assert_eq!(flag, "--webhook-tls-cipher-suites");
    }

    #[test]
    fn a_reload_swaps_a_changed_pair_and_keeps_the_old_one_when_the_new_is_unusable_reporting_it_once() {
        let dir = temp_dir("reload");
        let files = TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
        let (a_cert, a_key, a_der) = pem_pair("a.test");
        std::fs::write(&files.cert, &a_cert).unwrap();
        std::fs::write(&files.key, &a_key).unwrap();
        let reloader = CertReloader::load(files.clone(), Arc::new(TlsOptions::default().provider())).unwrap();
        let served = |r: &CertReloader| r.current().cert[0].to_vec();
        assert!(matches!(reloader.reload(), Reload::Unchanged));

        // A new certificate with the old key: unusable, reported once, the old pair stays.
        let (b_cert, b_key, b_der) = pem_pair("b.test");
        std::fs::write(&files.cert, &b_cert).unwrap();
        let Reload::Rejected(e) = reloader.reload() else { panic!("a mismatched pair is rejected") };
        assert!(!e.to_string().contains(a_key.lines().nth(1).unwrap()), "{e}");
        assert!(matches!(reloader.reload(), Reload::StillRejected));
        assert_eq!(served(&reloader), a_der);
        // Its key arrives: swapped.
        std::fs::write(&files.key, &b_key).unwrap();
        assert!(matches!(reloader.reload(), Reload::Replaced));
        assert_eq!(served(&reloader), b_der);
        assert!(matches!(reloader.reload(), Reload::Unchanged));
        // A removed file is another rejection; the pair stays.
        std::fs::remove_file(&files.key).unwrap();
        assert!(matches!(reloader.reload(), Reload::Rejected(Error::Io { .. })));
        assert!(matches!(reloader.reload(), Reload::StillRejected));
        assert_eq!(served(&reloader), b_der);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
