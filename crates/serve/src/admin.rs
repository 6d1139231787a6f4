//! The admin API: HTTP/1.1 (hyper) on an address of its own, every call authenticated
//! with a bearer token, JSON answers.
//!
//! - `GET /admin/policies`: every arm (two during an A/B run), the policy it runs with
//!   the SHA-256 of its component, its state (`primary`, `fallback`, `closed`) and its
//!   swap counters;
//! - `POST /admin/swap[?arm=LABEL]`: swap the policy of an arm (default: the control
//!   arm) in. The body is the `.wasm` itself (named by the `name` query parameter, else
//!   `uploaded`), or JSON `{"path": FILE}` (a file on the server) or `{"shipped": NAME}`.
//!   A policy the loader refuses gets 400 with the loader's reason and the running
//!   policy is untouched; otherwise 200 with what the swap did, the engine's pause
//!   included;
//! - `POST /admin/ab`: start an A/B run ([`super::ab`]) with the policy in the body (as
//!   for a swap) as the candidate; `share` (default 0.5), `by` (`request`, `stream`,
//!   `key`) and `arm` (the candidate arm's name) come as JSON fields or query
//!   parameters. `GET /admin/ab`: where the run stands and its report with confidence
//!   intervals. `POST /admin/ab/promote` and `POST /admin/ab/rollback`: end the run with
//!   the candidate or the control as the whole. 409 when there is no run to end or one
//!   is already in progress;
//! - `POST /admin/shadow` (body as for a swap): start the policy as a shadow of the
//!   live one ([`yardmaster_policy::Shadow`]): it gets the live events, its actions are
//!   validated and counted, never executed; `GET /admin/shadow`: its report (accepted
//!   and rejected actions, faults, call time); `DELETE /admin/shadow`: stop it, with
//!   the final report. 404 when no shadow runs.
//!
//! Without a token (in `[admin] token` or `YARDMASTER_ADMIN_TOKEN`) the admin API does
//! not start, and one log line says so. A call without `Authorization: Bearer TOKEN`,
//! or with another token, gets 401. [`Admin::start`] also starts the watched directory
//! ([`super::watch`]) when one is configured; it does not need the token.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{header, Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::ab::{Split, SplitBy};
use super::config::{AdminConfig, ADMIN_TOKEN_ENV};
use super::executor::OnnxExecutor;
use super::swap::{AbEnd, PolicySettings, PolicySource, SwapError, Swapper};
use super::watch::Watcher;
use yardmaster_engine::MonotonicClock;

/// The swapper of a served engine.
pub type ServeSwapper = Swapper<MonotonicClock, OnnxExecutor>;

/// Largest body of an admin call (a policy component).
pub const MAX_ADMIN_BODY: usize = 64 << 20;

/// The admin routes, with the token they require.
pub struct AdminApi {
    token: String,
    swapper: Arc<ServeSwapper>,
}

impl AdminApi {
    /// Routes over `swapper`, requiring `token`.
    pub fn new(token: String, swapper: Arc<ServeSwapper>) -> Self {
        Self { token, swapper }
    }

    /// Whether `authorization` carries the token (compared in constant time).
    fn authorized(&self, authorization: Option<&header::HeaderValue>) -> bool {
        let Some(given) = authorization.and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")) else {
            return false;
        };
        constant_time_eq(given.trim().as_bytes(), self.token.as_bytes())
    }

    /// Answer one call: a status and a JSON body.
    pub async fn handle(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> (StatusCode, Value) {
        if !self.authorized(headers.get(header::AUTHORIZATION)) {
            return error(StatusCode::UNAUTHORIZED, "the admin API needs `Authorization: Bearer TOKEN` with the configured token");
        }
        match (method, path) {
            (&Method::GET, "/admin/policies") => {
                let swapper = self.swapper.clone();
                match tokio::task::spawn_blocking(move || swapper.policies()).await {
                    Ok(Ok(arms)) => (StatusCode::OK, json!({ "arms": arms })),
                    Ok(Err(stopped)) => error(StatusCode::SERVICE_UNAVAILABLE, &stopped.to_string()),
                    Err(join) => error(StatusCode::INTERNAL_SERVER_ERROR, &join.to_string()),
                }
            }
            (&Method::POST, "/admin/swap") => {
                let (source, settings) = match swap_source(query, headers, &body).and_then(|s| Ok((s, policy_settings(query, &body)?))) {
                    Ok(request) => request,
                    Err(message) => return error(StatusCode::BAD_REQUEST, &message),
                };
                let (swapper, arm) = (self.swapper.clone(), query_value(query, "arm").map(str::to_string));
                answer_with(tokio::task::spawn_blocking(move || swapper.swap_arm(&source, arm.as_deref(), &settings)).await)
            }
            (&Method::POST, "/admin/shadow") => {
                let (source, settings) = match swap_source(query, headers, &body).and_then(|s| Ok((s, policy_settings(query, &body)?))) {
                    Ok(request) => request,
                    Err(message) => return error(StatusCode::BAD_REQUEST, &message),
                };
                let swapper = self.swapper.clone();
                let started =
                    tokio::task::spawn_blocking(move || swapper.start_shadow(&source, &settings).map(|report| json!({ "shadow": report })));
                answer_with(started.await)
            }
            (&Method::GET | &Method::DELETE, "/admin/shadow") => {
                let (swapper, stop) = (self.swapper.clone(), method == Method::DELETE);
                let read = move || if stop { swapper.stop_shadow() } else { swapper.shadow_report() };
                match tokio::task::spawn_blocking(read).await {
                    Ok(Ok(Some(report))) => (StatusCode::OK, json!({ "shadow": report })),
                    Ok(Ok(None)) => error(StatusCode::NOT_FOUND, "no shadow policy is running (POST /admin/shadow starts one)"),
                    Ok(Err(stopped)) => error(StatusCode::SERVICE_UNAVAILABLE, &stopped.to_string()),
                    Err(join) => error(StatusCode::INTERNAL_SERVER_ERROR, &join.to_string()),
                }
            }
            (&Method::POST, "/admin/ab") => {
                let (source, label, split, settings) =
                    match ab_request(query, headers, &body).and_then(|(s, l, sp)| Ok((s, l, sp, policy_settings(query, &body)?))) {
                        Ok(request) => request,
                        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
                    };
                let swapper = self.swapper.clone();
                answer_with(tokio::task::spawn_blocking(move || swapper.start_ab(&source, label.as_deref(), split, &settings)).await)
            }
            (&Method::GET, "/admin/ab") => {
                let swapper = self.swapper.clone();
                answer_with(tokio::task::spawn_blocking(move || swapper.ab().map_err(SwapError::from)).await)
            }
            (&Method::POST, "/admin/ab/promote" | "/admin/ab/rollback") => {
                let end = if path.ends_with("promote") { AbEnd::Promote } else { AbEnd::RollBack };
                let swapper = self.swapper.clone();
                answer_with(tokio::task::spawn_blocking(move || swapper.end_ab(end)).await)
            }
            (_, "/admin/policies" | "/admin/swap" | "/admin/shadow" | "/admin/ab" | "/admin/ab/promote" | "/admin/ab/rollback") => {
                error(StatusCode::METHOD_NOT_ALLOWED, &format!("{method} is not allowed on {path}"))
            }
            _ => error(
                StatusCode::NOT_FOUND,
                &format!(
                    "no admin route {path} (GET /admin/policies, POST /admin/swap, GET|POST|DELETE /admin/shadow, GET|POST /admin/ab, POST /admin/ab/promote, POST /admin/ab/rollback)"
                ),
            ),
        }
    }
}

/// The answer to a call that ran on a blocking thread: 200 with the value, 400 for a
/// refused policy, 409 for a command that does not fit, 503 once the engine stopped.
fn answer_with<T: serde::Serialize>(outcome: Result<Result<T, SwapError>, tokio::task::JoinError>) -> (StatusCode, Value) {
    match outcome {
        Ok(Ok(value)) => (StatusCode::OK, serde_json::to_value(value).expect("admin answers serialise")),
        Ok(Err(SwapError::Refused(reason))) => error(StatusCode::BAD_REQUEST, &reason),
        Ok(Err(SwapError::Conflict(reason))) => error(StatusCode::CONFLICT, &reason),
        Ok(Err(SwapError::Stopped(stopped))) => error(StatusCode::SERVICE_UNAVAILABLE, &stopped.to_string()),
        Err(join) => error(StatusCode::INTERNAL_SERVER_ERROR, &join.to_string()),
    }
}

/// A query parameter's value.
fn query_value<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query.into_iter().flat_map(|q| q.split('&')).find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

/// What `POST /admin/ab` asks for: the candidate (as for a swap), its arm's name and
/// the split, from JSON fields or query parameters.
fn ab_request(query: Option<&str>, headers: &http::HeaderMap, body: &Bytes) -> Result<(PolicySource, Option<String>, Split), String> {
    let source = swap_source(query, headers, body)?;
    let json: Option<Value> =
        matches!(source, PolicySource::Bytes { .. }).then_some(()).map_or_else(|| serde_json::from_slice(body).ok(), |_| None);
    let field = |key: &str| -> Option<String> {
        json.as_ref()
            .and_then(|v| v.get(key))
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .or_else(|| query_value(query, key).map(str::to_string))
    };
    let share = match field("share") {
        Some(text) => text.parse::<f64>().map_err(|_| format!("share {text:?} is not a number"))?,
        None => 0.5,
    };
    let by = field("by").map_or(Ok(SplitBy::Request), |b| b.parse::<SplitBy>())?;
    let label = field("arm").filter(|a| !a.is_empty());
    if let Some(label) = &label {
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!("arm name {label:?}: use letters, digits, '-', '_' and '.'"));
        }
    }
    Ok((source, label, Split::new(share, by)?))
}

/// The policy's own settings a swap, A/B or shadow call gives ([`PolicySettings`]): JSON
/// fields `params` (an object), `deadline_ms`, `memory_mib`, `failure`, or query
/// parameters of those names (`param=key=value`, repeatable) when the body is the
/// component itself.
fn policy_settings(query: Option<&str>, body: &Bytes) -> Result<PolicySettings, String> {
    let json: Option<Value> = (body.first() == Some(&b'{')).then(|| serde_json::from_slice(body).ok()).flatten();
    let field = |key: &str| -> Vec<String> {
        let mut values: Vec<String> = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
            .map(percent_decoded)
            .collect();
        match (key, json.as_ref()) {
            ("param", Some(json)) => {
                if let Some(params) = json.get("params").and_then(Value::as_object) {
                    values.extend(params.iter().map(|(k, v)| format!("{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_string))));
                }
            }
            (_, Some(json)) => {
                if let Some(value) = json.get(key) {
                    values.push(value.as_str().map_or_else(|| value.to_string(), str::to_string));
                }
            }
            (_, None) => {}
        }
        values
    };
    PolicySettings::from_fields(&field)
}

/// A query value with its `%XX` escapes and `+` (a space) decoded.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What `POST /admin/swap` asks for: JSON `{"path"}` / `{"shipped"}`, or the bytes.
fn swap_source(query: Option<&str>, headers: &http::HeaderMap, body: &Bytes) -> Result<PolicySource, String> {
    let is_json = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"))
        || body.first() == Some(&b'{');
    if !is_json {
        if body.is_empty() {
            return Err("the body is empty: send the policy's .wasm, or JSON {\"path\": FILE} or {\"shipped\": NAME}".into());
        }
        let name = query_value(query, "name")
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
            .unwrap_or("uploaded");
        return Ok(PolicySource::Bytes { name: name.to_string(), bytes: body.to_vec() });
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("the JSON body does not parse: {e}"))?;
    match (value.get("path").and_then(Value::as_str), value.get("shipped").and_then(Value::as_str)) {
        (Some(path), None) => Ok(PolicySource::File(path.into())),
        (None, Some(name)) => Ok(PolicySource::Shipped(name.into())),
        _ => Err("the JSON body needs exactly one of {\"path\": FILE} or {\"shipped\": NAME}".into()),
    }
}

fn error(status: StatusCode, message: &str) -> (StatusCode, Value) {
    (status, json!({ "error": message }))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The admin side of a server: the API's listener (when a token is configured) and the
/// directory watcher (when a directory is).
pub struct Admin {
    /// Where the admin API listens, when it runs.
    pub address: Option<SocketAddr>,
    shutdown: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    watcher: Option<Watcher>,
}

impl Admin {
    /// Start what `config` asks for over `swapper` (inside a tokio runtime).
    pub async fn start(config: &AdminConfig, swapper: Arc<ServeSwapper>) -> Result<Admin> {
        let watcher = match &config.watch_dir {
            Some(dir) => Some(Watcher::start(dir.clone(), config.watch_sha256.clone(), swapper.clone())?),
            None => None,
        };
        let Some(token) = config.effective_token() else {
            tracing::info!("admin API off: no token configured ([admin] token, or {ADMIN_TOKEN_ENV} in the environment)");
            return Ok(Admin { address: None, shutdown: None, watcher });
        };
        let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding the admin API to {}", config.listen))?;
        let address = listener.local_addr()?;
        let api = Arc::new(AdminApi::new(token, swapper));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(listener, api, stopped));
        tracing::info!(%address, "admin API listening");
        Ok(Admin { address: Some(address), shutdown: Some((stop, task)), watcher })
    }

    /// Stop the API and the watcher.
    pub async fn stop(mut self) {
        if let Some((stop, task)) = self.shutdown.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
        if let Some(watcher) = self.watcher.take() {
            let _ = tokio::task::spawn_blocking(move || watcher.stop()).await;
        }
    }
}

/// Serve `api` on `listener` until `shutdown` turns true.
async fn serve(listener: TcpListener, api: Arc<AdminApi>, shutdown: watch::Receiver<bool>) {
    super::http1::serve_with(listener, "admin API", shutdown, move |request, _peer| {
        let api = api.clone();
        async move { answer(&api, request).await }
    })
    .await
}

async fn answer(api: &AdminApi, request: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let (status, value) = match Limited::new(body, MAX_ADMIN_BODY).collect().await {
        Ok(collected) => api.handle(&parts.method, parts.uri.path(), parts.uri.query(), &parts.headers, collected.to_bytes()).await,
        Err(e) => error(StatusCode::PAYLOAD_TOO_LARGE, &format!("reading the body (at most {MAX_ADMIN_BODY} bytes): {e}")),
    };
    let mut response = http::Response::new(Full::new(Bytes::from(format!("{value}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn policy_settings_come_as_json_fields_or_query_parameters() {
        let json =
            Bytes::from_static(br#"{"shipped":"edf","params":{"slack_ms":"3","n":4},"deadline_ms":20,"memory_mib":32,"failure":"reload"}"#);
        let settings = policy_settings(None, &json).unwrap();
        let params: Vec<(&str, &str)> = settings.params.iter().map(|p| (p.key.as_str(), p.value.as_str())).collect();
        assert_eq!(params, [("n", "4"), ("slack_ms", "3")]);
        assert_eq!((settings.deadline_ms, settings.memory_mib), (Some(20.0), Some(32)));
        assert_eq!(settings.failure, Some(yardmaster_policy::FailureMode::Reload));
        let query = Some("name=x&param=a%3Db=c+d&param=k=v&deadline_ms=7.5&failure=fail-closed");
        let settings = policy_settings(query, &Bytes::from_static(b"\0asm")).unwrap();
        let params: Vec<(&str, &str)> = settings.params.iter().map(|p| (p.key.as_str(), p.value.as_str())).collect();
        assert_eq!(params, [("a", "b=c d"), ("k", "v")]);
        assert_eq!((settings.deadline_ms, settings.failure), (Some(7.5), Some(yardmaster_policy::FailureMode::FailClosed)));
        assert_eq!(policy_settings(None, &Bytes::from_static(b"\0asm")).unwrap(), PolicySettings::default());
        for (query, says) in [
            ("deadline_ms=0", "above 0"),
            ("deadline_ms=soon", "not a number"),
            ("memory_mib=0", "1 to 4096"),
            ("failure=panic", "unknown failure mode"),
            ("param=novalue", "key=value"),
        ] {
            let error = policy_settings(Some(query), &Bytes::from_static(b"\0asm")).unwrap_err();
            assert!(error.contains(says), "{query}: {error}");
        }
    }

    #[test]
    fn a_swap_body_is_json_or_the_component() {
        let headers = http::HeaderMap::new();
        let source = swap_source(None, &headers, &Bytes::from_static(br#"{"shipped":"edf"}"#)).unwrap();
        assert_eq!(source, PolicySource::Shipped("edf".into()));
        let source = swap_source(None, &headers, &Bytes::from_static(br#"{"path":"/p/x.wasm"}"#)).unwrap();
        assert_eq!(source, PolicySource::File("/p/x.wasm".into()));
        let source = swap_source(Some("name=mine"), &headers, &Bytes::from_static(b"\0asm\r\0\x01\0")).unwrap();
        assert!(matches!(source, PolicySource::Bytes { ref name, .. } if name == "mine"));
        assert!(swap_source(None, &headers, &Bytes::new()).unwrap_err().contains("empty"));
        assert!(swap_source(None, &headers, &Bytes::from_static(br#"{"path":"a","shipped":"b"}"#)).unwrap_err().contains("exactly one"));
    }
}
