//! Which namespaces the operator acts in: a list of namespaces (namespaced mode, Roles only),
//! or every namespace (cluster mode), optionally narrowed to those whose labels match a
//! selector; minus the excluded ones (`kube-system`, `kube-public` and `kube-node-lease` by
//! default) in either mode. An InferenceService outside the scope is left alone: no child, no
//! status, no Event, as if the operator did not see it, so two operators with disjoint scopes
//! can share one CRD.
//!
//! RBAC cannot follow a label (a ClusterRole grants every namespace), so in cluster mode the
//! selector and the exclusions bound what the operator *does*, not what it *may* do; the chart's
//! README says so. Namespaced mode is the one whose permissions are bounded too.

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;

/// The namespaces excluded unless `--exclude-namespaces` says otherwise: the control plane's
/// own, where an InferenceService would run pods beside the cluster's system components.
pub const DEFAULT_EXCLUDED: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// Where the controller watches and acts.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// These namespaces, or every namespace when empty.
    pub namespaces: Vec<String>,
    /// Never acted in, whatever their labels.
    pub excluded: Vec<String>,
    /// In cluster mode, only namespaces whose labels match this selector (e.g.
    /// `pacer.dev/enabled=true`).
    pub selector: Option<String>,
}

/// A scope that cannot work, found before anything starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// A watched namespace is also excluded.
    #[error(
        "namespace {0} is both watched (--namespaces) and excluded (--exclude-namespaces); drop it from one of them"
    )]
    WatchedAndExcluded(String),
    /// A selector with a list of namespaces: the list already says where.
    #[error(
        "--namespace-selector applies to cluster mode only; with --namespaces, list the namespaces to act in instead"
    )]
    SelectorWithList,
    /// An empty selector would select every namespace, which is not what anyone means by it.
    #[error("--namespace-selector is empty; leave it out to act in every namespace")]
    EmptySelector,
}

impl Scope {
    /// A checked scope: `excluded` without empty entries, the selector trimmed.
    pub fn new(
        namespaces: Vec<String>,
        excluded: Vec<String>,
        selector: Option<String>,
    ) -> Result<Scope, ScopeError> {
        let excluded: Vec<String> =
            excluded.into_iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        let selector = match selector.map(|s| s.trim().to_string()) {
            Some(s) if s.is_empty() => return Err(ScopeError::EmptySelector),
            s => s,
        };
        if selector.is_some() && !namespaces.is_empty() {
            return Err(ScopeError::SelectorWithList);
        }
        if let Some(both) = namespaces.iter().find(|n| excluded.contains(n)) {
            return Err(ScopeError::WatchedAndExcluded(both.clone()));
        }
        Ok(Scope { namespaces, excluded, selector })
    }

    /// Whether the operator acts in `namespace`, given whether its labels match the selector
    /// (`selected`, ignored without one).
    pub fn admits(&self, namespace: &str, selected: impl FnOnce() -> bool) -> bool {
        if self.excluded.iter().any(|n| n == namespace) {
            return false;
        }
        if !self.namespaces.is_empty() {
            return self.namespaces.iter().any(|n| n == namespace);
        }
        self.selector.is_none() || selected()
    }
}

/// A [`Scope`] with the cache of the namespaces its selector matches (cluster mode with a
/// selector only), for the reconciles to ask.
#[derive(Clone)]
pub struct ScopeFilter {
    /// The scope.
    pub scope: Scope,
    /// The namespaces whose labels match the selector, from a watch with that selector.
    selected: Option<Store<Namespace>>,
    /// Set once `selected` holds its first full list.
    filled: Arc<tokio::sync::OnceCell<()>>,
}

impl ScopeFilter {
    /// A filter for `scope`, with the cache of the namespaces its selector matches (`None`
    /// without a selector, or in namespaced mode).
    pub fn new(scope: Scope, selected: Option<Store<Namespace>>) -> ScopeFilter {
        ScopeFilter { scope, selected, filled: Arc::default() }
    }

    /// Whether the operator acts in `namespace` now.
    pub fn admits(&self, namespace: &str) -> bool {
        self.scope.admits(namespace, || {
            self.selected.as_ref().is_some_and(|store| store.get(&ObjectRef::new(namespace)).is_some())
        })
    }

    /// Resolves once the namespace cache holds its first full list (at once without one).
    /// Every reconcile waits here, many at once at the start: one of them waits on the store
    /// and the rest on a cell, because a store's readiness future wakes only its last poller
    /// (the others would wait forever, their InferenceServices never reconciled again).
    pub async fn ready(&self) {
        if let Some(store) = &self.selected {
            self.filled
                .get_or_init(|| async {
                    let _ = store.wait_until_ready().await;
                })
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn excluded_namespaces_are_never_admitted_whatever_their_labels() {
        let default = owned(&DEFAULT_EXCLUDED);
        let all = Scope::new(vec![], default.clone(), None).expect("scope");
        for ns in DEFAULT_EXCLUDED {
            assert!(!all.admits(ns, || true), "{ns}");
        }
        assert!(all.admits("team-a", || false), "no selector: every other namespace");
        let selected = Scope::new(vec![], default, Some("pacer.dev/enabled=true".into())).expect("scope");
        assert!(!selected.admits("kube-system", || true), "exclusion wins over a matching label");
        assert!(selected.admits("team-a", || true));
        assert!(!selected.admits("team-b", || false), "a namespace without the label is left alone");
        // Opting out of the exclusions (`--exclude-namespaces=`) admits them again.
        let none = Scope::new(vec![], owned(&["", " "]), None).expect("scope");
        assert!(none.excluded.is_empty());
        assert!(none.admits("kube-system", || false));
    }

    /// Many reconciles wait for the namespace cache at once when the operator starts; every one
    /// of them must go on once the first list is in. (Waiting on the store directly woke the
    /// last waiter only; the others hung, and their InferenceServices were never looked at
    /// again, even after their namespace gained the label.)
    #[tokio::test]
    async fn every_waiter_goes_on_once_the_namespace_cache_is_filled() {
        use kube::runtime::{reflector, watcher};
        let (reader, mut writer) = reflector::store::<Namespace>();
        let filter =
            ScopeFilter::new(Scope::new(vec![], vec![], Some("team=a".into())).expect("scope"), Some(reader));
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let filter = filter.clone();
                tokio::spawn(async move { filter.ready().await })
            })
            .collect();
        // Let every waiter reach the cache before it fills.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "a waiter went on before the first list");
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("a waiter was never woken")
                .expect("waiter");
        }
    }

    #[test]
    fn a_list_admits_its_namespaces_only() {
        let list = Scope::new(owned(&["a", "b"]), owned(&DEFAULT_EXCLUDED), None).expect("scope");
        assert!(list.admits("a", || false) && list.admits("b", || false));
        assert!(!list.admits("c", || true));
    }

    #[test]
    fn scopes_that_cannot_work_are_refused_with_the_flag_to_change() {
        let err = Scope::new(owned(&["kube-system"]), owned(&DEFAULT_EXCLUDED), None).unwrap_err();
        assert_eq!(err, ScopeError::WatchedAndExcluded("kube-system".into()));
        assert!(err.to_string().contains("--exclude-namespaces"));
        let err = Scope::new(owned(&["a"]), vec![], Some("x=y".into())).unwrap_err();
        assert_eq!(err, ScopeError::SelectorWithList);
        let err = Scope::new(vec![], vec![], Some("  ".into())).unwrap_err();
        assert_eq!(err, ScopeError::EmptySelector);
        // Listing kube-system works once it is no longer excluded.
        assert!(Scope::new(owned(&["kube-system"]), vec![], None).is_ok());
    }
}
