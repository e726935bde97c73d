//! TLS material of the endpoint: PEM files, or a self-signed certificate made at start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

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
    /// HTTPS with `--tls-cert-file` and `--tls-private-key-file`.
    Files(TlsFiles),
    /// Plain HTTP: for tests and for embedding behind a proxy that terminates TLS; no flag of
    /// the binaries selects it.
    Plain,
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

/// The server configuration for `tls`, or `None` for plain HTTP. Fails at start on unreadable
/// or unusable files; errors name the flag and never quote file content.
pub fn server_config(tls: &Tls, bind: IpAddr) -> Result<Option<ServerConfig>, Error> {
    let (certs, key) = match tls {
        Tls::Plain => return Ok(None),
        Tls::Files(files) => load_files(files)?,
        Tls::SelfSigned => {
            let made = rcgen::generate_simple_self_signed(self_signed_names(bind)).map_err(|e| Error::Serve {
                address: bind.to_string(),
                message: format!("generating a self-signed certificate: {e}"),
            })?;
            let fingerprint = ring::digest::digest(&ring::digest::SHA256, made.cert.der());
            let hex: String = fingerprint.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            tracing::info!(sha256 = %hex, "generated a self-signed serving certificate (no --tls-cert-file given)");
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
            (vec![made.cert.der().clone()], key)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| Error::InvalidFlag { flag: "--tls-private-key-file", message: e.to_string() })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(config))
}

/// Load a rustls server configuration from PEM files.
pub fn load_tls(files: &TlsFiles) -> Result<ServerConfig, Error> {
    server_config(&Tls::Files(files.clone()), IpAddr::from([127, 0, 0, 1]))?
        .ok_or_else(|| Error::InvalidFlag { flag: "--tls-cert-file", message: "no TLS configuration".into() })
}

fn load_files(files: &TlsFiles) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let read =
        |path: &PathBuf| std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source });
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| Error::InvalidFlag { flag: "--tls-cert-file", message: "not a PEM certificate".into() })?;
    if certs.is_empty() {
        return Err(Error::InvalidFlag { flag: "--tls-cert-file", message: "no certificate in the file".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| Error::InvalidFlag {
        flag: "--tls-private-key-file",
        message: "no PEM private key in the file".into(),
    })?;
    Ok((certs, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_self_signed_certificate_names_localhost_loopback_and_a_specific_bind_address() {
        assert_eq!(self_signed_names("0.0.0.0".parse().unwrap()), ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(self_signed_names("10.0.0.5".parse().unwrap()), ["localhost", "127.0.0.1", "::1", "10.0.0.5"]);
        assert!(server_config(&Tls::SelfSigned, "0.0.0.0".parse().unwrap()).unwrap().is_some());
        assert!(server_config(&Tls::Plain, "0.0.0.0".parse().unwrap()).unwrap().is_none());
    }

    #[test]
    fn unusable_tls_files_fail_at_start_naming_the_flag_not_the_content() {
        let dir = std::env::temp_dir().join(format!("ccm-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("c.pem");
        let key = dir.join("k.pem");
        std::fs::write(&cert, "SECRET-TOKEN-12345").unwrap();
        std::fs::write(&key, "SECRET-TOKEN-12345").unwrap();
        let files = TlsFiles { cert: cert.clone(), key: key.clone() };
        let e = server_config(&Tls::Files(files), "0.0.0.0".parse().unwrap()).unwrap_err().to_string();
        assert!(e.contains("--tls-"), "{e}");
        assert!(!e.contains("SECRET-TOKEN"), "{e}");
        let missing = TlsFiles { cert: dir.join("none.pem"), key };
        assert!(matches!(load_tls(&missing), Err(Error::Io { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
