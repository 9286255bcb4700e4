//! `pacer-engine`: run a llama-family GGUF model on CPU.
//!
//! - `generate`: stream a completion (or a chat reply) to stdout, with prefill/decode timings.
//! - `info`: print the model's metadata, sizes and available tiers.
//! - `bench`: measure prefill and batched decode throughput at one tier.
//! - `serve`: the OpenAI-compatible server with continuous batching and Prometheus metrics.
//! - `profile`: step times and quality at one tier, as the engine profile the planner reads.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use pacer_cli::{LogFormat, LogTarget};
use pacer_engine::bench::{self, BenchPlan};
use pacer_engine::chat::ChatMessage;
use pacer_engine::generate::{GenerateRequest, Sequence, run_to_completion};
use pacer_engine::model::{BLOCK_TOKENS, KvCache, Model, read_content};
use pacer_engine::profile::{self, ProfilePlan, Progress};
use pacer_engine::sampling::SamplingParams;
use pacer_engine::{ComputeDevice, LoadedModel, Tier, Tokenizer, threads};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "pacer-engine",
    version,
    about = "Pacer's LLM engine: llama-family GGUF models on CPU or, built with the `cuda` feature, NVIDIA GPUs"
)]
struct Cli {
    /// Log format: human-readable text, or JSON lines for log collectors in a cluster.
    #[arg(long, env = "PACER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text for a prompt and stream it to stdout.
    Generate(GenerateArgs),
    /// Print the model's metadata, sizes and tiers.
    Info(InfoArgs),
    /// Measure prefill and batched decode throughput.
    Bench(BenchArgs),
    /// Serve the OpenAI-compatible API with continuous batching.
    Serve(ServeArgs),
    /// Measure step times and quality at one tier into an engine profile (JSON).
    Profile(ProfileArgs),
}

#[derive(Args, Debug)]
struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// File to write the profile to (JSON, schema 1).
    #[arg(long, env = "PACER_PROFILE_OUT")]
    out: PathBuf,
    /// A small grid and a short quality text, for tests; too coarse to plan with.
    #[arg(long, env = "PACER_PROFILE_QUICK")]
    quick: bool,
}

#[derive(Args, Debug)]
struct ServeArgs {
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
    #[arg(long, env = "PACER_MAX_NUM_BATCHED_TOKENS", default_value_t = pacer_planner::engine_defaults::STEP_TOKEN_BUDGET as usize)]
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
    #[arg(long, env = "PACER_KV_CACHE_TOKENS", default_value_t = pacer_planner::engine_defaults::KV_CACHE_TOKENS as usize)]
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

#[derive(Args, Debug)]
struct ModelArgs {
    /// GGUF model file [default: the model `scripts/fetch-model.sh` caches].
    #[arg(long, env = "PACER_MODEL")]
    model: Option<PathBuf>,
    /// Quantization tier of the weights: f32, q8_0, q4_0, or native (as stored in the file).
    #[arg(long, env = "PACER_TIER", default_value = "native")]
    tier: Tier,
    /// Compute threads [default: the CPUs this process may use, after cgroup quota].
    #[arg(long, env = "PACER_THREADS")]
    threads: Option<usize>,
    /// Where the forward step runs: `cpu` (Pacer's CPU kernels), `cuda` / `cuda:N` (the candle
    /// backend on GPU N; needs a build with the `cuda` feature), `candle-cpu` (the candle
    /// backend on the CPU, the GPU code path without a GPU), or `auto`: `cuda:0` when this
    /// build has the `cuda` feature and a GPU answers, else `cpu`.
    #[arg(long, env = "PACER_DEVICE", default_value = "auto", value_parser = parse_device)]
    device: DeviceChoice,
}

/// `--device`: a device, or `auto`.
#[derive(Debug, Clone, Copy)]
enum DeviceChoice {
    Auto,
    Exactly(ComputeDevice),
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    if s == "auto" { Ok(DeviceChoice::Auto) } else { s.parse().map(DeviceChoice::Exactly) }
}

impl ModelArgs {
    fn model_path(&self) -> Result<PathBuf> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        match pacer_engine::default_model_path() {
            Some(p) if p.exists() => Ok(p),
            _ => bail!(
                "no model given: pass --model PATH or set PACER_MODEL (scripts/fetch-model.sh fetches the default)"
            ),
        }
    }

    fn device(&self) -> ComputeDevice {
        match self.device {
            DeviceChoice::Auto => ComputeDevice::auto(),
            DeviceChoice::Exactly(d) => d,
        }
    }

    fn init_threads(&self) -> usize {
        let n = threads::compute_threads(self.threads);
        threads::init_pool(n);
        n
    }
}

#[derive(Args, Debug)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (the user message with --chat).
    #[arg(long, env = "PACER_GENERATE_PROMPT", short)]
    prompt: String,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long, env = "PACER_GENERATE_CHAT")]
    chat: bool,
    /// System message for --chat (the template's default when omitted).
    #[arg(long, env = "PACER_GENERATE_SYSTEM")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, env = "PACER_GENERATE_MAX_TOKENS", default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, env = "PACER_GENERATE_TEMPERATURE", default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, env = "PACER_GENERATE_TOP_K", default_value_t = 0)]
    top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, env = "PACER_GENERATE_TOP_P", default_value_t = 1.0)]
    top_p: f32,
    /// Random seed for sampling.
    #[arg(long, env = "PACER_GENERATE_SEED")]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long, env = "PACER_GENERATE_STOP")]
    stop: Vec<String>,
    /// Prompt tokens per prefill step (chunked prefill).
    #[arg(long, env = "PACER_GENERATE_PREFILL_CHUNK", default_value_t = 512)]
    prefill_chunk: usize,
}

#[derive(Args, Debug)]
struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long, env = "PACER_INFO_JSON")]
    json: bool,
    /// Also write the tokenizer as Hugging Face files (tokenizer.json, tokenizer_config.json)
    /// into this directory.
    #[arg(long, env = "PACER_INFO_EXPORT_TOKENIZER")]
    export_tokenizer: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths for prefill.
    #[arg(long, env = "PACER_ENGINE_BENCH_PREFILL", value_delimiter = ',', default_value = "128,512")]
    prefill: Vec<usize>,
    /// Batch sizes for decode.
    #[arg(long, env = "PACER_ENGINE_BENCH_BATCH", value_delimiter = ',', default_value = "1,4,8,16")]
    batch: Vec<usize>,
    /// Prompt tokens each decoding sequence holds before the timed steps (the context its
    /// attention reads).
    #[arg(long, env = "PACER_ENGINE_BENCH_DECODE_CONTEXT", default_value_t = 32)]
    decode_context: usize,
    /// Decode steps timed per batch size.
    #[arg(long, env = "PACER_ENGINE_BENCH_DECODE_STEPS", default_value_t = 32)]
    decode_steps: usize,
    /// Repetitions (median reported).
    #[arg(long, env = "PACER_ENGINE_BENCH_REPEATS", default_value_t = 3)]
    repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "PACER_ENGINE_BENCH_JSON")]
    json: bool,
}

fn main() -> Result<()> {
    let Cli { log_format, command } = Cli::parse();
    pacer_cli::init_logging(log_format, "info", LogTarget::Stderr);
    match command {
        Command::Generate(args) => generate(args),
        Command::Info(args) => info(args),
        Command::Bench(args) => bench_cmd(args),
        Command::Serve(args) => serve(args),
        Command::Profile(args) => profile_cmd(args),
    }
}

fn load(args: &ModelArgs) -> Result<LoadedModel> {
    let path = args.model_path()?;
    let threads = args.init_threads();
    let device = args.device();
    let loaded = LoadedModel::open_on(&path, args.tier, device)
        .with_context(|| format!("loading {} for --device {device}", path.display()))?;
    tracing::info!(
        model = %path.display(),
        tier = %args.tier,
        %device,
        threads,
        weight_mib = loaded.model.weight_bytes() as f64 / (1 << 20) as f64,
        load_ms = loaded.model.load_time.as_millis() as u64,
        kernels = ?pacer_engine::kernels::isa(),
        amx_tiles = pacer_engine::kernels::amx_tiles(),
        "model loaded"
    );
    Ok(loaded)
}

fn generate(args: GenerateArgs) -> Result<()> {
    let GenerateArgs {
        model,
        prompt,
        chat,
        system,
        max_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stop,
        prefill_chunk,
    } = args;
    let loaded = load(&model)?;
    let text = if chat {
        let template =
            loaded.chat_template.as_ref().context("this model has no chat template; drop --chat")?;
        let mut messages: Vec<ChatMessage> =
            system.into_iter().map(|s| ChatMessage::new("system", s)).collect();
        messages.push(ChatMessage::new("user", prompt));
        template.render(&messages, true)?
    } else {
        prompt
    };
    let tokens = loaded.tokenizer.encode(&text)?;
    let context = loaded.model.config.context_length;
    let budget = (tokens.len() + max_tokens).min(context);
    let mut kv = loaded.model.new_kv_cache(budget.div_ceil(BLOCK_TOKENS) * BLOCK_TOKENS)?;
    let request = GenerateRequest {
        prompt: tokens,
        max_tokens,
        sampling: SamplingParams { temperature, top_k, top_p, seed },
        stop,
        ignore_eos: false,
        logprobs: None,
    };
    let mut seqs = vec![Sequence::new(request, context)?];
    let mut stdout = std::io::stdout().lock();
    let mut finish = None;
    let stats =
        run_to_completion(&loaded.model, &loaded.tokenizer, &mut kv, &mut seqs, prefill_chunk, |_, d| {
            let _ = stdout.write_all(d.text.as_bytes());
            let _ = stdout.flush();
            finish = d.finish.or(finish);
        })?;
    writeln!(stdout)?;
    let decode_tokens = stats.generated_tokens.saturating_sub(1);
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.1} tok/s) | decode: {} tokens in {:.1} ms ({:.1} tok/s) | finish: {}",
        stats.prompt_tokens,
        stats.prefill_seconds * 1e3,
        stats.prompt_tokens as f64 / stats.prefill_seconds.max(1e-9),
        decode_tokens,
        stats.decode_seconds * 1e3,
        decode_tokens as f64 / stats.decode_seconds.max(1e-9),
        finish.map_or("none", |f| f.as_str()),
    );
    Ok(())
}

fn info(args: InfoArgs) -> Result<()> {
    let path = args.model.model_path()?;
    let (content, _) = read_content(&path)?;
    let cfg = pacer_engine::model::LlamaConfig::from_gguf(&content)?;
    let tokenizer = Tokenizer::from_gguf(&content)?;
    if let Some(dir) = &args.export_tokenizer {
        tokenizer.export_hf(dir)?;
        eprintln!("wrote {}/tokenizer.json and tokenizer_config.json", dir.display());
    }
    let mut formats: std::collections::BTreeMap<String, usize> = Default::default();
    let mut params = 0usize;
    for t in content.tensor_infos.values() {
        *formats.entry(format!("{:?}", t.ggml_dtype)).or_default() += 1;
        params += t.shape.elem_count();
    }
    let file_bytes = std::fs::metadata(&path)?.len();
    let info = serde_json::json!({
        "path": path,
        "file_bytes": file_bytes,
        "config": cfg,
        "parameters": params,
        "tensor_formats": formats,
        "tokenizer": {
            "model": pacer_engine::tokenizer::metadata_string(&content, "tokenizer.ggml.model"),
            "pre": pacer_engine::tokenizer::metadata_string(&content, "tokenizer.ggml.pre"),
            "vocab_size": tokenizer.vocab_size(),
            "bos": tokenizer.bos().and_then(|i| tokenizer.token(i)),
            "eos": tokenizer.eos().and_then(|i| tokenizer.token(i)),
            "stop_tokens": tokenizer.stop_ids().iter().filter_map(|&i| tokenizer.token(i)).collect::<Vec<_>>(),
            "chat_template": tokenizer.chat_template().is_some(),
        },
        "tiers": Tier::ALL.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
        "default_tier": Tier::Native.as_str(),
        "kv_bytes_per_token": KvCache::bytes_per_token(&cfg),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    println!("model         {}", path.display());
    println!("name          {}", cfg.name.as_deref().unwrap_or("-"));
    println!("architecture  {}", cfg.architecture);
    println!("parameters    {:.1} M in {:.1} MiB", params as f64 / 1e6, file_bytes as f64 / (1 << 20) as f64);
    println!("tensors       {formats:?}");
    println!(
        "shape         {} layers, hidden {}, ffn {}, heads {}/{} (q/kv), head dim {}",
        cfg.layers, cfg.embedding, cfg.feed_forward, cfg.heads, cfg.kv_heads, cfg.head_dim
    );
    println!(
        "context       {} tokens, RoPE base {}, RMSNorm eps {:e}",
        cfg.context_length, cfg.rope_base, cfg.rms_eps
    );
    println!(
        "vocab         {} ({})",
        tokenizer.vocab_size(),
        info["tokenizer"]["pre"].as_str().unwrap_or("-")
    );
    println!("stop tokens   {}", info["tokenizer"]["stop_tokens"]);
    println!("chat template {}", if tokenizer.chat_template().is_some() { "yes" } else { "no" });
    println!("KV per token  {} bytes", KvCache::bytes_per_token(&cfg));
    println!("tiers         f32, q8_0, q4_0, native (default: as stored, {formats:?})");
    Ok(())
}

fn bench_cmd(args: BenchArgs) -> Result<()> {
    let BenchArgs { model: margs, prefill, batch, decode_context, decode_steps, repeats, json } = args;
    let path = margs.model_path()?;
    let threads = margs.init_threads();
    let model = Model::load_on(&path, margs.tier, margs.device())?;
    let plan =
        BenchPlan { prefill_lengths: prefill, batch_sizes: batch, decode_context, decode_steps, repeats };
    let bar = indicatif::ProgressBar::new((plan.prefill_lengths.len() + plan.batch_sizes.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} bench {msg} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let figures = bench::run(&model, &plan, |what| {
        bar.set_message(what.to_string());
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    if json {
        let out = serde_json::json!({
            "engine": "pacer",
            "tier": margs.tier,
            "device": model.device.to_string(),
            "threads": threads,
            "weight_bytes": model.weight_bytes(),
            "load_seconds": model.load_time.as_secs_f64(),
            "figures": figures,
        });
        println!("{out}");
    } else {
        println!(
            "tier {} | device {} | threads {threads} | weights {:.1} MiB | load {:.0} ms",
            margs.tier,
            model.device,
            model.weight_bytes() as f64 / (1 << 20) as f64,
            model.load_time.as_secs_f64() * 1e3
        );
        for f in figures {
            println!("{:<8} {:>5}  {:>9.1} tok/s", f.phase, f.size, f.tokens_per_second);
        }
    }
    Ok(())
}

fn profile_cmd(args: ProfileArgs) -> Result<()> {
    let ProfileArgs { model: margs, out, quick } = args;
    let path = margs.model_path()?;
    if !path.is_file() {
        bail!("model file {} does not exist", path.display());
    }
    // Fail on an unwritable destination now, not after minutes of measuring.
    let file = std::fs::File::create(&out)
        .with_context(|| format!("cannot write the profile to {}", out.display()))?;
    // The profile's step-time model (and its KV copying) is the CPU kernels'; the candle
    // backend has no profile yet, so a GPU pod's planner works from observed metrics alone.
    if let DeviceChoice::Exactly(d @ (ComputeDevice::CandleCpu | ComputeDevice::Cuda(_))) = margs.device {
        bail!("profile measures the CPU kernels only; --device {d} is not supported by profile");
    }
    let threads = margs.init_threads();
    let plan = if quick { ProfilePlan::quick() } else { ProfilePlan::full() };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("loading {} at {}", path.display(), margs.tier));
    let result = profile::profile(&path, margs.tier, threads, &plan, |p| match p {
        Progress::Loaded { steps, positions } => {
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} profile {msg} [{bar:30}] {pos}/{len} {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_length((steps + positions) as u64);
            bar.set_message("steps");
        }
        Progress::Step(s) => {
            bar.set_message(format!("rows {} prefill {}", s.decode_rows, s.prefill_tokens));
            bar.inc(1);
        }
        Progress::LoadingReference => bar.set_message(format!("loading {}", profile::REFERENCE_TIER)),
        Progress::Position => {
            bar.set_message(format!("quality vs {}", profile::REFERENCE_TIER));
            bar.inc(1);
        }
    });
    bar.finish_and_clear();
    let (profile, fit) = match result {
        Ok(r) => r,
        Err(e) => {
            drop(file);
            let _ = std::fs::remove_file(&out);
            return Err(e.into());
        }
    };
    let mut writer = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut writer, &profile)?;
    writeln!(writer)?;
    writer.flush().with_context(|| format!("writing {}", out.display()))?;

    let ms = |s: f64| s * 1e3;
    let m = &profile.step;
    println!(
        "{} at {} on {} thread(s), {} | load {:.0} ms, warm-up {:.0} ms",
        profile.model,
        profile.tier,
        profile.threads,
        profile.device,
        ms(profile.load_seconds),
        ms(profile.warmup_seconds)
    );
    println!(
        "step = {:.3} ms + {:.4} ms/decode row + {:.4} ms/prefill token + {:.6} ms/context token",
        ms(m.base_s),
        ms(m.per_decode_row_s),
        ms(m.per_prefill_token_s),
        ms(m.per_context_token_s)
    );
    println!(
        "fit over {} steps: mean relative error {:.1} %, max {:.1} %",
        profile.samples.len(),
        fit.mean_relative_error * 100.0,
        fit.max_relative_error * 100.0
    );
    println!("{:>5} {:>8} {:>8} {:>10} {:>10}", "rows", "prefill", "context", "measured", "fitted");
    for s in &profile.samples {
        println!(
            "{:>5} {:>8} {:>8} {:>7.2} ms {:>7.2} ms",
            s.decode_rows,
            s.prefill_tokens,
            s.context_tokens,
            ms(s.seconds),
            ms(m.predict(s))
        );
    }
    if let Some(q) = &profile.quality {
        println!(
            "quality vs {} over {} positions: top-1 agreement {:.1} %, mean KL {:.4} nats",
            q.reference_tier,
            q.tokens,
            q.top1_agreement * 100.0,
            q.mean_kl
        );
    }
    eprintln!("wrote {}", out.display());
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
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
            let how = pacer_cli::stop_signal().await;
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag can be set from the environment too, and `--help` names the variable.
    #[test]
    fn every_flag_has_an_environment_twin() {
        let missing = pacer_cli::flags_without_env(&mut super::Cli::command());
        assert!(missing.is_empty(), "flags without an environment twin: {missing:?}");
    }
}
