//! A real Prometheus — Debian's `prometheus`, which `scripts/setup.sh --deps` installs —
//! scrapes a running server under load with the rules of `docs/prometheus/rules.yml`,
//! and the queries the docs recommend are checked against the server's own counts:
//! goodput as `rate()` of on-time requests, p99 with `histogram_quantile`, the fault
//! rate, and the recording rules; and Triton's `nv_inference_*` metrics with the
//! autoscaling rule of Triton's own chart (average queue time per request).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::serve_end_to_end::{http_get, serve};
use super::serve_model_control::http_post;

/// The repository's `docs/prometheus`.
fn shipped(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/prometheus").join(file)
}

/// A Prometheus server, killed when dropped.
struct Prometheus {
    child: Child,
    address: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` with every byte but unreserved ones escaped, for a query string.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// The value of an instant query's first sample; `None` when the result is empty.
fn query(prometheus: &str, promql: &str) -> Option<f64> {
    let (status, body) = http_get(prometheus, &format!("/api/v1/query?query={}", encoded(promql)));
    assert_eq!(status, 200, "{promql}: {body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let result = answer["data"]["result"].as_array()?.first()?.clone();
    result["value"][1].as_str()?.parse().ok()
}

/// The sum of the server's own `yardmaster_requests_ended_total{outcome="on_time"}`.
fn on_time_at_server(server: &str) -> f64 {
    let (_, metrics) = http_get(server, "/metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with("yardmaster_requests_ended_total{") && l.contains("outcome=\"on_time\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn a_real_prometheus_scrapes_the_server_and_the_documented_queries_agree_with_it() {
    let (prometheus_bin, promtool) = (Path::new("/usr/bin/prometheus"), Path::new("/usr/bin/promtool"));
    assert!(prometheus_bin.exists() && promtool.exists(), "Debian's prometheus is missing: run `bash scripts/setup.sh --deps`");
    let rules = shipped("rules.yml");
    let check = Command::new(promtool).arg("check").arg("rules").arg(&rules).output().unwrap();
    assert!(check.status.success(), "{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(shipped("grafana-dashboard.json")).unwrap()).unwrap();
    assert!(dashboard["panels"].as_array().is_some_and(|p| !p.is_empty()), "the dashboard has panels");

    let server = serve("prometheus", "tiny", "");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let config = server.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [\"{}\"]\nscrape_configs:\n  - job_name: yardmaster\n    static_configs:\n      - targets: [\"{}\"]\n",
            rules.display(),
            server.address
        ),
    )
    .unwrap();
    let child = Command::new(prometheus_bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", server.dir.join("tsdb").display()))
        .arg(format!("--web.listen-address={address}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(server.dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus starts");
    let prometheus = Prometheus { child, address };
    let log = || std::fs::read_to_string(server.dir.join("prometheus.log")).unwrap_or_default();
    let started = Instant::now();
    while std::net::TcpStream::connect(&prometheus.address).is_err() || http_get(&prometheus.address, "/-/ready").0 != 200 {
        assert!(started.elapsed() < Duration::from_secs(60), "prometheus is not ready:\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    }

    // Prometheus scrapes the server before the load, so the counters rise between scrapes.
    let started = Instant::now();
    while query(&prometheus.address, "up{job=\"yardmaster\"}") != Some(1.0) {
        assert!(started.elapsed() < Duration::from_secs(30), "the server was never scraped:\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    }

    // Load: 150 requests over about 3 s, all within the tiny model's 1 s SLO.
    let body = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
    for _ in 0..150 {
        let (status, answer) = http_post(&server.address, "/v2/models/tiny/infer", body);
        assert_eq!(status, 200, "{answer}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let at_server = on_time_at_server(&server.address);
    assert!(at_server >= 150.0, "{at_server}");

    // Prometheus's view, once it has scraped after the last request.
    let goodput_total = "sum(yardmaster_requests_ended_total{outcome=\"on_time\"})";
    let started = Instant::now();
    while query(&prometheus.address, goodput_total) != Some(at_server) {
        assert!(started.elapsed() < Duration::from_secs(30), "Prometheus never saw {at_server} on time:\n{}", log());
        std::thread::sleep(Duration::from_millis(250));
    }
    let rate = "sum by (arm) (rate(yardmaster_requests_ended_total{outcome=\"on_time\"}[1m]))";
    let goodput = query(&prometheus.address, rate).unwrap_or_else(|| {
        let samples = encoded("yardmaster_requests_ended_total{outcome=\"on_time\"}[1m]");
        panic!("no goodput; the samples: {}", http_get(&prometheus.address, &format!("/api/v1/query?query={samples}")).1)
    });
    assert!(goodput > 0.0, "goodput as rate() of on-time requests: {goodput}");
    let p99 = query(&prometheus.address, "histogram_quantile(0.99, sum by (le) (rate(yardmaster_request_latency_seconds_bucket[1m])))")
        .expect("a p99 from the histogram");
    assert!(p99 > 0.0 && p99 <= 0.1, "every request took well under the 1 s SLO: p99 {p99} s");
    assert_eq!(query(&prometheus.address, "sum(rate(yardmaster_policy_faults_total[1m]))"), Some(0.0), "no fault, and the series is there");
    // The recording rules evaluate on what was scraped.
    let started = Instant::now();
    loop {
        match (
            query(&prometheus.address, "sum(yardmaster:goodput:rate1m)"),
            query(&prometheus.address, "min(yardmaster:slo_attainment:ratio1m)"),
        ) {
            (Some(recorded), Some(attainment)) if recorded > 0.0 => {
                assert_eq!(attainment, 1.0, "every request on time");
                break;
            }
            other => assert!(started.elapsed() < Duration::from_secs(30), "the recording rules gave {other:?}:\n{}", log()),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let alerts = http_get(&prometheus.address, "/api/v1/rules?type=alert").1;
    assert!(alerts.contains("YardmasterSloAttainmentLow") && alerts.contains("\"health\":\"ok\""), "{alerts}");

    // Triton's metric names: its counts, and the autoscaling rule of Triton's own chart
    // (average queue time per request) gives a number.
    assert_eq!(query(&prometheus.address, "sum(nv_inference_request_success{model=\"tiny\",version=\"1\"})"), Some(at_server));
    assert_eq!(query(&prometheus.address, "sum(nv_inference_request_failure)"), Some(0.0));
    let executions = query(&prometheus.address, "sum(nv_inference_exec_count)").expect("executions");
    assert!(executions >= 1.0 && executions <= at_server, "{executions} batches for {at_server} requests");
    assert_eq!(query(&prometheus.address, "sum(nv_inference_pending_request_count)"), Some(0.0));
    for part in ["input", "infer", "output"] {
        let compute = query(&prometheus.address, &format!("sum(nv_inference_compute_{part}_duration_us)")).expect("compute time");
        assert!(compute > 0.0, "compute {part}: {compute}");
    }
    let queue_per_request = "avg(delta(nv_inference_queue_duration_us[30s])/(1+delta(nv_inference_request_success[30s])))";
    let average = query(&prometheus.address, queue_per_request).expect("the chart's rule gives a number");
    assert!(average.is_finite() && average >= 0.0, "{average}");
    drop(prometheus);
}
