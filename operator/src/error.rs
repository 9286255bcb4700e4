//! The operator's errors, each with a short label for the `pacer_operator_reconcile_errors_total`
//! metric.

/// Why a reconcile (or the operator's start-up) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Server-side apply of a child failed.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        /// The child's kind.
        kind: String,
        /// The child's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The API server refused a child as invalid (400 or 422): the spec let through something
    /// the child's own validation refuses. Reported in status, not retried.
    #[error("the API server rejected {kind} {name}: {message}")]
    Rejected {
        /// The child's kind.
        kind: String,
        /// The child's name.
        name: String,
        /// The API server's message.
        message: String,
    },
    /// Writing the InferenceService status failed.
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    /// Another API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// An object could not be serialized (a bug, reported rather than panicking).
    #[error("serializing: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The object has no namespace (InferenceServices are namespaced).
    #[error("InferenceService without a namespace")]
    NoNamespace,
    /// The scope of namespaces cannot be set up (a malformed selector, a missing permission).
    #[error("namespace scope: {0}")]
    Scope(String),
    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(String),
    /// This process no longer holds the leader Lease: its writes are fenced off.
    #[error("not the leader: writes are fenced off")]
    NotLeader,
}

impl Error {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Apply { .. } => "apply",
            Error::Rejected { .. } => "rejected",
            Error::Status(_) => "status",
            Error::Kube(_) => "kube",
            Error::Serialize(_) => "serialize",
            Error::NoNamespace => "no_namespace",
            Error::Scope(_) => "scope",
            Error::Lease(_) => "lease",
            Error::NotLeader => "not_leader",
        }
    }
}
