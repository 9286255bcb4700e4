//! The Helm chart (`charts/pacer/`) and the monitoring config it ships (`config/prometheus/`,
//! `config/grafana/`), with the real tools: `helm lint` and `helm template` for every
//! `ci/*-values.yaml`, the values schema rejecting typos, `promtool` checking and unit-testing
//! the rules, every metric name the rules, the dashboard and the operator's queries use being
//! one the engine or the operator exports, every `pacer-operator run` flag set from values, and,
//! on a real apiserver, a server-side dry-run of every rendered object, `helm install`, the
//! operator reconciling a sample as the chart's ServiceAccount, `helm upgrade` and
//! `helm uninstall` keeping the CRD; the README's table of values is the one `values.yaml`
//! documents, and extra volumes reach the operator's pod.
//!
//! helm comes from `scripts/build-cluster-bins.sh`, promtool from `scripts/build-prometheus.sh`,
//! the Prometheus Operator's CRDs from `scripts/build-monitoring-crds.sh` (all cached outside
//! the repository; `scripts/test.sh` runs the three).

#[path = "chart/values.rs"]
mod values;

use crate::common::{OPERATOR, apply_json, cache, helm, repo_file, text, tool};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use pacer_tests::{Cluster, Workloads, eventually, yaml_documents};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROMETHEUS_VERSION: &str = "3.16.0";
const MONITORING_CRDS_VERSION: &str = "0.95.2";

fn promtool() -> PathBuf {
    tool(&format!("prometheus-{PROMETHEUS_VERSION}"), "promtool", "scripts/build-prometheus.sh")
}

fn chart() -> PathBuf {
    repo_file("charts/pacer")
}

/// `helm template` of the chart with `extra` arguments (values files, --set), as objects.
fn render(extra: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args =
        vec!["template", "pacer", chart.to_str().expect("utf-8 path"), "--namespace", "pacer-system"];
    args.extend_from_slice(extra);
    let out = helm(&args);
    assert!(out.status.success(), "helm template {extra:?} failed:\n{}", text(&out));
    yaml_documents(&String::from_utf8_lossy(&out.stdout))
}

fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .expect("charts/pacer/ci")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    files
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn operator_container(objects: &[Value]) -> &Value {
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment");
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args_of(container: &Value) -> Vec<String> {
    container["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("arg").to_string()).collect()
}

#[test]
fn helm_lint_passes_with_every_ci_values_file() {
    for values in ci_values() {
        let out = helm(&[
            "lint",
            "--strict",
            chart().to_str().expect("path"),
            "-f",
            values.to_str().expect("path"),
        ]);
        assert!(out.status.success(), "helm lint {}:\n{}", values.display(), text(&out));
    }
    // `helm package` follows the links to config/ and crds/: the package holds the files.
    let dir = tempfile::tempdir().expect("temp dir");
    let out = helm(&["package", chart().to_str().expect("path"), "-d", dir.path().to_str().expect("path")]);
    assert!(out.status.success(), "helm package:\n{}", text(&out));
    let package = dir.path().join("pacer-0.1.0.tgz");
    let listing = Command::new("tar").arg("tzf").arg(&package).output().expect("tar");
    let listing = String::from_utf8_lossy(&listing.stdout);
    for file in [
        "pacer/files/inferenceservice-crd.yaml",
        "pacer/files/config/rbac/operator.yaml",
        "pacer/files/config/prometheus/alerts.yaml",
        "pacer/files/config/grafana/pacer-dashboard.json",
    ] {
        assert!(listing.lines().any(|l| l == file), "{file} not packaged:\n{listing}");
    }
}

#[test]
fn invalid_values_fail_with_a_message_naming_the_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "operator.watchNamspace=ml"], "watchNamspace"),
        (&["--set", "operator.watchNamespaces={Team_A}"], "watchNamespaces"),
        (&["--set", "operator.watchNamespaces={a,a}"], "watchNamespaces"),
        (&["--set", "replicas=3"], "replicas"),
        (&["--set", "operator.logFormat=xml"], "logFormat"),
        (&["--set", "operator.leaderElection.leaseDuration=1"], "leaseDuration"),
        (&["--set", "prometheus.url=prometheus:9090"], "url"),
        (&["--set", "prometheus.timeout=ten"], "timeout"),
        (&["--set", "prometheusRule.alerts.PacerITLhigh.for=5m"], "PacerITLhigh"),
        (&["--set", "prometheusRule.alerts.PacerITLHigh.for=5"], "for"),
        (
            &[
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                "prometheusRule.alerts.PacerSLAViolated.threshold=1",
            ],
            "PacerSLAViolated.threshold",
        ),
        (&["--set", "operator.leaderElection.enabled=false"], "leaderElection"),
        (&["--set", "serviceAccount.create=false"], "serviceAccount.name"),
    ];
    for (args, key) in cases {
        let chart = chart();
        let mut all = vec!["template", "pacer", chart.to_str().expect("path")];
        all.extend_from_slice(args);
        let out = helm(&all);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(text(&out).contains(key), "{args:?}: the error does not name {key}:\n{}", text(&out));
    }
}

#[test]
fn the_chart_ships_config_and_the_generated_crd_unchanged() {
    let objects = render(&["--set", "dashboard.enabled=true", "--set", "prometheusRule.enabled=true"]);
    let crd_file =
        yaml_documents(&std::fs::read_to_string(repo_file("crds/inferenceservice.yaml")).expect("crd"));
    let crd = find(&objects, "CustomResourceDefinition", "inferenceservices.serving.pacer.dev");
    // Helm's YAML round trip writes `1.0` as `1`: compare numbers as numbers.
    assert_eq!(
        numbers_as_f64(&crd["spec"]),
        numbers_as_f64(&crd_file[0]["spec"]),
        "the rendered CRD differs from crds/inferenceservice.yaml"
    );
    assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");

    let rbac =
        yaml_documents(&std::fs::read_to_string(repo_file("config/rbac/operator.yaml")).expect("rbac"));
    assert_eq!(find(&objects, "ClusterRole", "pacer-operator")["rules"], rbac[0]["rules"]);
    assert_eq!(find(&objects, "ClusterRole", "pacer-operator-leader-election")["rules"], rbac[1]["rules"]);
    let binding = find(&objects, "ClusterRoleBinding", "pacer-operator");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "pacer-operator", "namespace": "pacer-system"})
    );

    let dashboard = find(&objects, "ConfigMap", "pacer-operator-dashboard");
    let shipped: Value =
        serde_json::from_str(dashboard["data"]["pacer-dashboard.json"].as_str().expect("json"))
            .expect("dashboard JSON");
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("config/grafana/pacer-dashboard.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    assert_eq!(shipped, file);
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");

    // Namespaced mode: Roles only, nothing cluster-scoped.
    let objects = render(&["-f", chart().join("ci/namespaced-values.yaml").to_str().expect("path")]);
    let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for cluster_scoped in ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"] {
        assert!(!kinds.contains(cluster_scoped), "namespaced mode renders a {cluster_scoped}");
    }
    // A Role and its binding in each watched namespace, the same rules as the ClusterRole.
    for ns in ["pacer-ci-team", "team-a"] {
        let in_ns = |kind: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == kind && o["metadata"]["namespace"] == ns)
                .unwrap_or_else(|| panic!("no {kind} in {ns}"))
        };
        assert_eq!(in_ns("Role")["rules"], rbac[0]["rules"]);
        assert_eq!(in_ns("RoleBinding")["roleRef"]["name"], "pacer-operator");
    }
    let args = args_of(operator_container(&objects));
    assert!(args.contains(&"--namespaces=pacer-ci-team,team-a".to_string()), "{args:?}");
    assert!(
        args.contains(&"--exclude-namespaces=kube-system,kube-public,kube-node-lease".to_string()),
        "the control plane's namespaces are excluded by default: {args:?}"
    );
}

/// Cluster mode with a namespace selector: the flag, and a ClusterRole to read namespaces
/// (from the one RBAC source) bound to the operator; none without a selector; a selector with
/// a list of namespaces is refused with a message naming both values.
#[test]
fn a_namespace_selector_reads_namespaces_in_cluster_mode_only() {
    let rbac =
        yaml_documents(&std::fs::read_to_string(repo_file("config/rbac/operator.yaml")).expect("rbac"));
    let objects = render(&["--set", "operator.namespaceSelector=pacer.dev/enabled=true"]);
    let args = args_of(operator_container(&objects));
    assert!(args.contains(&"--namespace-selector=pacer.dev/enabled=true".to_string()), "{args:?}");
    assert_eq!(find(&objects, "ClusterRole", "pacer-operator-namespaces")["rules"], rbac[2]["rules"]);
    let binding = find(&objects, "ClusterRoleBinding", "pacer-operator-namespaces");
    assert_eq!(binding["roleRef"]["name"], "pacer-operator-namespaces");
    assert_eq!(binding["subjects"][0]["name"], "pacer-operator");

    let plain = render(&[]);
    assert!(
        !plain.iter().any(|o| o["metadata"]["name"] == "pacer-operator-namespaces"),
        "namespaces are read only with a selector"
    );
    let out = helm(&[
        "template",
        "pacer",
        chart().to_str().expect("path"),
        "--set",
        "operator.namespaceSelector=a=b",
        "--set",
        "operator.watchNamespaces={team-a}",
    ]);
    assert!(!out.status.success());
    let text = text(&out);
    assert!(
        text.contains("operator.namespaceSelector") && text.contains("operator.watchNamespaces"),
        "{text}"
    );
}

/// `v` with every number as an f64 (so `1` and `1.0` compare equal).
fn numbers_as_f64(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64().expect("a finite number")),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_f64).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), numbers_as_f64(v))).collect())
        }
        other => other.clone(),
    }
}

/// The long flags of `pacer-operator run --help`, each with its env variable if it has one.
fn operator_flags() -> Vec<(String, Option<String>)> {
    let out = Command::new(OPERATOR).args(["run", "--help"]).output().expect("pacer-operator run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed.strip_prefix("-h, ").unwrap_or(trimmed);
        if let Some(rest) = flag.strip_prefix("--") {
            let name = rest.split([' ', '=']).next().expect("flag name").to_string();
            flags.push((name, None));
        } else if let (Some(last), Some(start)) = (flags.last_mut(), line.find("[env: ")) {
            let env = &line[start + 6..];
            last.1 = Some(env[..env.find('=').expect("[env: NAME=")].to_string());
        }
    }
    flags.retain(|(name, _)| name != "help");
    flags
}

#[test]
fn every_operator_flag_is_set_from_values() {
    let flags = operator_flags();
    assert!(flags.len() >= 8, "parsed too few flags from --help: {flags:?}");
    // Every optional setting switched on, so every flag the chart can pass is passed.
    let objects = render(&[
        "-f",
        chart().join("ci/monitoring-values.yaml").to_str().expect("path"),
        "--set",
        "operator.watchNamespaces={team-a,team-b}",
    ]);
    let container = operator_container(&objects);
    // The namespace selector is cluster mode's: rendered apart, its flags count too.
    let selector = render(&["--set", "operator.namespaceSelector=pacer.dev/enabled=true"]);
    let mut args = args_of(container);
    args.extend(args_of(operator_container(&selector)));
    let env: BTreeSet<String> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| e["name"].as_str().expect("env name").to_string())
        .collect();
    let passed: BTreeSet<String> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().expect("flag").to_string())
        .collect();
    for (flag, env_name) in &flags {
        let by_env = env_name.as_ref().is_some_and(|e| env.contains(e));
        assert!(
            passed.contains(flag) || by_env,
            "`pacer-operator run --{flag}` ({env_name:?}) is not set by the chart: add a value for it \
             (args: {args:?}, env: {env:?})"
        );
    }
    let known: BTreeSet<&str> = flags.iter().map(|(f, _)| f.as_str()).collect();
    for flag in &passed {
        assert!(known.contains(flag.as_str()), "the chart passes --{flag}, which pacer-operator run lacks");
    }
    // The profiles are only passed when the chart ships some.
    let profiles = std::fs::read_dir(repo_file("config/profiles"))
        .map(|d| d.filter_map(Result::ok).any(|e| e.path().extension().is_some_and(|x| x == "json")))
        .unwrap_or(false);
    assert_eq!(passed.contains("profiles"), profiles, "--profiles iff config/profiles has profiles");
}

fn run_promtool(args: &[&str]) -> String {
    let out = Command::new(promtool()).args(args).current_dir(repo_file("")).output().expect("promtool");
    assert!(out.status.success(), "promtool {args:?}:\n{}", text(&out));
    text(&out)
}

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    run_promtool(&[
        "check",
        "rules",
        "config/prometheus/recording-rules.yaml",
        "config/prometheus/alerts.yaml",
    ]);
    run_promtool(&["check", "config", "config/prometheus/prometheus.yaml"]);
    let out = run_promtool(&["test", "rules", "config/prometheus/alerts.test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert has a unit test, in which it fires.
    let alerts =
        yaml_documents(&std::fs::read_to_string(repo_file("config/prometheus/alerts.yaml")).expect("alerts"));
    let tests = std::fs::read_to_string(repo_file("config/prometheus/alerts.test.yaml")).expect("tests");
    for rule in alerts[0]["groups"][0]["rules"].as_array().expect("rules") {
        let name = rule["alert"].as_str().expect("alert name");
        assert!(
            tests.contains(&format!("alertname: {name}\n        exp_alerts:\n          - ")),
            "{name} never fires in a test"
        );
    }

    // The PrometheusRule the chart renders, thresholds and all, is valid too.
    let objects = render(&["-f", chart().join("ci/monitoring-values.yaml").to_str().expect("path")]);
    let rule = objects.iter().find(|o| o["kind"] == "PrometheusRule").expect("a PrometheusRule");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, serde_yaml::to_string(&rule["spec"]).expect("yaml")).expect("write");
    run_promtool(&["check", "rules", file.to_str().expect("path")]);
    let spec = serde_json::to_string(&rule["spec"]).expect("json");
    assert!(spec.contains(r#"quantile=\"0.99\"} > 0.08"#), "the ITL threshold override is missing");
    assert!(!spec.contains("PacerThroughputDrop"), "a disabled alert is rendered");
}

/// Metric names (`vllm:*`, `pacer_*`) and recorded names (`inferenceservice:*`) in PromQL text.
fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = promql.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while i < bytes.len() {
        if word(bytes[i]) && (i == 0 || !word(bytes[i - 1])) {
            let end = (i..bytes.len()).find(|&j| !word(bytes[j])).unwrap_or(bytes.len());
            let token = &promql[i..end];
            if ["vllm:", "pacer_", "inferenceservice:"].iter().any(|p| token.starts_with(p)) {
                names.insert(token.to_string());
            }
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// Every string value under `v` whose key is `expr` (dashboard targets and annotations).
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// Metric family names in Prometheus text format (histograms as their base name and parts).
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = line.split(['{', ' ']).next().expect("name").to_string();
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                names.insert(base.to_string());
            }
        }
        names.insert(name);
    }
    names
}

#[test]
fn every_metric_the_rules_dashboard_and_queries_use_is_exported() {
    // The engine's real exporter, with every labelled family touched once.
    let engine = pacer_engine::metrics::EngineMetrics::new("smol");
    engine.finished("stop");
    engine.rejected("queue_full");
    engine.set_info(
        "q4_0",
        &pacer_engine::scheduler::BatchSettings {
            max_batch_size: 8,
            batch_wait_ms: 0,
            max_num_batched_tokens: 512,
            max_step_ms: 80,
            prefill_hold_ms: 0,
        },
    );
    let mut available = exported(&engine.render());
    // The engine exports every engine metric of the contract (the queries are written with
    // the contract's constants).
    use pacer_engine_api::metrics::{ALL, Source};
    for m in ALL.iter().filter(|m| m.source == Source::Engine) {
        assert!(available.contains(m.name), "the engine does not export {}", m.name);
    }
    // The operator's families: labelled families appear in its /metrics only once a child
    // exists (after the first decision), and its telemetry registers every one from the
    // contract's list, so the list stands for them.
    available.extend(ALL.iter().filter(|m| m.source == Source::Operator).map(|m| m.name.to_string()));
    assert!(available.contains("pacer_operator_leader") && available.contains("vllm:num_requests_running"));

    let read = |p: &str| std::fs::read_to_string(repo_file(p)).expect(p);
    let recording = yaml_documents(&read("config/prometheus/recording-rules.yaml"));
    let mut recorded = BTreeSet::new();
    let mut used: Vec<(String, String)> = Vec::new();
    for file in ["config/prometheus/recording-rules.yaml", "config/prometheus/alerts.yaml"] {
        for group in yaml_documents(&read(file))[0]["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                if let Some(name) = rule["record"].as_str() {
                    recorded.insert(name.to_string());
                }
                used.push((file.to_string(), rule["expr"].as_str().expect("expr").to_string()));
            }
        }
    }
    assert!(!recording.is_empty());
    let dashboard: Value =
        serde_json::from_str(&read("config/grafana/pacer-dashboard.json")).expect("dashboard");
    let mut dashboard_exprs = Vec::new();
    exprs(&dashboard, &mut dashboard_exprs);
    assert!(dashboard_exprs.len() > 20, "{dashboard_exprs:?}");
    used.extend(dashboard_exprs.into_iter().map(|e| ("config/grafana/pacer-dashboard.json".to_string(), e)));
    // The planner's queries are written with the contract's constants, whose engine names the
    // engine was checked to export above.

    let mut checked = 0;
    for (file, promql) in &used {
        for name in metric_names(promql) {
            let ok = if name.starts_with("inferenceservice:") {
                recorded.contains(&name)
            } else {
                available.contains(&name)
            };
            assert!(
                ok,
                "{file} uses {name}, which neither the engine nor the operator exports (or no rule records)"
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} names checked");
}

/// A client and kubeconfig file for `token` on `cluster`.
fn token_kubeconfig(cluster: &Cluster, token: &str, path: &Path) {
    let ca = cluster.dir().join("certs").join("apiserver.crt");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
         users:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: sa\n\
         current-context: test\n",
        cluster.server,
        ca.display()
    );
    std::fs::write(path, text).expect("kubeconfig");
}

/// The operator binary with `args`, as the identity of `kubeconfig`, as if in a pod of
/// `namespace`, logging to `log`.
fn run_operator(args: &[String], kubeconfig: &Path, namespace: &str, log: &Path) -> Killed {
    let log = std::fs::File::create(log).expect("log");
    Killed(
        Command::new(OPERATOR)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", namespace)
            .env("POD_NAME", "pacer-operator-test")
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("pacer-operator"),
    )
}

/// Kills the child on drop, so a failed assertion leaves no operator behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn server_side_dry_run(client: &kube::Client, obj: &Value) -> Result<(), String> {
    let dynamic: DynamicObject = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    let types = dynamic.types.clone().ok_or("no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| e.to_string())?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.map_err(|e| e.to_string())?;
    let api: Api<DynamicObject> = match caps.scope {
        kube::discovery::Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            &dynamic.namespace().unwrap_or("pacer-system".into()),
            &resource,
        ),
        kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply("pacer-chart-test").force().dry_run();
    api.patch(&dynamic.name_any(), &params, &Patch::Apply(obj)).await.map(|_| ()).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_upgrades_and_uninstalls_on_a_real_apiserver() {
    let cluster = Cluster::start(Workloads::ApiOnly).await;
    let admin = cluster.admin().await;
    let kubeconfig = cluster.admin_kubeconfig();
    let kubeconfig = kubeconfig.to_str().expect("path");
    namespaces_and_monitoring_crds(&admin).await;
    every_ci_values_file_passes_a_server_side_dry_run(&admin).await;

    // helm install: CRD, RBAC, ServiceAccount and the operator Deployment.
    let chart = chart();
    let chart = chart.to_str().expect("path");
    let install = helm(&["install", "pacer", chart, "-n", "pacer-system", "--kubeconfig", kubeconfig]);
    assert!(install.status.success(), "helm install:\n{}", text(&install));
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "pacer-system");
    let deployment = deployments.get("pacer-operator").await.expect("the operator Deployment");
    assert_eq!(deployment.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let crd_api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    crd_established(&crd_api).await;

    // The operator as the chart's ServiceAccount, with the Deployment's own arguments: it
    // reconciles a sample in another namespace and holds the leader Lease in the release's.
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let (args, operator_kubeconfig) =
        as_the_release(&cluster, &admin, &deployment, "pacer-system", "chart", &format!("127.0.0.1:{port}"))
            .await;
    let log_path = cluster.dir().join("chart-operator.log");
    let operator = run_operator(&args, &operator_kubeconfig, "pacer-system", &log_path);
    apply_json(&admin, Some("team-a"), sample_doc()).await;
    engine_created(&admin, "team-a", &log_path, "the operator (as the chart's ServiceAccount)").await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "pacer-system");
    let lease = leases.get("pacer-operator").await.expect("the leader Lease in the release namespace");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("pacer-operator-test"));

    // helm upgrade changes the release in place.
    let upgrade = helm(&[
        "upgrade",
        "pacer",
        chart,
        "-n",
        "pacer-system",
        "--kubeconfig",
        kubeconfig,
        "--reuse-values",
        "--set",
        "replicaCount=3",
    ]);
    assert!(upgrade.status.success(), "helm upgrade:\n{}", text(&upgrade));
    let deployment = deployments.get("pacer-operator").await.expect("the operator Deployment");
    assert_eq!(deployment.spec.as_ref().and_then(|s| s.replicas), Some(3));

    // helm uninstall removes the operator and keeps the CRD (crds.keep, the default), so the
    // InferenceServices survive.
    let uninstall = helm(&["uninstall", "pacer", "-n", "pacer-system", "--kubeconfig", kubeconfig]);
    assert!(uninstall.status.success(), "helm uninstall:\n{}", text(&uninstall));
    assert!(
        deployments.get_opt("pacer-operator").await.expect("get").is_none(),
        "the operator is still there"
    );
    let crd = crd_api.get("inferenceservices.serving.pacer.dev").await.expect("the CRD is kept");
    assert!(crd.metadata.deletion_timestamp.is_none(), "the CRD is being deleted");
    let isvcs: Api<pacer_crds::InferenceService> = Api::namespaced(admin.clone(), "team-a");
    assert!(isvcs.get_opt("smol").await.expect("get").is_some(), "the InferenceService is gone");
    drop(operator);

    a_namespaced_release_reconciles_with_roles_only(&cluster, &admin, chart, kubeconfig).await;
}

/// The release namespaces (each with its default ServiceAccount, which the `helm test` pod runs
/// as and which no controller manager creates here) and the Prometheus Operator's real CRDs, so
/// ServiceMonitor and PrometheusRule are checked against their schemas.
async fn namespaces_and_monitoring_crds(admin: &kube::Client) {
    for ns in ["pacer-system", "pacer-ci-team", "team-a"] {
        apply_json(admin, None, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await;
        let default_sa =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        apply_json(admin, Some(ns), default_sa).await;
    }
    let crds = cache().join("crds").join(format!("prometheus-operator-{MONITORING_CRDS_VERSION}"));
    assert!(
        crds.exists(),
        "no {}: run scripts/build-monitoring-crds.sh (scripts/test.sh does)",
        crds.display()
    );
    for kind in ["servicemonitors", "prometheusrules", "podmonitors"] {
        let text =
            std::fs::read_to_string(crds.join(format!("monitoring.coreos.com_{kind}.yaml"))).expect("crd");
        crate::common::apply_yaml(admin, None, &text).await;
    }
    eventually(30, "the monitoring CRDs to be served", || {
        let admin = admin.clone();
        async move {
            let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PrometheusRule");
            kube::discovery::pinned_kind(&admin, &gvk).await.ok()
        }
    })
    .await;
}

/// Every object of every `ci/*-values.yaml`, accepted by a server-side dry-run.
async fn every_ci_values_file_passes_a_server_side_dry_run(admin: &kube::Client) {
    for values in ci_values() {
        let objects = render(&["-f", values.to_str().expect("path")]);
        for obj in &objects {
            if let Err(e) = server_side_dry_run(admin, obj).await {
                panic!("{}: {} {} rejected: {e}", values.display(), obj["kind"], obj["metadata"]["name"]);
            }
        }
    }
}

async fn crd_established(crd_api: &Api<CustomResourceDefinition>) {
    eventually(30, "the chart's CRD to be established", || {
        let crd_api = crd_api.clone();
        async move {
            let crd = crd_api.get("inferenceservices.serving.pacer.dev").await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        }
    })
    .await;
}

/// The arguments of the release's operator Deployment (with `--metrics-addr` moved to
/// `metrics_addr`) and a kubeconfig holding a token of its ServiceAccount (a TokenRequest, as
/// the kubelet would make), named after `name`.
async fn as_the_release(
    cluster: &Cluster,
    admin: &kube::Client,
    deployment: &Deployment,
    namespace: &str,
    name: &str,
    metrics_addr: &str,
) -> (Vec<String>, PathBuf) {
    let pod = deployment.spec.as_ref().and_then(|s| s.template.spec.clone()).expect("pod spec");
    let account = pod.service_account_name.clone().expect("a ServiceAccount");
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}});
    let token: Value = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_subresource("token", &account, &PostParams::default(), &request)
        .await
        .expect("a token for the ServiceAccount");
    let kubeconfig = cluster.dir().join(format!("{name}-sa.kubeconfig"));
    token_kubeconfig(cluster, token["status"]["token"].as_str().expect("token"), &kubeconfig);
    let rendered = serde_json::to_value(deployment).expect("json");
    let args = args_of(&rendered["spec"]["template"]["spec"]["containers"][0])
        .into_iter()
        .map(|a| if a.starts_with("--metrics-addr=") { format!("--metrics-addr={metrics_addr}") } else { a })
        .collect();
    (args, kubeconfig)
}

/// Waits up to a minute for the sample's engine Deployment in `namespace`; `who` and the
/// operator's log explain a failure.
async fn engine_created(admin: &kube::Client, namespace: &str, log_path: &Path, who: &str) {
    let engines: Api<Deployment> = Api::namespaced(admin.clone(), namespace);
    let reconciled = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while engines.get_opt("smol").await.ok().flatten().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        reconciled.is_ok(),
        "{who} did not create the engine Deployment:\n{}",
        std::fs::read_to_string(log_path).unwrap_or_default()
    );
}

/// Namespaced mode, as a second release would run next to a cluster-wide CRD: Roles in the
/// watched namespaces only, and the operator, as that release's ServiceAccount, reconciles in
/// them with nothing cluster-scoped granted.
async fn a_namespaced_release_reconciles_with_roles_only(
    cluster: &Cluster,
    admin: &kube::Client,
    chart: &str,
    kubeconfig: &str,
) {
    let values = chart_dir_file("ci/namespaced-values.yaml");
    let install = helm(&[
        "install",
        "pacer-ns",
        chart,
        "-n",
        "pacer-ci-team",
        "--kubeconfig",
        kubeconfig,
        "-f",
        &values,
    ]);
    assert!(install.status.success(), "helm install (namespaced):\n{}", text(&install));
    let deployment = Api::<Deployment>::namespaced(admin.clone(), "pacer-ci-team")
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .next()
        .expect("the namespaced operator Deployment");
    let (args, ns_kubeconfig) =
        as_the_release(cluster, admin, &deployment, "pacer-ci-team", "chart-ns", "127.0.0.1:0").await;
    assert!(args.contains(&"--namespaces=pacer-ci-team,team-a".to_string()), "{args:?}");
    let ns_log_path = cluster.dir().join("chart-ns-operator.log");
    let _namespaced = run_operator(&args, &ns_kubeconfig, "pacer-ci-team", &ns_log_path);
    let mut sample = sample_doc();
    sample["metadata"]["namespace"] = json!("pacer-ci-team");
    apply_json(admin, Some("pacer-ci-team"), sample).await;
    engine_created(admin, "pacer-ci-team", &ns_log_path, "the namespaced operator (Roles only)").await;
    let log = std::fs::read_to_string(&ns_log_path).unwrap_or_default();
    assert!(!log.contains("forbidden"), "the namespaced operator hit RBAC denials:\n{log}");
}

/// The sample InferenceService of the install test (a URL source: needs no PVC or image).
fn sample_doc() -> Value {
    json!({
        "apiVersion": "serving.pacer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "smol", "namespace": "team-a"},
        "spec": {
            "model": {"source": {"url": {
                "url": "https://models.example.com/smol.gguf",
                "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            }}},
            "sla": {"ttftMs": 400, "itlMs": 60},
            "replicas": {"min": 1, "max": 2},
        },
    })
}

fn chart_dir_file(rel: &str) -> String {
    chart().join(rel).to_str().expect("path").to_string()
}
