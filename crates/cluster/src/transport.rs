//! QUIC plumbing shared by both ends of the inter-node link: the ALPN name, transport
//! settings (windows sized for tensors, keep-alive, idle timeout), certificate pinning,
//! connection close codes, and reading and writing whole frames on a stream.
//!
//! **Pinning.** A node presents a self-signed certificate (generated once into its
//! state folder by [`Identity::load_or_generate`]) and prints its SHA-256 fingerprint
//! when it starts. The controller trusts exactly that certificate: it is given the
//! fingerprint (`sha256:HEX`) or the node's certificate file, and the handshake
//! succeeds only when the SHA-256 of the certificate the node presents matches and the
//! node proves it holds the certificate's key (TLS 1.3's signature check). Names and
//! validity dates are not checked — the pin replaces the web PKI, so a node is reached
//! by any address (an IP that is not in the certificate, a NAT) and no CA is needed.
//!
//! **A cluster CA.** Where nodes come and go (a StatefulSet behind a headless
//! Service), per-node pins cannot be written down in advance. Then every node presents
//! a certificate signed by one cluster CA, and the controller checks the chain up to
//! that CA (dates included) and that the certificate is valid for the cluster's node
//! name (a DNS name; a wildcard such as `*.nodes.ns.svc.cluster.local` covers every
//! pod of the Service). [`Trust`] is the choice between the two.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{RecvStream, SendStream, VarInt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::UnboundedReceiver;

use super::framing::{self, FrameError, Message, PREFIX_LEN};
use crate::tls::{self, Identity};

/// The ALPN protocol of the inter-node link (its framing version is in every frame).
pub const ALPN: &[u8] = b"yardmaster-node";
/// The server name a controller asks for; pinning ignores it.
pub const SERVER_NAME: &str = "yardmaster-node";

/// Connection close code: an orderly close.
pub const CLOSE_DONE: VarInt = VarInt::from_u32(0);
/// Connection close code: the peer sent a frame that does not decode or does not
/// belong where it was sent; the reason names it.
pub const CLOSE_PROTOCOL: VarInt = VarInt::from_u32(1);
/// Connection close code: the node is shutting down.
pub const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(2);

/// Per-stream receive window: a 16 MiB tensor crosses in one window.
const STREAM_WINDOW: u32 = 16 << 20;
/// Per-connection receive window.
const CONNECTION_WINDOW: u32 = 64 << 20;
/// The most worker streams one connection may have open at once.
pub const MAX_WORKER_STREAMS: u32 = 4096;
/// Bytes asked for each UDP socket buffer. A tensor leaves in bursts as large as the
/// congestion window; the kernel's default receive buffer (about 200 KiB on Linux)
/// overflows under them and every drop halves the window. The kernel may grant less
/// (`net.core.rmem_max`, `net.core.wmem_max`).
const SOCKET_BUFFER: usize = 8 << 20;
/// How much of a frame is read (and allocated) at a time: a peer that announces a
/// large frame and sends little of it costs little memory.
const READ_CHUNK: usize = 1 << 20;

/// QUIC transport settings of both ends: tensor-sized windows, one bidirectional
/// stream per worker, keep-alives at a third of `idle_timeout`, and `idle_timeout`
/// after which a silent peer counts as gone.
pub fn transport_config(idle_timeout: Duration) -> Result<quinn::TransportConfig> {
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(MAX_WORKER_STREAMS.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(CONNECTION_WINDOW as u64)
        .keep_alive_interval(Some(idle_timeout / 3))
        .max_idle_timeout(Some(idle_timeout.try_into().map_err(|e| anyhow!("idle timeout {idle_timeout:?}: {e}"))?));
    Ok(transport)
}

/// A QUIC endpoint on a UDP socket bound to `address`, with large socket buffers, as a
/// server when `server` is given. Must run inside a Tokio runtime.
pub fn endpoint(address: SocketAddr, server: Option<quinn::ServerConfig>) -> Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(address).with_context(|| format!("binding UDP {address}"))?;
    let state = quinn::udp::UdpSocketState::new((&socket).into()).with_context(|| format!("UDP socket {address}"))?;
    // Best effort: a smaller buffer costs throughput, not correctness.
    if let Err(error) = state.set_recv_buffer_size((&socket).into(), SOCKET_BUFFER) {
        tracing::debug!("UDP receive buffer of {address}: {error}");
    }
    if let Err(error) = state.set_send_buffer_size((&socket).into(), SOCKET_BUFFER) {
        tracing::debug!("UDP send buffer of {address}: {error}");
    }
    let runtime = Arc::new(quinn::TokioRuntime);
    quinn::Endpoint::new(quinn::EndpointConfig::default(), server, socket, runtime).with_context(|| format!("QUIC endpoint on {address}"))
}

/// The QUIC server configuration of a node.
pub fn server_config(identity: &Identity, idle_timeout: Duration) -> Result<quinn::ServerConfig> {
    let tls = identity.server_config(&[ALPN])?;
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS configuration: {e}"))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config(idle_timeout)?));
    Ok(config)
}

/// How a controller knows a node is the node it means to reach.
#[derive(Clone)]
pub enum Trust {
    /// Exactly the certificate with this SHA-256 (see the module docs).
    Pin(Fingerprint),
    /// Any certificate that chains to one of `roots` and is valid for `name`.
    Ca {
        /// The cluster CA's certificates.
        roots: Arc<rustls::RootCertStore>,
        /// The DNS name node certificates must be valid for.
        name: String,
    },
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trust::Pin(pin) => write!(f, "Pin({pin})"),
            Trust::Ca { roots, name } => write!(f, "Ca({} roots, name {name:?})", roots.len()),
        }
    }
}

impl From<Fingerprint> for Trust {
    fn from(pin: Fingerprint) -> Self {
        Trust::Pin(pin)
    }
}

impl Trust {
    /// Trust certificates signed by the CA in the PEM file `ca` and valid for `name`.
    pub fn cluster_ca(ca: &Path, name: &str) -> Result<Trust> {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in tls::read_certificates(ca).with_context(|| format!("reading the cluster CA {}", ca.display()))? {
            roots.add(certificate).map_err(|e| anyhow!("the cluster CA {}: {e}", ca.display()))?;
        }
        ServerName::try_from(name.to_string()).map_err(|e| anyhow!("node name {name:?} is not a DNS name: {e}"))?;
        Ok(Trust::Ca { roots: Arc::new(roots), name: name.to_string() })
    }

    /// The server name the handshake asks for.
    pub fn server_name(&self) -> &str {
        match self {
            Trust::Pin(_) => SERVER_NAME,
            Trust::Ca { name, .. } => name,
        }
    }
}

/// The QUIC client configuration of a controller that trusts the nodes `trust` admits.
pub fn client_config(trust: impl Into<Trust>, idle_timeout: Duration) -> Result<quinn::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| anyhow!("TLS versions: {e}"))?;
    let mut tls = match trust.into() {
        Trust::Pin(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier { pin, provider: provider.clone() }))
            .with_no_client_auth(),
        Trust::Ca { roots, .. } => {
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| anyhow!("the cluster CA verifier: {e}"))?;
            builder.with_webpki_verifier(verifier).with_no_client_auth()
        }
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS configuration: {e}"))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config(idle_timeout)?));
    Ok(config)
}

/// The SHA-256 of a certificate (DER), the pin a controller trusts a node by.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of `certificate`.
    pub fn of(certificate: &CertificateDer<'_>) -> Self {
        Fingerprint(Sha256::digest(certificate.as_ref()).into())
    }

    /// The fingerprint of the first (leaf) certificate in a PEM file.
    pub fn of_file(path: &Path) -> Result<Self> {
        let chain = tls::read_certificates(path)?;
        Ok(Self::of(&chain[0]))
    }

    /// Parse `sha256:HEX` or bare hex (64 digits, colons allowed between bytes).
    pub fn parse(text: &str) -> Result<Self> {
        let hex_digits: String = text.trim().trim_start_matches("sha256:").chars().filter(|c| *c != ':').collect();
        let bytes = hex::decode(&hex_digits).with_context(|| format!("certificate fingerprint {text:?} is not hex"))?;
        let bytes: [u8; 32] =
            bytes.try_into().map_err(|b: Vec<u8>| anyhow!("certificate fingerprint {text:?} has {} bytes; SHA-256 has 32", b.len()))?;
        Ok(Fingerprint(bytes))
    }

    /// A pin given on a command line: a file holding the node's certificate if one
    /// exists at `text`, a fingerprint otherwise.
    pub fn from_argument(text: &str) -> Result<Self> {
        let path = Path::new(text);
        if path.is_file() {
            Self::of_file(path)
        } else {
            Self::parse(text).context("expected `sha256:HEX` or the path of the node's certificate")
        }
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Fingerprint {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// Accepts exactly the certificate whose SHA-256 is the pin, and checks the
/// handshake signature against it.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Fingerprint,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of(end_entity);
        if presented == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!("the node's certificate is {presented}, not the pinned {}", self.pin)))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("the inter-node link speaks TLS 1.3 only".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Why a frame could not be read from a stream.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The bytes are not a valid frame.
    #[error("malformed frame: {0}")]
    Malformed(#[from] FrameError),
    /// The stream ended inside a frame.
    #[error("the stream ended inside a frame ({0} bytes of it read)")]
    Cut(usize),
    /// The stream or the connection failed.
    #[error("{0}")]
    Transport(#[from] quinn::ReadError),
}

/// Read one frame; `None` when the stream ended cleanly between frames.
pub async fn read_frame(recv: &mut RecvStream) -> Result<Option<Message>, ReadError> {
    let mut prefix = [0u8; PREFIX_LEN];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(n)) => return Err(ReadError::Cut(n)),
        Err(quinn::ReadExactError::ReadError(e)) => return Err(e.into()),
    }
    let total = framing::frame_len(prefix)?;
    let mut frame = Vec::with_capacity(total.min(READ_CHUNK));
    frame.extend_from_slice(&prefix);
    while frame.len() < total {
        let start = frame.len();
        let end = total.min(start + READ_CHUNK);
        frame.resize(end, 0);
        match recv.read_exact(&mut frame[start..end]).await {
            Ok(()) => {}
            Err(quinn::ReadExactError::FinishedEarly(n)) => return Err(ReadError::Cut(start + n)),
            Err(quinn::ReadExactError::ReadError(e)) => return Err(e.into()),
        }
    }
    Ok(Some(framing::decode(&frame)?))
}

/// Write one already-encoded frame (handed to QUIC without a copy).
pub async fn write_frame(send: &mut SendStream, frame: Vec<u8>) -> Result<(), quinn::WriteError> {
    send.write_chunk(bytes::Bytes::from(frame)).await
}

/// A connection's close, in words, for error messages.
pub fn describe_close(error: &quinn::ConnectionError) -> String {
    match error {
        quinn::ConnectionError::ApplicationClosed(close) => {
            let reason = String::from_utf8_lossy(&close.reason);
            match close.error_code {
                code if code == CLOSE_PROTOCOL => format!("closed for a protocol error: {reason}"),
                code if code == CLOSE_SHUTDOWN => format!("the node shut down: {reason}"),
                code if code == CLOSE_DONE => format!("closed: {reason}"),
                code => format!("closed with code {code}: {reason}"),
            }
        }
        quinn::ConnectionError::TimedOut => "no answer within the idle timeout (the peer is gone or unreachable)".into(),
        other => other.to_string(),
    }
}

/// A close reason, cut to fit in one QUIC packet.
pub fn close_reason(text: &str) -> Vec<u8> {
    let mut end = text.len().min(800);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.as_bytes()[..end].to_vec()
}

/// Write each message of `outbox` as a frame on `send`, in order, until the outbox
/// closes (then finish the stream) or the stream fails. A message that does not
/// encode goes to `unencodable` with the reason, which may give a frame to send in
/// its place (e.g. the job's end with an error). Both ends' stream writers.
pub async fn write_messages(
    mut send: SendStream,
    mut outbox: UnboundedReceiver<Message>,
    mut unencodable: impl FnMut(Message, FrameError) -> Option<Vec<u8>>,
) {
    while let Some(message) = outbox.recv().await {
        let frame = match framing::encode(&message) {
            Ok(frame) => frame,
            Err(error) => match unencodable(message, error) {
                Some(frame) => frame,
                None => continue,
            },
        };
        if write_frame(&mut send, frame).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
}

/// What a node said of itself in its welcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// Its device, in words.
    pub device: String,
    /// Its name as a host.
    pub name: String,
    /// Its device slots.
    pub slots: u32,
    /// Its parameter-cache capacity, bytes.
    pub cache_bytes: u64,
    /// Intra-op threads each of its workers may use.
    pub threads: u32,
}

/// Connect to the node at `address` (admitted by `trust`), send `hello` on the first
/// stream and wait for the node's welcome: the endpoint, the connection and what the
/// node said of itself. A refusal is an error naming `what` the hello offered and the
/// node's reason. Must run inside a Tokio runtime.
pub async fn handshake(
    address: SocketAddr,
    trust: impl Into<Trust>,
    idle_timeout: Duration,
    hello: &Message,
    what: &str,
) -> Result<(quinn::Endpoint, quinn::Connection, Welcome)> {
    let trust = trust.into();
    let bind: SocketAddr = if address.is_ipv6() { "[::]:0".parse()? } else { "0.0.0.0:0".parse()? };
    let mut endpoint = endpoint(bind, None).context("binding a UDP socket for the node link")?;
    let server_name = trust.server_name().to_string();
    endpoint.set_default_client_config(client_config(trust, idle_timeout)?);
    let connecting = endpoint.connect(address, &server_name).with_context(|| format!("connecting to node {address}"))?;
    let connection = tokio::time::timeout(idle_timeout, connecting)
        .await
        .map_err(|_| anyhow!("node {address} did not answer within {idle_timeout:?}"))?
        .map_err(|e| anyhow!("QUIC handshake with node {address}: {e}"))?;
    let hello = framing::encode(hello).context("encoding the hello")?;
    let exchange = async {
        let (mut send, mut recv) = connection.open_bi().await?;
        write_frame(&mut send, hello).await?;
        let _ = send.finish();
        anyhow::Ok(read_frame(&mut recv).await)
    };
    let answer = match tokio::time::timeout(idle_timeout, exchange).await {
        Err(_) => Err(anyhow!("node {address} did not answer the hello within {idle_timeout:?}")),
        Ok(Err(error)) => Err(anyhow!("sending the hello to node {address}: {error}")),
        Ok(Ok(Ok(Some(Message::Welcome { device, name, slots, cache_bytes, threads })))) => {
            Ok(Welcome { device, name, slots, cache_bytes, threads })
        }
        Ok(Ok(Ok(Some(Message::Refused { reason })))) => Err(anyhow!("node {address} refused {what}: {reason}")),
        Ok(Ok(Ok(Some(other)))) => Err(anyhow!("node {address} answered the hello with a {}", other.name())),
        Ok(Ok(Ok(None))) => Err(anyhow!("node {address} ended the hello stream without an answer")),
        Ok(Ok(Err(error))) => Err(match connection.close_reason() {
            Some(close) => anyhow!("node {address} closed the connection: {}", describe_close(&close)),
            None => anyhow!("reading node {address}'s answer to the hello: {error}"),
        }),
    };
    match answer {
        Ok(welcome) => Ok((endpoint, connection, welcome)),
        Err(error) => {
            connection.close(CLOSE_DONE, b"hello failed");
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_parse_in_every_written_form() {
        let pin = Fingerprint([0xab; 32]);
        let text = pin.to_string();
        assert!(text.starts_with("sha256:abab"));
        assert_eq!(Fingerprint::parse(&text).unwrap(), pin);
        assert_eq!(Fingerprint::parse("AB:".repeat(32).trim_end_matches(':')).unwrap(), pin);
        let short = Fingerprint::parse("sha256:abcd").unwrap_err().to_string();
        assert!(short.contains("2 bytes"), "{short}");
        assert!(Fingerprint::parse("sha256:zz").is_err());
    }
}
