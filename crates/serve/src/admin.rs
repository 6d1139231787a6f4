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
//! - `?async=1` on `POST /admin/swap`, `POST /admin/ab` and `POST /admin/shadow`: the
//!   call answers **202** at once with an operation (`{"operation": ID, "state": …}`)
//!   and goes on in the background; `GET /admin/operations/ID` says where it stands —
//!   `state` `compiling`, `preparing`, `warming` (an A/B candidate's workers
//!   starting), `done` (with `result`, the answer the call would have given) or
//!   `failed` (with `error` and the `status` the call would have had) — and
//!   `elapsed_ms`; `GET /admin/operations` lists the recent ones (the last
//!   [`KEPT_OPERATIONS`]). Without `async` the call answers when it is done, as
//!   before. Either way the work runs on a blocking thread and compiles before it
//!   waits for another swap to finish, so every other call (`GET /admin/policies`,
//!   `GET /admin/ab`, a roll-back) answers while a component compiles.
//!
//! Without a token (in `[admin] token` or `YARDMASTER_ADMIN_TOKEN`) the admin API does
//! not start, and one log line says so. A call without `Authorization: Bearer TOKEN`,
//! or with another token, gets 401. [`Admin::start`] also starts the watched directory
//! ([`super::watch`]) when one is configured; it does not need the token.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
use super::swap::{AbEnd, Phase, PolicyControl, PolicySettings, PolicySource, Progress, SwapError};
use super::watch::Watcher;

/// Largest body of an admin call (a policy component).
pub const MAX_ADMIN_BODY: usize = 64 << 20;

/// Operations the admin API keeps for `GET /admin/operations`, the most recent.
pub const KEPT_OPERATIONS: usize = 64;

/// A long call running in the background (`?async=1`).
struct Operation {
    id: u64,
    kind: &'static str,
    policy: String,
    size_bytes: Option<u64>,
    started: Instant,
    progress: Mutex<OperationState>,
}

/// Where an operation stands.
struct OperationState {
    /// `compiling`, `preparing`, `warming`, `done`, `failed`.
    state: &'static str,
    /// Milliseconds from the start at which each phase began.
    phases: Vec<(&'static str, f64)>,
    /// The call's answer, once it is over.
    outcome: Option<(StatusCode, Value)>,
    elapsed_ms: Option<f64>,
}

impl Operation {
    fn phase(&self, phase: Phase) {
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        if progress.state != phase.name() {
            progress.state = phase.name();
            progress.phases.push((phase.name(), self.started.elapsed().as_secs_f64() * 1e3));
        }
    }

    fn finish(&self, status: StatusCode, value: Value) {
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let state = if status == StatusCode::OK { "done" } else { "failed" };
        let elapsed = self.started.elapsed().as_secs_f64() * 1e3;
        progress.state = state;
        progress.phases.push((state, elapsed));
        progress.elapsed_ms = Some(elapsed);
        progress.outcome = Some((status, value));
    }

    fn view(&self) -> Value {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed_ms = progress.elapsed_ms.unwrap_or_else(|| self.started.elapsed().as_secs_f64() * 1e3);
        let mut view = json!({
            "operation": self.id,
            "kind": self.kind,
            "policy": self.policy,
            "size_bytes": self.size_bytes,
            "state": progress.state,
            "elapsed_ms": elapsed_ms,
            "phases": progress.phases.iter().map(|(phase, at)| json!({ "phase": phase, "at_ms": at })).collect::<Vec<_>>(),
            "poll": format!("/admin/operations/{}", self.id),
        });
        if let Some((status, value)) = &progress.outcome {
            view["status"] = json!(status.as_u16());
            match value.get("error").filter(|_| *status != StatusCode::OK) {
                Some(error) => view["error"] = error.clone(),
                None => view["result"] = value.clone(),
            }
        }
        view
    }
}

/// A long call: what it is (`swap`, `shadow`, `ab`), its policy, and the work.
type Work = Box<dyn FnOnce(&dyn PolicyControl, Progress<'_>) -> (StatusCode, Value) + Send>;

/// The admin routes, with the token they require.
pub struct AdminApi {
    token: String,
    swapper: Arc<dyn PolicyControl>,
    operations: Mutex<(u64, VecDeque<Arc<Operation>>)>,
}

impl AdminApi {
    /// Routes over `swapper`, requiring `token`.
    pub fn new(token: String, swapper: Arc<dyn PolicyControl>) -> Self {
        Self { token, swapper, operations: Mutex::new((0, VecDeque::new())) }
    }

    /// Run `work` on a blocking thread: answer when it is done, or at once with an
    /// operation to poll when the call asked for `async`.
    async fn long_call(&self, kind: &'static str, source: &PolicySource, query: Option<&str>, work: Work) -> (StatusCode, Value) {
        let swapper = self.swapper.clone();
        if !matches!(query_value(query, "async"), Some("1" | "true" | "yes")) {
            return match tokio::task::spawn_blocking(move || work(&*swapper, &super::swap::no_progress)).await {
                Ok(answer) => answer,
                Err(join) => error(StatusCode::INTERNAL_SERVER_ERROR, &join.to_string()),
            };
        }
        let (policy, size_bytes) = source.describe();
        let operation = {
            let mut operations = self.operations.lock().unwrap_or_else(|p| p.into_inner());
            operations.0 += 1;
            let operation = Arc::new(Operation {
                id: operations.0,
                kind,
                policy,
                size_bytes,
                started: Instant::now(),
                progress: Mutex::new(OperationState {
                    state: Phase::Compiling.name(),
                    phases: vec![(Phase::Compiling.name(), 0.0)],
                    outcome: None,
                    elapsed_ms: None,
                }),
            });
            operations.1.push_back(operation.clone());
            while operations.1.len() > KEPT_OPERATIONS {
                operations.1.pop_front();
            }
            operation
        };
        let running = operation.clone();
        tokio::task::spawn_blocking(move || {
            let (status, value) =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&*swapper, &|phase| running.phase(phase)))) {
                    Ok(answer) => answer,
                    Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the operation panicked"),
                };
            match value.get("error") {
                Some(reason) => tracing::warn!(operation = running.id, kind = running.kind, %reason, "admin operation failed"),
                None => tracing::info!(operation = running.id, kind = running.kind, "admin operation done"),
            }
            running.finish(status, value);
        });
        (StatusCode::ACCEPTED, operation.view())
    }

    /// The operation `id`, if it is still kept.
    fn operation(&self, id: &str) -> Option<Arc<Operation>> {
        let id: u64 = id.parse().ok()?;
        self.operations.lock().unwrap_or_else(|p| p.into_inner()).1.iter().find(|o| o.id == id).cloned()
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
                let arm = query_value(query, "arm").map(str::to_string);
                let described = source.clone();
                let work: Work = Box::new(move |swapper, progress| answer_now(swapper.swap_arm_with(&source, arm.as_deref(), &settings, progress)));
                self.long_call("swap", &described, query, work).await
            }
            (&Method::POST, "/admin/shadow") => {
                let (source, settings) = match swap_source(query, headers, &body).and_then(|s| Ok((s, policy_settings(query, &body)?))) {
                    Ok(request) => request,
                    Err(message) => return error(StatusCode::BAD_REQUEST, &message),
                };
                let described = source.clone();
                let work: Work = Box::new(move |swapper, progress| {
                    answer_now(swapper.start_shadow_with(&source, &settings, progress).map(|report| json!({ "shadow": report })))
                });
                self.long_call("shadow", &described, query, work).await
            }
            (&Method::GET, "/admin/operations") => {
                let operations = self.operations.lock().unwrap_or_else(|p| p.into_inner());
                (StatusCode::OK, json!({ "operations": operations.1.iter().map(|o| o.view()).collect::<Vec<_>>() }))
            }
            (&Method::GET, _) if path.starts_with("/admin/operations/") => match self.operation(&path["/admin/operations/".len()..]) {
                Some(operation) => (StatusCode::OK, operation.view()),
                None => error(
                    StatusCode::NOT_FOUND,
                    &format!("no operation {} (the last {KEPT_OPERATIONS} are kept)", &path["/admin/operations/".len()..]),
                ),
            },
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
                let warm = match query_value(query, "warm") {
                    None | Some("1" | "true" | "yes") => true,
                    Some("0" | "false" | "no") => false,
                    Some(other) => return error(StatusCode::BAD_REQUEST, &format!("warm={other}: give true or false")),
                };
                let described = source.clone();
                let work: Work = Box::new(move |swapper, progress| {
                    answer_now(swapper.start_ab_with(&source, label.as_deref(), split, &settings, warm, progress))
                });
                self.long_call("ab", &described, query, work).await
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
            (_, "/admin/policies" | "/admin/swap" | "/admin/shadow" | "/admin/ab" | "/admin/ab/promote" | "/admin/ab/rollback" | "/admin/operations") => {
                error(StatusCode::METHOD_NOT_ALLOWED, &format!("{method} is not allowed on {path}"))
            }
            _ => error(
                StatusCode::NOT_FOUND,
                &format!(
                    "no admin route {path} (GET /admin/policies, POST /admin/swap, GET|POST|DELETE /admin/shadow, GET|POST /admin/ab, POST /admin/ab/promote, POST /admin/ab/rollback, GET /admin/operations[/ID])"
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

/// The answer to a call: 200 with the value, 400 for a refused policy, 409 for a
/// command that does not fit, 503 once the engine stopped.
fn answer_now<T: serde::Serialize>(outcome: Result<T, SwapError>) -> (StatusCode, Value) {
    answer_with(Ok(outcome))
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
    pub async fn start(config: &AdminConfig, swapper: Arc<dyn PolicyControl>) -> Result<Admin> {
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
