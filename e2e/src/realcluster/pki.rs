//! Certificates of the real cluster: one CA, the API server's serving certificate for the node
//! address, a client certificate per component identity, and the service-account key pair.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

use crate::Error;

/// The identities the components authenticate as: (file stem, common name, organization).
/// Each is what the API server's default RBAC and the Node authorizer expect.
pub(crate) fn identities(node: &str) -> Vec<(&'static str, String, Option<&'static str>)> {
    vec![
        ("admin", "ccm-realcluster-admin".into(), Some("system:masters")),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client".into(), Some("system:masters")),
        ("kubelet", format!("system:node:{node}"), Some("system:nodes")),
        ("kube-controller-manager", "system:kube-controller-manager".into(), None),
        ("kube-scheduler", "system:kube-scheduler".into(), None),
        ("kube-proxy", "system:kube-proxy".into(), None),
    ]
}

/// The CA's parameters: the same each time, so that an issuer can be rebuilt from the key
/// alone for certificates made after the start.
fn ca_params() -> Result<CertificateParams, Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.distinguished_name.push(DnType::CommonName, "ccm-realcluster-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(ca)
}

/// Writes `<stem>.{crt,key}`: a client certificate for `cn` (and group `org`).
fn client<S: rcgen::SigningKey>(
    dir: &Path,
    issuer: &Issuer<'_, S>,
    stem: &str,
    cn: String,
    org: Option<&str>,
) -> Result<(), Error> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    if let Some(org) = org {
        params.distinguished_name.push(DnType::OrganizationName, org);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().map_err(err)?;
    write(dir, &format!("{stem}.crt"), &params.signed_by(&key, issuer).map_err(err)?.pem())?;
    write(dir, &format!("{stem}.key"), &key.serialize_pem())
}

/// The file stem of an added Node's kubelet certificate.
pub(crate) fn kubelet_stem(node: &str) -> String {
    format!("kubelet-{node}")
}

/// Writes the kubelet client certificate of a Node added after the start
/// (`system:node:<node>` in `system:nodes`, what the Node authorizer expects), signed with the
/// CA in `dir`.
pub(crate) fn node_client(dir: &Path, node: &str) -> Result<(), Error> {
    let pem = std::fs::read_to_string(dir.join("ca.key")).map_err(|e| Error::io("reading the CA key", e))?;
    let key = KeyPair::from_pem(&pem).map_err(err)?;
    let issuer = Issuer::new(ca_params()?, key);
    client(dir, &issuer, &kubelet_stem(node), format!("system:node:{node}"), Some("system:nodes"))
}

fn err(e: rcgen::Error) -> Error {
    Error::Other(format!("generating certificates: {e}"))
}

fn write(dir: &Path, name: &str, content: &str) -> Result<(), Error> {
    let path = dir.join(name);
    std::fs::write(&path, content).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Writes `ca.{crt,key}`, `apiserver.{crt,key}`, `<identity>.{crt,key}` and `sa.{key,pub}`
/// into `dir`. The serving certificate names `node_ip`, loopback and the `kubernetes` Service.
pub(crate) fn generate(dir: &Path, node: &str, node_ip: Ipv4Addr, kubernetes_ip: Ipv4Addr) -> Result<(), Error> {
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca = ca_params()?;
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    write(dir, "ca.crt", &ca_cert.pem())?;
    write(dir, "ca.key", &ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca, ca_key);

    let names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"];
    let mut serving = CertificateParams::new(names.map(String::from).to_vec()).map_err(err)?;
    serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    for ip in [Ipv4Addr::LOCALHOST, node_ip, kubernetes_ip] {
        serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(ip)));
    }
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(err)?;
    write(dir, "apiserver.crt", &serving.signed_by(&key, &issuer).map_err(err)?.pem())?;
    write(dir, "apiserver.key", &key.serialize_pem())?;

    for (stem, cn, org) in identities(node) {
        client(dir, &issuer, stem, cn, org)?;
    }

    let sa = KeyPair::generate().map_err(err)?;
    write(dir, "sa.key", &sa.serialize_pem())?;
    write(dir, "sa.pub", &sa.public_key_pem())?;
    Ok(())
}
