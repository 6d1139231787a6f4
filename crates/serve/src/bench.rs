//! The serving overhead benchmark behind `yardmaster serve-bench`: the trivial model
//! (`y = x + 1` on four floats, [`super::tiny_model`]) served by the whole stack —
//! KServe codec, transport, engine actor, policy, ONNX Runtime worker — and driven on
//! loopback by the project's own clients, over HTTP/1.1 and HTTP/3:
//!
//! - **latency**: requests one at a time; end-to-end latency percentiles, and the
//!   overhead beyond model time (latency minus the worker's measured run time of the
//!   batch, which the engine accounts as accelerator time);
//! - **throughput**: a closed loop of concurrent clients; completed requests per second.
//!
//! Client and server share the machine, so the figures include the client's own cost.
//! To separate the scheduling path from what the transport, the codec and the client
//! cost anyway, the same requests also go to a **baseline** server in the same run:
//! the same API and transports answered by [`InlineTiny`], which computes `x + 1` on
//! the request's task — no engine, no policy, no worker thread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use rustls::pki_types::CertificateDer;

use super::api::{Backend, BoxFuture, InferError, ModelMetadata, TensorSpec};
use super::client::{Http1Client, Http3Client};
use super::kserve::{DataType, InferRequest, InferResponse, Tensor};
use yardmaster_engine::metrics::Histogram;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Requests sent one at a time (latency).
    pub sequential: usize,
    /// Requests sent by the closed loop (throughput).
    pub requests: usize,
    /// Concurrent clients of the closed loop.
    pub concurrency: usize,
    /// HTTP/1.1 connections of the closed loop (requests on one go one after another).
    pub connections: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { sequential: 2_000, requests: 20_000, concurrency: 64, connections: 64 }
    }
}

/// The transport measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTransport {
    /// HTTP/1.1 over TCP.
    Http1,
    /// HTTP/3 over QUIC.
    Http3,
}

impl std::fmt::Display for BenchTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BenchTransport::Http1 => "HTTP/1.1",
            BenchTransport::Http3 => "HTTP/3",
        })
    }
}

/// Figures of one transport.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// The transport.
    pub transport: BenchTransport,
    /// End-to-end latency of sequential requests, ns.
    pub latency: Histogram,
    /// Mean model time per sequential request, ns (the worker's measured run time).
    pub model_mean_ns: f64,
    /// Completed requests per second in the closed loop.
    pub throughput: f64,
    /// Requests of the closed loop that did not get a 200.
    pub errors: u64,
}

impl BenchReport {
    /// Overhead beyond model time at quantile `q`, ns.
    pub fn overhead(&self, q: f64) -> f64 {
        (self.latency.quantile(q) as f64 - self.model_mean_ns).max(0.0)
    }

    /// One line for the terminal.
    pub fn render(&self) -> String {
        let us = |ns: f64| ns / 1e3;
        format!(
            "{:<8} latency p50 {:>7.1} µs  p99 {:>7.1} µs | model {:>5.1} µs | overhead p50 {:>7.1} µs  p99 {:>7.1} µs | {:>8.0} req/s ({} errors)",
            self.transport.to_string(),
            us(self.latency.quantile(0.5) as f64),
            us(self.latency.quantile(0.99) as f64),
            us(self.model_mean_ns),
            us(self.overhead(0.5)),
            us(self.overhead(0.99)),
            self.throughput,
            self.errors
        )
    }
}

/// Where one request's time went in the server, from the traces of sequential
/// requests (Triton's trace format, `super::trace`): the median of each step.
#[derive(Debug, Clone, PartialEq)]
pub struct Breakdown {
    /// Requests traced.
    pub requests: usize,
    /// From the backend taking the request to the engine taking it in: the hand-over
    /// to the engine actor (the request is decoded before it), ns.
    pub to_engine_ns: u64,
    /// From the engine taking it in to its job starting: the policy's decision and the
    /// dispatch, ns.
    pub to_job_ns: u64,
    /// The job: the hand-over to the worker, stacking, ONNX Runtime's `Run`, the split
    /// and the report back to the engine, ns.
    pub job_ns: u64,
    /// Of the job, where the worker measured it (`COMPUTE_INPUT_END`,
    /// `COMPUTE_OUTPUT_START`): the hand-over to the worker and the stacking; the `Run`;
    /// the split and the report back to the engine, ns.
    pub job_parts: Option<[u64; 3]>,
    /// From the job's end to the answer: the wake-up of the request's task and turning
    /// the worker's outputs into the response, ns.
    pub to_answer_ns: u64,
}

impl Breakdown {
    /// The medians of a trace file's requests (those traced with every timestamp).
    pub fn from_trace(trace: &serde_json::Value) -> Option<Breakdown> {
        let mut steps: [Vec<u64>; 4] = Default::default();
        let mut parts: [Vec<u64>; 3] = Default::default();
        for entry in trace.as_array()? {
            let Some(stamps) = entry["timestamps"].as_array() else { continue };
            let at = |name: &str| stamps.iter().find(|s| s["name"] == name).and_then(|s| s["ns"].as_u64());
            let (Some(start), Some(queue), Some(compute), Some(computed), Some(end)) =
                (at("REQUEST_START"), at("QUEUE_START"), at("COMPUTE_START"), at("COMPUTE_END"), at("REQUEST_END"))
            else {
                continue;
            };
            for (step, span) in steps.iter_mut().zip([queue - start, compute - queue, computed - compute, end - computed]) {
                step.push(span);
            }
            if let (Some(input_end), Some(output_start)) = (at("COMPUTE_INPUT_END"), at("COMPUTE_OUTPUT_START")) {
                let spans =
                    [input_end.saturating_sub(compute), output_start.saturating_sub(input_end), computed.saturating_sub(output_start)];
                for (part, span) in parts.iter_mut().zip(spans) {
                    part.push(span);
                }
            }
        }
        let median = |values: &mut Vec<u64>| {
            values.sort_unstable();
            values.get(values.len() / 2).copied()
        };
        let requests = steps[0].len();
        let [a, b, c, d] = &mut steps;
        // Parts only when every traced request has them (the medians must be of the
        // same requests).
        let job_parts = if parts[0].len() == requests {
            let [i, r, o] = &mut parts;
            Some([median(i)?, median(r)?, median(o)?])
        } else {
            None
        };
        Some(Breakdown {
            requests,
            to_engine_ns: median(a)?,
            to_job_ns: median(b)?,
            job_ns: median(c)?,
            job_parts,
            to_answer_ns: median(d)?,
        })
    }

    /// Lines for the terminal, beside the client's median latency and the model's time.
    pub fn render(&self, client_p50_ns: u64, model_ns: f64) -> String {
        let us = |ns: f64| ns / 1e3;
        let inside = self.to_engine_ns + self.to_job_ns + self.job_ns + self.to_answer_ns;
        let parts = match self.job_parts {
            Some([input, run, output]) => format!(
                ": to the worker and stacking {:.1}, run {:.1}, split and back {:.1}",
                us(input as f64),
                us(run as f64),
                us(output as f64)
            ),
            None => String::new(),
        };
        format!(
            "per request (medians of {} traced HTTP/1.1 requests, µs): to the engine {:.1} | policy and dispatch {:.1} | job {:.1} (model {:.1}{parts}) | to the answer {:.1} | in the server {:.1} of {:.1} at the client (transport, HTTP and JSON: {:.1})",
            self.requests,
            us(self.to_engine_ns as f64),
            us(self.to_job_ns as f64),
            us(self.job_ns as f64),
            us(model_ns),
            us(self.to_answer_ns as f64),
            us(inside as f64),
            us(client_p50_ns as f64),
            us(client_p50_ns.saturating_sub(inside) as f64),
        )
    }
}

/// Where the benchmark sends, and how it reads the model time.
pub struct BenchTarget {
    /// The server (TCP and UDP, same port).
    pub address: SocketAddr,
    /// Certificates to trust for HTTP/3.
    pub trusted: Vec<CertificateDer<'static>>,
    /// The model's accelerator time and job count so far (ns, jobs).
    pub model_time: Arc<dyn Fn() -> (u64, u64) + Send + Sync>,
}

/// The baseline backend: the trivial model's arithmetic done inline on the caller's
/// task, with the same metadata and validation outcome as the served `tiny` model.
#[derive(Debug, Default, Clone, Copy)]
pub struct InlineTiny;

impl Backend for InlineTiny {
    fn models(&self) -> Vec<ModelMetadata> {
        let spec = |name: &str| TensorSpec { name: name.into(), datatype: DataType::F32, shape: vec![-1, 4] };
        vec![ModelMetadata {
            name: "tiny".into(),
            versions: vec!["1".into()],
            platform: "inline".into(),
            inputs: vec![spec("x")],
            outputs: vec![spec("y")],
            config: None,
        }]
    }

    fn ready(&self) -> bool {
        true
    }

    fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
        let model = model.to_string();
        Box::pin(async move {
            let x = request.inputs.first().and_then(Tensor::as_f32).ok_or_else(|| InferError::Invalid("x must be FP32".into()))?;
            let y: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
            let output = Tensor::f32("y", vec![1, y.len() as u64], &y).map_err(|e| InferError::Invalid(e.0))?;
            Ok(InferResponse {
                timing: None,
                model_name: model,
                model_version: None,
                id: request.id,
                parameters: Default::default(),
                outputs: vec![output],
            })
        })
    }
}

/// The trivial model's request body.
fn body() -> Bytes {
    Bytes::from_static(br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#)
}

enum Client {
    One(Http1Client),
    Three(Http3Client),
}

impl Client {
    async fn connect(transport: BenchTransport, target: &BenchTarget) -> Result<Client> {
        Ok(match transport {
            BenchTransport::Http1 => Client::One(Http1Client::connect(target.address).await?),
            BenchTransport::Http3 => Client::Three(Http3Client::connect(target.address, "localhost", &target.trusted).await?),
        })
    }

    async fn infer(&mut self, headers: &HeaderMap) -> Result<StatusCode> {
        let path = "/v2/models/tiny/infer";
        let reply = match self {
            Client::One(c) => c.request(Method::POST, path, headers, body()).await?,
            Client::Three(c) => c.request(Method::POST, path, headers, body()).await?,
        };
        Ok(reply.status)
    }
}

/// Measure one transport.
pub async fn run(transport: BenchTransport, target: &BenchTarget, options: &BenchOptions) -> Result<BenchReport> {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut client = Client::connect(transport, target).await?;
    for _ in 0..options.sequential.min(200) {
        client.infer(&headers).await?; // warm-up: connection, worker, policy
    }
    let (time_before, jobs_before) = (target.model_time)();
    let mut latency = Histogram::default();
    for _ in 0..options.sequential {
        let sent = Instant::now();
        let status = client.infer(&headers).await?;
        if status != StatusCode::OK {
            bail!("{transport}: the trivial model answered {status}");
        }
        latency.record(sent.elapsed().as_nanos() as u64);
    }
    let (time_after, jobs_after) = (target.model_time)();
    let model_mean_ns = (time_after - time_before) as f64 / (jobs_after - jobs_before).max(1) as f64;

    let (throughput, errors) = closed_loop(transport, target, options, &headers).await?;
    Ok(BenchReport { transport, latency, model_mean_ns, throughput, errors })
}

async fn closed_loop(transport: BenchTransport, target: &BenchTarget, options: &BenchOptions, headers: &HeaderMap) -> Result<(f64, u64)> {
    let concurrency = options.concurrency.max(1);
    // HTTP/1.1 needs a connection per concurrent client; HTTP/3 multiplexes streams
    // over a few connections.
    let connections = match transport {
        BenchTransport::Http1 => concurrency,
        BenchTransport::Http3 => options.connections.clamp(1, 4),
    };
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Client::connect(transport, target).await?);
    }
    let h3: Vec<Http3Client> = clients.iter().filter_map(|c| if let Client::Three(c) = c { Some(c.clone()) } else { None }).collect();
    let mut h1: Vec<Option<Http1Client>> = clients.into_iter().map(|c| if let Client::One(c) = c { Some(c) } else { None }).collect();
    let per_client = options.requests.div_ceil(concurrency);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..concurrency {
        let headers = headers.clone();
        let mut client = match transport {
            BenchTransport::Http1 => Client::One(h1[i].take().expect("one connection per client")),
            BenchTransport::Http3 => Client::Three(h3[i % h3.len()].clone()),
        };
        tasks.spawn(async move {
            let (mut ok, mut errors) = (0u64, 0u64);
            for _ in 0..per_client {
                match client.infer(&headers).await {
                    Ok(StatusCode::OK) => ok += 1,
                    _ => errors += 1,
                }
            }
            (ok, errors)
        });
    }
    let (mut ok, mut errors) = (0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (o, e) = joined?;
        ok += o;
        errors += e;
    }
    let elapsed = started.elapsed().max(Duration::from_nanos(1));
    Ok((ok as f64 / elapsed.as_secs_f64(), errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breakdown_is_the_median_of_each_step_of_complete_traces() {
        let traced = |id: u64, times: [u64; 5]| {
            let names = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"];
            let stamps: Vec<serde_json::Value> = names.iter().zip(times).map(|(n, t)| serde_json::json!({ "name": n, "ns": t })).collect();
            [
                serde_json::json!({ "id": id, "model_name": "tiny", "model_version": 1 }),
                serde_json::json!({ "id": id, "timestamps": stamps }),
            ]
        };
        let mut entries = Vec::new();
        entries.extend(traced(1, [0, 10, 30, 130, 140]));
        entries.extend(traced(2, [0, 20, 50, 250, 280]));
        entries.extend(traced(3, [0, 30, 60, 160, 200]));
        // A dropped request has no queue or compute times: it is left out.
        entries
            .push(serde_json::json!({ "id": 4, "timestamps": [{ "name": "REQUEST_START", "ns": 0 }, { "name": "REQUEST_END", "ns": 9 }] }));
        let breakdown = Breakdown::from_trace(&serde_json::Value::Array(entries)).unwrap();
        assert_eq!(breakdown, Breakdown { requests: 3, to_engine_ns: 20, to_job_ns: 30, job_ns: 100, job_parts: None, to_answer_ns: 30 });
        assert!(breakdown.render(1_000, 50.0).contains("in the server 0.2 of 1.0"), "{}", breakdown.render(1_000, 50.0));
        assert_eq!(Breakdown::from_trace(&serde_json::json!([])), None, "no complete trace, no breakdown");

        // With the worker's stamps, the job is split: input (to the worker, stacking),
        // run, output (split, back to the engine).
        let with_parts = |id: u64, times: [u64; 7]| {
            let names = [
                "REQUEST_START",
                "QUEUE_START",
                "COMPUTE_START",
                "COMPUTE_INPUT_END",
                "COMPUTE_OUTPUT_START",
                "COMPUTE_END",
                "REQUEST_END",
            ];
            let stamps: Vec<serde_json::Value> = names.iter().zip(times).map(|(n, t)| serde_json::json!({ "name": n, "ns": t })).collect();
            serde_json::json!({ "id": id, "timestamps": stamps })
        };
        let entries = vec![with_parts(1, [0, 10, 30, 40, 100, 130, 140]), with_parts(2, [0, 10, 30, 50, 90, 130, 140])];
        let breakdown = Breakdown::from_trace(&serde_json::Value::Array(entries)).unwrap();
        assert_eq!(breakdown.job_parts, Some([20, 60, 40]));
        assert!(breakdown.render(1_000, 50.0).contains("to the worker and stacking 0.0, run 0.1"), "{}", breakdown.render(1_000, 50.0));
    }
}
