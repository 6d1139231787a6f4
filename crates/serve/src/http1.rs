//! The HTTP/1.1 front end (hyper): every request goes to [`Api::handle`]. Keep-alive
//! connections, no Nagle delay, bodies read up to the API's limit (413 beyond it).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::api::{Api, ApiRequest, ApiResponse, BodyChunks};

/// Serve `api` on `listener` until `shutdown` turns true; connections already open
/// finish their current request.
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: watch::Receiver<bool>) {
    serve_with(listener, "HTTP/1.1", shutdown, move |request, peer| {
        let api = api.clone();
        async move { answer(&api, request, peer).await }
    })
    .await
}

/// The HTTP/1.1 accept loop for any handler (the client API, the admin API): keep-alive
/// connections without Nagle delay, each request answered by `handle`, until
/// `shutdown` turns true; connections already open finish their current request.
/// `label` names the listener in log lines.
pub async fn serve_with<H, F>(listener: TcpListener, label: &'static str, mut shutdown: watch::Receiver<bool>, handle: H)
where
    H: Fn(http::Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                tracing::warn!("{label} accept failed: {error}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = handle(request, peer);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let connection = hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!("{label} connection from {peer}: {error}");
                    }
                }
                _ = shutdown.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
}

async fn answer(api: &Api, request: http::Request<Incoming>, _peer: SocketAddr) -> http::Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    // The body's pieces as hyper read them, then one buffer (see `BodyChunks::gather`).
    let mut body = Limited::new(body, api.max_body());
    let mut chunks = BodyChunks::default();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    chunks.push(data);
                }
            }
            Err(error) => {
                let status = if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    http::StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    http::StatusCode::BAD_REQUEST
                };
                let message = format!("reading the request body: {error}");
                return into_hyper(ApiResponse::error_response(status, &message));
            }
        }
    }
    let body = chunks.gather(&parts.headers);
    let request = ApiRequest { method: parts.method, path: parts.uri.path().to_string(), headers: parts.headers, body };
    into_hyper(api.handle(request).await)
}

fn into_hyper(response: ApiResponse) -> http::Response<Full<Bytes>> {
    let mut out = http::Response::new(Full::new(response.body));
    *out.status_mut() = response.status;
    *out.headers_mut() = response.headers;
    out
}
