//! The server's configuration file (`yardmaster serve --config FILE`, TOML). Every key
//! has a default, so an empty file — or no file — serves the default PP-OCR pipeline
//! with the `edf` policy on `127.0.0.1:8000` (HTTP/1.1 on TCP and HTTP/3 on UDP) and
//! `127.0.0.1:8001` (gRPC).
//!
//! ```toml
//! listen = "127.0.0.1:8000"   # TCP for HTTP/1.1 and UDP for HTTP/3, same port
//! http1 = true
//! http3 = true
//! grpc = true                 # KServe v2 over gRPC (tritonclient.grpc, perf_analyzer -i grpc)
//! grpc_listen = "127.0.0.1:8001"  # default: listen's host, the next port (0 when listen's is 0)
//! pipeline = "ocr"            # a preset name or a pipeline .toml file
//! model_repository = ["models/"]  # instead: serve every model of these Triton model
//!                             # repositories (see docs/model-repository.md)
//! model_control_mode = "none" # none, explicit (load/unload on request) or poll
//! load_model = []             # explicit/poll: the models loaded at start (none: all)
//! repository_poll_secs = 15   # poll: how often the repository is read again
//! unload_timeout_secs = 30    # how long an unloaded model's requests may drain
//! policy = "edf"              # a shipped policy name or a .wasm file
//! params = { }                # policy parameters, key = "value"
//!                             # (or a [policy] table: name, params, and the policy's
//!                             # deadline_ms = 5, memory_mib = 64, failure = "fail-open")
//! tbt_ms = 100                # LLM pipelines: the time between tokens promised to
//!                             # latency-sensitive streams (default: params.tbt_ms, else 100)
//! device = "auto"             # auto (CUDA when present, else CPU), cpu, cuda or cuda:N
//! max_body_bytes = 67108864   # larger request bodies get 413
//! max_in_flight = 10000       # more inference requests at once get 503
//! capture = "live.jsonl"      # optional: write a JSON-lines trace of what is served
//! trace_file = "trace.json"   # optional: where Triton's trace extension writes (off until
//!                             # a client sets trace_level, docs/serving.md)
//! state_dir = "…"             # where a generated certificate is kept
//!
//! [tls]                       # optional: a certificate instead of a self-signed one
//! cert = "cert.pem"
//! key = "key.pem"
//!
//! [admin]                     # optional: the admin API (docs/swap.md)
//! listen = "127.0.0.1:8003"   # its own address
//! token = "…"                 # bearer token (or env YARDMASTER_ADMIN_TOKEN); none: no admin API
//! watch_dir = "policies/"     # optional: swap in a .wasm that appears here
//! watch_sha256 = ["…"]        # optional: only files with these SHA-256s
//!
//! [watchdog]                  # stalled jobs (see `super::watchdog`)
//! enabled = true
//! multiple = 20.0             # a job stalls past 20 × its profiled p99 …
//! min_ms = 30000              # … and never before 30 s
//!
//! [cluster]                   # optional: every `yardmaster node` found here is a host
//! nodes = "dns:yardmaster-nodes.default.svc.cluster.local:7443"  # or "static:IP:PORT,…"
//! resolve_secs = 5            # how often the name is resolved again
//! ca = "/etc/yardmaster/tls/ca.pem"  # the cluster CA that signs node certificates
//! node_name = "…"             # the name node certificates carry (default: the DNS name)
//! pins = { "10.0.0.7:7443" = "sha256:…" }  # without a CA: each static node's pin
//! local_slots = 0             # worker slots of this host (default 0: nodes only)
//! startup_wait_secs = 300     # how long the start waits for the first node
//! idle_timeout_secs = 10      # silence after which a node counts as lost
//!
//! [[remote]]                  # optional: stages served by `yardmaster node` hosts
//! stages = ["rec"]
//! node = "127.0.0.1:7443"
//! pin = "sha256:3f1c…"        # the node's certificate: its printed fingerprint, or
//!                             # the path of a copy of its cert.pem
//! ```
//!
//! Unknown keys are refused (a misspelt key is an error, not a silent default).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::listeners::{ListenOptions, TlsSource};
use super::watchdog::WatchdogConfig;
use yardmaster_engine::EngineOptions;
use yardmaster_policy::contract::Param;

use super::swap::PolicySettings;

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8000";

/// A certificate and key given by the operator.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// Stages placed on a remote node.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemotePlacement {
    /// Stage names (as the pipeline names them).
    pub stages: Vec<String>,
    /// The node's QUIC address.
    pub node: SocketAddr,
    /// The node's certificate, pinned: `sha256:HEX` or the path of its PEM file.
    pub pin: String,
}

/// The `[cluster]` section: nodes found by name or list, each a host of the engine's
/// (see `super::membership`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `dns:NAME:PORT` or `static:IP:PORT,…`.
    pub nodes: String,
    /// Seconds between two resolutions of the name.
    #[serde(default = "ClusterConfig::default_resolve_secs")]
    pub resolve_secs: f64,
    /// The cluster CA's certificate (PEM): nodes must present a certificate it signed.
    pub ca: Option<PathBuf>,
    /// The DNS name node certificates must be valid for (default: the name in
    /// `nodes`; `yardmaster-node` for a static list).
    pub node_name: Option<String>,
    /// Without a CA: each static node's certificate pin, by address (`sha256:HEX` or
    /// the path of its `cert.pem`).
    #[serde(default)]
    pub pins: BTreeMap<String, String>,
    /// Worker slots of the controller's own host (0: it runs no model worker while
    /// any node has a free slot).
    #[serde(default)]
    pub local_slots: u32,
    /// How long the start waits for the first node with a slot.
    #[serde(default = "ClusterConfig::default_startup_wait_secs")]
    pub startup_wait_secs: f64,
    /// Silence after which a node counts as lost.
    #[serde(default = "ClusterConfig::default_idle_timeout_secs")]
    pub idle_timeout_secs: f64,
}

impl ClusterConfig {
    fn default_resolve_secs() -> f64 {
        5.0
    }
    fn default_startup_wait_secs() -> f64 {
        300.0
    }
    fn default_idle_timeout_secs() -> f64 {
        10.0
    }

    /// A cluster of the nodes `nodes` names, with every other key at its default.
    pub fn new(nodes: &str) -> Self {
        ClusterConfig {
            nodes: nodes.to_string(),
            resolve_secs: Self::default_resolve_secs(),
            ca: None,
            node_name: None,
            pins: BTreeMap::new(),
            local_slots: 0,
            startup_wait_secs: Self::default_startup_wait_secs(),
            idle_timeout_secs: Self::default_idle_timeout_secs(),
        }
    }

    /// Refuse what cannot work: a bad `nodes`, a bad duration, no way to trust nodes.
    pub fn validate(&self) -> Result<()> {
        let source: yardmaster_cluster::discovery::NodeSource = self.nodes.parse().context("[cluster] nodes")?;
        for (key, value) in [("resolve_secs", self.resolve_secs), ("idle_timeout_secs", self.idle_timeout_secs)] {
            if !(value.is_finite() && value > 0.0) {
                bail!("[cluster] {key} must be a positive number of seconds, not {value}");
            }
        }
        if !(self.startup_wait_secs.is_finite() && self.startup_wait_secs >= 0.0) {
            bail!("[cluster] startup_wait_secs must be a number of seconds, at least 0");
        }
        if self.ca.is_none() {
            match &source {
                yardmaster_cluster::discovery::NodeSource::Dns { .. } => {
                    bail!("[cluster] nodes found through DNS need `ca`: the cluster CA that signs every node's certificate (pins cannot be known in advance)")
                }
                yardmaster_cluster::discovery::NodeSource::Static(addresses) => {
                    for address in addresses {
                        if !self.pins.contains_key(&address.to_string()) {
                            bail!("[cluster] node {address} has no pin: give `ca` (the cluster CA) or `pins = {{ \"{address}\" = \"sha256:…\" }}`");
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The default admin API address: port 8003, off the ports Triton's tools expect
/// (HTTP 8000, gRPC 8001, metrics 8002).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8003";

/// The environment variable the admin token is read from when the file has none.
pub const ADMIN_TOKEN_ENV: &str = "YARDMASTER_ADMIN_TOKEN";

/// The admin API and the watched directory (`[admin]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Listen address of the admin API (TCP, HTTP/1.1).
    pub listen: SocketAddr,
    /// Bearer token every admin call must carry; without one (here or in
    /// `YARDMASTER_ADMIN_TOKEN`) the admin API does not start.
    pub token: Option<String>,
    /// A directory watched for new policy `.wasm` files to swap in.
    pub watch_dir: Option<PathBuf>,
    /// SHA-256s (hex) of the files the watched directory may swap in; empty: any.
    pub watch_sha256: Vec<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: DEFAULT_ADMIN_LISTEN.parse().expect("the default admin address parses"),
            token: None,
            watch_dir: None,
            watch_sha256: Vec::new(),
        }
    }
}

impl AdminConfig {
    /// The token: the file's, else the environment's; an empty one counts as none.
    pub fn effective_token(&self) -> Option<String> {
        self.token.clone().or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok()).filter(|t| !t.trim().is_empty())
    }

    /// Refuse a malformed allow-list.
    pub fn validate(&self) -> Result<()> {
        for sha in &self.watch_sha256 {
            if sha.len() != 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
                bail!("[admin] watch_sha256: {sha:?} is not a SHA-256 (64 hex digits)");
            }
        }
        Ok(())
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Listen address (TCP and UDP).
    pub listen: SocketAddr,
    /// Serve HTTP/1.1.
    pub http1: bool,
    /// Serve HTTP/3.
    pub http3: bool,
    /// Serve KServe v2 over gRPC.
    pub grpc: bool,
    /// Where gRPC listens; `None`: [`ServeConfig::grpc_address`]'s default.
    pub grpc_listen: Option<SocketAddr>,
    /// Pipeline preset or file.
    pub pipeline: String,
    /// Triton model repositories to serve instead of `pipeline` (none: serve `pipeline`).
    pub model_repository: Vec<PathBuf>,
    /// Whether models load and unload while serving (Triton's model control mode).
    pub model_control_mode: super::model_control::ControlMode,
    /// With model control: the models loaded at start (empty: every model).
    pub load_model: Vec<String>,
    /// Poll mode: seconds between two reads of the repository.
    pub repository_poll_secs: f64,
    /// Seconds an unloaded model's requests may drain before they fail.
    pub unload_timeout_secs: f64,
    /// Policy: shipped name or `.wasm` file.
    pub policy: String,
    /// Policy parameters.
    pub params: BTreeMap<String, String>,
    /// The policy's decision deadline, memory limit and failure mode (the `[policy]`
    /// table's `deadline_ms`, `memory_mib`, `failure`; its parameters are `params`).
    #[serde(skip)]
    pub policy_settings: PolicySettings,
    /// LLM pipelines: the time between tokens promised to latency-sensitive streams, in
    /// milliseconds (the timeline LLM goodput is measured against); `None`: the
    /// policy's `tbt_ms` parameter if given, else 100.
    pub tbt_ms: Option<f64>,
    /// Device: `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Most inference requests admitted at once (over HTTP/1.1 and HTTP/3 together);
    /// more are refused with 503.
    pub max_in_flight: usize,
    /// When a job counts as stalled.
    pub watchdog: WatchdogConfig,
    /// Trace capture file.
    pub capture: Option<PathBuf>,
    /// Where Triton's trace extension writes request traces (`None`: tracing cannot
    /// be turned on).
    pub trace_file: Option<PathBuf>,
    /// Where generated TLS material is kept.
    pub state_dir: Option<PathBuf>,
    /// Configured TLS material.
    pub tls: Option<TlsFiles>,
    /// Remote placements.
    pub remote: Vec<RemotePlacement>,
    /// The cluster: nodes found by name or list, each a host.
    pub cluster: Option<ClusterConfig>,
    /// The admin API.
    pub admin: AdminConfig,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: DEFAULT_LISTEN.parse().expect("the default address parses"),
            http1: true,
            http3: true,
            grpc: true,
            grpc_listen: None,
            pipeline: "ocr".into(),
            model_repository: Vec::new(),
            model_control_mode: super::model_control::ControlMode::None,
            load_model: Vec::new(),
            repository_poll_secs: 15.0,
            unload_timeout_secs: 30.0,
            policy: "edf".into(),
            params: BTreeMap::new(),
            policy_settings: PolicySettings::default(),
            tbt_ms: None,
            device: "auto".into(),
            max_body_bytes: super::api::DEFAULT_MAX_BODY,
            max_in_flight: super::api::DEFAULT_MAX_IN_FLIGHT,
            watchdog: WatchdogConfig::default(),
            capture: None,
            trace_file: None,
            state_dir: None,
            tls: None,
            remote: Vec::new(),
            cluster: None,
            admin: AdminConfig::default(),
        }
    }
}

/// The `[policy]` table: the policy's name, parameters and own settings.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyTable {
    name: Option<String>,
    params: Option<toml::Table>,
    deadline_ms: Option<f64>,
    memory_mib: Option<u64>,
    failure: Option<String>,
}

impl ServeConfig {
    /// Parse a configuration; relative paths in it are taken from `base` (the file's
    /// directory).
    pub fn parse(text: &str, base: &Path) -> Result<ServeConfig> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        let policy_settings = match table.remove("policy") {
            // `[policy]`: the policy's name and parameters, and its own settings.
            Some(toml::Value::Table(policy)) => {
                let policy: PolicyTable = policy.try_into().map_err(|e| anyhow::anyhow!("[policy]: {}", e.to_string().trim_end()))?;
                if let Some(name) = policy.name {
                    table.insert("policy".into(), toml::Value::String(name));
                }
                if let Some(params) = policy.params {
                    if table.contains_key("params") {
                        bail!("the policy parameters are given twice: in `params` and in [policy] params; keep one");
                    }
                    table.insert("params".into(), toml::Value::Table(params));
                }
                let failure =
                    policy.failure.map(|f| f.parse()).transpose().map_err(|e: String| anyhow::anyhow!("[policy] failure: {e}"))?;
                let settings =
                    PolicySettings { params: Vec::new(), deadline_ms: policy.deadline_ms, memory_mib: policy.memory_mib, failure };
                settings.limits(&yardmaster_policy::Limits::default()).map_err(|e| anyhow::anyhow!("[policy] {e}"))?;
                settings
            }
            Some(name) => {
                table.insert("policy".into(), name);
                PolicySettings::default()
            }
            None => PolicySettings::default(),
        };
        let mut config: ServeConfig = table.try_into().map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        config.policy_settings = policy_settings;
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(tls) = &mut config.tls {
            resolve(&mut tls.cert);
            resolve(&mut tls.key);
        }
        for remote in &mut config.remote {
            if !remote.pin.starts_with("sha256:") {
                let mut path = PathBuf::from(&remote.pin);
                resolve(&mut path);
                remote.pin = path.to_string_lossy().into_owned();
            }
        }
        if let Some(capture) = &mut config.capture {
            resolve(capture);
        }
        if let Some(trace_file) = &mut config.trace_file {
            resolve(trace_file);
        }
        if let Some(cluster) = &mut config.cluster {
            if let Some(ca) = &mut cluster.ca {
                resolve(ca);
            }
            for pin in cluster.pins.values_mut() {
                if !pin.starts_with("sha256:") {
                    let mut path = PathBuf::from(&*pin);
                    resolve(&mut path);
                    *pin = path.to_string_lossy().into_owned();
                }
            }
        }
        for dir in &mut config.model_repository {
            resolve(dir);
        }
        if let Some(dir) = &mut config.state_dir {
            resolve(dir);
        }
        if let Some(dir) = &mut config.admin.watch_dir {
            resolve(dir);
        }
        if config.pipeline.ends_with(".toml") {
            // a file, not a preset name
            let mut file = PathBuf::from(&config.pipeline);
            resolve(&mut file);
            config.pipeline = file.to_string_lossy().into_owned();
        }
        config.validate()?;
        Ok(config)
    }

    /// Read and parse a configuration file.
    pub fn load(path: &Path) -> Result<ServeConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        ServeConfig::parse(&text, base).with_context(|| format!("in {}", path.display()))
    }

    /// Refuse combinations that cannot serve.
    pub fn validate(&self) -> Result<()> {
        if !self.http1 && !self.http3 {
            bail!("both http1 and http3 are off: nothing would listen");
        }
        self.device_preference()?;
        self.admin.validate()?;
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        if let Some(grpc) = self.grpc_address() {
            if grpc.port() != 0 && grpc == self.listen && self.http1 {
                bail!("grpc_listen {grpc} is the HTTP/1.1 address: give gRPC a port of its own");
            }
            if grpc.port() != 0 && grpc == self.admin.listen && self.admin.effective_token().is_some() {
                bail!("grpc_listen {grpc} is the admin API's address: give one of them another port");
            }
        }
        if self.max_body_bytes < 1024 {
            bail!("max_body_bytes must be at least 1024 (got {})", self.max_body_bytes);
        }
        if self.max_in_flight == 0 {
            bail!("max_in_flight must be at least 1: 0 would refuse every request");
        }
        self.watchdog.validate().map_err(|e| anyhow::anyhow!(e))?;
        use super::model_control::ControlMode;
        if self.model_control_mode != ControlMode::None && self.model_repository.is_empty() {
            bail!("model_control_mode = \"{}\" needs a model repository (model_repository or --model-repository)", self.model_control_mode);
        }
        if !self.load_model.is_empty() && self.model_control_mode == ControlMode::None {
            bail!("load_model names models to load at start under model control: set model_control_mode to explicit or poll (with none, every model loads)");
        }
        if !(self.repository_poll_secs.is_finite() && self.repository_poll_secs >= 0.1) {
            bail!("repository_poll_secs must be at least 0.1 (got {})", self.repository_poll_secs);
        }
        if !(self.unload_timeout_secs.is_finite() && self.unload_timeout_secs >= 0.0) {
            bail!("unload_timeout_secs must be 0 or more (got {})", self.unload_timeout_secs);
        }
        Ok(())
    }

    /// The device to run on.
    pub fn device_preference(&self) -> Result<yardmaster_dataplane::DevicePreference> {
        self.device.parse().map_err(|e: String| anyhow::anyhow!(e))
    }

    /// The engine's options for this configuration: the policy parameters, the LLM
    /// accounting's LS time between tokens (`tbt_ms`), and no more intra-op threads per
    /// worker than this machine's cores (a cluster's nodes each state their own); the
    /// rest at their defaults.
    pub fn engine_options(&self) -> EngineOptions {
        let params = self.policy_params();
        let ls_time_between_tokens = EngineOptions::ls_time_between_tokens_from(self.tbt_ms, &params);
        let cores = yardmaster_dataplane::parallel::cores() as u32;
        let max_threads = EngineOptions::default().max_threads.min(cores);
        EngineOptions { params, ls_time_between_tokens, max_threads, ..EngineOptions::default() }
    }

    /// The policy parameters in the contract's form.
    pub fn policy_params(&self) -> Vec<Param> {
        self.params.iter().map(|(key, value)| Param { key: key.clone(), value: value.clone() }).collect()
    }

    /// Where generated state (the self-signed certificate) lives: `state_dir`, or
    /// `serve/` under the assets directory (`YARDMASTER_ASSETS`, by default
    /// `~/.cache/yardmaster`).
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        let assets = std::env::var_os("YARDMASTER_ASSETS")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/yardmaster")))
            .unwrap_or_else(|| PathBuf::from(".yardmaster"));
        assets.join("serve")
    }

    /// Where gRPC listens, when it is on: `grpc_listen`, or by default `listen`'s host
    /// on the next port (8001 beside 8000, as Triton), or a free port when `listen`'s
    /// port is 0.
    pub fn grpc_address(&self) -> Option<SocketAddr> {
        if !self.grpc {
            return None;
        }
        Some(self.grpc_listen.unwrap_or_else(|| {
            let mut address = self.listen;
            address.set_port(if address.port() == 0 { 0 } else { address.port().saturating_add(1) });
            address
        }))
    }

    /// The listener settings.
    pub fn listen_options(&self) -> ListenOptions {
        let tls = match &self.tls {
            Some(files) => TlsSource::Files { cert: files.cert.clone(), key: files.key.clone() },
            None => TlsSource::SelfSigned(self.state_dir().join("tls")),
        };
        ListenOptions { address: self.listen, http1: self.http1, http3: self.http3, tls, grpc: self.grpc_address() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_default() {
        assert_eq!(ServeConfig::parse("", Path::new("/etc")).unwrap(), ServeConfig::default());
    }

    #[test]
    fn relative_paths_are_taken_from_the_file() {
        let config = ServeConfig::parse(
            "pipeline = \"p.toml\"\ncapture = \"t.jsonl\"\n[tls]\ncert = \"c.pem\"\nkey = \"/abs/k.pem\"\n",
            Path::new("/srv/ym"),
        )
        .unwrap();
        assert_eq!(config.pipeline, "/srv/ym/p.toml");
        assert_eq!(config.capture.as_deref(), Some(Path::new("/srv/ym/t.jsonl")));
        let tls = config.tls.unwrap();
        assert_eq!(tls.cert, PathBuf::from("/srv/ym/c.pem"));
        assert_eq!(tls.key, PathBuf::from("/abs/k.pem"));
    }

    #[test]
    fn misspelt_keys_and_impossible_settings_are_refused() {
        let error = ServeConfig::parse("polcy = \"edf\"", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("polcy"), "{error:#}");
        let error = ServeConfig::parse("http1 = false\nhttp3 = false", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("nothing would listen"), "{error:#}");
        let error = ServeConfig::parse("listen = \"nowhere\"", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("listen") || format!("{error:#}").contains("address"), "{error:#}");
    }

    #[test]
    fn grpc_listens_beside_http_by_default_and_refuses_a_taken_address() {
        let default = ServeConfig::parse("", Path::new(".")).unwrap();
        assert_eq!(default.grpc_address(), Some("127.0.0.1:8001".parse().unwrap()));
        let free = ServeConfig::parse("listen = \"127.0.0.1:0\"", Path::new(".")).unwrap();
        assert_eq!(free.grpc_address(), Some("127.0.0.1:0".parse().unwrap()));
        let moved = ServeConfig::parse("listen = \"0.0.0.0:9000\"\ngrpc_listen = \"0.0.0.0:9500\"", Path::new(".")).unwrap();
        assert_eq!(moved.grpc_address(), Some("0.0.0.0:9500".parse().unwrap()));
        assert_eq!(ServeConfig::parse("grpc = false", Path::new(".")).unwrap().grpc_address(), None);
        let error = ServeConfig::parse("grpc_listen = \"127.0.0.1:8000\"", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("a port of its own"), "{error:#}");
    }

    #[test]
    fn the_admin_section_parses_and_checks_its_allow_list() {
        let config =
            ServeConfig::parse("[admin]\nlisten = \"127.0.0.1:9001\"\ntoken = \"s3cret\"\nwatch_dir = \"drop\"\n", Path::new("/srv/ym"))
                .unwrap();
        assert_eq!(config.admin.listen, "127.0.0.1:9001".parse().unwrap());
        assert_eq!(config.admin.effective_token().as_deref(), Some("s3cret"));
        assert_eq!(config.admin.watch_dir.as_deref(), Some(Path::new("/srv/ym/drop")));
        let error = ServeConfig::parse("[admin]\nwatch_sha256 = [\"abc\"]\n", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("not a SHA-256"), "{error:#}");
        let error = ServeConfig::parse("[admin]\ntokn = \"x\"\n", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("tokn"), "{error:#}");
    }

    #[test]
    fn a_policy_table_gives_the_name_parameters_and_settings() {
        let text = "[policy]\nname = \"fifo\"\nparams = { slack = \"2\" }\ndeadline_ms = 20\nmemory_mib = 32\nfailure = \"reload\"\n";
        let config = ServeConfig::parse(text, Path::new(".")).unwrap();
        assert_eq!((config.policy.as_str(), config.params["slack"].as_str()), ("fifo", "2"));
        let settings = &config.policy_settings;
        assert_eq!((settings.deadline_ms, settings.memory_mib), (Some(20.0), Some(32)));
        assert_eq!(settings.failure, Some(yardmaster_policy::FailureMode::Reload));
        assert_eq!(ServeConfig::parse("policy = \"fifo\"", Path::new(".")).unwrap().policy_settings, PolicySettings::default());
        for (text, says) in [
            ("[policy]\nfailure = \"panic\"", "unknown failure mode"),
            ("[policy]\ndeadline_ms = 0", "above 0"),
            ("[policy]\nspeed = 1", "unknown field"),
            ("params = { a = \"1\" }\n[policy]\nparams = { b = \"2\" }", "given twice"),
        ] {
            let error = ServeConfig::parse(text, Path::new(".")).unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn the_watchdog_and_admission_cap_parse_and_are_checked() {
        let config = ServeConfig::parse(
            "max_in_flight = 64
[watchdog]
multiple = 4.0
min_ms = 250
",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(config.max_in_flight, 64);
        assert_eq!(config.watchdog, WatchdogConfig { enabled: true, multiple: 4.0, min_ms: 250 });
        let error = ServeConfig::parse("max_in_flight = 0", Path::new(".")).unwrap_err();
        assert!(format!("{error:#}").contains("max_in_flight"), "{error:#}");
        let error = ServeConfig::parse(
            "[watchdog]
multiple = 0.5
",
            Path::new("."),
        )
        .unwrap_err();
        assert!(format!("{error:#}").contains("multiple"), "{error:#}");
        let error = ServeConfig::parse(
            "[watchdog]
min = 5
",
            Path::new("."),
        )
        .unwrap_err();
        assert!(format!("{error:#}").contains("min"), "{error:#}");
    }

    #[test]
    fn the_ls_time_between_tokens_comes_from_tbt_ms_then_the_policy_parameter_then_100() {
        let tbt = |text: &str| ServeConfig::parse(text, Path::new(".")).unwrap().engine_options().ls_time_between_tokens;
        assert_eq!(tbt(""), 100_000_000);
        assert_eq!(tbt("params = { tbt_ms = \"40\" }"), 40_000_000);
        assert_eq!(tbt("tbt_ms = 25\nparams = { tbt_ms = \"40\" }"), 25_000_000);
        assert_eq!(ServeConfig::parse("tbt_ms = 25", Path::new(".")).unwrap().engine_options().params.len(), 0);
    }

    #[test]
    fn params_become_policy_params() {
        let config = ServeConfig::parse("params = { lambda = \"0.5\", mode = \"x\" }", Path::new(".")).unwrap();
        let params = config.policy_params();
        assert_eq!(params.len(), 2);
        assert_eq!((params[0].key.as_str(), params[0].value.as_str()), ("lambda", "0.5"));
    }
}
