//! The client API over real sockets: HTTP/1.1 (hyper) and HTTP/3 (quinn + h3, TLS
//! with a generated certificate), driven by the project's own clients. Both
//! transports must give byte-identical answers.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};
use yardmaster::serve::api::{Api, Backend, BoxFuture, InferError, ModelMetadata, TensorSpec};
use yardmaster::serve::client::{Http1Client, Http3Client};
use yardmaster::serve::kserve::{DataType, InferRequest, InferResponse, Tensor};
use yardmaster::serve::{http1, http3, tls};

/// Negates its FP32 input (transport test: the model is beside the point).
struct Negate;

impl Backend for Negate {
    fn models(&self) -> Vec<ModelMetadata> {
        vec![ModelMetadata {
            name: "negate".into(),
            versions: vec!["1".into()],
            platform: "test".into(),
            inputs: vec![TensorSpec { name: "x".into(), datatype: DataType::F32, shape: vec![-1] }],
            outputs: vec![TensorSpec { name: "y".into(), datatype: DataType::F32, shape: vec![-1] }],
            config: None,
        }]
    }
    fn ready(&self) -> bool {
        true
    }
    fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
        let model = model.to_string();
        Box::pin(async move {
            let y: Vec<f32> = request.inputs[0].as_f32().unwrap().iter().map(|v| -v).collect();
            Ok(InferResponse {
                timing: None,
                model_name: model,
                model_version: None,
                id: request.id,
                parameters: Default::default(),
                outputs: vec![Tensor::f32("y", vec![y.len() as u64], &y).unwrap()],
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_http3_answer_identically() {
    let api = Arc::new(Api::new(Arc::new(Negate)).with_max_body(4096));
    let (stop, shutdown) = tokio::sync::watch::channel(false);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http1_address = listener.local_addr().unwrap();
    tokio::spawn(http1::serve(listener, api.clone(), shutdown.clone()));

    let dir = std::env::temp_dir().join(format!("yardmaster-transport-{}", std::process::id()));
    let identity = tls::Identity::load_or_generate(&dir).unwrap();
    let endpoint = http3::endpoint(&identity, "127.0.0.1:0".parse().unwrap()).unwrap();
    let http3_address: SocketAddr = endpoint.local_addr().unwrap();
    tokio::spawn(http3::serve(endpoint, api.clone(), shutdown.clone()));

    let mut one = Http1Client::connect(http1_address).await.unwrap();
    let mut three = Http3Client::connect(http3_address, "localhost", &identity.chain).await.unwrap();
    let none = HeaderMap::new();
    let infer = Bytes::from(r#"{"id":"q","inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,-2,0.5]}]}"#);
    let cases: Vec<(Method, &str, Bytes, StatusCode)> = vec![
        (Method::GET, "/v2/health/ready", Bytes::new(), StatusCode::OK),
        (Method::GET, "/v2/models/negate", Bytes::new(), StatusCode::OK),
        (Method::POST, "/v2/models/negate/infer", infer.clone(), StatusCode::OK),
        (Method::POST, "/v2/models/negate/infer", Bytes::from("{oops"), StatusCode::BAD_REQUEST),
        (Method::POST, "/v2/models/negate/infer", Bytes::from(vec![b' '; 5000]), StatusCode::PAYLOAD_TOO_LARGE),
        (Method::GET, "/v2/models/absent", Bytes::new(), StatusCode::NOT_FOUND),
    ];
    for (method, path, body, status) in cases {
        let a = one.request(method.clone(), path, &none, body.clone()).await.unwrap();
        let b = three.request(method.clone(), path, &none, body).await.unwrap();
        assert_eq!(a.status, status, "HTTP/1.1 {method} {path}: {:?}", a.body);
        assert_eq!(b.status, status, "HTTP/3 {method} {path}: {:?}", b.body);
        if status != StatusCode::PAYLOAD_TOO_LARGE {
            assert_eq!(a.body, b.body, "{method} {path}: same answer on both transports");
        }
    }
    let answer: Value =
        serde_json::from_slice(&one.request(Method::POST, "/v2/models/negate/infer", &none, infer).await.unwrap().body).unwrap();
    assert_eq!(answer["outputs"][0]["data"], json!([-1.0, 2.0, -0.5]));

    // Many concurrent requests on one HTTP/3 connection.
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut client = three.clone();
        tasks.push(tokio::spawn(async move {
            let body = format!(r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"FP32","data":[{i}]}}]}}"#);
            let reply = client.request(Method::POST, "/v2/models/negate/infer", &HeaderMap::new(), Bytes::from(body)).await.unwrap();
            let value: Value = serde_json::from_slice(&reply.body).unwrap();
            value["outputs"][0]["data"][0].as_f64().unwrap()
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        assert_eq!(task.await.unwrap(), -(i as f64));
    }
    stop.send(true).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
