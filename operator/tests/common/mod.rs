//! Shared setup of the cluster tests: one control plane per test binary (started on first use),
//! the CRD and the operator's RBAC installed once, and per test a namespace with the operator
//! running in it under its own least-privileged identity.
#![allow(dead_code, missing_docs)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use pacer_crds::InferenceService;
use pacer_tests::{Cluster, OperatorProcess, Workloads, eventually, yaml_documents};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub mod cases;

pub const OPERATOR: &str = env!("CARGO_BIN_EXE_pacer-operator");

/// The helm version `scripts/build-cluster-bins.sh` installs.
pub const HELM_VERSION: &str = "4.3.2";

/// The cache of built tools (`PACER_CACHE`, else `$XDG_CACHE_HOME/pacer`, else `~/.cache/pacer`).
pub fn cache() -> PathBuf {
    std::env::var_os("PACER_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"))
            .join("pacer")
    })
}

/// A cached tool, or a failure that names the script building it (never a silent skip).
pub fn tool(dir: &str, name: &str, script: &str) -> PathBuf {
    let path = cache().join("bin").join(dir).join(name);
    assert!(path.exists(), "no {} : run {script} (scripts/test.sh does)", path.display());
    path
}

pub fn helm_bin() -> PathBuf {
    tool(&format!("helm-{HELM_VERSION}"), "helm", "scripts/build-cluster-bins.sh")
}

/// Runs helm with `args`; helm's own state (cache, config) stays in a throwaway directory.
pub fn helm(args: &[&str]) -> Output {
    let home = std::env::temp_dir().join(format!("pacer-helm-{}", std::process::id()));
    Command::new(helm_bin())
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm")
}

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The real model: `PACER_MODEL`, else the file `scripts/fetch-model.sh` caches.
pub fn model() -> PathBuf {
    std::env::var_os("PACER_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(PathBuf::from(home).join(".cache/pacer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        })
        .filter(|p| p.is_file())
        .expect("model not found: run scripts/fetch-model.sh or set PACER_MODEL")
}

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The control plane shared by this test binary, with the CRD and RBAC installed.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        // Started on a runtime of its own: each test's runtime ends with the test.
        std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let cluster = Cluster::start(Workloads::Pods { nodes: 3 }).await;
                let admin = cluster.admin().await;
                install_crd(&admin).await;
                apply_yaml(&admin, None, &std::fs::read_to_string(repo_file("config/rbac/operator.yaml")).expect("rbac"))
                    .await;
                let binding = serde_json::json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": "pacer-operator"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pacer-operator"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "pacer-operator"}],
                });
                apply_json(&admin, None, binding).await;
                // Reading namespaces, for the tests of cluster mode with a namespace selector.
                let binding = serde_json::json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": "pacer-operator-namespaces"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pacer-operator-namespaces"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "pacer-operator"}],
                });
                apply_json(&admin, None, binding).await;
                cluster
            })
        })
        .join()
        .expect("cluster start-up")
    })
}

pub async fn install_crd(admin: &Client) {
    let text = std::fs::read_to_string(repo_file("crds/inferenceservice.yaml")).expect("crd yaml");
    apply_yaml(admin, None, &text).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    eventually(30, "the CRD to be established", || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("inferenceservices.serving.pacer.dev").await.ok()?;
            let established =
                crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        }
    })
    .await;
}

/// Server-side applies every document of `text` (as `kubectl apply --server-side` does).
pub async fn apply_yaml(client: &Client, namespace: Option<&str>, text: &str) -> Vec<DynamicObject> {
    let mut out = Vec::new();
    for doc in yaml_documents(text) {
        out.push(apply_json(client, namespace, doc).await);
    }
    out
}

pub async fn apply_json(client: &Client, namespace: Option<&str>, doc: serde_json::Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
    let types = obj.types.clone().expect("apiVersion and kind");
    let gvk = GroupVersionKind::try_from(&types).expect("gvk");
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.expect("discover kind");
    let api: Api<DynamicObject> = match (caps.scope, namespace) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (kube::discovery::Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
        (kube::discovery::Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    };
    api.patch(&obj.name_any(), &PatchParams::apply("pacer-tests").force(), &Patch::Apply(&doc))
        .await
        .unwrap_or_else(|e| panic!("applying {} {}: {e}", types.kind, obj.name_any()))
}

/// One test's world: a namespace, the leader-election binding in it, and an admin client.
pub struct TestNs {
    pub name: String,
    pub admin: Client,
}

impl TestNs {
    pub async fn new(prefix: &str) -> TestNs {
        let admin = cluster().admin().await;
        let name = pacer_tests::namespace(&admin, prefix).await;
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "pacer-operator-leader-election", "namespace": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pacer-operator-leader-election"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "pacer-operator"}],
        });
        apply_json(&admin, Some(&name), binding).await;
        TestNs { name, admin }
    }

    /// Starts an operator (the real binary, as the `pacer-operator` user) scoped to this namespace.
    pub fn operator(&self, identity: &str) -> OperatorProcess {
        let c = cluster();
        OperatorProcess::start(Path::new(OPERATOR), &c.operator_kubeconfig(), &self.name, identity, c.dir())
    }

    /// An operator in cluster mode (every namespace, narrowed by `extra` flags only), electing
    /// its leader in this namespace.
    pub fn cluster_wide_operator(&self, identity: &str, extra: &[String]) -> OperatorProcess {
        let c = cluster();
        OperatorProcess::start_cluster_wide(
            Path::new(OPERATOR),
            &c.operator_kubeconfig(),
            &self.name,
            identity,
            c.dir(),
            extra,
        )
    }

    /// [`TestNs::operator`] with extra `run` flags.
    pub fn operator_with(&self, identity: &str, extra: &[String]) -> OperatorProcess {
        let c = cluster();
        OperatorProcess::start_with(
            Path::new(OPERATOR),
            &c.operator_kubeconfig(),
            &self.name,
            identity,
            c.dir(),
            extra,
        )
    }

    pub fn isvcs(&self) -> Api<InferenceService> {
        Api::namespaced(self.admin.clone(), &self.name)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.admin.clone(), &self.name)
    }

    pub async fn create(&self, doc: serde_json::Value) -> InferenceService {
        let isvc: InferenceService = serde_json::from_value(doc).expect("an InferenceService");
        self.isvcs().create(&Default::default(), &isvc).await.expect("create InferenceService")
    }
}

/// A valid InferenceService document named `name` (URL source: needs no PVC or image).
pub fn isvc_doc(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "serving.pacer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": {"url": {
                "url": "https://models.example.com/smol.gguf",
                "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            }}},
            "sla": {"ttftMs": 400, "itlMs": 60},
            "replicas": {"min": 1, "max": 3},
        },
    })
}

pub fn pod_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PodMonitor"),
        "podmonitors",
    )
}
