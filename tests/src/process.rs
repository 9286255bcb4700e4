//! A `pacer-operator run` process against a test cluster, stopped when dropped (or when the
//! test process exits, through the same watchdog as the control plane).

use crate::control_plane::{WATCHDOG, free_port};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running operator process.
pub struct OperatorProcess {
    child: Option<Child>,
    /// Its `/metrics` base URL.
    pub metrics_url: String,
    /// Its log file.
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts `bin run` with `kubeconfig`, watching `namespace`, electing a leader on the Lease
    /// `pacer-operator` in that namespace as `identity`.
    pub fn start(
        bin: &Path,
        kubeconfig: &Path,
        namespace: &str,
        identity: &str,
        log_dir: &Path,
    ) -> OperatorProcess {
        OperatorProcess::start_with(bin, kubeconfig, namespace, identity, log_dir, &[])
    }

    /// [`OperatorProcess::start`] with `extra` flags for `run` (e.g. `--prometheus-url=...`).
    pub fn start_with(
        bin: &Path,
        kubeconfig: &Path,
        namespace: &str,
        identity: &str,
        log_dir: &Path,
        extra: &[String],
    ) -> OperatorProcess {
        OperatorProcess::launch(bin, kubeconfig, Some(namespace), namespace, identity, log_dir, extra)
    }

    /// Starts `bin run` in cluster mode (every namespace, narrowed only by `extra` flags such as
    /// `--namespace-selector`), electing a leader in `lease_namespace` as `identity`.
    pub fn start_cluster_wide(
        bin: &Path,
        kubeconfig: &Path,
        lease_namespace: &str,
        identity: &str,
        log_dir: &Path,
        extra: &[String],
    ) -> OperatorProcess {
        OperatorProcess::launch(bin, kubeconfig, None, lease_namespace, identity, log_dir, extra)
    }

    fn launch(
        bin: &Path,
        kubeconfig: &Path,
        watch: Option<&str>,
        namespace: &str,
        identity: &str,
        log_dir: &Path,
        extra: &[String],
    ) -> OperatorProcess {
        let port = free_port();
        let log = log_dir.join(format!("operator-{namespace}-{identity}.log"));
        let out = std::fs::File::create(&log).expect("operator log");
        let err = out.try_clone().expect("operator log");
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(bin)
            .args(["--log-format=json", "run"])
            .args(watch.map(|ns| format!("--namespace={ns}")))
            .arg(format!("--lease-namespace={namespace}"))
            .arg(format!("--identity={identity}"))
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            // The production default: a renewal may take up to 10 s before the leader steps
            // down, so a loaded test machine does not cost a test its leader. A test that wants
            // a shorter Lease passes its own `--lease-duration`.
            .args((!extra.iter().any(|a| a.starts_with("--lease-duration"))).then_some("--lease-duration=15"))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("PACER_OPERATOR_LOG").unwrap_or_else(|_| "info,pacer_operator=debug".into()),
            )
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting pacer-operator");
        OperatorProcess { child: Some(child), metrics_url: format!("http://127.0.0.1:{port}/metrics"), log }
    }

    /// Stops the process with SIGTERM (through its watchdog) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// The value of one un-labelled metric, or the sum over the label set matching `labels`
    /// (`None` when the endpoint cannot be read).
    pub async fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        let text = http_get(&self.metrics_url).await?;
        Some(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter(|l| {
                    l.starts_with(name)
                        && (l[name.len()..].starts_with(' ') || l[name.len()..].starts_with('{'))
                })
                .filter(|l| l.contains(labels))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// The operator's own process id (the child of its watchdog shell).
    pub fn pid(&self) -> u32 {
        let Some(child) = &self.child else { return 0 };
        let shell = child.id();
        std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
            .unwrap_or(shell)
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        // A failing test shows what the operator last said (the harness prints a failed test's
        // stderr), so a timeout can be told from a crash or a lost Lease without the log file.
        if std::thread::panicking() {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            eprintln!("--- the last {} lines of {} ---\n{}", tail.len(), self.log.display(), tail.join("\n"));
        }
        self.stop();
    }
}

/// Lines of an operator's log shown when a test fails.
const LOG_TAIL: usize = 40;

/// A plain HTTP/1.1 GET on loopback (the metrics endpoint), without an HTTP client dependency.
async fn http_get(url: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}")))?;
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    let (head, body) = body.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}
