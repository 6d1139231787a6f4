//! `yardmaster serve` end to end, driven by clients we did not write: Triton's own
//! Python HTTP client (tritonclient) for metadata and inference with JSON and binary
//! tensors, aioquic's HTTP/3 client for an inference over QUIC, the Prometheus
//! reference parser (prometheus-client) for `/metrics`, and `yardmaster load` over
//! both transports. The server is the real binary with real ONNX Runtime workers.
//!
//! The Python clients live in a virtual environment that `scripts/setup.sh --deps`
//! installs (`~/.cache/yardmaster/toolchains/clients`, or `$YARDMASTER_TOOLCHAINS`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A `yardmaster serve` process, killed on drop.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) address: String,
    /// Where gRPC listens (from the same banner line).
    pub(crate) grpc: Option<String>,
    pub(crate) certificate: PathBuf,
    pub(crate) dir: PathBuf,
    /// The banner's lines before "listening on …".
    pub(crate) banner: Vec<String>,
}

/// `serve`'s banner up to its "listening on …" line: the lines before it, and the
/// addresses on it. Panics with `exited()` when the output ends first.
pub(crate) fn read_banner(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    exited: impl Fn() -> String,
) -> (Vec<String>, (String, Option<String>)) {
    let mut banner = Vec::new();
    loop {
        let Some(line) = lines.next() else { panic!("{}", exited()) };
        let line = line.unwrap();
        if let Some(addresses) = listening_addresses(&line) {
            return (banner, addresses);
        }
        banner.push(line);
    }
}

/// The HTTP address and the gRPC one (when on) of the banner's "listening on …" line.
pub(crate) fn listening_addresses(line: &str) -> Option<(String, Option<String>)> {
    let rest = line.strip_prefix("listening on ")?;
    let address = rest.split_whitespace().next()?.to_string();
    let grpc = rest.split("gRPC on ").nth(1).and_then(|g| g.split_whitespace().next()).map(str::to_string);
    Some((address, grpc))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("yardmaster-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Start the server on a free port with `pipeline` and `extra` config lines, and wait
/// for its "listening on" line.
pub(crate) fn serve(name: &str, pipeline: &str, extra: &str) -> Server {
    let dir = scratch(name);
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:0\"\npipeline = \"{pipeline}\"\npolicy = \"edf\"\nstate_dir = \"state\"\n{extra}"),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the yardmaster binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (banner, (address, grpc)) = read_banner(&mut lines, || "serve exited before printing its address".into());
    std::thread::spawn(move || for _ in lines {});
    Server { child, address, grpc, certificate: dir.join("state/tls/cert.pem"), dir, banner }
}

/// A program of the toolchains `scripts/setup.sh --deps` installs
/// (`~/.cache/yardmaster/toolchains`, or `$YARDMASTER_TOOLCHAINS`), which must be there.
pub(crate) fn toolchain(relative: &str) -> PathBuf {
    let root = std::env::var_os("YARDMASTER_TOOLCHAINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/yardmaster/toolchains"));
    let program = root.join(relative);
    assert!(program.exists(), "{} is missing: run `bash scripts/setup.sh --deps`", program.display());
    program
}

pub(crate) fn clients_python() -> PathBuf {
    toolchain("clients/bin/python")
}

pub(crate) fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients").join(name)
}

/// Run a client script; its last stdout line is JSON.
pub(crate) fn run_client(name: &str, args: &[&str]) -> Value {
    let output = Command::new(clients_python()).arg(script(name)).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{name} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

pub(crate) fn http_get(address: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn tritonclient_aioquic_and_prometheus_talk_to_the_server() {
    let server = serve("clients", "tiny", "");
    let triton = run_client("triton_http.py", &[&server.address, "tiny"]);
    assert_eq!(triton["server"]["name"], "yardmaster", "{triton}");
    assert_eq!(triton["model"]["name"], "tiny");
    for encoding in ["json", "binary"] {
        let y = &triton["outputs"][encoding]["y"];
        assert_eq!(y, &serde_json::json!([1.0, 2.0, 3.0, 4.0]), "{encoding}: y = x + 1 for x = 0,1,2,3: {triton}");
    }

    let (host, port) = server.address.rsplit_once(':').unwrap();
    let body = server.dir.join("infer.json");
    std::fs::write(&body, r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#).unwrap();
    let cert = server.certificate.to_str().unwrap();
    let h3 = run_client("h3_infer.py", &[host, port, cert, "/v2/models/tiny/infer", body.to_str().unwrap()]);
    assert_eq!(h3["status"], 200, "{h3}");
    let answer: Value = serde_json::from_str(h3["body"].as_str().unwrap()).unwrap();
    assert_eq!(answer["outputs"][0]["data"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "{answer}");
    let bad = server.dir.join("bad.json");
    std::fs::write(&bad, r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2,3]}]}"#).unwrap();
    let refused = run_client("h3_infer.py", &[host, port, cert, "/v2/models/tiny/infer", bad.to_str().unwrap()]);
    assert_eq!(refused["status"], 400, "a wrong shape is a 400 with a reason: {refused}");
    assert!(refused["body"].as_str().unwrap().contains("error"), "{refused}");

    let (status, text) = http_get(&server.address, "/metrics");
    assert_eq!(status, 200);
    let file = server.dir.join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let families = run_client("prometheus_parse.py", &[file.to_str().unwrap()]);
    for (family, kind) in [
        ("yardmaster_requests_ended", "counter"),
        ("yardmaster_request_latency_seconds", "histogram"),
        ("yardmaster_batch_size", "histogram"),
        ("yardmaster_policy_decision_seconds", "counter"),
        ("yardmaster_policy_fuel", "counter"),
        ("yardmaster_policy_fallbacks", "counter"),
        ("yardmaster_requests_in_flight", "gauge"),
    ] {
        assert_eq!(families[family]["type"], kind, "{family} in {families}");
        assert!(families[family]["labels"].as_array().unwrap().contains(&"arm".into()), "{family} is labelled by arm");
    }
    let on_time = text
        .lines()
        .find(|l| l.starts_with("yardmaster_requests_ended_total{arm=\"primary\",stream=\"tiny\",outcome=\"on_time\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .expect("an on-time counter for the whole arm");
    assert!(on_time >= 3.0, "the three inferences above were on time: {on_time}");
}

#[test]
fn load_runs_over_both_transports_and_reports() {
    let server = serve("load", "tiny", "");
    for transport in ["h1", "h3"] {
        let output = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(["load", "--model", "tiny", "--transport", transport, "--rate", "50", "--duration", "2"])
            .args(["--address", &server.address, "--cert", server.certificate.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{transport}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let sent: u64 = stdout.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a 'sent N' line");
        assert!(sent > 50, "{transport}: about 100 requests in 2 s at 50/s: {stdout}");
        assert!(stdout.contains("goodput") && stdout.contains("p99"), "{stdout}");
        assert!(stdout.contains(" 0 failed"), "{transport}: nothing failed: {stdout}");
    }
}

#[test]
fn an_ocr_request_is_read_and_a_capture_replays_in_the_simulator() {
    let server = serve("ocr", "ocr", "capture = \"live.jsonl\"\n");
    let output = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["load", "--model", "ocr", "--transport", "h1", "--rate", "4", "--duration", "2", "--slo-ms", "5000"])
        .args(["--address", &server.address])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    // The recorder flushes at every turn of the engine loop: the file is complete
    // for every request that has ended, with the server still running.
    let trace = server.dir.join("live.jsonl");
    let replay = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "compare", "--pipeline", "ocr", "--policies", "fifo,edf", "--workload"])
        .arg(format!("trace:{}", trace.display()))
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "the captured trace replays: {}\n{}",
        String::from_utf8_lossy(&replay.stdout),
        String::from_utf8_lossy(&replay.stderr)
    );
}

/// A `yardmaster node` process: (process, address, fingerprint).
fn node(dir: &Path) -> (Child, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["node", "--listen", "127.0.0.1:0", "--tls-dir"])
        .arg(dir.join("node-tls"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines.next().unwrap().unwrap();
    let address = listening.strip_prefix("yardmaster node listening on ").unwrap_or_else(|| panic!("{listening}")).to_string();
    let certificate = lines.next().unwrap().unwrap();
    let pin = certificate.strip_prefix("certificate ").unwrap().split_whitespace().next().unwrap().to_string();
    std::thread::spawn(move || for _ in lines {});
    (child, address, pin)
}

#[test]
fn one_pipeline_split_across_two_hosts_reads_text() {
    let dir = scratch("nodes");
    let (mut node_process, node_address, pin) = node(&dir);
    let server = serve("split", "ocr", &format!("[[remote]]\nstages = [\"cls\", \"rec\"]\nnode = \"{node_address}\"\npin = \"{pin}\"\n"));
    let placed = format!("stages cls, rec on node {node_address}");
    assert!(server.banner.contains(&placed), "the banner says where the stages run: {:?}", server.banner);
    let body = server.dir.join("page.json");
    let image = yardmaster_dataplane::ocr::sample::render_text(&["SPLIT ACROSS HOSTS"], 32.0, 480, 80, 10.0, 10.0).unwrap();
    // A generous deadline (Triton's `timeout`, 30 s): this test is about the split, and
    // on a loaded 2-core machine the stream's own SLO can pass while the first request
    // crosses to the node, which edf would rightly drop.
    let request = serde_json::json!({"parameters": {"timeout": 30_000_000}, "inputs": [{"name": "image", "datatype": "UINT8",
        "shape": [image.height, image.width, 3], "data": image.data}]});
    std::fs::write(&body, serde_json::to_vec(&request).unwrap()).unwrap();
    let (host, port) = server.address.rsplit_once(':').unwrap();
    let cert = server.certificate.to_str().unwrap();
    let reply = run_client("h3_infer.py", &[host, port, cert, "/v2/models/ocr/infer", body.to_str().unwrap()]);
    assert_eq!(reply["status"], 200, "{reply}");
    let answer: Value = serde_json::from_str(reply["body"].as_str().unwrap()).unwrap();
    let texts = answer["outputs"].as_array().unwrap().iter().find(|o| o["name"] == "texts").unwrap()["data"].clone();
    assert_eq!(texts, serde_json::json!(["SPLIT ACROSS HOSTS"]), "{answer}");

    // A server that pins another certificate refuses to start, saying why.
    let wrong = "sha256:".to_string() + &"0".repeat(64);
    let config = dir.join("wrong-pin.toml");
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n[[remote]]\nstages = [\"rec\"]\nnode = \"{node_address}\"\npin = \"{wrong}\"\n"),
    )
    .unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_yardmaster")).args(["serve", "--for", "1", "--config"]).arg(&config).output().unwrap();
    assert!(!refused.status.success(), "a wrong pin must not serve");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&node_address), "the error names the node: {stderr}");
    let _ = node_process.kill();
    let _ = node_process.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
