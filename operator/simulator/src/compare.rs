//! Running the simulator from the command line: one policy on one trace, or `--compare`, every
//! policy on every trace, with the best static replica count searched and the offline bound
//! computed; JSON summaries, per-window timelines, timeline pictures and a Markdown table.

use super::calibrate::{self, Bound, Mix, Profiled};
use super::dynamo::{Dynamo, DynamoV1};
use super::hindsight::{self, Hindsight};
use super::pacer::Pacer;
use super::policy::{Kpa, LlmdSlo, Policy, Static};
use super::score::Outcome;
use super::trace::{self, Shape, Trace, TraceSpec};
use super::{SimConfig, SimError, simulate};
use pacer_bench::load::Length;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A policy by name.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyName {
    /// Pacer's planner.
    Pacer,
    /// Pacer's planner given no profile: it learns the step model from the metrics
    /// (`pacer_planner::online`), as it must for a vLLM deployment nobody profiled.
    PacerOnline,
    /// llm-d's SLO saturation law behind an HPA.
    LlmdSlo,
    /// NVIDIA Dynamo's planner (its step model fitted online).
    Dynamo,
    /// NVIDIA Dynamo's earlier planner (correction factors).
    DynamoV1,
    /// Knative's KPA.
    Kpa,
    /// A fixed number of replicas.
    Static(i32),
    /// The per-window need, known in advance (`hindsight`, a pod start ahead) or from each
    /// window's first tick (`hindsight-no-lead`): references, not policies.
    Hindsight {
        /// Whether it asks a pod start ahead.
        lead: bool,
    },
    /// The offline lower bound (a number, not a run).
    Bound,
}

impl std::str::FromStr for PolicyName {
    type Err = String;
    fn from_str(s: &str) -> Result<PolicyName, String> {
        match s {
            "pacer" => Ok(PolicyName::Pacer),
            "pacer-online" => Ok(PolicyName::PacerOnline),
            "llmd-slo" => Ok(PolicyName::LlmdSlo),
            "dynamo" => Ok(PolicyName::Dynamo),
            "dynamo-v1" => Ok(PolicyName::DynamoV1),
            "kpa" => Ok(PolicyName::Kpa),
            "bound" => Ok(PolicyName::Bound),
            "hindsight" => Ok(PolicyName::Hindsight { lead: true }),
            "hindsight-no-lead" => Ok(PolicyName::Hindsight { lead: false }),
            _ => s
                .strip_prefix("static:")
                .and_then(|n| n.parse().ok())
                .filter(|n: &i32| *n >= 1)
                .map(PolicyName::Static)
                .ok_or_else(|| {
                    format!("`{s}`: expected pacer, pacer-online, llmd-slo, dynamo, dynamo-v1, kpa, static:N, hindsight, hindsight-no-lead or bound")
                }),
        }
    }
}

/// What the profile says, computed once per configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// Highest stationary rate meeting the SLA, for 1..=max replicas.
    pub capacities: Vec<f64>,
    /// One replica's mean latencies across rates (Dynamo's profile).
    pub profiled: Profiled,
}

/// The lengths the built-in traces draw from (chat sessions build longer prompts).
pub const LENGTHS: (Length, Length) = (trace::PROMPT_TOKENS, trace::OUTPUT_TOKENS);

/// The traces `--compare` runs: the four the planner was developed on, then the four held
/// out from its tuning.
pub const SHAPES: [Shape; 8] = [
    Shape::Step,
    Shape::Ramp,
    Shape::Diurnal,
    Shape::Bursty,
    Shape::FlashCrowd,
    Shape::LlmdBench,
    Shape::ChatSessions,
    Shape::RagMix,
];

/// Calibrates `config` on the request mix `mix` (a few seconds of CPU).
pub fn calibrate(config: &SimConfig, mix: &Mix) -> Result<Calibration, SimError> {
    let capacities = calibrate::capacities(config, mix)?;
    let one = capacities.first().copied().unwrap_or(1.0).max(0.05);
    let profiled = Profiled::measure(config, 1.6 * one, 24, mix)?;
    Ok(Calibration { capacities, profiled })
}

/// The request mix of `shape`: its length distributions, or for a shape that draws its own
/// lengths (chat sessions' prompts grow with the conversation) the requests of a sample of it.
pub fn mix_of(shape: &Shape, seed: u64) -> Result<Mix, SimError> {
    if !shape.own_lengths() {
        return Ok(shape.lengths().into());
    }
    let (prompt, output) = shape.lengths();
    let sample = trace::generate(&TraceSpec {
        shape: shape.clone(),
        base_rate: 2.0,
        duration: 3600.0,
        seed: seed ^ 0x5eed,
        prompt,
        output,
        resample: None,
    })?;
    Ok(Mix::of(&sample))
}

/// The trace `shape` at its base rate (a multiple of one replica's capacity on its own mix).
pub fn trace_for(shape: &Shape, cal: &Calibration, hours: f64, seed: u64) -> Result<Trace, SimError> {
    let one = cal.capacities.first().copied().unwrap_or(1.0);
    let (prompt, output) = shape.lengths();
    trace::generate(&TraceSpec {
        shape: shape.clone(),
        base_rate: one * shape.load_multiple(),
        duration: hours * 3600.0,
        seed,
        prompt,
        output,
        resample: None,
    })
}

/// The policy `name` for `config`.
pub fn make_policy(name: &PolicyName, config: &SimConfig, cal: &Calibration) -> Option<Box<dyn Policy>> {
    Some(match name {
        PolicyName::Pacer => Box::new(Pacer::new(&config.spec, config.profiles.clone())),
        PolicyName::PacerOnline => Box::new(Pacer::online(&config.spec)),
        PolicyName::LlmdSlo => Box::new(LlmdSlo::new(&config.spec)),
        PolicyName::Dynamo => Box::new(Dynamo::new(&config.spec)),
        PolicyName::DynamoV1 => Box::new(DynamoV1::new(&config.spec, cal.profiled.clone())),
        PolicyName::Kpa => Box::new(Kpa::new(&config.spec)),
        PolicyName::Static(n) => Box::new(Static { replicas: *n }),
        PolicyName::Hindsight { .. } | PolicyName::Bound => return None,
    })
}

/// Runs `name` on `trace` with the bound filled in.
pub fn run_one(
    config: &SimConfig,
    trace: &Trace,
    name: &PolicyName,
    cal: &Calibration,
) -> Result<Outcome, SimError> {
    if let PolicyName::Hindsight { lead } = name {
        return run_hindsight(config, trace, cal, &hindsight_needs(config, trace, cal)?, *lead);
    }
    let bound = calibrate::bound(config, trace, &cal.capacities);
    let mut policy = make_policy(name, config, cal)
        .ok_or_else(|| SimError::Input("the bound is not a run; use it with --compare or alone".into()))?;
    // Every run starts sized for its first minute (a service already serving its load, as the
    // bound is), and a static one at its size, so no policy pays for a cold start.
    let initial = match name {
        PolicyName::Static(n) => *n,
        _ => bound.replicas.first().copied().unwrap_or(config.spec.min_replicas),
    };
    run_from(config, trace, &bound, policy.as_mut(), initial)
}

/// The per-window needs of the hindsight references, repaired on `hindsight` runs.
pub fn hindsight_needs(config: &SimConfig, trace: &Trace, cal: &Calibration) -> Result<Vec<i32>, SimError> {
    hindsight::repaired(config, trace, cal, |need| {
        let o = run_hindsight(config, trace, cal, need, true)?;
        Ok(o.timeline.iter().map(|w| w.met).collect())
    })
}

/// Runs a hindsight reference on `trace` whose per-window needs are `need`.
pub fn run_hindsight(
    config: &SimConfig,
    trace: &Trace,
    cal: &Calibration,
    need: &[i32],
    lead: bool,
) -> Result<Outcome, SimError> {
    let bound = calibrate::bound(config, trace, &cal.capacities);
    // A pod start of the preferred tier, and a tick to notice it.
    let pod_start = config
        .profiles
        .iter()
        .find(|p| p.tier == config.spec.preferred_tier)
        .map_or(0.0, |p| super::fleet::start_delay(config.container_start, p));
    let lead = if lead { pod_start + hindsight::INTERVAL } else { 0.0 };
    let mut policy = Hindsight::new(need.to_vec(), config.score_window, lead);
    let initial = need.first().copied().unwrap_or(config.spec.min_replicas);
    run_from(config, trace, &bound, &mut policy, initial)
}

fn run_from(
    config: &SimConfig,
    trace: &Trace,
    bound: &Bound,
    policy: &mut dyn Policy,
    initial: i32,
) -> Result<Outcome, SimError> {
    let mut config = config.clone();
    config.initial.replicas = initial.clamp(config.spec.min_replicas, config.spec.max_replicas);
    let mut outcome = simulate(&config, trace, policy)?;
    outcome.summary.bound_replica_seconds = Some(bound.replica_seconds);
    outcome.summary.vs_bound = Some(outcome.summary.replica_seconds / bound.replica_seconds.max(1e-9));
    Ok(outcome)
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), SimError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| SimError::Output { path: path.display().to_string(), message: e.to_string() })?;
    std::fs::write(path, text + "\n")
        .map_err(|e| SimError::Output { path: path.display().to_string(), message: e.to_string() })
}

fn mkdir(dir: &Path) -> Result<(), SimError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| SimError::Output { path: dir.display().to_string(), message: e.to_string() })
}

/// Writes `summary.json`, `timeline.json` and the timeline picture of `outcome` into `dir`.
pub fn write_outcome(dir: &Path, outcome: &Outcome, config: &SimConfig) -> Result<Vec<PathBuf>, SimError> {
    mkdir(dir)?;
    let summary = dir.join("summary.json");
    write_json(&summary, &outcome.summary)?;
    let timeline = dir.join("timeline.json");
    write_json(&timeline, &serde_json::json!({"windows": outcome.timeline, "decisions": outcome.decisions}))?;
    let mut files = vec![summary, timeline];
    let pictures =
        super::plot::timeline(dir, outcome, (config.spec.ttft_target, config.spec.itl_target)).map_err(
            |message| SimError::Output { path: dir.join("timeline.svg").display().to_string(), message },
        )?;
    files.extend(pictures);
    Ok(files)
}

/// One line of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Trace name.
    pub trace: String,
    /// Policy name (the best static count as `static:N*`).
    pub policy: String,
    /// Share of windows meeting the SLA.
    pub attainment: f64,
    /// Share of requests meeting both targets (llm-d's measure).
    pub request_attainment: f64,
    /// Mean replicas (llm-d's cost measure).
    pub mean_replicas: f64,
    /// Pods × seconds.
    pub replica_seconds: f64,
    /// Against the bound.
    pub vs_bound: f64,
    /// Lever changes per hour.
    pub changes_per_hour: f64,
    /// Lever changes per hour while stationary.
    pub stationary_changes_per_hour: Option<f64>,
    /// Seconds to recover after the step.
    pub recovery_s: Option<f64>,
    /// Requests failed.
    pub failed: u64,
}

impl Row {
    fn of(o: &Outcome, name: &str) -> Row {
        let s = &o.summary;
        Row {
            trace: s.trace.clone(),
            policy: name.into(),
            attainment: s.attainment,
            request_attainment: s.request_attainment,
            mean_replicas: s.mean_pods,
            replica_seconds: s.replica_seconds,
            vs_bound: s.vs_bound.unwrap_or(f64::NAN),
            changes_per_hour: s.changes_per_hour,
            stationary_changes_per_hour: s.stationary_changes_per_hour,
            recovery_s: s.recovery_s,
            failed: s.failed,
        }
    }
}

/// The smallest static count meeting ≥ 99 % attainment on `trace` (or the maximum, if none
/// does), and its outcome.
pub fn best_static(
    config: &SimConfig,
    trace: &Trace,
    cal: &Calibration,
) -> Result<(i32, Outcome, bool), SimError> {
    let mut last = None;
    for n in config.spec.min_replicas..=config.spec.max_replicas {
        let o = run_one(config, trace, &PolicyName::Static(n), cal)?;
        if o.summary.attainment >= 0.99 {
            return Ok((n, o, true));
        }
        last = Some((n, o));
    }
    let (n, o) = last.ok_or_else(|| SimError::Input("the replica range is empty".into()))?;
    Ok((n, o, false))
}

/// Every policy on every trace; writes each run under `out/<trace>/<policy>/`, and
/// `compare.json` and `compare.md` into `out`. Returns the rows.
pub fn compare(
    config: &SimConfig,
    cal: &Calibration,
    hours: f64,
    seed: u64,
    out: &Path,
) -> Result<Vec<Row>, SimError> {
    let policies =
        [PolicyName::Pacer, PolicyName::LlmdSlo, PolicyName::Dynamo, PolicyName::DynamoV1, PolicyName::Kpa];
    let mut rows = Vec::new();
    let mut cals = vec![(Mix::from(LENGTHS), cal.clone())];
    for shape in &SHAPES {
        let mix = mix_of(shape, seed)?;
        let cal = match cals.iter().find(|(m, _)| *m == mix) {
            Some((_, c)) => c.clone(),
            None => {
                let c = calibrate(config, &mix)?;
                cals.push((mix, c.clone()));
                c
            }
        };
        let cal = &cal;
        let trace = trace_for(shape, cal, hours, seed)?;
        let bound = calibrate::bound(config, &trace, &cal.capacities);
        for name in &policies {
            let o = run_one(config, &trace, name, cal)?;
            let policy = o.summary.policy.clone();
            write_outcome(&out.join(&trace.name).join(&policy), &o, config)?;
            rows.push(Row::of(&o, &policy));
        }
        let (n, o, met) = best_static(config, &trace, cal)?;
        let label = if met { format!("static:{n}*") } else { format!("static:{n} (none meets 99 %)") };
        write_outcome(&out.join(&trace.name).join("static-best"), &o, config)?;
        rows.push(Row::of(&o, &label));
        let need = hindsight_needs(config, &trace, cal)?;
        for lead in [true, false] {
            let o = run_hindsight(config, &trace, cal, &need, lead)?;
            let policy = o.summary.policy.clone();
            write_outcome(&out.join(&trace.name).join(&policy), &o, config)?;
            rows.push(Row::of(&o, &policy));
        }
        rows.push(bound_row(&trace, &bound));
    }
    write_json(&out.join("compare.json"), &serde_json::json!({"calibration": cal, "rows": rows}))?;
    let md = markdown(&rows);
    std::fs::write(out.join("compare.md"), &md).map_err(|e| SimError::Output {
        path: out.join("compare.md").display().to_string(),
        message: e.to_string(),
    })?;
    Ok(rows)
}

fn bound_row(trace: &Trace, bound: &Bound) -> Row {
    Row {
        trace: trace.name.clone(),
        policy: "bound".into(),
        attainment: f64::NAN,
        request_attainment: f64::NAN,
        mean_replicas: bound.replica_seconds / trace.duration.max(1e-9),
        replica_seconds: bound.replica_seconds,
        vs_bound: 1.0,
        changes_per_hour: f64::NAN,
        stationary_changes_per_hour: None,
        recovery_s: None,
        failed: 0,
    }
}

/// The comparison as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| trace | policy | windows met | requests met | replica-seconds | mean replicas | vs bound | changes/h | changes/h stationary | recovery after step | failed |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let num = |v: f64, f: &dyn Fn(f64) -> String| if v.is_finite() { f(v) } else { "—".into() };
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {} |\n",
            r.trace,
            r.policy,
            num(r.attainment, &|v| format!("{:.1} %", v * 100.0)),
            num(r.request_attainment, &|v| format!("{:.1} %", v * 100.0)),
            r.replica_seconds,
            r.mean_replicas,
            num(r.vs_bound, &|v| format!("{v:.2}×")),
            num(r.changes_per_hour, &|v| format!("{v:.1}")),
            r.stationary_changes_per_hour.map_or("—".into(), |v| format!("{v:.1}")),
            r.recovery_s.map_or("—".into(), |v| format!("{v:.0} s")),
            if r.policy == "bound" { "—".into() } else { r.failed.to_string() },
        );
    }
    s
}

/// One `pacer-operator simulate` invocation.
#[derive(Debug, Clone)]
pub struct Options {
    /// The service and its profiles.
    pub config: SimConfig,
    /// The trace shape.
    pub trace: Shape,
    /// The policy.
    pub policy: PolicyName,
    /// Hours of simulated time.
    pub hours: f64,
    /// Seed of the trace.
    pub seed: u64,
    /// Output folder.
    pub out: PathBuf,
    /// Every policy on every trace instead of one run.
    pub compare: bool,
}

/// Runs what `options` asks for; returns the files written.
pub fn run(options: &Options) -> Result<Vec<PathBuf>, SimError> {
    let Options { config, trace: shape, policy, hours, seed, out, compare: all } = options;
    mkdir(out)?;
    let cal = calibrate(config, &mix_of(shape, *seed)?)?;
    if *all {
        compare(config, &cal, *hours, *seed, out)?;
        return Ok(vec![out.join("compare.json"), out.join("compare.md")]);
    }
    let trace = trace_for(shape, &cal, *hours, *seed)?;
    if *policy == PolicyName::Bound {
        let bound = calibrate::bound(config, &trace, &cal.capacities);
        let path = out.join("bound.json");
        write_json(&path, &serde_json::json!({"trace": trace.name, "calibration": cal, "bound": bound}))?;
        return Ok(vec![path]);
    }
    let outcome = run_one(config, &trace, policy, &cal)?;
    write_outcome(out, &outcome, config)
}
