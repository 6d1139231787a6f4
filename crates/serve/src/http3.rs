//! The HTTP/3 front end (quinn + h3) over TLS 1.3: every request goes to
//! [`Api::handle`], exactly as over HTTP/1.1. A request whose client closes the
//! connection before its answer is dropped, which cancels it in the engine (as a
//! closed HTTP/1.1 connection does).

use std::sync::Arc;

use anyhow::{anyhow, Result};
use bytes::{Buf, Bytes};
use quinn::crypto::rustls::QuicServerConfig;
use tokio::sync::watch;

use super::api::{Api, ApiRequest, ApiResponse, BodyChunks};
use super::tls::Identity;

/// The ALPN protocol of HTTP/3.
pub const ALPN: &[u8] = b"h3";

/// A QUIC endpoint for HTTP/3 on `address`.
pub fn endpoint(identity: &Identity, address: std::net::SocketAddr) -> Result<quinn::Endpoint> {
    let tls = identity.server_config(&[ALPN])?;
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS configuration: {e}"))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(1024u32.into());
    config.transport_config(Arc::new(transport));
    quinn::Endpoint::server(config, address).map_err(|e| anyhow!("binding HTTP/3 on {address}: {e}"))
}

/// Serve `api` on `endpoint` until `shutdown` turns true.
pub async fn serve(endpoint: quinn::Endpoint, api: Arc<Api>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = shutdown.changed() => break,
        };
        let Some(incoming) = incoming else { break };
        let api = api.clone();
        tokio::spawn(async move {
            match incoming.await {
                Ok(connection) => {
                    if let Err(error) = serve_connection(connection, api).await {
                        tracing::debug!("HTTP/3 connection: {error}");
                    }
                }
                Err(error) => tracing::debug!("HTTP/3 handshake: {error}"),
            }
        });
    }
    endpoint.close(0u32.into(), b"shutting down");
}

async fn serve_connection(connection: quinn::Connection, api: Arc<Api>) -> Result<()> {
    let quic = connection.clone();
    let mut h3 =
        h3::server::Connection::<_, Bytes>::new(h3_quinn::Connection::new(connection)).await.map_err(|e| anyhow!("HTTP/3 setup: {e}"))?;
    loop {
        match h3.accept().await {
            Ok(Some(resolver)) => {
                let (api, quic) = (api.clone(), quic.clone());
                tokio::spawn(async move {
                    let Ok((request, mut stream)) = resolver.resolve_request().await else { return };
                    let response = tokio::select! {
                        response = read_and_answer(&api, request, &mut stream) => response,
                        // The client went away: dropping the unfinished answer cancels
                        // the request in the engine.
                        _ = quic.closed() => return,
                    };
                    let mut head = http::Response::new(());
                    *head.status_mut() = response.status;
                    *head.headers_mut() = response.headers;
                    if stream.send_response(head).await.is_ok() {
                        if !response.body.is_empty() {
                            let _ = stream.send_data(response.body).await;
                        }
                        let _ = stream.finish().await;
                    }
                });
            }
            Ok(None) => return Ok(()),
            Err(error) => return Err(anyhow!("{error}")),
        }
    }
}

async fn read_and_answer<S>(api: &Api, request: http::Request<()>, stream: &mut h3::server::RequestStream<S, Bytes>) -> ApiResponse
where
    S: h3::quic::BidiStream<Bytes>,
{
    // The DATA frames' payloads as they came (slices of what QUIC received), then one
    // buffer (see `BodyChunks::gather`).
    let mut body = BodyChunks::default();
    loop {
        match stream.recv_data().await {
            Ok(Some(mut chunk)) => {
                if body.len() + chunk.remaining() > api.max_body() {
                    return ApiResponse::error_response(
                        http::StatusCode::PAYLOAD_TOO_LARGE,
                        &format!("body exceeds the limit of {} bytes", api.max_body()),
                    );
                }
                body.push(chunk.copy_to_bytes(chunk.remaining()));
            }
            Ok(None) => break,
            Err(error) => return ApiResponse::error_response(http::StatusCode::BAD_REQUEST, &format!("reading the request body: {error}")),
        }
    }
    let (parts, ()) = request.into_parts();
    let body = body.gather(&parts.headers);
    api.handle(ApiRequest { method: parts.method, path: parts.uri.path().to_string(), headers: parts.headers, body }).await
}
