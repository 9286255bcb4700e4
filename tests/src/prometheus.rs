//! A real Prometheus on loopback, and the scrape targets the metrics tests give it: engine
//! processes and fixed expositions.
//!
//! [`Prometheus::start`] runs `prometheus` (built by `scripts/build-prometheus.sh`) with a
//! generated config: one job whose targets come from a file (rewritten while it runs, as
//! Kubernetes pods come and go) and whose relabelling is exactly that of a Kubernetes pod
//! scrape ([`KUBERNETES_RELABELING`]): each target carries the `__meta_kubernetes_*` labels
//! Kubernetes service discovery would give its pod, and the rules turn them into `namespace`,
//! `inferenceservice` and `pod`. State lives in a temporary directory; the process runs under
//! the harness's watchdog, so it dies with the test process however that ends.

use crate::control_plane::{WATCHDOG, free_port};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// The Prometheus version `scripts/build-prometheus.sh` builds.
pub const PROMETHEUS_VERSION: &str = "3.16.0";

/// The relabelling of a Kubernetes pod scrape of engine pods: keep pods labelled
/// `serving.pacer.dev/inferenceservice`, and set `inferenceservice`, `namespace` and `pod`
/// from the pod's label, namespace and name (`docs/metrics.md`).
pub const KUBERNETES_RELABELING: &str = r#"    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_label_serving_pacer_dev_inferenceservice]
        regex: .+
        action: keep
      - source_labels: [__meta_kubernetes_pod_label_serving_pacer_dev_inferenceservice]
        target_label: inferenceservice
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
"#;

/// The directory of `prometheus` and `promtool`: `PACER_PROMETHEUS_BIN`, else where
/// `scripts/build-prometheus.sh` puts them.
pub fn prometheus_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PACER_PROMETHEUS_BIN") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("PACER_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"))
            .join("pacer")
    });
    cache.join("bin").join(format!("prometheus-{PROMETHEUS_VERSION}"))
}

/// One scrape target as Kubernetes would discover an engine pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// `host:port` of its `/metrics`.
    pub address: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's `serving.pacer.dev/inferenceservice` label.
    pub inferenceservice: String,
    /// The pod's name.
    pub pod: String,
}

impl ScrapeTarget {
    /// A target at `address` for pod `pod` of InferenceService `namespace/inferenceservice`.
    pub fn new(address: &str, namespace: &str, inferenceservice: &str, pod: &str) -> ScrapeTarget {
        ScrapeTarget {
            address: address.into(),
            namespace: namespace.into(),
            inferenceservice: inferenceservice.into(),
            pod: pod.into(),
        }
    }
}

/// One series of an instant query's answer: its labels and value.
pub type Series = (BTreeMap<String, String>, f64);

/// A running Prometheus. Dropping it stops the process and removes its state.
pub struct Prometheus {
    child: Option<Child>,
    dir: TempDir,
    http: reqwest::Client,
    /// Base URL of its HTTP API.
    pub url: String,
    /// The scrape interval of its one job.
    pub scrape_interval: Duration,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` every `scrape_interval` (whole seconds, ≥ 1 s) and
    /// waits until it is ready.
    pub async fn start(scrape_interval: Duration, targets: &[ScrapeTarget]) -> Prometheus {
        Prometheus::start_with_jobs(scrape_interval, targets, "").await
    }

    /// As [`Prometheus::start`], with more scrape jobs after the engine job (`extra_jobs`:
    /// YAML list items of `scrape_configs`, indented by two spaces).
    pub async fn start_with_jobs(
        scrape_interval: Duration,
        targets: &[ScrapeTarget],
        extra_jobs: &str,
    ) -> Prometheus {
        let dir = tempfile::Builder::new().prefix("pacer-prometheus-").tempdir().expect("temp dir");
        let interval = format!("{}s", scrape_interval.as_secs().max(1));
        let targets_file = dir.path().join("targets.json");
        let config = format!(
            r#"global:
  scrape_interval: {interval}
  scrape_timeout: {interval}
  evaluation_interval: {interval}
scrape_configs:
  - job_name: pacer-engines
    metrics_path: /metrics
    file_sd_configs:
      - files: ["{}"]
        refresh_interval: 1s
{KUBERNETES_RELABELING}{extra_jobs}"#,
            targets_file.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("prometheus.yml");
        let prometheus = Prometheus::launch(dir, scrape_interval);
        prometheus.set_targets(targets);
        prometheus.started().await
    }

    /// Starts Prometheus with the project's own configuration, `config/prometheus/prometheus.yaml`
    /// (its Kubernetes service discovery, relabelling, recording rules and alerts), discovering
    /// pods through the API server of `kubeconfig`, with scrapes and rule evaluations every
    /// `interval` instead of the file's production cadence. `extra_relabeling` (YAML of one
    /// rule, e.g. [`crate::POD_NETWORK_RELABELING`]) is appended to every job's rules.
    pub async fn start_kubernetes(
        interval: Duration,
        kubeconfig: &Path,
        extra_relabeling: Option<&str>,
    ) -> Prometheus {
        let dir = tempfile::Builder::new().prefix("pacer-prometheus-").tempdir().expect("temp dir");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/prometheus");
        let text = std::fs::read_to_string(source.join("prometheus.yaml"))
            .expect("config/prometheus/prometheus.yaml");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("prometheus.yaml");
        let every = serde_yaml::Value::from(format!("{}s", interval.as_secs().max(1)));
        config["global"]["scrape_interval"] = every.clone();
        config["global"]["scrape_timeout"] = every.clone();
        config["global"]["evaluation_interval"] = every;
        for rules in config["rule_files"].as_sequence_mut().into_iter().flatten() {
            let name = rules.as_str().expect("a rule file").to_string();
            std::fs::copy(source.join(&name), dir.path().join(&name)).expect("rule file");
        }
        for job in config["scrape_configs"].as_sequence_mut().into_iter().flatten() {
            for sd in job["kubernetes_sd_configs"].as_sequence_mut().into_iter().flatten() {
                sd["kubeconfig_file"] = serde_yaml::Value::from(kubeconfig.display().to_string());
            }
            if let Some(rule) = extra_relabeling {
                let rule: serde_yaml::Value = serde_yaml::from_str(rule).expect("relabelling rule");
                job["relabel_configs"].as_sequence_mut().expect("relabel_configs").push(rule);
            }
        }
        let config = serde_yaml::to_string(&config).expect("yaml");
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("prometheus.yml");
        Prometheus::launch(dir, interval).started().await
    }

    fn launch(dir: TempDir, scrape_interval: Duration) -> Prometheus {
        let bin = prometheus_bin_dir().join("prometheus");
        assert!(bin.exists(), "no {}: run scripts/build-prometheus.sh (scripts/test.sh does)", bin.display());
        let port = free_port();
        let mut prometheus = Prometheus {
            child: None,
            http: reqwest::Client::new(),
            url: format!("http://127.0.0.1:{port}"),
            scrape_interval: Duration::from_secs(scrape_interval.as_secs().max(1)),
            dir,
        };
        let log = std::fs::File::create(prometheus.log_path()).expect("log file");
        let err = log.try_clone().expect("log file");
        let args = [
            format!("--config.file={}", prometheus.dir.path().join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", prometheus.dir.path().join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".to_string(),
        ];
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(&bin)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        prometheus.child = Some(child);
        prometheus
    }

    async fn started(mut self) -> Prometheus {
        self.wait_ready().await;
        self
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("prometheus.log")
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("prometheus exited ({status}) while starting:\n{}", self.log_tail(40));
            }
            let ready = self.http.get(format!("{}/-/ready", self.url)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(Instant::now() < deadline, "prometheus not ready:\n{}", self.log_tail(40));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Replaces the scrape targets (file service discovery picks the change up within a
    /// second, as it would a pod added or deleted).
    pub fn set_targets(&self, targets: &[ScrapeTarget]) {
        let groups: Vec<serde_json::Value> = targets
            .iter()
            .map(|t| {
                serde_json::json!({
                    "targets": [t.address],
                    "labels": {
                        "__meta_kubernetes_namespace": t.namespace,
                        "__meta_kubernetes_pod_name": t.pod,
                        "__meta_kubernetes_pod_label_serving_pacer_dev_inferenceservice": t.inferenceservice,
                    }
                })
            })
            .collect();
        // Write then rename, so Prometheus never reads a half-written file.
        let tmp = self.dir.path().join("targets.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&groups).expect("json")).expect("targets");
        std::fs::rename(&tmp, self.dir.path().join("targets.json")).expect("targets");
    }

    /// Waits until exactly `up` active targets report `health: up`, or panics after `secs`.
    pub async fn wait_targets_up(&self, up: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut last = serde_json::Value::Null;
        loop {
            if let Ok(body) = self.api("/api/v1/targets?state=active").await {
                let healthy = body["data"]["activeTargets"]
                    .as_array()
                    .map_or(0, |ts| ts.iter().filter(|t| t["health"] == "up").count());
                if healthy == up {
                    return;
                }
                last = body;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {secs}s waiting for {up} targets up; last answer: {last}\n{}",
                self.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn api(&self, path_and_query: &str) -> Result<serde_json::Value, String> {
        let response =
            self.http.get(format!("{}{path_and_query}", self.url)).send().await.map_err(|e| e.to_string())?;
        response.json().await.map_err(|e| e.to_string())
    }

    /// The raw answer (`data`) of an instant query, evaluated at `at` (unix seconds) or now.
    pub async fn query_data(&self, promql: &str, at: Option<f64>) -> serde_json::Value {
        let mut params = vec![("query", promql.to_string())];
        if let Some(at) = at {
            params.push(("time", format!("{at:.3}")));
        }
        let response = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&params)
            .send()
            .await
            .unwrap_or_else(|e| panic!("query {promql}: {e}"));
        let body: serde_json::Value = response.json().await.unwrap_or_else(|e| panic!("query {promql}: {e}"));
        assert_eq!(body["status"], "success", "query {promql}: {body}");
        body["data"].clone()
    }

    /// An instant query's series (an instant vector), evaluated at `at` (unix seconds) or now.
    pub async fn query(&self, promql: &str, at: Option<f64>) -> Vec<Series> {
        let data = self.query_data(promql, at).await;
        assert_eq!(data["resultType"], "vector", "query {promql}: {data}");
        data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|series| {
                let labels = series["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                (labels, parse_sample_value(&series["value"][1]))
            })
            .collect()
    }

    /// The value of an instant query answering one series (`None` when it answers none).
    pub async fn query_one(&self, promql: &str, at: Option<f64>) -> Option<f64> {
        let series = self.query(promql, at).await;
        assert!(series.len() <= 1, "query {promql} answered {} series", series.len());
        series.first().map(|(_, v)| *v)
    }

    /// Stops the process (through its watchdog) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// The state directory (config, targets file, TSDB, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A sample value as the HTTP API writes it: a string, `NaN` and `±Inf` included.
fn parse_sample_value(value: &serde_json::Value) -> f64 {
    match value.as_str() {
        Some("NaN") => f64::NAN,
        Some("+Inf") => f64::INFINITY,
        Some("-Inf") => f64::NEG_INFINITY,
        Some(text) => text.parse().unwrap_or(f64::NAN),
        None => f64::NAN,
    }
}

/// A `/metrics` endpoint on loopback serving a fixed text exposition (a recorded engine's),
/// which the test can replace between scrapes. Stops when dropped.
pub struct StaticMetrics {
    body: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
    /// `host:port` to scrape.
    pub address: String,
}

impl StaticMetrics {
    /// Serves `body` as `text/plain; version=0.0.4` on a free loopback port.
    pub async fn start(body: impl Into<String>) -> StaticMetrics {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let body = Arc::new(Mutex::new(body.into()));
        let served = body.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let text = served.lock().map(|b| b.clone()).unwrap_or_default();
                tokio::spawn(answer(stream, text));
            }
        });
        StaticMetrics { body, task, address }
    }

    /// Replaces the exposition served from the next scrape on.
    pub fn set(&self, body: impl Into<String>) {
        if let Ok(mut b) = self.body.lock() {
            *b = body.into();
        }
    }
}

impl Drop for StaticMetrics {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one HTTP request's head and answers with `body`, closing the connection.
async fn answer(mut stream: tokio::net::TcpStream, body: String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The `pacer-engine` binary: `PACER_ENGINE_BIN`, else the one cargo built next to the running
/// test binary (`cargo test --workspace` builds it; so does `cargo build -p pacer-engine`).
pub fn engine_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PACER_ENGINE_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> → target/<profile>/pacer-engine
    let profile_dir = exe.parent().and_then(Path::parent).expect("target directory");
    profile_dir.join("pacer-engine")
}

/// A `pacer-engine serve` process on a free loopback port, stopped when dropped (or when the
/// test process exits, through the watchdog).
pub struct EngineProcess {
    child: Option<Child>,
    log: PathBuf,
    /// `host:port` it serves on (`/v1/...`, `/metrics`).
    pub address: String,
}

impl EngineProcess {
    /// Starts `pacer-engine serve` (model from `PACER_MODEL`, else the engine's default) with
    /// one compute thread and `extra` flags, logging to `log_dir`, and waits until `/ready`.
    pub async fn start(name: &str, extra: &[&str], log_dir: &Path) -> EngineProcess {
        let bin = engine_bin();
        assert!(
            bin.exists(),
            "no {}: build it with `cargo build --release -p pacer-engine` or set PACER_ENGINE_BIN",
            bin.display()
        );
        let port = free_port();
        let log = log_dir.join(format!("engine-{name}.log"));
        let out = std::fs::File::create(&log).expect("engine log");
        let err = out.try_clone().expect("engine log");
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(&bin)
            .args(["serve", "--host=127.0.0.1", "--threads=1"])
            .arg(format!("--port={port}"))
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut engine = EngineProcess { child: Some(child), log, address: format!("127.0.0.1:{port}") };
        engine.wait_ready().await;
        engine
    }

    async fn wait_ready(&mut self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("pacer-engine exited ({status}) while starting:\n{}", self.log_text());
            }
            let ready = http.get(format!("http://{}/ready", self.address)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(Instant::now() < deadline, "pacer-engine not ready:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its base URL, `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Its `/metrics` text now.
    pub async fn metrics(&self) -> String {
        let response = reqwest::get(format!("{}/metrics", self.url())).await.expect("GET /metrics");
        response.text().await.expect("metrics body")
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}
