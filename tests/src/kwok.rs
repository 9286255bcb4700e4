//! kwok's fake nodes: Node objects that kwok keeps Ready and whose pods it moves through their
//! lifecycle (scheduled → Running → Ready, init containers completed) without a kubelet.

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// The annotation kwok selects the nodes it manages by.
pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// kwok's stages: a node turns Ready once; a scheduled pod turns Running and Ready with its
/// init containers completed; a deleted pod goes at once (there is no kubelet to drain it).
pub const CONFIG: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pacer-node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Ready, status: "True", reason: KubeletReady, message: "kwok fake node", lastHeartbeatTime: {{ $now | Quote }}, lastTransitionTime: {{ $now | Quote }}}
      addresses:
      - {type: InternalIP, address: {{ NodeIP | Quote }}}
      - {type: Hostname, address: {{ NodeName | Quote }}}
      allocatable:
      {{ YAML .status.allocatable 1 }}
      capacity:
      {{ YAML .status.capacity 1 }}
      nodeInfo: {kubeletVersion: fake, kubeProxyVersion: fake, operatingSystem: linux, architecture: amd64}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pacer-pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.spec.nodeName', operator: Exists}
    - {key: '.status.phase', operator: In, values: [Pending]}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true, restartCount: 0, state: {running: {startedAt: {{ $now | Quote }}}}}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0, state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pacer-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
  next:
    delete: true
"#;

/// Creates `n` fake nodes and waits until kwok reports them Ready.
pub async fn create_nodes(client: &Client, n: usize) {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..n {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("kwok-node-{i}"),
                "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"type": "kwok", "kubernetes.io/hostname": format!("kwok-node-{i}"), "kubernetes.io/os": "linux"},
            },
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            },
        }))
        .expect("node");
        nodes.create(&PostParams::default(), &node).await.expect("create fake node");
        // The API server taints new nodes not-ready; without a node lifecycle controller
        // (nothing here has a real kubelet to watch) nobody would lift it.
        let untaint = serde_json::json!({"spec": {"taints": null}});
        nodes
            .patch(&format!("kwok-node-{i}"), &PatchParams::default(), &Patch::Merge(&untaint))
            .await
            .expect("untaint fake node");
    }
    crate::eventually(60, "kwok nodes to turn Ready", || {
        let nodes = nodes.clone();
        async move {
            let list = nodes.list(&Default::default()).await.ok()?;
            let ready = list
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            (ready >= n).then_some(())
        }
    })
    .await;
}
