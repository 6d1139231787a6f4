//! TLS material for the HTTP/3 endpoint and inter-node QUIC: a configured certificate
//! and key (PEM files), or a self-signed pair generated on first run and kept in the
//! server's state directory so that clients can pin it across restarts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate chain and its private key.
#[derive(Debug)]
pub struct Identity {
    /// The chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
    /// Where the certificate lives (for clients that need to trust it).
    pub certificate_path: PathBuf,
    /// Whether it was generated just now.
    pub generated: bool,
}

/// The names a generated certificate is valid for.
pub const SELF_SIGNED_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl Identity {
    /// Read `cert` and `key` (PEM). Both must exist.
    pub fn load(cert: &Path, key: &Path) -> Result<Identity> {
        let chain = read_certificates(cert)?;
        let key_pem = std::fs::read_to_string(key).with_context(|| format!("reading TLS key {}", key.display()))?;
        let key = parse_key(&key_pem).with_context(|| format!("TLS key {}", key.display()))?;
        Ok(Identity { chain, key, certificate_path: cert.to_path_buf(), generated: false })
    }

    /// The pair in `dir` (`cert.pem`, `key.pem`), generated (self-signed for
    /// [`SELF_SIGNED_NAMES`]) if absent.
    pub fn load_or_generate(dir: &Path) -> Result<Identity> {
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        if cert.exists() && key.exists() {
            return Identity::load(&cert, &key);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let generated = rcgen::generate_simple_self_signed(SELF_SIGNED_NAMES.map(String::from).to_vec())
            .map_err(|e| anyhow!("generating a self-signed certificate: {e}"))?;
        std::fs::write(&cert, generated.cert.pem()).with_context(|| format!("writing {}", cert.display()))?;
        write_private(&key, &generated.signing_key.serialize_pem())?;
        let mut identity = Identity::load(&cert, &key)?;
        identity.generated = true;
        Ok(identity)
    }

    /// A rustls server configuration offering `alpn` protocols.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| anyhow!("TLS versions: {e}"))?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| anyhow!("TLS certificate: {e}"))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// A rustls client configuration trusting exactly the certificates in `trusted`.
pub fn client_config(trusted: &[CertificateDer<'static>], alpn: &[&[u8]]) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in trusted {
        roots.add(cert.clone()).map_err(|e| anyhow!("trusting certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| anyhow!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The certificates in a PEM file.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading TLS certificate {}", path.display()))?;
    let chain = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| anyhow!("{}: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(anyhow!("{}: no PEM CERTIFICATE block", path.display()));
    }
    Ok(chain)
}

/// The files of a cluster CA and the node certificate it signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterCertificates {
    /// The CA's certificate (`ca.pem`): what a controller trusts.
    pub ca: PathBuf,
    /// The CA's key (`ca-key.pem`): keep it off the nodes.
    pub ca_key: PathBuf,
    /// The nodes' certificate (`node.pem`), valid for the node name and `*.` it.
    pub node: PathBuf,
    /// Its key (`node-key.pem`).
    pub node_key: PathBuf,
}

/// Make a cluster CA and a node certificate it signs, valid for `node_name` and every
/// name one label under it (`*.node_name`: each pod of a headless Service), into `dir`
/// (`yardmaster cluster certificates`). Existing files are replaced.
pub fn issue_cluster_certificates(dir: &Path, node_name: &str) -> Result<ClusterCertificates> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(|e| anyhow!("CA parameters: {e}"))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "yardmaster cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().map_err(|e| anyhow!("generating the CA key: {e}"))?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(|e| anyhow!("signing the CA certificate: {e}"))?;
    let names = vec![node_name.to_string(), format!("*.{node_name}")];
    let mut node_params = CertificateParams::new(names).map_err(|e| anyhow!("node name {node_name:?}: {e}"))?;
    node_params.distinguished_name.push(DnType::CommonName, node_name);
    let node_key = KeyPair::generate().map_err(|e| anyhow!("generating the node key: {e}"))?;
    let issuer = Issuer::new(ca_params, &ca_key);
    let node_cert = node_params.signed_by(&node_key, &issuer).map_err(|e| anyhow!("signing the node certificate: {e}"))?;
    let files = ClusterCertificates {
        ca: dir.join("ca.pem"),
        ca_key: dir.join("ca-key.pem"),
        node: dir.join("node.pem"),
        node_key: dir.join("node-key.pem"),
    };
    std::fs::write(&files.ca, ca_cert.pem()).with_context(|| format!("writing {}", files.ca.display()))?;
    write_private(&files.ca_key, &ca_key.serialize_pem())?;
    std::fs::write(&files.node, node_cert.pem()).with_context(|| format!("writing {}", files.node.display()))?;
    write_private(&files.node_key, &node_key.serialize_pem())?;
    Ok(files)
}

fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| anyhow!("no usable PEM private key: {e}"))
}

/// Write a file readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_then_reused_and_key_is_private() {
        let dir = std::env::temp_dir().join(format!("yardmaster-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = Identity::load_or_generate(&dir).unwrap();
        assert!(first.generated);
        let second = Identity::load_or_generate(&dir).unwrap();
        assert!(!second.generated);
        assert_eq!(first.chain, second.chain, "the same certificate across restarts");
        first.server_config(&[b"h3"]).unwrap();
        client_config(&first.chain, &[b"h3"]).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("key.pem")).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the key is not readable by others");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_files_are_refused_with_the_path() {
        let dir = std::env::temp_dir().join(format!("yardmaster-tls-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cert.pem"), "not a certificate").unwrap();
        std::fs::write(dir.join("key.pem"), "nor a key").unwrap();
        let error = format!("{:#}", Identity::load(&dir.join("cert.pem"), &dir.join("key.pem")).unwrap_err());
        assert!(error.contains("cert.pem") && error.contains("no PEM CERTIFICATE"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
