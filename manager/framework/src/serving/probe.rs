//! A minimal HTTPS GET that does not verify the server's certificate, like a kubelet's HTTPS
//! probe: for probing the endpoint's self-signed default in tests and the sandbox. Never use it
//! to send a token anywhere but a process you started.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::crypto::{self, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, ClientConfig, DigitallySignedStruct, SignatureScheme};

/// A response: status code and body (lossy UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResponse {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

/// Accepts any certificate, still checking the handshake signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS connector that accepts any server certificate.
pub fn insecure_connector() -> TlsConnector {
    insecure_connector_with(rustls::DEFAULT_VERSIONS)
}

/// A TLS connector that accepts any server certificate and offers only `versions` (an empty
/// list: TLS 1.2 and 1.3).
pub fn insecure_connector_with(versions: &[&'static rustls::SupportedProtocolVersion]) -> TlsConnector {
    insecure_connector_with_groups(versions, &[])
}

/// [`insecure_connector_with`] offering only the key-exchange groups `groups` (empty: all).
pub fn insecure_connector_with_groups(
    versions: &[&'static rustls::SupportedProtocolVersion],
    groups: &[rustls::NamedGroup],
) -> TlsConnector {
    let versions = if versions.is_empty() { rustls::DEFAULT_VERSIONS } else { versions };
    let mut provider = rustls::crypto::ring::default_provider();
    if !groups.is_empty() {
        provider.kx_groups.retain(|g| groups.contains(&g.name()));
    }
    let provider = Arc::new(provider);
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map(|b| {
            b.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))).with_no_client_auth()
        })
        .unwrap_or_else(|_| unreachable!("ring supports TLS 1.2 and 1.3"));
    TlsConnector::from(Arc::new(config))
}

/// `GET path` over HTTPS (certificate not verified), with `Authorization: Bearer` when a token
/// is given. `None` when the connection fails, times out or the answer is not HTTP.
pub async fn get(addr: SocketAddr, path: &str, token: Option<&str>, timeout: Duration) -> Option<ProbeResponse> {
    tokio::time::timeout(timeout, async {
        let tcp = TcpStream::connect(addr).await.ok()?;
        let name = ServerName::try_from("localhost").ok()?;
        let tls = insecure_connector().connect(name, tcp).await.ok()?;
        exchange(tls, addr, path, token).await
    })
    .await
    .ok()
    .flatten()
}

/// `GET path` over plain HTTP.
pub async fn get_plain(addr: SocketAddr, path: &str, token: Option<&str>, timeout: Duration) -> Option<ProbeResponse> {
    tokio::time::timeout(timeout, async {
        let tcp = TcpStream::connect(addr).await.ok()?;
        exchange(tcp, addr, path, token).await
    })
    .await
    .ok()
    .flatten()
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Option<ProbeResponse> {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    // HTTP/1.0: the server closes after the (never chunked) body.
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}Accept: */*\r\n\r\n");
    s.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    // A TLS peer may close without close_notify; keep what arrived.
    let _ = s.read_to_end(&mut raw).await;
    parse(&raw)
}

/// Parse a close-delimited HTTP/1.x response.
pub fn parse(raw: &[u8]) -> Option<ProbeResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut parts = head.lines().next()?.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    Some(ProbeResponse { status, body: body.to_string() })
}
