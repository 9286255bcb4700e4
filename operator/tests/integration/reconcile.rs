//! The operator binary against a real control plane with kwok nodes: children with owner
//! references, status and Events, spec changes rolled out, drift reverted, garbage collection,
//! a no-op restart, background deletion and a same-name re-create, cluster mode's namespace
//! selector and exclusions, and leader election between two replicas (and a leader whose
//! apiserver stalls, fenced before a standby leads).

use crate::common::{TestNs, isvc_doc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use pacer_crds::{InferenceService, conditions};
use pacer_tests::{OperatorProcess, eventually};
use serde_json::json;

fn condition(isvc: &InferenceService, type_: &str) -> Option<(String, String, Option<i64>)> {
    let c = isvc.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.observed_generation))
}

/// Waits until the InferenceService reports Ready=True for its current generation.
async fn wait_ready(ns: &TestNs, name: &str, op: &OperatorProcess) -> InferenceService {
    let api = ns.isvcs();
    let what = format!("{name} to turn Ready");
    let found = tokio::time::timeout(std::time::Duration::from_secs(90), async {
        loop {
            if let Ok(isvc) = api.get(name).await
                && let Some((status, _, generation)) = condition(&isvc, conditions::READY)
                && status == "True"
                && generation == isvc.metadata.generation
                && isvc.status.as_ref().and_then(|s| s.observed_generation) == isvc.metadata.generation
            {
                return isvc;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    match found {
        Ok(isvc) => isvc,
        Err(_) => {
            let status = api.get(name).await.ok().and_then(|i| i.status);
            let pods = ns.api::<k8s_openapi::api::core::v1::Pod>().list(&ListParams::default()).await.ok();
            let pods: Vec<String> = pods
                .map(|l| l.items.iter().map(|p| format!("{}: {:?}", p.name_any(), p.status)).collect())
                .unwrap_or_default();
            let deployment = ns.api::<Deployment>().get_opt(name).await.ok().flatten().and_then(|d| d.status);
            panic!(
                "timed out waiting for {what}\nstatus: {status:?}\ndeployment: {deployment:?}\npods:\n{}\noperator log:\n{}",
                pods.join("\n"),
                op.log_text()
            )
        }
    }
}

#[tokio::test]
async fn a_valid_inferenceservice_gets_owned_children_status_and_events() {
    let ns = TestNs::new("children").await;
    let op = ns.operator("only");
    let created = ns.create(isvc_doc("smol")).await;
    let isvc = wait_ready(&ns, "smol", &op).await;

    // Children exist, are owned by the InferenceService (controller reference), and carry the
    // label that ties pods, metrics and the CR together.
    let uid = created.uid().expect("uid");
    let owned_by = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        let refs = meta.owner_references.clone().unwrap_or_default();
        refs.len() == 1 && refs[0].uid == uid && refs[0].controller == Some(true)
    };
    let deployment = ns.api::<Deployment>().get("smol").await.expect("deployment");
    assert!(owned_by(&deployment.metadata));
    assert!(owned_by(&ns.api::<Service>().get("smol").await.expect("service").metadata));
    let cm = ns.api::<ConfigMap>().get("smol-settings").await.expect("configmap");
    assert!(owned_by(&cm.metadata));
    assert_eq!(
        cm.data.expect("data")["settings.json"],
        r#"{"batch_wait_ms":0,"max_batch_size":8,"max_num_batched_tokens":512,"max_step_ms":0,"prefill_hold_ms":0}"#
    );
    assert!(owned_by(&ns.api::<PodDisruptionBudget>().get("smol").await.expect("pdb").metadata));
    let labels =
        deployment.spec.and_then(|s| s.template.metadata).and_then(|m| m.labels).expect("pod labels");
    assert_eq!(labels[pacer_crds::INFERENCESERVICE_LABEL], "smol");

    // Status: generation, replicas under kwok, conditions and the summary for kubectl.
    let status = isvc.status.clone().expect("status");
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!((status.replicas, status.ready_replicas), (Some(1), Some(1)));
    assert_eq!(status.tier.as_deref(), Some("native"));
    assert_eq!(condition(&isvc, conditions::SPEC_VALID).map(|c| c.0), Some("True".into()));
    let summary = status.summary.expect("summary");
    assert_eq!((summary.replicas.as_str(), summary.ttft.as_str()), ("1/1", "-/400ms"));

    // Events say what the operator did.
    let events: Api<Event> = ns.api();
    let reasons = eventually(20, "Events about smol", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            let reasons: Vec<String> = list
                .items
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("smol"))
                .filter_map(|e| e.reason.clone())
                .collect();
            (reasons.iter().any(|r| r == "Created") && reasons.iter().any(|r| r == "Ready"))
                .then_some(reasons)
        }
    })
    .await;
    assert!(reasons.iter().filter(|r| *r == "Created").count() >= 4, "{reasons:?}");

    // Printer columns, as kubectl asks for them (server-side Table).
    let req = http::Request::get(format!(
        "/apis/serving.pacer.dev/v1alpha1/namespaces/{}/inferenceservices/smol",
        ns.name
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .expect("request");
    let table: serde_json::Value = ns.admin.request(req).await.expect("table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["Name", "Ready", "Replicas", "Tier", "TTFT", "ITL", "SLA", "Age"]);
    let cells = &table["rows"][0]["cells"];
    assert_eq!(
        (cells[1].as_str(), cells[2].as_str(), cells[3].as_str()),
        (Some("True"), Some("1/1"), Some("native"))
    );
    assert_eq!(
        (cells[4].as_str(), cells[5].as_str(), cells[6].as_str()),
        (Some("-/400ms"), Some("-/60ms"), Some("Unknown"))
    );
}

#[tokio::test]
async fn spec_changes_roll_out_and_edits_to_owned_fields_are_reverted() {
    let ns = TestNs::new("drift").await;
    let op = ns.operator("only");
    ns.create(isvc_doc("smol")).await;
    wait_ready(&ns, "smol", &op).await;
    let deployments: Api<Deployment> = ns.api();

    // A spec change: more replicas and an extra engine argument.
    let patch =
        json!({"spec": {"replicas": {"min": 2, "max": 3}, "engine": {"args": ["--kv-cache-tokens=4096"]}}});
    ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch spec");
    let isvc = wait_ready(&ns, "smol", &op).await;
    assert_eq!(isvc.status.as_ref().and_then(|s| s.ready_replicas), Some(2));
    let d = deployments.get("smol").await.expect("deployment");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let args = spec.template.spec.expect("pod").containers[0].args.clone().expect("args");
    assert_eq!(args.last().map(String::as_str), Some("--kv-cache-tokens=4096"));

    // Someone scales the Deployment by hand, with another field manager: reverted.
    let edit = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 5}});
    deployments
        .patch("smol", &PatchParams::apply("someone").force(), &Patch::Apply(&edit))
        .await
        .expect("manual scale");
    eventually(30, "the manual scale to be reverted", || {
        let deployments = deployments.clone();
        async move { (deployments.get("smol").await.ok()?.spec?.replicas == Some(2)).then_some(()) }
    })
    .await;

    // Someone edits the live settings: reverted. Someone deletes the Service: recreated.
    let configmaps: Api<ConfigMap> = ns.api();
    let edit = json!({"data": {"settings.json": "{\"max_batch_size\": 1}"}});
    configmaps
        .patch("smol-settings", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit settings");
    ns.api::<Service>().delete("smol", &DeleteParams::default()).await.expect("delete service");
    eventually(30, "the settings edit to be reverted and the Service recreated", || {
        let (configmaps, services) = (configmaps.clone(), ns.api::<Service>());
        async move {
            let cm = configmaps.get("smol-settings").await.ok()?;
            let restored = cm.data?.get("settings.json")?.contains("\"max_batch_size\":8");
            (restored && services.get_opt("smol").await.ok()?.is_some()).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn deleting_the_inferenceservice_removes_its_children() {
    let ns = TestNs::new("gc").await;
    let op = ns.operator("only");
    ns.create(isvc_doc("smol")).await;
    wait_ready(&ns, "smol", &op).await;
    ns.isvcs().delete("smol", &DeleteParams::foreground()).await.expect("delete");
    eventually(60, "the garbage collector to remove the children", || {
        let (d, s, c, p) = (
            ns.api::<Deployment>(),
            ns.api::<Service>(),
            ns.api::<ConfigMap>(),
            ns.api::<PodDisruptionBudget>(),
        );
        async move {
            let gone = d.get_opt("smol").await.ok()?.is_none()
                && s.get_opt("smol").await.ok()?.is_none()
                && c.get_opt("smol-settings").await.ok()?.is_none()
                && p.get_opt("smol").await.ok()?.is_none();
            gone.then_some(())
        }
    })
    .await;
}

/// The resource versions of the InferenceService and its children.
async fn versions(ns: &TestNs) -> Vec<(String, String)> {
    let rv = |kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        (kind.to_string(), meta.resource_version.clone().unwrap_or_default())
    };
    vec![
        rv("InferenceService", &ns.isvcs().get("smol").await.expect("isvc").metadata),
        rv("Deployment", &ns.api::<Deployment>().get("smol").await.expect("deployment").metadata),
        rv("Service", &ns.api::<Service>().get("smol").await.expect("service").metadata),
        rv("ConfigMap", &ns.api::<ConfigMap>().get("smol-settings").await.expect("configmap").metadata),
        rv("PodDisruptionBudget", &ns.api::<PodDisruptionBudget>().get("smol").await.expect("pdb").metadata),
    ]
}

#[tokio::test]
async fn a_restarted_operator_writes_nothing() {
    let ns = TestNs::new("restart").await;
    let mut first = ns.operator("first");
    ns.create(isvc_doc("smol")).await;
    wait_ready(&ns, "smol", &first).await;
    // Let the Deployment's status settle (kwok and the controller manager write it).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let before = versions(&ns).await;
    first.stop();

    let second = ns.operator("second");
    eventually(30, "the restarted operator to reconcile", || async {
        (second.metric("pacer_operator_reconciles_total", "result=\"ok\"").await? >= 1.0).then_some(())
    })
    .await;
    // Another evaluation cannot pass without a reconcile, so force one with a no-op label.
    let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
    ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&touch)).await.expect("touch");
    eventually(30, "a second reconcile", || async {
        (second.metric("pacer_operator_reconciles_total", "result=\"ok\"").await? >= 2.0).then_some(())
    })
    .await;
    let after = versions(&ns).await;
    // The label changed the InferenceService itself; nothing the operator writes changed.
    assert_eq!(before[1..], after[1..], "children were rewritten by a no-op reconcile");
    assert_eq!(second.metric("pacer_operator_writes_total", "").await, Some(0.0), "{}", second.log_text());
}

#[tokio::test]
async fn two_operator_replicas_never_both_act() {
    let ns = TestNs::new("leader").await;
    let a = ns.operator("a");
    let b = ns.operator("b");
    let (leader, _) = eventually(30, "one replica to lead", || async {
        let la = a.metric("pacer_operator_leader", "").await?;
        let lb = b.metric("pacer_operator_leader", "").await?;
        match (la, lb) {
            (1.0, 0.0) => Some(("a", "b")),
            (0.0, 1.0) => Some(("b", "a")),
            _ => None,
        }
    })
    .await;
    let (mut leader, follower) = if leader == "a" { (a, b) } else { (b, a) };

    ns.create(isvc_doc("smol")).await;
    wait_ready(&ns, "smol", &leader).await;
    let follower_proc = &follower;
    // The follower has stood by the whole time.
    assert_eq!(follower_proc.metric("pacer_operator_reconciles_total", "").await, Some(0.0));
    assert_eq!(follower_proc.metric("pacer_operator_writes_total", "").await, Some(0.0));
    assert_eq!(follower_proc.metric("pacer_operator_leader", "").await, Some(0.0));

    // The leader goes away (SIGTERM releases the Lease); the follower takes over and acts.
    leader.stop();
    eventually(30, "the follower to take the Lease", || async {
        (follower_proc.metric("pacer_operator_leader", "").await? == 1.0).then_some(())
    })
    .await;
    let patch = json!({"spec": {"replicas": {"min": 2}}});
    ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    let isvc = wait_ready(&ns, "smol", follower_proc).await;
    assert_eq!(isvc.status.and_then(|s| s.ready_replicas), Some(2));
}

#[tokio::test]
async fn the_samples_run_under_kwok() {
    use k8s_openapi::api::core::v1::Node;
    let ns = TestNs::new("samples").await;
    // What the samples expect of a cluster: a claim `models` (bound to a volume here), and
    // nodes labelled for the image and GPU samples' node selectors (the fake nodes have GPUs).
    let volume = format!("models-{}", ns.name);
    crate::common::apply_json(
        &ns.admin,
        None,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                     "hostPath": {"path": "/var/lib/models"},
                     "claimRef": {"namespace": ns.name, "name": "models"}},
        }),
    )
    .await;
    crate::common::apply_json(
        &ns.admin,
        Some(&ns.name),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models"},
            "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": volume,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await;
    let nodes: Api<Node> = Api::all(ns.admin.clone());
    for node in nodes.list(&ListParams::default()).await.expect("nodes").items {
        let label = json!({"metadata": {"labels": {"pacer.dev/pool": "inference", "nvidia.com/gpu.present": "true"}}});
        nodes
            .patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&label))
            .await
            .expect("label node");
    }

    let op = ns.operator("only");
    let mut names = Vec::new();
    let mut samples: Vec<_> = std::fs::read_dir(crate::common::repo_file("config/samples"))
        .expect("samples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    samples.sort();
    assert!(samples.len() >= 3, "{samples:?}");
    for path in &samples {
        let text = std::fs::read_to_string(path).expect("sample");
        for obj in crate::common::apply_yaml(&ns.admin, Some(&ns.name), &text).await {
            names.push((obj.name_any(), path.display().to_string()));
        }
    }
    for (name, path) in &names {
        let isvc = wait_ready(&ns, name, &op).await;
        let status = isvc.status.clone().expect("status");
        assert_eq!(status.ready_replicas, Some(isvc.spec.replicas.min), "{path}");
        assert_eq!(status.tier.as_deref(), Some(isvc.spec.quantization.preferred().as_str()), "{path}");
    }
}

/// The engine pod spec of the Deployment `smol`, as JSON, once it exists.
async fn pod_spec(ns: &TestNs) -> Option<serde_json::Value> {
    let d = ns.api::<Deployment>().get_opt("smol").await.ok()??;
    serde_json::to_value(d.spec?.template.spec?).ok()
}

#[tokio::test]
async fn fields_removed_from_the_spec_leave_the_deployment() {
    let ns = TestNs::new("removal").await;
    let op = ns.operator("only");
    let mut doc = isvc_doc("smol");
    doc["spec"]["engine"] = json!({
        "nodeSelector": {"pacer.dev/pool": "inference"},
        "tolerations": [{"key": "pacer.dev/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "env": [{"name": "RUST_LOG", "value": "debug"}],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "3", "memory": "1Gi"}},
        "args": ["--kv-cache-tokens=4096"],
    });
    ns.create(doc).await;
    let set = eventually(60, "the engine fields in the Deployment", || async {
        let pod = pod_spec(&ns).await?;
        let c = &pod["containers"][0];
        let all = pod["nodeSelector"]["pacer.dev/pool"] == "inference"
            && pod["tolerations"][0]["key"] == "pacer.dev/dedicated"
            && c["env"][0]["name"] == "RUST_LOG"
            && c["resources"]["limits"]["cpu"] == "3"
            && c["args"].as_array()?.iter().any(|a| a == "--kv-cache-tokens=4096");
        all.then_some(pod)
    })
    .await;
    assert!(set["containers"][0]["args"].as_array().is_some());

    // Remove every one of them (null deletes in a merge patch; resources fall back to the default).
    let patch = json!({"spec": {"engine": {"nodeSelector": null, "tolerations": null, "env": null, "resources": null, "args": null}}});
    ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    let pod = eventually(60, "the removed fields to leave the Deployment", || async {
        let pod = pod_spec(&ns).await?;
        let c = &pod["containers"][0];
        let gone = pod.get("nodeSelector").is_none()
            && pod.get("tolerations").is_none()
            && c.get("env").is_none()
            && c["resources"]["limits"].get("cpu").is_none()
            && !c["args"].as_array()?.iter().any(|a| a == "--kv-cache-tokens=4096");
        gone.then_some(pod)
    })
    .await;
    // The default resources took their place.
    assert_eq!(pod["containers"][0]["resources"]["limits"]["memory"], "2Gi", "{pod}");
    assert_eq!(pod["containers"][0]["resources"]["requests"]["cpu"], "2", "{pod}");
    wait_ready(&ns, "smol", &op).await;
}

#[tokio::test]
async fn the_batch_lever_moves_the_configmap_and_not_the_pod_template() {
    let ns = TestNs::new("batch").await;
    let op = ns.operator("only");
    ns.create(isvc_doc("smol")).await;
    wait_ready(&ns, "smol", &op).await;
    let deployments: Api<Deployment> = ns.api();
    let before = deployments.get("smol").await.expect("deployment");
    let configmaps: Api<ConfigMap> = ns.api();
    assert_eq!(
        configmaps.get("smol-settings").await.expect("cm").data.expect("data")["settings.json"],
        r#"{"batch_wait_ms":0,"max_batch_size":8,"max_num_batched_tokens":512,"max_step_ms":0,"prefill_hold_ms":0}"#
    );

    // Narrowing the range moves the lever (8 → 4) and raises the wait floor (0 → 5).
    let patch = json!({"spec": {"batching": {"maxBatchSize": {"min": 1, "max": 4, "initial": 4},
                                             "batchWaitMs": {"min": 5, "max": 20, "initial": 5}}}});
    ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    eventually(30, "the settings ConfigMap to carry the new batch settings", || {
        let configmaps = configmaps.clone();
        async move {
            let data = configmaps.get("smol-settings").await.ok()?.data?;
            (data.get("settings.json")?
                == r#"{"batch_wait_ms":5,"max_batch_size":4,"max_num_batched_tokens":512,"max_step_ms":0,"prefill_hold_ms":0}"#)
                .then_some(())
        }
    })
    .await;
    let isvc = wait_ready(&ns, "smol", &op).await;
    assert_eq!(isvc.status.as_ref().and_then(|s| s.max_batch_size), Some(4));
    let after = deployments.get("smol").await.expect("deployment");
    assert_eq!(before.metadata.generation, after.metadata.generation, "the Deployment spec changed");
    assert_eq!(before.spec.as_ref().map(|s| &s.template), after.spec.as_ref().map(|s| &s.template));

    // A tier change, by contrast, is a new template (a rolling update).
    let patch = json!({"spec": {"quantization": {"allowedTiers": ["q8_0", "native"]}}});
    ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    let isvc = wait_ready(&ns, "smol", &op).await;
    assert_eq!(isvc.status.as_ref().and_then(|s| s.tier.as_deref()), Some("q8_0"));
    let rolled = deployments.get("smol").await.expect("deployment");
    assert!(rolled.metadata.generation > after.metadata.generation);
}

#[tokio::test]
async fn a_child_the_api_server_rejects_is_reported_not_retried() {
    let ns = TestNs::new("rejected").await;
    let op = ns.operator("only");
    // Pod validation refuses this field path; the CRD has no rule for it, so it reaches the
    // Deployment.
    let mut doc = isvc_doc("smol");
    doc["spec"]["engine"] =
        json!({"env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nowhere"}}}]});
    ns.create(doc).await;
    let api = ns.isvcs();
    let message = eventually(30, "Ready=False with reason ChildRejected", || {
        let api = api.clone();
        async move {
            let isvc = api.get("smol").await.ok()?;
            let c = isvc.status?.conditions.into_iter().find(|c| c.type_ == conditions::READY)?;
            (c.status == "False" && c.reason == conditions::reasons::CHILD_REJECTED).then_some(c.message)
        }
    })
    .await;
    assert!(message.contains("Deployment smol") && message.contains("spec.nowhere"), "{message}");
    let events: Api<Event> = ns.api();
    eventually(20, "a Warning Event with the API's message", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some("ChildRejected")
                        && e.note.as_deref().is_some_and(|n| n.contains("spec.nowhere"))
                })
                .then_some(())
        }
    })
    .await;
    // No retry loop: the attempts stop once the status says why.
    let writes = || op.metric("pacer_operator_writes_total", "kind=\"Deployment\"");
    let first = writes().await;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(writes().await, first, "the rejected Deployment is retried:\n{}", op.log_text());
    // One attempt per trigger that reaches the controller before the status records the
    // refusal: the create, the settings ConfigMap's creation and the status write itself, which
    // coalesce into fewer reconciles on a fast machine (a cold CI run saw all three).
    assert!(first.unwrap_or(0.0) <= 3.0, "{first:?}");
    assert_eq!(op.metric("pacer_operator_reconcile_errors_total", "").await, Some(0.0));

    // Fixing the spec clears the condition.
    let patch = json!({"spec": {"engine": {"env": null}}});
    api.patch("smol", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("fix");
    wait_ready(&ns, "smol", &op).await;
}

/// `--namespaces a,b`: one operator reconciles InferenceServices in both, and leaves those of a
/// namespace it was not given alone (no children, no status), though its RBAC would allow it.
#[tokio::test]
async fn a_list_of_namespaces_is_watched_and_nothing_else() {
    let first = TestNs::new("multi-a").await;
    let second = pacer_tests::namespace(&first.admin, "multi-b").await;
    let other = pacer_tests::namespace(&first.admin, "multi-c").await;
    let op = first.operator_with("multi", &[format!("--namespaces={second}")]);
    first.create(isvc_doc("smol")).await;
    let isvc: InferenceService = serde_json::from_value(isvc_doc("smol")).expect("isvc");
    for ns in [&second, &other] {
        Api::<InferenceService>::namespaced(first.admin.clone(), ns)
            .create(&Default::default(), &isvc)
            .await
            .expect("create");
    }
    for ns in [&first.name, &second] {
        let deployments: Api<Deployment> = Api::namespaced(first.admin.clone(), ns);
        let isvcs: Api<InferenceService> = Api::namespaced(first.admin.clone(), ns);
        eventually(60, &format!("the Deployment and status in {ns}"), || {
            let (deployments, isvcs) = (deployments.clone(), isvcs.clone());
            async move {
                deployments.get_opt("smol").await.ok()??;
                isvcs.get("smol").await.ok()?.status?.observed_generation.map(|_| ())
            }
        })
        .await;
    }
    // The first two are done; the third has had the same time and more.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let ignored: Api<Deployment> = Api::namespaced(first.admin.clone(), &other);
    assert!(ignored.get_opt("smol").await.expect("get").is_none(), "{}", op.log_text());
    let isvc =
        Api::<InferenceService>::namespaced(first.admin.clone(), &other).get("smol").await.expect("get");
    assert!(isvc.status.is_none(), "status written in an unwatched namespace: {:?}", isvc.status);
    let log = op.log_text();
    assert!(log.contains(&second) && !log.contains(&other), "the log names the watched namespaces only");
}

/// Background deletion (the default propagation) gives the operator no last reconcile: its
/// sweep against the watch caches forgets the service (planner state, gauges, retries), the
/// garbage collector removes the children, and a service re-created under the same name gets
/// children owned by the new object and a status of its own. (Foreground deletion is
/// `deleting_the_inferenceservice_removes_its_children`.)
#[tokio::test]
async fn a_background_deletion_is_forgotten_and_a_recreated_service_starts_afresh() {
    let ns = TestNs::new("bg-delete").await;
    // A Prometheus URL nothing answers: the SLA loop runs (and holds), so it keeps state.
    let op = ns.operator_with(
        "only",
        &["--prometheus-url=http://127.0.0.1:9".into(), "--metrics-interval=1".into()],
    );
    let first = ns.create(isvc_doc("smol")).await;
    wait_ready(&ns, "smol", &op).await;
    ns.isvcs().delete("smol", &DeleteParams::background()).await.expect("delete");
    eventually(60, "the sweep to forget the deleted service", || {
        let log = op.log_text();
        async move { log.contains("forgetting a deleted InferenceService").then_some(()) }
    })
    .await;
    let deployments = ns.api::<Deployment>();
    eventually(60, "the garbage collector to remove the Deployment", || {
        let deployments = deployments.clone();
        async move { deployments.get_opt("smol").await.ok()?.is_none().then_some(()) }
    })
    .await;

    let second = ns.create(isvc_doc("smol")).await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    let ready = wait_ready(&ns, "smol", &op).await;
    let status = ready.status.expect("status");
    assert_eq!(status.last_decision, None, "the new object inherited a decision: {status:?}");
    let deployment = deployments.get("smol").await.expect("deployment");
    let owners: Vec<_> = deployment.owner_references().iter().map(|o| o.uid.clone()).collect();
    assert_eq!(owners, vec![second.metadata.uid.clone().expect("uid")]);
}

/// Cluster mode with `--namespace-selector`: the operator acts in the namespaces whose labels
/// match and leaves the others alone (no child, no status); a namespace that gains the label
/// is picked up at once (its watch triggers the reconciles; the out-of-scope recheck is minutes
/// away); `kube-system` is excluded by default even when it carries the label.
#[tokio::test]
async fn a_namespace_selector_and_the_exclusions_bound_where_cluster_mode_acts() {
    let lease = TestNs::new("selector").await;
    let admin = lease.admin.clone();
    let (key, value) = ("pacer.dev/test-selector", lease.name.clone());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let label =
        |on: bool| json!({"metadata": {"labels": {key: if on { Some(value.as_str()) } else { None }}}});
    let selected = pacer_tests::namespace(&admin, "sel-on").await;
    let unlabelled = pacer_tests::namespace(&admin, "sel-off").await;
    namespaces.patch(&selected, &PatchParams::default(), &Patch::Merge(&label(true))).await.expect("label");
    namespaces
        .patch("kube-system", &PatchParams::default(), &Patch::Merge(&label(true)))
        .await
        .expect("label");
    let name = format!("smol-{}", lease.name);
    let mut isvc: InferenceService = serde_json::from_value(isvc_doc("smol")).expect("isvc");
    isvc.metadata.name = Some(name.clone());
    for ns in [&selected, &unlabelled, "kube-system"] {
        Api::<InferenceService>::namespaced(admin.clone(), ns)
            .create(&Default::default(), &isvc)
            .await
            .expect("create");
    }
    let op = lease.cluster_wide_operator("sel", &[format!("--namespace-selector={key}={value}")]);
    let acted = |ns: String| {
        let (deployments, isvcs) = (
            Api::<Deployment>::namespaced(admin.clone(), &ns),
            Api::<InferenceService>::namespaced(admin.clone(), &ns),
        );
        let name = name.clone();
        async move {
            deployments.get_opt(&name).await.ok()??;
            isvcs.get(&name).await.ok()?.status?.observed_generation.map(|_| ())
        }
    };
    eventually(60, "the Deployment and status in the selected namespace", || acted(selected.clone())).await;
    // The selected one is done; the others have had the same time and more.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    for ns in [unlabelled.as_str(), "kube-system"] {
        assert!(acted(ns.to_string()).await.is_none(), "acted in {ns}: {}", op.log_text());
        let left = Api::<InferenceService>::namespaced(admin.clone(), ns).get(&name).await.expect("get");
        assert!(left.status.is_none(), "status written in {ns}: {:?}", left.status);
    }
    namespaces.patch(&unlabelled, &PatchParams::default(), &Patch::Merge(&label(true))).await.expect("label");
    eventually(30, "the namespace that gained the label to be picked up", || acted(unlabelled.clone())).await;
    assert!(acted("kube-system".into()).await.is_none(), "acted in kube-system: {}", op.log_text());
    Api::<InferenceService>::namespaced(admin.clone(), "kube-system")
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    namespaces
        .patch("kube-system", &PatchParams::default(), &Patch::Merge(&label(false)))
        .await
        .expect("unlabel");
}

/// A leader whose Lease renewals hang (its apiserver connection stalls, nothing is closed)
/// lowers its write fence and steps down by its renew deadline, before a standby — counting
/// the lease duration from the last renewal it saw — takes the Lease: there is no moment
/// with two leaders. Before renewals were bounded, the old leader's renewal waited forever
/// and it kept acting.
#[tokio::test]
async fn a_leader_whose_renewals_hang_is_fenced_before_a_standby_leads() {
    use k8s_openapi::api::coordination::v1::Lease;
    use pacer_operator::leader::{Elector, Timing};
    use std::time::{Duration, Instant};
    let ns = TestNs::new("fence").await;
    let cluster = crate::common::cluster();
    let mut config = cluster.admin_config().await;
    let target = {
        let url = &config.cluster_url;
        let host = url.host().expect("apiserver host");
        let port = url.port_u16().expect("apiserver port");
        tokio::net::lookup_host((host, port)).await.expect("apiserver address").next().expect("an address")
    };
    let proxy = pacer_tests::StallProxy::start(target).await;
    config.cluster_url = format!("https://{}", proxy.addr()).parse().expect("proxy url");
    let via_proxy = kube::Client::try_from(config).expect("client through the proxy");

    let timing = Timing {
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry: Duration::from_millis(500),
    };
    let mut old = Elector::new(Api::<Lease>::namespaced(via_proxy, &ns.name), "fence", "old", timing);
    old.acquire().await.expect("the first leader");
    let fence = old.leadership();
    let (leading_tx, leading) = tokio::sync::watch::channel(true);
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let keeper = tokio::spawn(old.keep(leading_tx, stop_rx));
    // Renewals go through: the fence stays up past one renew deadline.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(fence.is_leading() && *leading.borrow(), "the leader lost its fence while renewals worked");

    proxy.stall();
    let stalled = Instant::now();
    // Record when the old leader's fence falls.
    let fell = tokio::spawn({
        let fence = fence.clone();
        async move {
            while fence.is_leading() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Instant::now()
        }
    });
    let mut standby =
        Elector::new(Api::<Lease>::namespaced(ns.admin.clone(), &ns.name), "fence", "standby", timing);
    tokio::time::timeout(Duration::from_secs(30), standby.acquire())
        .await
        .expect("the standby never took the Lease")
        .expect("the standby's election");
    let standby_leads = Instant::now();
    assert!(!fence.is_leading(), "two leaders: the old one's fence was still up when the standby led");
    assert!(!*leading.borrow(), "two leaders: the old one had not stepped down when the standby led");
    let fell = fell.await.expect("fence watcher");
    assert!(fell < standby_leads, "the fence fell after the standby led");
    assert!(
        fell - stalled <= timing.renew_deadline + Duration::from_secs(1),
        "the fence fell {:?} after the stall, past the renew deadline",
        fell - stalled
    );
    tokio::time::timeout(Duration::from_secs(2), keeper)
        .await
        .expect("the old keeper still runs")
        .expect("keeper");
    proxy.resume();
    let lease = Api::<Lease>::namespaced(ns.admin.clone(), &ns.name).get("fence").await.expect("lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("standby"));
}
