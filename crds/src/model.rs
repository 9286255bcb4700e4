//! Where an `InferenceService`'s model comes from: a PVC, an OCI image volume or an HTTPS URL
//! with its SHA-256, and how the engine names it.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The model and where its files come from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// The name clients send in the OpenAI `model` field. Default: the InferenceService's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), pattern(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"))]
    pub served_name: Option<String>,
    /// Largest context (prompt + output tokens) a request may use. Default: the model's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub context_length: Option<u32>,
    /// Where the model comes from: exactly one of `pvc`, `image` or `url`. With `runtime:
    /// pacer` it is required and names the GGUF file; with `runtime: vllm` it is optional, and a
    /// `pvc` or `image` is mounted at `/models` for the variants' paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ModelSource>,
}

/// Where engine pods read the GGUF file from. Exactly one field is set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.pvc), has(self.image), has(self.url)].filter(x, x).size() == 1")
    .message("model.source must set exactly one of pvc, image or url"))]
pub struct ModelSource {
    /// A file on a PersistentVolumeClaim, mounted read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcSource>,
    /// A file inside an OCI image, mounted as an image volume (Kubernetes ≥ 1.33 with the
    /// ImageVolume feature, on by default from 1.35).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSource>,
    /// An HTTP(S) URL that an init container downloads once per pod and checks against its SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<UrlSource>,
}

/// A GGUF file on a PersistentVolumeClaim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PvcSource {
    /// The claim's name, in the InferenceService's namespace.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('{}')", crate::schema::DNS1123_SUBDOMAIN_RE))
        .message("model.source.pvc.claimName must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub claim_name: String,
    /// The file's path inside the volume, e.g. `models/SmolLM2-135M-Instruct.Q4_1.gguf`.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.contains('..')")
        .message("model.source.pvc.path must be relative to the volume and must not contain '..'"))]
    pub path: String,
}

/// A GGUF file inside an OCI image.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageSource {
    /// The image reference, e.g. `registry.example.com/models/smollm2:135m-q4_1`.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new(r"!self.matches('\\s')")
        .message("model.source.image.reference must be an image reference without whitespace"))]
    pub reference: String,
    /// The file's path inside the image.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.contains('..')")
        .message("model.source.image.path must be relative to the image root and must not contain '..'"))]
    pub path: String,
    /// When to pull the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_enum::<PullPolicy>")]
    pub pull_policy: Option<PullPolicy>,
}

/// A GGUF file at an HTTP(S) URL.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UrlSource {
    /// Where to download the file from.
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')")
        .message("model.source.url.url must be an http:// or https:// URL"))]
    #[x_kube(validation = Rule::new(r"!self.matches('\\s')")
        .message("model.source.url.url must not contain whitespace (write a space as %20)"))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getHostname() != ''")
        .message("model.source.url.url must be a URL with a host, e.g. https://models.example.com/smol.gguf"))]
    #[x_kube(validation = Rule::new("!self.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@')")
        .message("model.source.url.url must not carry credentials (user:password@): the URL is stored in clear in the pod spec; serve the file from a PVC or an image, or a URL that needs none"))]
    pub url: String,
    /// The file's SHA-256 as 64 lowercase hex digits; a download that does not match fails the pod.
    #[schemars(pattern(r"^[a-f0-9]{64}$"))]
    pub sha256: String,
}

/// Kubernetes image pull policies.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull on every pod start.
    Always,
    /// Pull when the node does not have the image.
    IfNotPresent,
    /// Never pull; the image must be on the node.
    Never,
}

impl PullPolicy {
    /// The name Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}
