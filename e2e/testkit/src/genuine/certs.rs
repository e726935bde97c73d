//! Certificates for the genuine control plane: a CA, a serving certificate for loopback, an
//! admin client certificate (`O=system:masters`) and the service-account signing key.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

use crate::error::Error;

/// PEM-encoded material written to the control plane's directory.
pub(crate) struct Pki {
    pub ca_cert: String,
    pub serving_cert: String,
    pub serving_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    /// The service-account token signing key (PKCS#8).
    pub sa_key: String,
    /// Its public key (SPKI), which kube-apiserver verifies tokens with.
    pub sa_pub: String,
}

fn err(e: rcgen::Error) -> Error {
    Error::Genuine(format!("generating certificates: {e}"))
}

impl Pki {
    /// Makes a fresh CA and everything signed by it.
    pub fn generate() -> Result<Pki, Error> {
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.distinguished_name.push(DnType::CommonName, "ccm-envtest-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
        let issuer = Issuer::new(ca, ca_key);

        let serving_key = KeyPair::generate().map_err(err)?;
        let mut serving =
            CertificateParams::new(vec!["localhost".to_string(), "kubernetes".to_string()]).map_err(err)?;
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer).map_err(err)?;

        let admin_key = KeyPair::generate().map_err(err)?;
        let mut admin = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        admin.distinguished_name.push(DnType::CommonName, "ccm-envtest-admin");
        admin.distinguished_name.push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer).map_err(err)?;

        let sa_key = KeyPair::generate().map_err(err)?;
        Ok(Pki {
            ca_cert: ca_cert.pem(),
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            sa_pub: sa_key.public_key_pem(),
            sa_key: sa_key.serialize_pem(),
        })
    }
}
