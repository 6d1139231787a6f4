//! The reference policies' very `.wasm` files schedule live traffic: each is started
//! under the real server (ONNX Runtime workers, HTTP/1.1) on the PP-OCR and the trivial
//! pipelines, and every request must be answered — completed, or dropped with a 503
//! and a reason — with no request failing. This is the check that a policy has no
//! simulator-only code path.

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use yardmaster::serve::client::Http1Client;
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::server::Server;

async fn exercise(policy: &str, pipeline: &str, body: Bytes, headers: HeaderMap, requests: usize) {
    let config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        http3: false,
        pipeline: pipeline.into(),
        policy: policy.into(),
        ..ServeConfig::default()
    };
    let server = Server::start(&config, Vec::new()).await.unwrap_or_else(|e| panic!("{policy} on {pipeline}: {e:#}"));
    let address = server.address();
    let path = format!("/v2/models/{pipeline}/infer");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..requests {
        let (body, headers, path) = (body.clone(), headers.clone(), path.clone());
        tasks.spawn(async move {
            let mut client = Http1Client::connect(address).await.unwrap();
            client.request(Method::POST, &path, &headers, body).await.unwrap()
        });
    }
    let mut completed = 0;
    let mut reasons = Vec::new();
    while let Some(reply) = tasks.join_next().await {
        let reply = reply.unwrap();
        match reply.status {
            StatusCode::OK => completed += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                let text = String::from_utf8_lossy(&reply.body);
                assert!(text.contains("dropped"), "{policy}: a 503 says why: {text}");
                reasons.push(text.into_owned());
            }
            other => panic!("{policy} on {pipeline}: {other} {}", String::from_utf8_lossy(&reply.body)),
        }
    }
    assert!(completed > 0, "{policy} on {pipeline} completed none of {requests}: {reasons:?}");
    let summary = server.summary();
    server.stop().await;
    assert!(summary.contains(" 0 failed"), "{policy} on {pipeline}: {summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_policies_schedule_the_trivial_model_live() {
    let body = Bytes::from_static(br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#);
    for policy in ["pard", "flex", "quart", "loki", "edf", "fifo"] {
        exercise(policy, "tiny", body.clone(), HeaderMap::new(), 24).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pard_schedules_the_ocr_pipeline_live() {
    let image = yardmaster_dataplane::ocr::sample::render_text(&["PARD under the server"], 28.0, 400, 80, 10.0, 10.0).unwrap();
    // A generous deadline (Triton's timeout, µs): the machine running the tests may be
    // busy, and the point is that PARD serves, not how fast.
    let header = serde_json::json!({"parameters": {"timeout": 60_000_000}, "inputs": [{"name": "image", "datatype": "UINT8",
        "shape": [image.height, image.width, 3], "parameters": {"binary_data_size": image.data.len()}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(yardmaster::serve::kserve::HEADER_CONTENT_LENGTH, body.len().into());
    body.extend_from_slice(&image.data);
    exercise("pard", "ocr", Bytes::from(body), headers, 4).await;
}
