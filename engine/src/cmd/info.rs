//! `pacer-engine info`: the model's metadata, sizes and tiers.

use super::model::ModelArgs;
use anyhow::Result;
use clap::Args;
use pacer_engine::model::{KvCache, read_content};
use pacer_engine::{Tier, Tokenizer};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct InfoArgs {
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

pub fn run(args: InfoArgs) -> Result<()> {
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
        "tiers": Tier::PACER.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
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
