//! `pacer-engine serve`: the OpenAI-compatible server with continuous batching and Prometheus
//! metrics, its probes on a port of their own, and the drain on a stop signal.

use anyhow::{Context, Result, bail};
use clap::Args;

use super::model::ModelArgs;
use super::model::load;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, env = "PACER_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, env = "PACER_PORT", default_value_t = 8000)]
    port: u16,
    /// Also serve `/health`, `/ready` and `/metrics` on this port, with a connection limit of
    /// their own, so a flood of API connections cannot fail the probes or the scrapes.
    #[arg(long, env = "PACER_PROBE_PORT")]
    probe_port: Option<u16>,
    /// Model name clients send in `model` [default: the GGUF file name without extension].
    #[arg(long, env = "PACER_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer <key>` on the API routes.
    #[arg(long, env = "PACER_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Most sequences in the running batch.
    #[arg(long, env = "PACER_MAX_BATCH_SIZE", default_value_t = 16)]
    max_batch_size: usize,
    /// How long an idle engine waits to fill a batch, in ms (0 = never).
    #[arg(long, env = "PACER_BATCH_WAIT_MS", default_value_t = 0)]
    batch_wait_ms: u64,
    /// Most tokens per scheduler step (decodes plus prompt chunks).
    #[arg(long, env = "PACER_MAX_NUM_BATCHED_TOKENS", default_value_t = pacer_engine_api::defaults::STEP_TOKEN_BUDGET as usize)]
    max_num_batched_tokens: usize,
    /// The ITL budget in ms: while streams decode, prompt chunks are cut so a step is predicted
    /// to take at most this long, by the engine's own fit of its step times (0 = no time bound;
    /// prompts alone still run at the full token budget).
    #[arg(long, env = "PACER_MAX_STEP_MS", default_value_t = pacer_engine::scheduler::DEFAULT_MAX_STEP_MS)]
    max_step_ms: u64,
    /// The prompt hold, in ms (0 = off: prompts start at once, cut to the ITL budget). On, the
    /// waiting prompt work goes in one step while at most 2.5 % of the streams' recent gaps were
    /// steps with prompt work; past that, a new prompt waits up to this long (from its arrival)
    /// for others to start in the same step. Fewer long gaps hold the ITL tail at a decode
    /// step, at some cost in TTFT.
    #[arg(long, env = "PACER_PREFILL_HOLD_MS", default_value_t = 0)]
    prefill_hold_ms: u64,
    /// JSON file with live batch settings, re-read when it changes (a mounted ConfigMap).
    #[arg(long, env = "PACER_SETTINGS_FILE")]
    settings_file: Option<PathBuf>,
    /// Waiting requests beyond which new ones get 429.
    #[arg(long, env = "PACER_MAX_WAITING", default_value_t = 256)]
    max_waiting: usize,
    /// KV-cache capacity in tokens (45 KiB per token for SmolLM2-135M).
    #[arg(long, env = "PACER_KV_CACHE_TOKENS", default_value_t = pacer_engine_api::defaults::KV_CACHE_TOKENS as usize)]
    kv_cache_tokens: usize,
    /// Reuse the KV cache of prompt prefixes earlier requests computed (shared system prompts,
    /// multi-turn chats), in 16-token blocks; `false` computes every prompt in full.
    #[arg(long, env = "PACER_PREFIX_CACHING", default_value_t = true, action = clap::ArgAction::Set)]
    prefix_caching: bool,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, env = "PACER_DRAIN_TIMEOUT", default_value_t = 30)]
    drain_timeout: u64,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "PACER_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds a connection may take to send a request's headers before it is closed.
    #[arg(long, env = "PACER_HEADER_TIMEOUT", default_value_t = 10)]
    header_timeout: u64,
    /// Seconds a request's body may take to arrive after its headers (408 after).
    #[arg(long, env = "PACER_BODY_TIMEOUT", default_value_t = 30)]
    body_timeout: u64,
    /// Most client connections open at once; more are closed as they arrive.
    #[arg(long, env = "PACER_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Log prompt token ids (off: prompts may contain personal data).
    #[arg(long, env = "PACER_LOG_PROMPTS")]
    log_prompts: bool,
    /// Most request-body bytes buffered at once across all connections; a body that would
    /// pass it gets 503 with Retry-After (bodies are read only after the API key is checked).
    #[arg(long, env = "PACER_MAX_BUFFERED_BYTES", default_value_t = 64 << 20)]
    max_buffered_bytes: usize,
    /// Seconds one forward step may run before /health and /ready fail (a hung device).
    #[arg(long, env = "PACER_STALL_TIMEOUT", default_value_t = 60)]
    stall_timeout: u64,
    /// Largest context (prompt + output tokens) a request may use [default: the model's own].
    #[arg(long, env = "PACER_CONTEXT_LENGTH")]
    context_length: Option<usize>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let ServeArgs {
        model,
        host,
        port,
        probe_port,
        served_model_name,
        api_key,
        max_batch_size,
        batch_wait_ms,
        max_num_batched_tokens,
        max_step_ms,
        prefill_hold_ms,
        settings_file,
        max_waiting,
        kv_cache_tokens,
        prefix_caching,
        drain_timeout,
        max_body_bytes,
        header_timeout,
        body_timeout,
        max_connections,
        log_prompts,
        max_buffered_bytes,
        stall_timeout,
        context_length,
    } = args;
    let path = model.model_path()?;
    let served_name = served_model_name.unwrap_or_else(|| {
        path.file_stem().map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
    });
    let mut loaded = load(&model)?;
    if let Some(limit) = context_length {
        loaded.model.limit_context(limit)?;
    }
    let loaded = std::sync::Arc::new(loaded);
    let config = pacer_engine::server::ServeConfig {
        served_name,
        api_key,
        settings: pacer_engine::scheduler::BatchSettings {
            max_batch_size,
            batch_wait_ms,
            max_num_batched_tokens,
            max_step_ms,
            prefill_hold_ms,
        },
        settings_file,
        max_waiting,
        kv_cache_tokens,
        prefix_caching,
        drain_timeout: std::time::Duration::from_secs(drain_timeout),
        max_body_bytes,
        header_timeout: std::time::Duration::from_secs(header_timeout),
        body_timeout: std::time::Duration::from_secs(body_timeout),
        max_connections,
        log_prompts,
        max_buffered_bytes,
        stall_timeout: std::time::Duration::from_secs(stall_timeout.max(1)),
    };
    // The HTTP side is light; the compute pool does the heavy work on its own threads.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let served = runtime.block_on(async move {
        let server = pacer_engine::server::build(loaded, &config)?;
        let listener = tokio::net::TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| format!("binding {host}:{port}"))?;
        tracing::info!(address = %listener.local_addr()?, model = %config.served_name, "serving");
        let probes = match probe_port {
            Some(p) if p == port && port != 0 => {
                bail!("--probe-port must differ from --port ({port}): the probes need a port of their own")
            }
            Some(p) => {
                let probes = tokio::net::TcpListener::bind((host.as_str(), p))
                    .await
                    .with_context(|| format!("binding the probe port {host}:{p}"))?;
                tracing::info!(address = %probes.local_addr()?, "serving /health, /ready and /metrics");
                Some(probes)
            }
            None => None,
        };
        pacer_engine::server::serve_with_probes(listener, probes, server, config.drain_timeout, async {
            let how = pacer_runtime::stop_signal().await;
            tracing::info!(signal = how, "stopping");
        })
        .await?;
        anyhow::Ok(())
    });
    // Connections still open after the drain (half-sent requests, idle keep-alives) belong to
    // tasks of this runtime: drop them now rather than wait for their clients.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    served?;
    tracing::info!("stopped");
    Ok(())
}
