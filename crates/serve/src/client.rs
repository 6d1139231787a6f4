//! Clients of the client API over HTTP/1.1 and HTTP/3, for the load generator and
//! tests: one connection each, requests in, [`Reply`]s out.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use quinn::crypto::rustls::QuicClientConfig;
use rustls::pki_types::CertificateDer;

/// A response as a client sees it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// An HTTP/1.1 connection (keep-alive; requests go one after another).
pub struct Http1Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    authority: String,
}

impl Http1Client {
    /// Connect to `address`.
    pub async fn connect(address: SocketAddr) -> Result<Self> {
        let stream = tokio::net::TcpStream::connect(address).await.with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { sender, authority: address.to_string() })
    }

    /// Send one request and read the whole reply.
    pub async fn request(&mut self, method: Method, path: &str, headers: &HeaderMap, body: Bytes) -> Result<Reply> {
        self.sender.ready().await.map_err(|e| anyhow!("HTTP/1.1 connection: {e}"))?;
        let mut request = http::Request::builder().method(method).uri(path).header(http::header::HOST, &self.authority);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(body))?;
        let response = self.sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply { status: parts.status, headers: parts.headers, body })
    }
}

/// An HTTP/3 connection (requests may run concurrently on it).
#[derive(Clone)]
pub struct Http3Client {
    sender: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    authority: String,
    _endpoint: quinn::Endpoint,
}

impl Http3Client {
    /// Connect to `address`, trusting `trusted` certificates, checking the server's
    /// name against `server_name`.
    pub async fn connect(address: SocketAddr, server_name: &str, trusted: &[CertificateDer<'static>]) -> Result<Self> {
        let tls = super::tls::client_config(trusted, &[super::http3::ALPN])?;
        let crypto = QuicClientConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS configuration: {e}"))?;
        let bind: SocketAddr = if address.is_ipv6() { "[::]:0".parse()? } else { "0.0.0.0:0".parse()? };
        let mut endpoint = quinn::Endpoint::client(bind)?;
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let connection = endpoint.connect(address, server_name)?.await.with_context(|| format!("QUIC handshake with {address}"))?;
        let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(connection)).await?;
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Self { sender, authority: address.to_string(), _endpoint: endpoint })
    }

    /// Send one request and read the whole reply.
    pub async fn request(&mut self, method: Method, path: &str, headers: &HeaderMap, body: Bytes) -> Result<Reply> {
        let uri = format!("https://{}{path}", self.authority);
        let mut request = http::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let mut stream = self.sender.send_request(request.body(())?).await?;
        if !body.is_empty() {
            stream.send_data(body).await?;
        }
        stream.finish().await?;
        let response = stream.recv_response().await?;
        let mut collected = BytesMut::new();
        while let Some(mut chunk) = stream.recv_data().await? {
            while chunk.has_remaining() {
                let piece = chunk.chunk();
                collected.extend_from_slice(piece);
                let n = piece.len();
                chunk.advance(n);
            }
        }
        let (parts, ()) = response.into_parts();
        Ok(Reply { status: parts.status, headers: parts.headers, body: collected.freeze() })
    }
}
