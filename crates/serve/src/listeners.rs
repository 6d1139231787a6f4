//! Bringing the client API up on its sockets: HTTP/1.1 on a TCP port and HTTP/3 on the
//! UDP port of the same number (so one `--listen` address serves both, as browsers and
//! Triton clients expect), with TLS for HTTP/3 from a configured certificate or a
//! self-signed one generated on first run, and gRPC on a TCP port of its own (by
//! default the next one, as Triton's 8000 and 8001). Stopping is one call that lets open
//! connections finish their current request.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::api::Api;
use super::{grpc, http1, http3, tls};

/// Where the certificate for HTTP/3 comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// PEM files given by the operator.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// A self-signed pair kept in this directory (generated when absent).
    SelfSigned(PathBuf),
}

/// How to listen.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// The address; port 0 picks a free TCP port and uses the same number for UDP.
    pub address: SocketAddr,
    /// Serve HTTP/1.1 (TCP).
    pub http1: bool,
    /// Serve HTTP/3 (UDP, TLS).
    pub http3: bool,
    /// The HTTP/3 certificate.
    pub tls: TlsSource,
    /// Where gRPC listens (port 0: a free one), when it is on.
    pub grpc: Option<SocketAddr>,
}

/// The running listeners.
pub struct Listeners {
    /// Where HTTP/1.1 listens, when enabled.
    pub http1: Option<SocketAddr>,
    /// Where HTTP/3 listens, when enabled.
    pub http3: Option<SocketAddr>,
    /// The certificate HTTP/3 clients should trust (when HTTP/3 is enabled).
    pub certificate: Option<PathBuf>,
    /// Whether that certificate was generated at this start.
    pub certificate_generated: bool,
    /// Where gRPC listens, when enabled.
    pub grpc: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Listeners {
    /// The address clients use (TCP and UDP share the port).
    pub fn address(&self) -> SocketAddr {
        self.http1.or(self.http3).expect("a validated configuration keeps one transport on")
    }

    /// Bind and start serving `api`. Must run inside a tokio runtime.
    pub async fn start(options: &ListenOptions, api: Arc<Api>) -> Result<Listeners> {
        let (stop, shutdown) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut address = options.address;
        let mut http1_address = None;
        if options.http1 {
            let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding HTTP/1.1 on TCP {address}"))?;
            let bound = listener.local_addr()?;
            address.set_port(bound.port());
            http1_address = Some(bound);
            tasks.push(tokio::spawn(http1::serve(listener, api.clone(), shutdown.clone())));
        }
        let (mut http3_address, mut certificate, mut certificate_generated) = (None, None, false);
        if options.http3 {
            let identity = match &options.tls {
                TlsSource::Files { cert, key } => tls::Identity::load(cert, key)?,
                TlsSource::SelfSigned(dir) => tls::Identity::load_or_generate(dir)?,
            };
            let endpoint = http3::endpoint(&identity, address).with_context(|| format!("binding HTTP/3 on UDP {address}"))?;
            http3_address = Some(endpoint.local_addr()?);
            certificate = Some(identity.certificate_path.clone());
            certificate_generated = identity.generated;
            tasks.push(tokio::spawn(http3::serve(endpoint, api.clone(), shutdown.clone())));
        }
        let mut grpc_address = None;
        if let Some(address) = options.grpc {
            let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding gRPC on TCP {address}"))?;
            grpc_address = Some(listener.local_addr()?);
            tasks.push(tokio::spawn(grpc::serve(listener, api, shutdown)));
        }
        Ok(Listeners { http1: http1_address, http3: http3_address, certificate, certificate_generated, grpc: grpc_address, stop, tasks })
    }

    /// Stop accepting, let open connections finish, and wait for the listeners.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
