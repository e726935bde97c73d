//! Certificates for test listeners an API server calls (webhooks): a fresh CA and a serving
//! certificate for `127.0.0.1` and `localhost` signed by it.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

use crate::error::Error;

/// PEM texts of a CA (for a `caBundle`) and of a loopback serving certificate and its key.
pub struct LoopbackServing {
    /// The CA certificate.
    pub ca: String,
    /// The serving certificate, for `127.0.0.1` and `localhost`.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

/// Makes a fresh CA and a loopback serving certificate signed by it.
pub fn loopback_serving() -> Result<LoopbackServing, Error> {
    serving_for(&[IpAddr::V4(Ipv4Addr::LOCALHOST)])
}

/// Makes a fresh CA and a serving certificate for `localhost` and `addresses` signed by it.
pub fn serving_for(addresses: &[IpAddr]) -> Result<LoopbackServing, Error> {
    let err = |e: rcgen::Error| Error::Genuine(format!("generating certificates: {e}"));
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.distinguished_name.push(DnType::CommonName, "ccm-test-listener-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().map_err(err)?;
    let mut serving = CertificateParams::new(vec!["localhost".to_string()]).map_err(err)?;
    serving.distinguished_name.push(DnType::CommonName, "ccm-test-listener");
    serving.subject_alt_names.extend(addresses.iter().map(|a| SanType::IpAddress(*a)));
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = serving.signed_by(&key, &issuer).map_err(err)?;
    Ok(LoopbackServing { ca: ca_cert.pem(), cert: cert.pem(), key: key.serialize_pem() })
}
