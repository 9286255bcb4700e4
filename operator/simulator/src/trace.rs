//! Seeded request traces: when each request arrives and how long its prompt and output are.
//! Arrivals are `pacer-bench`'s open-loop schedule at unit rate (Poisson, or gamma for bursts)
//! mapped through the trace's cumulative rate, so one generator serves every shape; replays
//! read JSON lines (this module's `prompt_tokens`/`output_tokens` lines, or `pacer-bench`
//! datasets with timestamps).

use super::SimError;
use pacer_bench::load::{Arrivals, Length, Rng};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Seconds from the start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
}

/// The shape of a trace.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// The base rate throughout, Poisson arrivals.
    Steady,
    /// The base rate, doubled for the middle third of the run.
    Step,
    /// The rate grows linearly to 4× the base over the run.
    Ramp,
    /// A day compressed into the run: a sinusoid from the base rate up to 4× and back.
    Diurnal,
    /// The base rate with gamma inter-arrivals of coefficient of variation 3.
    Bursty,
    /// Held out (never tuned on): the diurnal day with a flash crowd — at 55 % of the run the
    /// rate triples within 30 s, holds for 5 minutes and falls back within a minute.
    FlashCrowd,
    /// Held out: llm-d's autoscaling benchmark shape — low load, five times that load, low
    /// again (a fifth, half and the rest of the run).
    LlmdBench,
    /// Held out: chat sessions with long, growing prompts — sessions arrive at random, each
    /// 2–8 turns apart by 5–60 s of reading and typing; a turn's prompt is a system prompt
    /// plus the conversation so far (up to about 3,000 tokens), so arrivals cluster and
    /// prompts lengthen within a session.
    ChatSessions,
    /// Held out, written after the planner's last change tuned on `chat-sessions`:
    /// retrieval-augmented traffic through a working day — Poisson arrivals at the base rate,
    /// rising to twice it between 25 and 35 % of the run, held, and back down between 75 and
    /// 85 %; a tenth of the prompts carry retrieved documents (1,000–2,500 tokens), the rest
    /// are questions (64–512).
    RagMix,
    /// Requests read from a JSON-lines file.
    Replay(PathBuf),
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Shape, String> {
        match s {
            "steady" => Ok(Shape::Steady),
            "step" => Ok(Shape::Step),
            "ramp" => Ok(Shape::Ramp),
            "diurnal" => Ok(Shape::Diurnal),
            "bursty" => Ok(Shape::Bursty),
            "flash-crowd" => Ok(Shape::FlashCrowd),
            "llmd-bench" => Ok(Shape::LlmdBench),
            "chat-sessions" => Ok(Shape::ChatSessions),
            "rag-mix" => Ok(Shape::RagMix),
            _ => match s.strip_prefix("replay:") {
                Some(path) if !path.is_empty() => Ok(Shape::Replay(PathBuf::from(path))),
                _ => Err(format!(
                    "`{s}`: expected steady, step, ramp, diurnal, bursty, flash-crowd, llmd-bench, chat-sessions, rag-mix or replay:FILE.jsonl"
                )),
            },
        }
    }
}

impl Shape {
    /// The name in tables and file names.
    pub fn name(&self) -> String {
        match self {
            Shape::Steady => "steady".into(),
            Shape::Step => "step".into(),
            Shape::Ramp => "ramp".into(),
            Shape::Diurnal => "diurnal".into(),
            Shape::Bursty => "bursty".into(),
            Shape::FlashCrowd => "flash-crowd".into(),
            Shape::LlmdBench => "llmd-bench".into(),
            Shape::ChatSessions => "chat-sessions".into(),
            Shape::RagMix => "rag-mix".into(),
            Shape::Replay(p) => format!("replay:{}", p.display()),
        }
    }

    /// The base rate as a multiple of one replica's capacity at the SLA, chosen so the
    /// interesting range lies between a few and most of the replicas.
    pub fn load_multiple(&self) -> f64 {
        match self {
            Shape::Steady | Shape::Step => 2.0,
            Shape::Ramp => 1.25,
            Shape::Diurnal => 1.2,
            Shape::Bursty => 2.5,
            Shape::FlashCrowd => 1.0,
            Shape::LlmdBench => 1.0,
            Shape::ChatSessions => 2.0,
            Shape::RagMix => 1.5,
            Shape::Replay(_) => 1.0,
        }
    }

    /// The arrival rate at `t` of a run of `duration` seconds, relative to the base rate.
    pub fn relative_rate(&self, t: f64, duration: f64) -> f64 {
        match self {
            Shape::Step => {
                if (duration / 3.0..2.0 * duration / 3.0).contains(&t) {
                    2.0
                } else {
                    1.0
                }
            }
            Shape::Ramp => 1.0 + 3.0 * t / duration,
            Shape::Diurnal => 1.0 + 1.5 * (1.0 - (std::f64::consts::TAU * t / duration).cos()),
            Shape::FlashCrowd => {
                let day = Shape::Diurnal.relative_rate(t, duration);
                let start = 0.55 * duration;
                let crowd = if t < start {
                    0.0
                } else if t < start + 30.0 {
                    (t - start) / 30.0
                } else if t < start + 330.0 {
                    1.0
                } else {
                    (1.0 - (t - start - 330.0) / 60.0).max(0.0)
                };
                day * (1.0 + 2.0 * crowd)
            }
            Shape::LlmdBench => {
                if (0.2 * duration..0.7 * duration).contains(&t) {
                    5.0
                } else {
                    1.0
                }
            }
            Shape::RagMix => {
                let f = t / duration;
                let ramp = |from: f64, to: f64| ((f - from) / (to - from)).clamp(0.0, 1.0);
                1.0 + ramp(0.25, 0.35) - ramp(0.75, 0.85)
            }
            Shape::Steady | Shape::Bursty | Shape::ChatSessions | Shape::Replay(_) => 1.0,
        }
    }

    /// When the load steps, for the recovery score.
    pub fn step_at(&self, duration: f64) -> Option<f64> {
        match self {
            Shape::Step => Some(duration / 3.0),
            Shape::LlmdBench => Some(0.2 * duration),
            _ => None,
        }
    }

    /// The prompt and output lengths the shape draws from (chat sessions build their own
    /// prompts from the conversation; their outputs come from the second).
    pub fn lengths(&self) -> (Length, Length) {
        match self {
            Shape::ChatSessions => (Length::Uniform { min: 40, max: 200 }, OUTPUT_TOKENS),
            _ => (PROMPT_TOKENS, OUTPUT_TOKENS),
        }
    }

    /// Whether the shape draws its own prompt lengths (so its request mix is measured on a
    /// sample of it, not read from [`Shape::lengths`]).
    pub fn own_lengths(&self) -> bool {
        matches!(self, Shape::ChatSessions | Shape::RagMix)
    }

    /// Whether the shape is one of those held out from tuning the planner.
    pub fn held_out(&self) -> bool {
        matches!(self, Shape::FlashCrowd | Shape::LlmdBench | Shape::ChatSessions | Shape::RagMix)
    }

    /// Where the rate is constant (start, end), for the changes-per-hour-while-stationary score.
    pub fn stationary(&self, duration: f64) -> Vec<(f64, f64)> {
        match self {
            // The settling after each step (10 min) is not stationary.
            Shape::Step => {
                let third = duration / 3.0;
                vec![(0.0, third), (third + 600.0, 2.0 * third), (2.0 * third + 600.0, duration)]
            }
            // The first 10 min settle from the minimum replicas.
            Shape::Steady | Shape::Bursty | Shape::ChatSessions => vec![(600.0_f64.min(duration), duration)],
            // The quiet morning after its first 10 min, and the busy day 10 min after the rise.
            Shape::RagMix => [(600.0, 0.25 * duration), (0.35 * duration + 600.0, 0.75 * duration)]
                .into_iter()
                .filter(|(a, b)| a < b)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// A generated or replayed trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The shape's name.
    pub name: String,
    /// The shape.
    pub shape: Shape,
    /// Requests in arrival order.
    pub requests: Vec<Request>,
    /// Seconds the run lasts.
    pub duration: f64,
    /// Base requests per second.
    pub base_rate: f64,
}

impl Trace {
    /// The trace `spec` describes, with these requests.
    fn of(spec: &TraceSpec, requests: Vec<Request>) -> Trace {
        Trace {
            name: spec.shape.name(),
            shape: spec.shape.clone(),
            requests,
            duration: spec.duration,
            base_rate: spec.base_rate,
        }
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct TraceSpec {
    /// The shape.
    pub shape: Shape,
    /// Base requests per second.
    pub base_rate: f64,
    /// Seconds.
    pub duration: f64,
    /// Seed of arrivals and lengths.
    pub seed: u64,
    /// Prompt lengths.
    pub prompt: Length,
    /// Output lengths.
    pub output: Length,
    /// Instead of drawing lengths: draw (prompt, output) pairs from these, at random (a
    /// stationary load with another trace's request mix, for calibration).
    pub resample: Option<std::sync::Arc<Vec<(u32, u32)>>>,
}

/// Prompt lengths fitting the test model's serving setup (64–512 tokens).
pub const PROMPT_TOKENS: Length = Length::Uniform { min: 64, max: 512 };
/// Output lengths (32–256 tokens).
pub const OUTPUT_TOKENS: Length = Length::Uniform { min: 32, max: 256 };

/// Builds the trace `spec` describes.
pub fn generate(spec: &TraceSpec) -> Result<Trace, SimError> {
    if let Shape::Replay(path) = &spec.shape {
        return replay(path, spec.duration);
    }
    if let Shape::ChatSessions = &spec.shape {
        return sessions(spec);
    }
    if let Some(pool) = &spec.resample {
        return resampled(spec, pool);
    }
    let mut rng = Rng::new(spec.seed);
    let burstiness = if matches!(spec.shape, Shape::Bursty) { 1.0 / 9.0 } else { 1.0 };
    // Cumulative rate on a fine grid; arrivals of a unit-rate process are mapped through its
    // inverse (time change), which keeps the process' burstiness and gives the shape's rate.
    let dt = 0.5;
    let steps = (spec.duration / dt).ceil() as usize;
    let mut cumulative = Vec::with_capacity(steps + 1);
    let mut acc = 0.0;
    cumulative.push(0.0);
    for k in 0..steps {
        let t = (k as f64 + 0.5) * dt;
        acc += spec.base_rate * spec.shape.relative_rate(t, spec.duration) * dt;
        cumulative.push(acc);
    }
    let expected = acc;
    let n = (expected * 1.2 + 10.0 * expected.sqrt() + 100.0) as usize;
    let unit = Arrivals::Open { rate: 1.0, burstiness, ramp_to: None }.schedule(n, &mut rng);
    let mut requests = Vec::with_capacity(expected as usize + 16);
    for u in unit {
        if u >= expected {
            break;
        }
        let k = cumulative.partition_point(|c| *c <= u).max(1) - 1;
        let within = (u - cumulative[k]) / (cumulative[k + 1] - cumulative[k]).max(f64::MIN_POSITIVE);
        let t = (k as f64 + within) * dt;
        requests.push(Request {
            timestamp: t.min(spec.duration),
            prompt_tokens: prompt_for(&spec.shape, &spec.prompt, &mut rng),
            output_tokens: spec.output.sample(&mut rng) as u32,
        });
    }
    Ok(Trace::of(spec, requests))
}

/// The share of `rag-mix` prompts that carry retrieved documents...
const RAG_SHARE: f64 = 0.1;
/// ...and their lengths.
const RAG_PROMPT: Length = Length::Uniform { min: 1000, max: 2500 };

/// A prompt length for `shape`: from `prompt`, or for `rag-mix` a document-carrying prompt
/// with chance [`RAG_SHARE`].
fn prompt_for(shape: &Shape, prompt: &Length, rng: &mut Rng) -> u32 {
    if *shape == Shape::RagMix && rng.uniform() < RAG_SHARE {
        RAG_PROMPT.sample(rng) as u32
    } else {
        prompt.sample(rng) as u32
    }
}

/// Mean turns of a chat session (2–8, uniform).
const SESSION_TURNS: (u32, u32) = (2, 8);
/// Seconds between a session's turns (reading the answer, typing the next question).
const THINK_SECONDS: (f64, f64) = (5.0, 60.0);
/// Tokens of the system prompt every session starts with.
const SYSTEM_PROMPT: u32 = 150;
/// A conversation longer than this is cut (the client keeps the recent turns).
const MAX_PROMPT: u32 = 3000;

/// Chat sessions: session starts in Poisson at a rate that gives `base_rate` requests per
/// second on average; each session's turns follow with think times, prompts growing with the
/// conversation.
fn sessions(spec: &TraceSpec) -> Result<Trace, SimError> {
    let mut rng = Rng::new(spec.seed);
    let mean_turns = f64::from(SESSION_TURNS.0 + SESSION_TURNS.1) / 2.0;
    let session_rate = spec.base_rate / mean_turns;
    let mut requests = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.uniform()).ln() / session_rate;
        if t >= spec.duration {
            break;
        }
        let turns =
            SESSION_TURNS.0 + (rng.uniform() * f64::from(SESSION_TURNS.1 - SESSION_TURNS.0 + 1)) as u32;
        let (mut at, mut context) = (t, SYSTEM_PROMPT);
        for _ in 0..turns.min(SESSION_TURNS.1) {
            if at >= spec.duration {
                break;
            }
            let question = spec.prompt.sample(&mut rng) as u32;
            let answer = spec.output.sample(&mut rng) as u32;
            let prompt = (context + question).min(MAX_PROMPT);
            requests.push(Request { timestamp: at, prompt_tokens: prompt, output_tokens: answer });
            context = prompt + answer;
            at += THINK_SECONDS.0 + rng.uniform() * (THINK_SECONDS.1 - THINK_SECONDS.0);
        }
    }
    requests.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    Ok(Trace::of(spec, requests))
}

/// Poisson arrivals at the base rate with (prompt, output) pairs drawn from `pool`.
fn resampled(spec: &TraceSpec, pool: &[(u32, u32)]) -> Result<Trace, SimError> {
    if pool.is_empty() {
        return Err(SimError::Input("no request lengths to resample".into()));
    }
    let mut rng = Rng::new(spec.seed);
    let mut requests = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.uniform()).ln() / spec.base_rate.max(1e-9);
        if t >= spec.duration {
            break;
        }
        let (prompt, output) = pool[((rng.uniform() * pool.len() as f64) as usize).min(pool.len() - 1)];
        requests.push(Request { timestamp: t, prompt_tokens: prompt, output_tokens: output });
    }
    Ok(Trace::of(spec, requests))
}

/// Reads a replay: this module's lines (`timestamp`, `prompt_tokens`, `output_tokens`), or a
/// `pacer-bench` dataset with timestamps (prompt words count as tokens, as its synthetic
/// prompts are built; `max_tokens` is the output). A duration of 0 means the trace's own.
fn replay(path: &std::path::Path, duration: f64) -> Result<Trace, SimError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SimError::Input(format!("reading {}: {e}", path.display())))?;
    let ours: Result<Vec<Request>, _> = pacer_bench::jsonl::parse(&text);
    let mut requests = match ours {
        Ok(r) => r,
        Err(_) => {
            let items = pacer_bench::dataset::parse(&text)
                .map_err(|e| SimError::Input(format!("{}: {e}", path.display())))?;
            let times = pacer_bench::dataset::replay_schedule(&items, 1.0)
                .map_err(|e| SimError::Input(format!("{}: {e}", path.display())))?;
            items
                .iter()
                .zip(times)
                .map(|(it, t)| Request {
                    timestamp: t,
                    prompt_tokens: it.prompt.as_deref().map_or(64, |p| p.split_whitespace().count()) as u32,
                    output_tokens: it.max_tokens.unwrap_or(128) as u32,
                })
                .collect()
        }
    };
    if requests.is_empty() {
        return Err(SimError::Input(format!("{}: no requests", path.display())));
    }
    requests.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    let start = requests[0].timestamp;
    requests.iter_mut().for_each(|r| r.timestamp -= start);
    let own = requests.last().map_or(0.0, |r| r.timestamp) + 1.0;
    let duration = if duration > 0.0 { duration.min(own) } else { own };
    requests.retain(|r| r.timestamp < duration);
    let base_rate = requests.len() as f64 / duration;
    Ok(Trace { name: "replay".into(), shape: Shape::Replay(path.into()), requests, duration, base_rate })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(shape: Shape) -> TraceSpec {
        TraceSpec {
            shape,
            base_rate: 5.0,
            duration: 3600.0,
            seed: 1,
            prompt: PROMPT_TOKENS,
            output: OUTPUT_TOKENS,
            resample: None,
        }
    }

    #[test]
    fn traces_follow_their_rate_shape_and_are_reproducible() {
        let step = generate(&spec(Shape::Step)).unwrap();
        let count = |t: &Trace, a: f64, b: f64| {
            t.requests.iter().filter(|r| r.timestamp >= a && r.timestamp < b).count() as f64
        };
        let before = count(&step, 0.0, 1200.0) / 1200.0;
        let during = count(&step, 1200.0, 2400.0) / 1200.0;
        let after = count(&step, 2400.0, 3600.0) / 1200.0;
        assert!((before - 5.0).abs() < 0.4 && (during - 10.0).abs() < 0.5, "{before} {during}");
        assert!((after - 5.0).abs() < 0.4, "{after}");
        let ramp = generate(&spec(Shape::Ramp)).unwrap();
        assert!((count(&ramp, 3300.0, 3600.0) / 300.0 - 5.0 * 3.875).abs() < 1.5);
        let again = generate(&spec(Shape::Step)).unwrap();
        assert_eq!(step.requests, again.requests);
        assert!(step.requests.iter().all(|r| (64..=512).contains(&r.prompt_tokens)));
        assert!(step.requests.iter().all(|r| (32..=256).contains(&r.output_tokens)));
    }

    #[test]
    fn bursty_arrivals_have_a_coefficient_of_variation_near_three() {
        let t = generate(&spec(Shape::Bursty)).unwrap();
        let gaps: Vec<f64> = t.requests.windows(2).map(|w| w[1].timestamp - w[0].timestamp).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((2.4..3.6).contains(&cv), "CV {cv}");
        assert!((1.0 / mean - 5.0).abs() < 0.8, "rate {}", 1.0 / mean);
    }

    #[test]
    fn held_out_shapes_have_their_features() {
        let crowd = generate(&spec(Shape::FlashCrowd)).unwrap();
        let count = |t: &Trace, a: f64, b: f64| {
            t.requests.iter().filter(|r| r.timestamp >= a && r.timestamp < b).count() as f64 / (b - a)
        };
        let (before, during) = (count(&crowd, 1800.0, 1980.0), count(&crowd, 2040.0, 2280.0));
        assert!(during > 2.5 * before, "the crowd triples the rate: {before} → {during}");
        let llmd = generate(&spec(Shape::LlmdBench)).unwrap();
        let (low, high) = (count(&llmd, 0.0, 720.0), count(&llmd, 720.0, 2520.0));
        assert!((high / low - 5.0).abs() < 0.6, "{low} → {high}");
        let chat = generate(&spec(Shape::ChatSessions)).unwrap();
        let rate = chat.requests.len() as f64 / 3600.0;
        assert!((rate - 5.0).abs() < 0.8, "{rate}");
        let longest = chat.requests.iter().map(|r| r.prompt_tokens).max().unwrap();
        assert!(longest > 1500 && longest <= MAX_PROMPT, "{longest}");
        assert!(chat.requests.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        let rag = generate(&spec(Shape::RagMix)).unwrap();
        let (quiet, busy) = (count(&rag, 0.0, 900.0), count(&rag, 1260.0, 2700.0));
        assert!((busy / quiet - 2.0).abs() < 0.25, "{quiet} → {busy}");
        let long = rag.requests.iter().filter(|r| r.prompt_tokens >= 1000).count() as f64;
        let share = long / rag.requests.len() as f64;
        assert!((share - RAG_SHARE).abs() < 0.02, "{share}");
        assert!(rag.requests.iter().all(|r| (64..=2500).contains(&r.prompt_tokens)));
        // Resampling keeps the pool's lengths at a stationary rate.
        let pool = std::sync::Arc::new(vec![(100, 10), (900, 20)]);
        let r = generate(&TraceSpec { resample: Some(pool), ..spec(Shape::Steady) }).unwrap();
        assert!(
            r.requests
                .iter()
                .all(|q| (q.prompt_tokens, q.output_tokens) == (100, 10) || q.prompt_tokens == 900)
        );
        assert!((r.requests.len() as f64 / 3600.0 - 5.0).abs() < 0.4);
    }

    #[test]
    fn replays_read_both_formats() {
        let dir = std::env::temp_dir().join(format!("pacer-sim-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours.jsonl");
        std::fs::write(
            &ours,
            "{\"timestamp\": 10, \"prompt_tokens\": 100, \"output_tokens\": 20}\n\
             {\"timestamp\": 12.5, \"prompt_tokens\": 50, \"output_tokens\": 5}\n",
        )
        .unwrap();
        let t = generate(&spec(Shape::Replay(ours))).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[1].timestamp, 2.5);
        let bench = dir.join("bench.jsonl");
        std::fs::write(&bench, "{\"prompt\": \"a b c\", \"max_tokens\": 7, \"timestamp\": 3}\n").unwrap();
        let t = generate(&spec(Shape::Replay(bench))).unwrap();
        assert_eq!((t.requests[0].prompt_tokens, t.requests[0].output_tokens), (3, 7));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
