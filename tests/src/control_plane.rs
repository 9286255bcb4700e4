//! Starting and stopping the control plane's processes, and the kubeconfigs to reach it.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Which components run besides etcd and kube-apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workloads {
    /// API only: CRDs, validation, server-side apply, status, garbage collection needs `Pods`.
    ApiOnly,
    /// Also kube-controller-manager (Deployments → ReplicaSets → Pods, garbage collection),
    /// kube-scheduler and kwok with fake nodes, so pods get scheduled and turn Ready.
    Pods {
        /// How many fake nodes to create.
        nodes: usize,
    },
}

/// A running control plane. Dropping it stops every process and removes its state.
pub struct Cluster {
    /// Removes the state directory on drop, unless `PACER_KEEP_CLUSTER` is set.
    _cleanup: Option<TempDir>,
    root: PathBuf,
    processes: Vec<(String, Child)>,
    /// The API server's URL.
    pub server: String,
    /// Which components run.
    pub workloads: Workloads,
}

/// Runs `"$@"` and kills it when this shell's stdin (a pipe from the test process) reaches EOF:
/// the kernel closes that pipe whenever the test process ends, however it ends.
pub(crate) const WATCHDOG: &str = r#"
exec 3<&0
"$@" </dev/null &
child=$!
( cat <&3 >/dev/null; kill -TERM "$child" 2>/dev/null; sleep 3; kill -KILL "$child" 2>/dev/null ) &
wait "$child"
"#;

/// Static tokens: user, token, groups. The operator's identity has no groups: only the RBAC
/// that the tests install from `config/rbac/`.
const USERS: &[(&str, &str, &str)] = &[
    ("admin", "admin-token", "system:masters"),
    ("pacer-operator", "operator-token", ""),
    ("system:kube-controller-manager", "kcm-token", "system:masters"),
    ("system:kube-scheduler", "scheduler-token", "system:masters"),
    ("kwok", "kwok-token", "system:masters"),
];

/// The directory of the cluster binaries: `PACER_CLUSTER_BIN`, else the set that
/// `scripts/build-cluster-bins.sh` builds for `PACER_KUBERNETES_VERSION` (default 1.37.2).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PACER_CLUSTER_BIN") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("PACER_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"))
            .join("pacer")
    });
    let version = std::env::var("PACER_KUBERNETES_VERSION").unwrap_or_else(|_| "1.37.2".into());
    cache.join("bin").join(format!("cluster-{version}"))
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Cluster {
    /// Starts a control plane and waits until the API server is ready (and, with pods, until
    /// the fake nodes are Ready).
    pub async fn start(workloads: Workloads) -> Cluster {
        let bins = bin_dir();
        assert!(
            bins.join("kube-apiserver").exists(),
            "no cluster binaries in {}: run scripts/build-cluster-bins.sh (scripts/test.sh does)",
            bins.display()
        );
        let dir = tempfile::Builder::new().prefix("pacer-cluster-").tempdir().expect("temp dir");
        let root = dir.path().to_path_buf();
        // PACER_KEEP_CLUSTER=1 keeps the state and logs for a post-mortem.
        let cleanup = if std::env::var_os("PACER_KEEP_CLUSTER").is_some() {
            eprintln!("pacer-tests: keeping the cluster state in {}", dir.keep().display());
            None
        } else {
            Some(dir)
        };
        let mut cluster = Cluster {
            server: String::new(),
            processes: Vec::new(),
            workloads,
            _cleanup: cleanup,
            root: root.clone(),
        };
        let path = |name: &str| root.join(name);

        let tokens: String = USERS
            .iter()
            .map(|(user, token, groups)| format!("{token},{user},{user},\"{groups}\"\n"))
            .collect();
        std::fs::write(path("tokens.csv"), tokens).expect("tokens");
        let status = Command::new("openssl")
            .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
            .arg(path("sa.key"))
            .stderr(Stdio::null())
            .status()
            .expect("openssl (for the service-account signing key)");
        assert!(status.success(), "openssl genpkey failed");

        let etcd_client = free_port();
        let etcd_peer = free_port();
        let etcd_args = vec![
            format!("--data-dir={}", path("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
            // Test state is thrown away: skip fsync, the slowest part of etcd on a shared disk.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        cluster.spawn("etcd", &bins.join("etcd"), &etcd_args);

        let port = free_port();
        cluster.server = format!("https://127.0.0.1:{port}");
        let sa_key = path("sa.key").display().to_string();
        let apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            format!("--cert-dir={}", path("certs").display()),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // The kubernetes Service endpoints cannot point at loopback; nothing needs them here.
            "--endpoint-reconciler-type=none".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", path("tokens.csv").display()),
            format!("--service-account-key-file={sa_key}"),
            format!("--service-account-signing-key-file={sa_key}"),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--allow-privileged=true".into(),
            // Image volumes (a model source) are beta in 1.34 and off there by default.
            "--feature-gates=ImageVolume=true".into(),
            "--v=0".into(),
        ];
        cluster.spawn("kube-apiserver", &bins.join("kube-apiserver"), &apiserver_args);
        cluster.write_kubeconfigs();
        cluster.wait_ready().await;

        if let Workloads::Pods { nodes } = workloads {
            let ca = path("certs").join("apiserver.crt").display().to_string();
            let kcm_args = vec![
                format!("--kubeconfig={}", cluster.kubeconfig("kcm-token").display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                format!("--cert-dir={}", path("kcm-certs").display()),
                format!("--service-account-private-key-file={sa_key}"),
                format!("--root-ca-file={ca}"),
                "--use-service-account-credentials=false".into(),
                // Fake nodes have no heartbeat to lose: no lifecycle controller to evict them,
                // and the apiserver's self-signed certificate is no CA to publish as a trust bundle.
                "--controllers=*,-node-lifecycle-controller,-node-ipam-controller,-kube-apiserver-serving-clustertrustbundle-publisher-controller".into(),
                "--concurrent-gc-syncs=5".into(),
            ];
            cluster.spawn("kube-controller-manager", &bins.join("kube-controller-manager"), &kcm_args);
            let scheduler_args = vec![
                format!("--kubeconfig={}", cluster.kubeconfig("scheduler-token").display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                format!("--cert-dir={}", path("scheduler-certs").display()),
            ];
            cluster.spawn("kube-scheduler", &bins.join("kube-scheduler"), &scheduler_args);
            let kwok_args = vec![
                format!("--kubeconfig={}", cluster.kubeconfig("kwok-token").display()),
                format!("--config={}", path("kwok.yaml").display()),
                "--manage-all-nodes=false".into(),
                format!("--manage-nodes-with-annotation-selector={}=fake", crate::kwok::NODE_ANNOTATION),
                "--node-ip=10.244.0.1".into(),
                "--cidr=10.244.0.0/16".into(),
                format!("--server-address=127.0.0.1:{}", free_port()),
            ];
            std::fs::write(path("kwok.yaml"), crate::kwok::CONFIG).expect("kwok config");
            cluster.spawn("kwok", &bins.join("kwok"), &kwok_args);
            crate::kwok::create_nodes(&cluster.admin().await, nodes).await;
        }
        cluster
    }

    fn spawn(&mut self, name: &str, bin: &Path, args: &[String]) {
        let log = std::fs::File::create(self.root.as_path().join(format!("{name}.log"))).expect("log file");
        let err = log.try_clone().expect("log file");
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        self.processes.push((name.to_string(), child));
    }

    /// A component's error lines (klog `E`/`F`) and its last lines, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.root.as_path().join(format!("{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let errors: Vec<&str> =
            all.iter().copied().filter(|l| l.starts_with('E') || l.starts_with('F')).take(20).collect();
        format!(
            "errors:\n{}\nlast lines:\n{}",
            errors.join("\n"),
            all[all.len().saturating_sub(lines)..].join("\n")
        )
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some((name, status)) = self.exited() {
                panic!("{name} exited ({status}) while starting:\n{}", self.log_tail(&name, 40));
            }
            if self.root.as_path().join("certs/apiserver.crt").exists()
                && let Ok(client) = self.try_client("admin-token").await
                && let Ok(text) = client
                    .request_text(http::Request::get("/readyz").body(Vec::new()).expect("request"))
                    .await
                && text.trim() == "ok"
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready:\n{}",
                self.log_tail("kube-apiserver", 40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn exited(&mut self) -> Option<(String, String)> {
        self.processes.iter_mut().find_map(|(name, child)| match child.try_wait() {
            Ok(Some(status)) => Some((name.clone(), status.to_string())),
            _ => None,
        })
    }

    /// The kubeconfig of one of the static tokens (written at start).
    pub fn kubeconfig(&self, token: &str) -> PathBuf {
        self.root.join(format!("{token}.kubeconfig"))
    }

    fn write_kubeconfigs(&self) {
        for (_, token, _) in USERS {
            self.write_kubeconfig(token);
        }
    }

    fn write_kubeconfig(&self, token: &str) {
        let path = self.kubeconfig(token);
        let ca = self.root.as_path().join("certs").join("apiserver.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: pacer-test\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: {token}\n  user:\n    token: {token}\n\
             contexts:\n- name: pacer-test\n  context:\n    cluster: pacer-test\n    user: {token}\n\
             current-context: pacer-test\n",
            self.server,
            ca.display()
        );
        std::fs::write(&path, text).expect("kubeconfig");
    }

    /// The API server's CA certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.root.as_path().join("certs").join("apiserver.crt")
    }

    /// The admin kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.kubeconfig("admin-token")
    }

    /// The operator's kubeconfig: the `pacer-operator` user, bound to nothing until a test
    /// installs the operator's ClusterRole and binding.
    pub fn operator_kubeconfig(&self) -> PathBuf {
        self.kubeconfig("operator-token")
    }

    async fn try_client(&self, token: &str) -> Result<Client, String> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig(token)).map_err(|e| e.to_string())?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
    }

    /// The admin's client configuration, for a test that changes it (a proxy in between, a
    /// timeout).
    pub async fn admin_config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig("admin-token")).expect("admin kubeconfig");
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("admin config")
    }

    /// A client with the admin identity (create one per test: a client belongs to the tokio
    /// runtime it was made on).
    pub async fn admin(&self) -> Client {
        self.try_client("admin-token").await.expect("admin client")
    }

    /// A client with the operator's identity.
    pub async fn operator_client(&self) -> Client {
        self.try_client("operator-token").await.expect("operator client")
    }

    /// The state directory (logs of every component are there).
    pub fn dir(&self) -> &Path {
        self.root.as_path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Closing a watchdog's stdin stops its process; stop in reverse start order.
        for (_, mut child) in self.processes.drain(..).rev() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}
