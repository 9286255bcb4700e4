//! A test node agent: makes the pods bound to one Node real without a container runtime, by
//! running their container's binary as a local process. **For tests and local development
//! only** — it has no isolation, no image pulls, no resource limits and no cgroups.
//!
//! What it does, in the kubelet's place:
//! - registers its Node (Ready, with capacity) and serves the pods the scheduler binds to it;
//! - gives each pod an address of its own, as a pod network would: the process listens on a
//!   loopback address `127.0.x.y` (the container's `0.0.0.0` binds are rewritten to it), and
//!   the pod's status says `10.99.x.y`, because the API server will not put a loopback address
//!   in an EndpointSlice. Whoever connects to a pod maps the one to the other
//!   ([`loopback_of`]; Prometheus with [`POD_NETWORK_RELABELING`]) — the one liberty this
//!   test network takes;
//! - maps the image to a binary (by name, e.g. `pacer-engine` → the built engine) and runs it
//!   with the container's args and env (values and the downward API's name, namespace, pod IP
//!   and node name), the volume mount paths rewritten to per-pod host directories:
//!   ConfigMaps are materialized and follow updates with the kubelet's atomic `..data` symlink
//!   swap, emptyDirs are directories, PVCs map to host directories given to the agent, and the
//!   pod's ServiceAccount gets a token (a TokenRequest) in a kubeconfig named by `KUBECONFIG`;
//! - runs the startup, readiness and liveness HTTP probes and reports phase, pod IP, readiness
//!   and restarts in the pod's status; a container that exits or fails liveness is restarted
//!   (`restartCount` goes up, the pod is unready meanwhile);
//! - on delete: the preStop sleep, then SIGTERM, then SIGKILL when
//!   `terminationGracePeriodSeconds` runs out, then the pod's final removal.

mod pod;

use crate::control_plane::WATCHDOG;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, Probe, ServiceAccount};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use pod::{plan, probe, report, start, sync_config_maps, terminate};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the agent needs to know about the machine.
#[derive(Clone)]
pub struct AgentConfig {
    /// The Node's name.
    pub node: String,
    /// Image name fragment → binary: the first whose fragment the image contains runs it.
    pub binaries: Vec<(String, PathBuf)>,
    /// PersistentVolumeClaim name → the host directory that backs it.
    pub claims: BTreeMap<String, PathBuf>,
    /// The API server's URL and CA file, for the kubeconfigs of pod ServiceAccounts.
    pub server: String,
    /// See [`AgentConfig::server`].
    pub ca_file: PathBuf,
    /// Where pod directories and logs go.
    pub dir: PathBuf,
}

/// A running agent. Dropping it stops every process it started (their watchdogs see to it).
pub struct NodeAgent {
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

struct Shared {
    config: AgentConfig,
    client: Client,
    /// Running containers by pod `namespace/name`: their host process ids.
    pids: Mutex<HashMap<String, u32>>,
}

/// Pod addresses, unique within the test process: (the pod IP, the loopback address its
/// process listens on).
static NEXT_IP: AtomicU32 = AtomicU32::new(0);

fn next_ip() -> (String, String) {
    let n = NEXT_IP.fetch_add(1, Ordering::Relaxed);
    let (a, b) = (100 + n / 250, 2 + n % 250);
    (format!("10.99.{a}.{b}"), format!("127.0.{a}.{b}"))
}

/// The loopback address a pod IP of this agent listens on (`10.99.a.b` → `127.0.a.b`); any
/// other address unchanged.
pub fn loopback_of(pod_ip: &str) -> String {
    match pod_ip.strip_prefix("10.99.") {
        Some(rest) => format!("127.0.{rest}"),
        None => pod_ip.to_string(),
    }
}

/// A relabelling rule to append to a Kubernetes scrape job, so Prometheus reaches the pods of
/// this agent at their loopback addresses (see [`loopback_of`]).
pub const POD_NETWORK_RELABELING: &str = r"source_labels: [__address__]
regex: 10\.99\.(\d+)\.(\d+)(:\d+)?
replacement: 127.0.$1.$2$3
target_label: __address__";

impl NodeAgent {
    /// Registers the Node and starts serving its pods.
    pub async fn start(client: Client, config: AgentConfig) -> NodeAgent {
        std::fs::create_dir_all(&config.dir).expect("agent dir");
        register_node(&client, &config.node).await;
        let shared = Arc::new(Shared { config, client, pids: Mutex::new(HashMap::new()) });
        let task = tokio::spawn(watch_pods(shared.clone()));
        NodeAgent { task, shared }
    }

    /// Kills the container of pod `namespace/name` with SIGKILL, as a crash would; the agent
    /// sees it exit and restarts it. Returns whether there was one to kill.
    pub fn crash(&self, namespace: &str, name: &str) -> bool {
        let pid = self.shared.pids.lock().expect("pids").get(&format!("{namespace}/{name}")).copied();
        pid.is_some_and(|pid| signal("KILL", pid))
    }

    /// The last `lines` lines of every container log, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&self.shared.config.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        dirs.sort();
        for dir in dirs {
            let text = std::fs::read_to_string(dir.join("container.log")).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("== {}\n", dir.file_name().unwrap_or_default().to_string_lossy()));
            out.push_str(&all[all.len().saturating_sub(lines)..].join("\n"));
            out.push('\n');
        }
        out
    }

    /// The log file of a pod's container.
    pub fn log_path(&self, namespace: &str, name: &str) -> PathBuf {
        self.shared.config.dir.join(format!("{namespace}_{name}")).join("container.log")
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn register_node(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
    }))
    .expect("node");
    nodes.create(&PostParams::default(), &node).await.expect("registering the node");
    let now = Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "pacer test node agent", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": "pacer-test-agent", "architecture": "amd64", "operatingSystem": "linux",
                     "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                     "containerRuntimeVersion": "process://", "kubeProxyVersion": ""},
    }});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("node status");
    // The API server taints a new node not-ready; the node lifecycle controller would lift the
    // taint once the node reports Ready, but the test cluster does not run it.
    let untaint = json!({"spec": {"taints": null}});
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(&untaint)).await.expect("node taints");
}

/// Watches the pods bound to the node; one task per pod, fed the pod's newest version
/// (`None` once it is gone from the API).
async fn watch_pods(shared: Arc<Shared>) {
    let pods: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", shared.config.node));
    let mut stream = watcher(pods, config).boxed();
    let mut running: HashMap<String, tokio::sync::watch::Sender<Option<Pod>>> = HashMap::new();
    while let Some(event) = stream.next().await {
        let (pod, gone) = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
            Ok(watcher::Event::Delete(p)) => (p, true),
            Ok(_) => continue,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let Some(uid) = pod.metadata.uid.clone() else { continue };
        if let Some(tx) = running.get(&uid) {
            let _ = tx.send(if gone { None } else { Some(pod) });
            continue;
        }
        if gone
            || pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed")
        {
            continue;
        }
        let (tx, rx) = tokio::sync::watch::channel(Some(pod));
        running.insert(uid, tx);
        tokio::spawn(run_pod(shared.clone(), rx));
        running.retain(|_, tx| !tx.is_closed());
    }
}

/// One container process and what the agent knows of it.
struct Running {
    child: Child,
    started: Timestamp,
    started_probe_ok: bool,
    ready: bool,
    readiness_failures: i32,
    liveness_failures: i32,
    next_probe: HashMap<&'static str, Instant>,
}

impl Running {
    /// The container's own process id (the child of its watchdog shell).
    fn pid(&self) -> u32 {
        let shell = self.child.id();
        std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
            .unwrap_or(shell)
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

fn signal(sig: &str, pid: u32) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn run_pod(shared: Arc<Shared>, mut rx: tokio::sync::watch::Receiver<Option<Pod>>) {
    let Some(pod) = rx.borrow().clone() else { return };
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let plan = match plan(&shared, &pod).await {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!(
                "test agent: pod {}/{} failed: {message}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            );
            let status = json!({"status": {"phase": "Failed", "reason": "UnsupportedByTestAgent", "message": message}});
            let _ = pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await;
            return;
        }
    };
    let start_time = Timestamp::now();
    let mut restarts = 0;
    let mut versions: HashMap<String, String> = HashMap::new();
    sync_config_maps(&shared, &plan, &mut versions).await;
    let mut running = start(&shared, &plan);
    report(&pods, &plan, &running, restarts, start_time).await;
    let mut last_sync = Instant::now();
    loop {
        let pod = tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() { None } else { rx.borrow().clone() }
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => Some(pod.clone()),
        };
        let Some(pod) = pod else {
            // Force-deleted: no grace.
            let _ = signal("KILL", running.pid());
            let _ = running.child.wait();
            break;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            terminate(&shared, &pods, &plan, &pod, &mut running, restarts, start_time).await;
            break;
        }
        if last_sync.elapsed() > Duration::from_secs(1) {
            sync_config_maps(&shared, &plan, &mut versions).await;
            last_sync = Instant::now();
        }
        let before = (running.ready, restarts);
        let mut restart = running.exited();
        if !restart {
            restart = !probe(&plan, &mut running).await;
        }
        if restart {
            let _ = signal("KILL", running.pid());
            let _ = running.child.wait();
            restarts += 1;
            running.ready = false;
            report(&pods, &plan, &running, restarts, start_time).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            running = start(&shared, &plan);
        }
        if (running.ready, restarts) != before {
            report(&pods, &plan, &running, restarts, start_time).await;
        }
    }
    shared.pids.lock().expect("pids").remove(&plan.key);
}
