//! The open-loop load generator behind `yardmaster load`: requests are sent at the
//! instants of a workload (a simulator preset at a rate, or a trace), whatever the
//! server's answers, over HTTP/1.1 (a pool of keep-alive connections) or HTTP/3 (one
//! connection, a stream per request), and the outcome of each is recorded: goodput,
//! drop rate and latency percentiles at the end, progress while it runs.
//!
//! At most [`LoadPlan::max_outstanding`] requests are out at once: an arrival past it
//! is *shed* (counted, never sent), as a real client gives up rather than queue without
//! end. Without the cap an overloaded server would make the generator's own backlog
//! grow with the offered load (one task and one body per unanswered arrival).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use rustls::pki_types::CertificateDer;

use super::client::{Http1Client, Http3Client};
use yardmaster_engine::metrics::Histogram;
use yardmaster_formats::workload::Arrival;

/// The transport to load with.
#[derive(Debug, Clone)]
pub enum Transport {
    /// HTTP/1.1 over `connections` keep-alive connections.
    Http1 {
        /// Connections in the pool.
        connections: usize,
    },
    /// HTTP/3 over one QUIC connection.
    Http3 {
        /// Name to check the certificate against.
        server_name: String,
        /// Certificates to trust.
        trusted: Vec<CertificateDer<'static>>,
    },
}

/// What to send.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// The server.
    pub address: SocketAddr,
    /// The model (pipeline stream) to call.
    pub model: String,
    /// The infer request body (JSON, or JSON + binary with `json_length`).
    pub body: Bytes,
    /// Length of the JSON part when the body uses the binary extension.
    pub json_length: Option<usize>,
    /// A request is on time when answered within this.
    pub slo: Duration,
    /// Transport.
    pub transport: Transport,
    /// Most requests out at once; arrivals past it are shed.
    pub max_outstanding: usize,
}

/// Default of [`LoadPlan::max_outstanding`].
pub const DEFAULT_MAX_OUTSTANDING: usize = 10_000;

/// The outcome counts and latencies of a run.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: u64,
    /// Arrivals not sent because `max_outstanding` requests were already out.
    pub shed: u64,
    /// Answered 200 within the SLO.
    pub on_time: u64,
    /// Answered 200 after the SLO.
    pub late: u64,
    /// Dropped by the scheduler (503).
    pub dropped: u64,
    /// Other errors (4xx, 5xx, transport).
    pub failed: u64,
    /// First error seen, for the operator.
    pub first_error: Option<String>,
    /// Latency of 200 answers, ns.
    pub latency: Histogram,
    /// Wall time from the first send to the last answer.
    pub elapsed: Duration,
}

impl LoadReport {
    /// On-time answers per second.
    pub fn goodput(&self) -> f64 {
        self.on_time as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// (dropped + late + shed) / offered, where offered = sent + shed.
    pub fn drop_rate(&self) -> f64 {
        (self.dropped + self.late + self.shed) as f64 / ((self.sent + self.shed).max(1)) as f64
    }

    /// A few lines for the terminal.
    pub fn render(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut text = format!(
            "sent {} in {:.1} s: {} on time, {} late, {} dropped, {} failed\n\
             goodput {:.1} req/s, drop rate {:.2}%\n\
             latency of answered requests: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
            self.sent,
            self.elapsed.as_secs_f64(),
            self.on_time,
            self.late,
            self.dropped,
            self.failed,
            self.goodput(),
            self.drop_rate() * 100.0,
            ms(self.latency.quantile(0.5)),
            ms(self.latency.quantile(0.9)),
            ms(self.latency.quantile(0.99)),
            ms(self.latency.max()),
        );
        if self.shed > 0 {
            text.push_str(&format!("shed {} arrivals (the generator's cap on requests out at once)\n", self.shed));
        }
        if let Some(error) = &self.first_error {
            text.push_str(&format!("first error: {error}\n"));
        }
        text
    }
}

enum Connections {
    Http1(Vec<tokio::sync::Mutex<Http1Client>>),
    Http3(Http3Client),
}

/// Send one request at each arrival's instant (relative to the start) and wait for
/// every answer. `progress` is called about once a second with (sent, answered).
pub async fn run(plan: &LoadPlan, arrivals: Vec<Arrival>, progress: impl Fn(u64, u64)) -> Result<LoadReport> {
    let connections = Arc::new(match &plan.transport {
        Transport::Http1 { connections } => {
            let mut pool = Vec::new();
            for _ in 0..(*connections).max(1) {
                pool.push(tokio::sync::Mutex::new(Http1Client::connect(plan.address).await?));
            }
            Connections::Http1(pool)
        }
        Transport::Http3 { server_name, trusted } => Connections::Http3(Http3Client::connect(plan.address, server_name, trusted).await?),
    });
    let path = format!("/v2/models/{}/infer", plan.model);
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(n) = plan.json_length {
        headers.insert(super::kserve::HEADER_CONTENT_LENGTH, HeaderValue::from(n));
    }
    let report = Arc::new(Mutex::new(LoadReport::default()));
    let answered = Arc::new(AtomicU64::new(0));
    let next_connection = AtomicU64::new(0);
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for arrival in &arrivals {
        let at = started + Duration::from_nanos(arrival.at);
        tokio::time::sleep_until(at.into()).await;
        {
            let mut report = report.lock().unwrap();
            if report.sent.saturating_sub(answered.load(Ordering::Relaxed)) >= plan.max_outstanding.max(1) as u64 {
                report.shed += 1;
                continue;
            }
            report.sent += 1;
        }
        let connections = connections.clone();
        let (task_report, task_answered, path, headers, body, slo) =
            (report.clone(), answered.clone(), path.clone(), headers.clone(), plan.body.clone(), plan.slo);
        let index = next_connection.fetch_add(1, Ordering::Relaxed) as usize;
        tasks.spawn(async move {
            let sent = Instant::now();
            let result = match &*connections {
                Connections::Http1(pool) => {
                    let mut client = pool[index % pool.len()].lock().await;
                    client.request(Method::POST, &path, &headers, body).await
                }
                Connections::Http3(client) => client.clone().request(Method::POST, &path, &headers, body).await,
            };
            let latency = sent.elapsed();
            let mut report = task_report.lock().unwrap();
            match result {
                Ok(reply) if reply.status == StatusCode::OK => {
                    report.latency.record(latency.as_nanos() as u64);
                    if latency <= slo {
                        report.on_time += 1;
                    } else {
                        report.late += 1;
                    }
                }
                Ok(reply) if reply.status == StatusCode::SERVICE_UNAVAILABLE => report.dropped += 1,
                Ok(reply) => {
                    report.failed += 1;
                    if report.first_error.is_none() {
                        report.first_error = Some(format!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body)));
                    }
                }
                Err(error) => {
                    report.failed += 1;
                    if report.first_error.is_none() {
                        report.first_error = Some(format!("{error:#}"));
                    }
                }
            }
            task_answered.fetch_add(1, Ordering::Relaxed);
        });
        while let Some(joined) = tasks.try_join_next() {
            joined.map_err(|e| anyhow!("a request task failed: {e}"))?;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            progress(report.lock().unwrap().sent, answered.load(Ordering::Relaxed));
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| anyhow!("a request task failed: {e}"))?;
    }
    let mut report = report.lock().unwrap().clone();
    report.elapsed = started.elapsed();
    progress(report.sent, answered.load(Ordering::Relaxed));
    Ok(report)
}
