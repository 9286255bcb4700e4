//! One pod's process as the agent runs it: the plan (binary, args, env, volumes) made from its
//! spec, its ConfigMaps kept in sync, the process started, its probes, its status reported,
//! and its termination (preStop, SIGTERM, SIGKILL at the grace period).

use super::*;

/// Everything about a pod that does not change while it runs.
pub(super) struct PodPlan {
    pub(super) key: String,
    pub(super) namespace: String,
    pub(super) name: String,
    /// The pod IP (what the API says).
    pub(super) ip: String,
    /// Where the process listens.
    pub(super) listen: String,
    pub(super) dir: PathBuf,
    pub(super) container: Container,
    pub(super) binary: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    /// ConfigMap volumes: (ConfigMap name, host directory).
    pub(super) config_maps: Vec<(String, PathBuf)>,
}

pub(super) async fn plan(shared: &Shared, pod: &Pod) -> Result<PodPlan, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let spec = pod.spec.as_ref().ok_or("no spec")?;
    if spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err("init containers are not supported by the test agent".into());
    }
    let container = spec.containers.first().ok_or("no container")?.clone();
    let image = container.image.clone().unwrap_or_default();
    let binary = shared
        .config
        .binaries
        .iter()
        .find(|(fragment, _)| image.contains(fragment.as_str()))
        .map(|(_, bin)| bin.clone())
        .ok_or_else(|| format!("no binary for image {image}"))?;
    let (ip, listen) = next_ip();
    let dir = shared.config.dir.join(format!("{namespace}_{name}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut env: Vec<(String, String)> = Vec::new();

    // Volumes → host directories.
    let mut hosts: HashMap<String, PathBuf> = HashMap::new();
    let mut config_maps = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        let host = dir.join("volumes").join(&volume.name);
        if let Some(cm) = &volume.config_map {
            config_maps.push((cm.name.clone(), host.clone()));
            std::fs::create_dir_all(&host).map_err(|e| e.to_string())?;
        } else if volume.empty_dir.is_some() {
            std::fs::create_dir_all(&host).map_err(|e| e.to_string())?;
        } else if let Some(projected) = &volume.projected {
            // The API access volume admission adds (token, CA, namespace), or a token alone.
            std::fs::create_dir_all(&host).map_err(|e| e.to_string())?;
            for source in projected.sources.iter().flatten() {
                if let Some(token) = &source.service_account_token {
                    let account = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
                    let value = service_account_token(shared, &namespace, &account).await?;
                    std::fs::write(host.join(&token.path), value).map_err(|e| e.to_string())?;
                }
                for item in source.config_map.iter().flat_map(|c| c.items.iter().flatten()) {
                    if item.key == "ca.crt" {
                        std::fs::copy(&shared.config.ca_file, host.join(&item.path))
                            .map_err(|e| e.to_string())?;
                    }
                }
                if source.downward_api.is_some() {
                    std::fs::write(host.join("namespace"), &namespace).map_err(|e| e.to_string())?;
                }
            }
        } else if let Some(pvc) = &volume.persistent_volume_claim {
            let backing = shared
                .config
                .claims
                .get(&pvc.claim_name)
                .ok_or_else(|| format!("no host directory for PVC {}", pvc.claim_name))?;
            hosts.insert(volume.name.clone(), backing.clone());
            continue;
        } else {
            return Err(format!("volume {} has a kind the test agent does not support", volume.name));
        }
        hosts.insert(volume.name.clone(), host);
    }
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let host = hosts.get(&mount.name).ok_or_else(|| format!("mount of unknown volume {}", mount.name))?;
        let host = match &mount.sub_path {
            Some(sub) if !sub.is_empty() => host.join(sub),
            _ => host.clone(),
        };
        mounts.push((mount.mount_path.trim_end_matches('/').to_string(), host));
    }
    // Longest first, so /etc/pacer/x wins over /etc/pacer.
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let rewrite = |value: &str| -> String {
        let value = value.replace("0.0.0.0", &listen);
        for (path, host) in &mounts {
            if let Some(at) = value.find(path.as_str()) {
                let rest = &value[at + path.len()..];
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{}{}{rest}", &value[..at], host.display());
                }
            }
        }
        value
    };

    // The ServiceAccount's token, as a kubeconfig.
    if spec.automount_service_account_token != Some(false) {
        let account = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
        let token = service_account_token(shared, &namespace, &account).await?;
        let kubeconfig = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: {namespace}\n\
             current-context: c\n",
            shared.config.server,
            shared.config.ca_file.display()
        );
        std::fs::write(&kubeconfig, text).map_err(|e| e.to_string())?;
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            rewrite(value)
        } else if let Some(field) = var.value_from.as_ref().and_then(|v| v.field_ref.as_ref()) {
            match field.field_path.as_str() {
                "metadata.name" => name.clone(),
                "metadata.namespace" => namespace.clone(),
                "status.podIP" => ip.clone(),
                "spec.nodeName" => shared.config.node.clone(),
                other => return Err(format!("env {}: fieldRef {other} is not supported", var.name)),
            }
        } else {
            return Err(format!("env {}: only values and fieldRefs are supported", var.name));
        };
        env.push((var.name.clone(), value));
    }
    let mut args: Vec<String> = container.command.iter().flatten().skip(1).map(|a| rewrite(a)).collect();
    args.extend(container.args.iter().flatten().map(|a| rewrite(a)));
    Ok(PodPlan {
        key: format!("{namespace}/{name}"),
        namespace,
        name,
        ip,
        listen,
        dir,
        container,
        binary,
        args,
        env,
        config_maps,
    })
}

/// A token of `account` (a TokenRequest, as the kubelet makes for a projected volume).
pub(super) async fn service_account_token(
    shared: &Shared,
    namespace: &str,
    account: &str,
) -> Result<String, String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(shared.client.clone(), namespace);
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}});
    let token: serde_json::Value = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("a token for ServiceAccount {account}: {e}"))?;
    Ok(token["status"]["token"].as_str().unwrap_or_default().to_string())
}

/// Writes each ConfigMap volume as the kubelet does: the files in a fresh `..<version>`
/// directory, `..data` pointing at it (swapped atomically by a rename), and each key a link
/// through `..data`. A reader that opens `key` sees the old or the new content, never a mix.
pub(super) async fn sync_config_maps(
    shared: &Shared,
    plan: &PodPlan,
    versions: &mut HashMap<String, String>,
) {
    let api: Api<ConfigMap> = Api::namespaced(shared.client.clone(), &plan.namespace);
    for (name, host) in &plan.config_maps {
        let Ok(Some(cm)) = api.get_opt(name).await else { continue };
        let version = cm.metadata.resource_version.clone().unwrap_or_default();
        if versions.get(name) == Some(&version) {
            continue;
        }
        let data = cm.data.clone().unwrap_or_default();
        let fresh = host.join(format!("..{version}"));
        if std::fs::create_dir_all(&fresh).is_err() {
            continue;
        }
        for (key, value) in &data {
            let _ = std::fs::write(fresh.join(key), value);
        }
        let tmp = host.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        if std::os::unix::fs::symlink(format!("..{version}"), &tmp).is_err()
            || std::fs::rename(&tmp, host.join("..data")).is_err()
        {
            continue;
        }
        for key in data.keys() {
            let link = host.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                let _ = std::os::unix::fs::symlink(Path::new("..data").join(key), &link);
            }
        }
        if let Some(old) = versions.insert(name.clone(), version) {
            let _ = std::fs::remove_dir_all(host.join(format!("..{old}")));
        }
    }
}

pub(super) fn start(shared: &Shared, plan: &PodPlan) -> Running {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(plan.dir.join("container.log"))
        .expect("container log");
    let err = log.try_clone().expect("container log");
    let child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("sh")
        .arg(&plan.binary)
        .args(&plan.args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &plan.dir)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.dir)
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(err)
        .spawn()
        .expect("starting a container process");
    let mut running = Running {
        child,
        started: Timestamp::now(),
        started_probe_ok: plan.container.startup_probe.is_none(),
        ready: false,
        readiness_failures: 0,
        liveness_failures: 0,
        next_probe: HashMap::new(),
    };
    // The shell forks the binary at once; wait for it so crash() finds its pid.
    let deadline = Instant::now() + Duration::from_secs(2);
    while running.pid() == running.child.id() && Instant::now() < deadline && !running.exited() {
        std::thread::sleep(Duration::from_millis(5));
    }
    shared.pids.lock().expect("pids").insert(plan.key.clone(), running.pid());
    running
}

/// Runs the probes that are due; returns `false` when the container must be restarted.
pub(super) async fn probe(plan: &PodPlan, running: &mut Running) -> bool {
    let c = &plan.container;
    let now = Instant::now();
    let due = |running: &mut Running, kind: &'static str, p: &Probe| {
        let next = running.next_probe.get(kind).copied();
        if next.is_some_and(|n| n > now) {
            return false;
        }
        running
            .next_probe
            .insert(kind, now + Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64));
        true
    };
    if !running.started_probe_ok {
        let p = c.startup_probe.as_ref().expect("startup probe");
        if due(running, "startup", p) {
            if check(plan, p).await {
                running.started_probe_ok = true;
            } else if Timestamp::now().duration_since(running.started).as_secs()
                > i64::from(p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3))
            {
                return false;
            }
        }
        return true;
    }
    if let Some(p) = &c.liveness_probe
        && due(running, "liveness", p)
    {
        if check(plan, p).await {
            running.liveness_failures = 0;
        } else {
            running.liveness_failures += 1;
            if running.liveness_failures >= p.failure_threshold.unwrap_or(3) {
                return false;
            }
        }
    }
    match &c.readiness_probe {
        None => running.ready = true,
        Some(p) => {
            if due(running, "readiness", p) {
                if check(plan, p).await {
                    running.readiness_failures = 0;
                    running.ready = true;
                } else {
                    running.readiness_failures += 1;
                    if running.readiness_failures >= p.failure_threshold.unwrap_or(3) || !running.ready {
                        running.ready = false;
                    }
                }
            }
        }
    }
    true
}

/// One HTTP GET probe: a 2xx or 3xx within its timeout.
pub(super) async fn check(plan: &PodPlan, p: &Probe) -> bool {
    let Some(get) = &p.http_get else { return true };
    let port = match &get.port {
        IntOrString::Int(port) => Some(*port),
        IntOrString::String(name) => plan
            .container
            .ports
            .iter()
            .flatten()
            .find(|port| port.name.as_deref() == Some(name.as_str()))
            .map(|port| port.container_port),
    };
    let Some(port) = port else { return false };
    let url = format!("http://{}:{port}{}", plan.listen, get.path.as_deref().unwrap_or("/"));
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    let client = reqwest::Client::builder().timeout(timeout).pool_max_idle_per_host(0).build();
    match client {
        Ok(client) => {
            client.get(url).send().await.is_ok_and(|r| r.status().is_success() || r.status().is_redirection())
        }
        Err(_) => false,
    }
}

pub(super) async fn report(
    pods: &Api<Pod>,
    plan: &PodPlan,
    running: &Running,
    restarts: i32,
    start_time: Timestamp,
) {
    let ready = if running.ready { "True" } else { "False" };
    let now = Timestamp::now().to_string();
    let image = plan.container.image.clone().unwrap_or_default();
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": plan.ip,
        "podIPs": [{"ip": plan.ip}],
        "startTime": start_time.to_string(),
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": start_time.to_string()},
            {"type": "Initialized", "status": "True", "lastTransitionTime": start_time.to_string()},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
            {"type": "Ready", "status": ready, "lastTransitionTime": now},
        ],
        "containerStatuses": [{
            "name": plan.container.name,
            "image": image,
            "imageID": "",
            "containerID": format!("process://{}", running.pid()),
            "ready": running.ready,
            "started": running.started_probe_ok,
            "restartCount": restarts,
            "state": {"running": {"startedAt": running.started.to_string()}},
        }],
    }});
    if let Err(e) = pods.patch_status(&plan.name, &PatchParams::default(), &Patch::Merge(&status)).await {
        eprintln!("test agent: status of {}: {e}", plan.key);
    }
}

/// The kubelet's termination: unready, the preStop sleep, SIGTERM, SIGKILL when the grace
/// period runs out, then the pod's final removal.
pub(super) async fn terminate(
    shared: &Shared,
    pods: &Api<Pod>,
    plan: &PodPlan,
    pod: &Pod,
    running: &mut Running,
    restarts: i32,
    start_time: Timestamp,
) {
    let started = Instant::now();
    let grace = Duration::from_secs(
        pod.metadata
            .deletion_grace_period_seconds
            .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30)
            .max(0) as u64,
    );
    running.ready = false;
    report(pods, plan, running, restarts, start_time).await;
    let pre_stop = plan
        .container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.sleep.as_ref())
        .map(|s| Duration::from_secs(s.seconds.max(0) as u64))
        .unwrap_or_default();
    tokio::time::sleep(pre_stop.min(grace)).await;
    let pid = running.pid();
    signal("TERM", pid);
    while !running.exited() && started.elapsed() < grace {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !running.exited() {
        signal("KILL", pid);
    }
    let _ = running.child.wait();
    shared.pids.lock().expect("pids").remove(&plan.key);
    let uid = pod.metadata.uid.clone();
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid.map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::default()
    };
    let _ = pods.delete(&plan.name, &params).await;
}
