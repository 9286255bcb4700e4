//! One reconcile against a mocked API server, as kube-rs' `controller-rs` tests its reconciler:
//! what the controller writes, in which order and under which field manager, and what it leaves
//! alone, without a control plane. A `tower` service stands in for the API server: it records
//! every request and answers as the real one does for a server-side apply, a status patch and an
//! Event, or with the error a test asks for. The watch caches are filled by hand.
//!
//! The API server's own side (admission, CEL, garbage collection, watches, a Lease) is tested
//! against a real one in `tests/integration/`.

use super::reconcile::retry_delay;
use super::*;
use crate::build::fixtures;
use crate::scope::Scope;
use http::{Request, Response};
use kube::client::Body;
use kube::runtime::watcher::Event as WatchEvent;
use serde_json::{Value, json};
use std::sync::Mutex;

/// One request the mocked API server received.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

impl Call {
    /// The resource written: `deployments`, `inferenceservices/status`, `events`, ….
    fn resource(&self) -> String {
        let parts: Vec<&str> = self.path.split('/').collect();
        match parts.iter().position(|p| *p == "namespaces") {
            // …/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]
            Some(i) => match (parts.get(i + 2), parts.get(i + 4)) {
                (Some(r), Some(sub)) => format!("{r}/{sub}"),
                (Some(r), None) => (*r).to_string(),
                _ => self.path.clone(),
            },
            None => self.path.clone(),
        }
    }

    /// A server-side apply of a child (not a status, not an Event).
    fn is_child_apply(&self) -> bool {
        let resource = self.resource();
        self.method == "PATCH" && !resource.contains('/') && resource != "events"
    }

    fn is_status(&self) -> bool {
        self.resource() == "inferenceservices/status"
    }

    fn is_event(&self) -> bool {
        self.resource() == "events"
    }
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// A Kubernetes `Status` error as the API server sends it.
fn status_error(code: u16, reason: &str, message: &str) -> (u16, Value) {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    (code, body)
}

/// A client whose API server records every request and answers it: first `answer` (a test's
/// error), else as a real API server does — an applied child comes back as sent (with a uid), a
/// status patch returns the InferenceService with that status, an Event is created.
fn api_server(
    isvc: &InferenceService,
    answer: impl Fn(&Call) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> (Client, Calls) {
    let calls: Calls = Arc::default();
    let (log, isvc) = (calls.clone(), serde_json::to_value(isvc).expect("isvc json"));
    let answer = Arc::new(answer);
    let service = tower::service_fn(move |request: Request<Body>| {
        let (log, isvc, answer) = (log.clone(), isvc.clone(), answer.clone());
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.expect("request body");
            let call = Call {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body: if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes).expect("json")
                },
            };
            log.lock().expect("calls").push(call.clone());
            let (code, reply) = answer(&call).unwrap_or_else(|| match call.method.as_str() {
                "PATCH" if call.is_status() => {
                    let mut isvc = isvc.clone();
                    isvc["status"] = call.body["status"].clone();
                    (200, isvc)
                }
                "PATCH" => {
                    let mut object = call.body.clone();
                    object["metadata"]["uid"] = json!("00000000-0000-4000-8000-00000000c41d");
                    object["metadata"]["resourceVersion"] = json!("1");
                    (200, object)
                }
                "POST" if call.is_event() => (201, call.body.clone()),
                _ => status_error(
                    404,
                    "NotFound",
                    &format!("{} {} is not served here", call.method, call.path),
                ),
            });
            let response = Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&reply).expect("reply")))
                .expect("response");
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    (Client::new(service, "default"), calls)
}

/// The children the watch caches hold when the reconcile starts.
#[derive(Default, Clone)]
struct Children {
    configmaps: Vec<ConfigMap>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    pdbs: Vec<PodDisruptionBudget>,
}

impl Children {
    /// The children as the API server returned them to `calls`' applies.
    fn from_applies(calls: &[Call]) -> Children {
        let mut children = Children::default();
        for call in calls.iter().filter(|c| c.is_child_apply()) {
            let object = call.body.clone();
            match call.resource().as_str() {
                "configmaps" => children.configmaps.push(serde_json::from_value(object).expect("configmap")),
                "deployments" => {
                    children.deployments.push(serde_json::from_value(object).expect("deployment"))
                }
                "services" => children.services.push(serde_json::from_value(object).expect("service")),
                "poddisruptionbudgets" => children.pdbs.push(serde_json::from_value(object).expect("pdb")),
                other => panic!("unexpected child {other}"),
            }
        }
        children
    }
}

/// A filled watch cache holding `objects`.
fn filled<K>(objects: Vec<K>) -> Store<K>
where
    K: reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&WatchEvent::Init);
    for object in objects {
        writer.apply_watcher_event(&WatchEvent::InitApply(object));
    }
    writer.apply_watcher_event(&WatchEvent::InitDone);
    store
}

/// The moment every condition is stamped with.
fn now() -> Time {
    Time(Timestamp::from_second(1_800_000_000).expect("timestamp"))
}

/// The controller's context as `run` builds it, on `client`, with `children` in the caches, no
/// metrics source, acting everywhere but `kube-system`.
fn context(client: Client, children: Children, leadership: Leadership) -> Arc<Context> {
    let scope = Scope::new(Vec::new(), vec!["kube-system".into()], None).expect("scope");
    let reporter = Reporter { controller: "pacer-operator".into(), instance: Some("test".into()) };
    Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics: Metrics::new(),
        stores: Stores {
            deployments: filled(children.deployments),
            services: filled(children.services),
            configmaps: filled(children.configmaps),
            pdbs: filled(children.pdbs),
            pod_monitors: None,
            filled: Arc::default(),
        },
        pod_monitors: false,
        now,
        sla: None,
        leadership,
        scope: ScopeFilter::new(scope, None),
        failures: Default::default(),
    })
}

/// Reconciles `isvc` once with `children` cached; what it returned and every request it sent.
async fn reconcile_once(
    isvc: &InferenceService,
    children: Children,
    answer: impl Fn(&Call) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> (Result<Action, Error>, Vec<Call>, Arc<Context>) {
    let (client, calls) = api_server(isvc, answer);
    let ctx = context(client, children, Leadership::always());
    let result = reconcile(Arc::new(isvc.clone()), ctx.clone()).await;
    let calls = calls.lock().expect("calls").clone();
    (result, calls, ctx)
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

fn event_reasons(calls: &[Call]) -> Vec<(String, String)> {
    calls
        .iter()
        .filter(|c| c.is_event())
        .map(|c| {
            (
                c.body["type"].as_str().unwrap_or_default().into(),
                c.body["reason"].as_str().unwrap_or_default().into(),
            )
        })
        .collect()
}

/// The first reconcile of a new InferenceService, and the status it wrote.
async fn first_reconcile(isvc: &InferenceService) -> (Vec<Call>, InferenceService) {
    let (result, calls, _) = reconcile_once(isvc, Children::default(), |_| None).await;
    result.expect("first reconcile");
    let status = calls.iter().find(|c| c.is_status()).expect("a status write").body["status"].clone();
    let mut written = isvc.clone();
    written.status = Some(serde_json::from_value(status).expect("status"));
    (calls, written)
}

#[tokio::test]
async fn a_new_service_gets_its_settings_then_its_children_then_its_status_by_server_side_apply() {
    let isvc = fixtures::isvc();
    let (result, calls, _) = reconcile_once(&isvc, Children::default(), |_| None).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(build::evaluation_interval(&isvc)));

    // The settings ConfigMap first (new pods read their batch settings from it at start).
    let applied: Vec<String> = calls.iter().filter(|c| c.is_child_apply()).map(Call::resource).collect();
    assert_eq!(applied, ["configmaps", "deployments", "services", "poddisruptionbudgets"]);
    for call in calls.iter().filter(|c| c.method == "PATCH") {
        assert_eq!(call.content_type, "application/apply-patch+yaml", "{call:?}");
        assert!(
            call.query.contains("fieldManager=pacer-operator") && call.query.contains("force=true"),
            "{call:?}"
        );
        assert!(call.path.starts_with("/api"), "{call:?}");
        assert!(
            call.path.contains("/namespaces/ml/"),
            "every write stays in the service's namespace: {call:?}"
        );
    }
    for call in calls.iter().filter(|c| c.is_child_apply()) {
        let owner = &call.body["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], json!(isvc.metadata.uid), "{call:?}");
        assert_eq!(owner["controller"], json!(true), "{call:?}");
        assert!(
            call.body["metadata"]["annotations"][crate::apply::APPLIED_HASH_ANNOTATION].is_string(),
            "each child carries the fingerprint of what was applied: {call:?}"
        );
    }

    // One status write, after every child, saying no replica is ready yet.
    let status: Vec<usize> =
        calls.iter().enumerate().filter(|(_, c)| c.is_status()).map(|(i, _)| i).collect();
    let last_apply = calls.iter().rposition(Call::is_child_apply).expect("applies");
    assert_eq!(status.len(), 1, "{calls:#?}");
    assert!(status[0] > last_apply);
    let written = &calls[status[0]].body["status"];
    assert_eq!(condition(written, conditions::READY)["status"], "False");
    assert_eq!(condition(written, conditions::SPEC_VALID)["status"], "True");
    assert_eq!(written["observedGeneration"], 1);

    // An Event per child created, then one for the readiness the status now reports.
    let events = event_reasons(&calls);
    let created = ("Normal".to_string(), "Created".to_string());
    assert_eq!(events[..4], [created.clone(), created.clone(), created.clone(), created]);
    assert_eq!(events[4..], [("Normal".to_string(), "NotReady".to_string())]);
    assert_eq!(calls.len(), 4 + 1 + 5, "{calls:#?}");
}

#[tokio::test]
async fn a_steady_state_costs_no_request() {
    let isvc = fixtures::isvc();
    let (calls, written) = first_reconcile(&isvc).await;
    // The next reconcile sees what it applied (through the watches) and the status it wrote.
    let (result, calls, _) = reconcile_once(&written, Children::from_applies(&calls), |_| None).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(build::evaluation_interval(&isvc)));
    assert!(calls.is_empty(), "a steady state wrote: {calls:#?}");
}

#[tokio::test]
async fn a_child_edited_by_hand_is_applied_again_and_nothing_else_is_written() {
    let isvc = fixtures::isvc();
    let (calls, written) = first_reconcile(&isvc).await;
    let mut children = Children::from_applies(&calls);
    // Someone scaled the Deployment by hand; the operator owns `spec.replicas`.
    let spec = children.deployments[0].spec.as_mut().expect("deployment spec");
    spec.replicas = Some(spec.replicas.unwrap_or(1) + 4);

    let (result, calls, _) = reconcile_once(&written, children, |_| None).await;
    result.expect("reconcile");
    let writes: Vec<String> = calls.iter().filter(|c| !c.is_event()).map(Call::resource).collect();
    assert_eq!(writes, ["deployments"], "{calls:#?}");
    assert_eq!(event_reasons(&calls), [("Normal".to_string(), "Updated".to_string())]);
}

#[tokio::test]
async fn an_invalid_spec_writes_its_reason_and_a_warning_and_no_child() {
    let mut isvc = fixtures::isvc();
    isvc.spec.policy.evaluation_interval = "soon".into();
    let (result, calls, ctx) = reconcile_once(&isvc, Children::default(), |_| None).await;
    assert_eq!(result.expect("a refused spec is no error"), Action::await_change());
    assert!(!calls.iter().any(Call::is_child_apply), "{calls:#?}");
    let status: Vec<&Call> = calls.iter().filter(|c| c.is_status()).collect();
    assert_eq!(status.len(), 1);
    let ready = condition(&status[0].body["status"], conditions::READY);
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], conditions::reasons::INVALID_SPEC);
    assert!(ready["message"].as_str().unwrap_or_default().contains("soon"), "{ready}");
    assert_eq!(
        event_reasons(&calls),
        [("Warning".to_string(), conditions::reasons::INVALID_SPEC.to_string())]
    );
    assert_eq!(ctx.metrics.reconciles.with_label_values(&["invalid_spec"]).get(), 1);

    // Refused once: the same spec with its status written is not written again.
    let mut written = isvc.clone();
    written.status = Some(serde_json::from_value(status[0].body["status"].clone()).expect("status"));
    let (result, calls, _) = reconcile_once(&written, Children::default(), |_| None).await;
    assert_eq!(result.expect("reconcile"), Action::await_change());
    assert!(calls.is_empty(), "{calls:#?}");
}

#[tokio::test]
async fn a_child_the_api_server_rejects_is_reported_with_its_message_and_not_retried() {
    let isvc = fixtures::isvc();
    let message = "Deployment.apps \"smol\" is invalid: spec.template.spec.containers[0].resources.limits: Invalid value";
    let (result, calls, _) = reconcile_once(&isvc, Children::default(), move |call| {
        (call.is_child_apply() && call.resource() == "deployments")
            .then(|| status_error(422, "Invalid", message))
    })
    .await;
    assert_eq!(result.expect("a rejected child is no transient error"), Action::await_change());
    let applied: Vec<String> = calls.iter().filter(|c| c.is_child_apply()).map(Call::resource).collect();
    assert_eq!(applied, ["configmaps", "deployments"], "nothing is applied after the rejected child");
    let status = &calls.iter().find(|c| c.is_status()).expect("status").body["status"];
    let ready = condition(status, conditions::READY);
    assert_eq!(ready["reason"], conditions::reasons::CHILD_REJECTED);
    assert!(ready["message"].as_str().unwrap_or_default().contains("resources.limits"), "{ready}");
    assert_eq!(event_reasons(&calls).last().map(|e| e.0.as_str()), Some("Warning"));
}

#[tokio::test]
async fn a_transient_failure_is_an_error_that_backs_off_and_a_success_resets_it() {
    let isvc = fixtures::isvc();
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let unavailable = {
        let failing = failing.clone();
        move |call: &Call| {
            (failing.load(std::sync::atomic::Ordering::SeqCst) && call.resource() == "deployments")
                .then(|| status_error(503, "ServiceUnavailable", "etcd is unavailable"))
        }
    };
    let (client, calls) = api_server(&isvc, unavailable);
    let ctx = context(client, Children::default(), Leadership::always());
    let isvc = Arc::new(isvc);
    let error = reconcile(isvc.clone(), ctx.clone()).await.expect_err("a 503 fails the reconcile");
    assert!(matches!(error, Error::Apply { .. }), "{error:?}");
    assert!(!calls.lock().expect("calls").iter().any(Call::is_status), "no status on a transient failure");
    assert_eq!(error_policy(isvc.clone(), &error, ctx.clone()), Action::requeue(Duration::from_secs(1)));
    assert_eq!(error_policy(isvc.clone(), &error, ctx.clone()), Action::requeue(Duration::from_secs(2)));
    assert_eq!(error_policy(isvc.clone(), &error, ctx.clone()), Action::requeue(Duration::from_secs(4)));
    assert_eq!(ctx.metrics.errors.with_label_values(&[error.metric_label()]).get(), 3);

    // The API server recovers: the reconcile goes through and the next failure starts at 1 s.
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    reconcile(isvc.clone(), ctx.clone()).await.expect("reconcile after recovery");
    assert_eq!(error_policy(isvc, &error, ctx), Action::requeue(Duration::from_secs(1)));
}

#[tokio::test]
async fn a_deleted_service_and_one_out_of_scope_cost_no_request() {
    let mut deleted = fixtures::isvc();
    deleted.metadata.deletion_timestamp = Some(now());
    let (result, calls, _) = reconcile_once(&deleted, Children::default(), |_| None).await;
    assert_eq!(result.expect("reconcile"), Action::await_change());
    assert!(calls.is_empty(), "{calls:#?}");

    let mut excluded = fixtures::isvc();
    excluded.metadata.namespace = Some("kube-system".into());
    let (result, calls, _) = reconcile_once(&excluded, Children::default(), |_| None).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(OUT_OF_SCOPE_RECHECK));
    assert!(calls.is_empty(), "{calls:#?}");
}

#[tokio::test]
async fn a_process_that_is_not_the_leader_writes_nothing() {
    let isvc = fixtures::isvc();
    let (client, calls) = api_server(&isvc, |_| None);
    let ctx = context(client, Children::default(), Leadership::elected());
    let result = reconcile(Arc::new(isvc), ctx).await;
    assert!(matches!(result, Err(Error::NotLeader)), "{result:?}");
    assert!(calls.lock().expect("calls").is_empty(), "a standby wrote");
}

#[test]
fn retries_back_off_to_a_bound() {
    assert_eq!(retry_delay(1), Duration::from_secs(1));
    assert_eq!(retry_delay(3), Duration::from_secs(4));
    assert_eq!(retry_delay(50), Duration::from_secs(300));
}
