//! The simulator against its physics and Pacer's planner against the scenarios it must pass:
//! Little's law on a stationary run, static capacity below and above the load, the load step
//! (recover, rise, fall), a stationary load (few changes) and degrading a tier at max replicas
//! then restoring it; and the comparison table's figures on the smooth traces, held as floors.
//! Fixed seeds; each run is minutes to hours of simulated time.

use pacer_crds::Tier;
use pacer_planner::Levers;
use pacer_simulator::compare::{self, LENGTHS, PolicyName};
use pacer_simulator::policy::{Move, Policy, Static};
use pacer_simulator::prom::Seen;
use pacer_simulator::trace::{Shape, TraceSpec, generate};
use pacer_simulator::{SimConfig, calibrate, pacer::Pacer, read_spec, simulate, test_profile, vllm_profile};

fn config(yaml_overrides: &str) -> SimConfig {
    let mut yaml = pacer_simulator::DEFAULT_SPEC.to_string();
    for (from, to) in yaml_overrides.split(';').filter_map(|p| p.split_once("=>")) {
        assert!(yaml.contains(from.trim()), "{from}");
        yaml = yaml.replace(from.trim(), to.trim());
    }
    let spec = read_spec(&yaml).expect("spec");
    SimConfig::new(&spec, vec![test_profile(Tier::Q8_0), test_profile(Tier::Q4_0)]).expect("config")
}

fn trace(shape: Shape, rate: f64, seconds: f64, seed: u64) -> pacer_simulator::trace::Trace {
    generate(&TraceSpec {
        shape,
        base_rate: rate,
        duration: seconds,
        seed,
        prompt: LENGTHS.0,
        output: LENGTHS.1,
        resample: None,
    })
    .expect("trace")
}

/// Holds the levers and records what Prometheus says is in the engines.
struct Recorder {
    in_system: Vec<f64>,
}

impl Policy for Recorder {
    fn name(&self) -> String {
        "recorder".into()
    }
    fn interval(&self) -> f64 {
        15.0
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        let m = &seen.observation.metrics;
        if now > 120.0 {
            self.in_system.push(m.running.unwrap_or(0.0) + m.waiting.unwrap_or(0.0));
        }
        Move { levers: *current, reason: "hold".into() }
    }
}

#[test]
fn littles_law_holds_on_a_stationary_run() {
    let mut c = config("replicas: {min: 1, max: 8} => replicas: {min: 3, max: 8}");
    c.initial.replicas = 3;
    let t = trace(Shape::Steady, 4.0, 3600.0, 11);
    let mut rec = Recorder { in_system: Vec::new() };
    let o = simulate(&c, &t, &mut rec).expect("run");
    let s = &o.summary;
    assert_eq!(s.failed, 0);
    let lambda = s.finished as f64 / s.duration_s;
    let l_measured = rec.in_system.iter().sum::<f64>() / rec.in_system.len() as f64;
    let l_little = lambda * s.e2e_mean.expect("e2e");
    let rel = (l_measured - l_little).abs() / l_little;
    assert!(rel < 0.05, "L from the gauges {l_measured:.2} vs λW {l_little:.2}");
}

#[test]
fn static_replicas_below_the_load_violate_and_enough_meet() {
    let c = config("");
    let one = calibrate::capacity(&c, 1, &LENGTHS.into()).expect("capacity");
    assert!(one > 0.2 && one < 20.0, "one replica holds {one} req/s");
    let t = trace(Shape::Steady, 2.0 * one, 1800.0, 3);
    let run = |n: i32| {
        let mut c = c.clone();
        c.initial.replicas = n;
        simulate(&c, &t, &mut Static { replicas: n }).expect("run").summary
    };
    let (few, enough) = (run(1), run(4));
    assert!(few.attainment < 0.5, "1 replica at twice its capacity: {}", few.attainment);
    assert!(enough.attainment >= 0.99, "4 replicas at twice one's capacity: {}", enough.attainment);
    assert!(enough.replica_seconds > 3.9 * few.replica_seconds);
    assert_eq!(few.failed + enough.failed, 0);
}

#[test]
fn pacer_recovers_from_a_step_and_gives_the_replicas_back() {
    let c = config("");
    let one = calibrate::capacity(&c, 1, &LENGTHS.into()).expect("capacity");
    let t = trace(Shape::Step, 2.0 * one, 5400.0, 5);
    let o = simulate(&c, &t, &mut Pacer::new(&c.spec, c.profiles.clone())).expect("run");
    let s = &o.summary;
    let recovery = s.recovery_s.expect("a step trace");
    assert!(recovery <= 600.0, "recovered in {recovery} s");
    let at = |t: f64| o.timeline.iter().find(|w| w.t >= t).expect("window").desired;
    let (before, during, after) = (at(1700.0), at(3500.0), at(5400.0));
    assert!(during > before, "replicas rise with the step: {before} → {during}");
    assert!(after < during, "and fall after it: {during} → {after}");
    assert!(s.attainment >= 0.9, "attainment {}", s.attainment);
    assert_eq!(s.failed, 0);
}

/// The current Dynamo baseline sizes from the step model it fits to the workers' reports: one
/// replica far below a doubled load scales up on its predictions, never beyond the range, and
/// every decision names the prediction it acted on.
#[test]
fn the_dynamo_baseline_scales_on_the_step_model_it_fits_to_the_workers_reports() {
    use pacer_simulator::dynamo::Dynamo;
    let c = config("");
    let one = calibrate::capacity(&c, 1, &LENGTHS.into()).expect("capacity");
    let t = trace(Shape::Steady, 3.0 * one, 900.0, 4);
    let o = simulate(&c, &t, &mut Dynamo::new(&c.spec)).expect("run");
    let ups: Vec<_> = o.decisions.iter().filter(|d| d.to.replicas > d.from.replicas).collect();
    assert!(!ups.is_empty(), "never scaled up: {:?}", o.decisions);
    assert!(ups.iter().all(|d| d.reason.contains("every worker predicts")), "{:?}", ups);
    let most = o.timeline.iter().map(|w| w.desired).max().expect("windows");
    assert!((3..=c.spec.max_replicas).contains(&most), "peak {most} replicas for three times one's capacity");
}

#[test]
fn pacer_holds_still_under_a_stationary_load() {
    let mut c = config("");
    let one = calibrate::capacity(&c, 1, &LENGTHS.into()).expect("capacity");
    // Started at the size the load needs: a stationary load, not a step from the minimum.
    let t = trace(Shape::Steady, 2.5 * one, 7200.0, 9);
    let caps: Vec<f64> =
        (1..=8).map(|n| calibrate::capacity(&c, n, &LENGTHS.into()).expect("capacity")).collect();
    c.initial.replicas = caps.iter().position(|cap| *cap >= 2.5 * one).expect("fits") as i32 + 1;
    let o = simulate(&c, &t, &mut Pacer::new(&c.spec, c.profiles.clone())).expect("run");
    let per_hour = o.summary.stationary_changes_per_hour.expect("stationary");
    assert!(per_hour <= 2.0, "{per_hour} changes per hour: {:?}", o.decisions);
    assert!(o.summary.attainment >= 0.95, "attainment {}", o.summary.attainment);
}

#[test]
fn pacer_degrades_the_tier_at_max_replicas_and_restores_it() {
    let c = config(
        "replicas: {min: 1, max: 8} => replicas: {min: 1, max: 2}; allowDegrade: false => allowDegrade: true",
    );
    let two = calibrate::capacity(&c, 2, &LENGTHS.into()).expect("capacity");
    // The middle third needs 1.2× what two q8_0 replicas hold; q4_0 is ~1.4× faster.
    let t = trace(Shape::Step, 0.6 * two, 5400.0, 13);
    let o = simulate(&c, &t, &mut Pacer::new(&c.spec, c.profiles.clone())).expect("run");
    let tiers: Vec<&str> = o.timeline.iter().map(|w| w.tier.as_str()).collect();
    let degraded = tiers.iter().position(|t| *t == "q4_0").expect("degraded at some point");
    assert!(degraded as f64 * 60.0 >= 1800.0, "degraded only after the step, at minute {degraded}");
    assert_eq!(*tiers.last().expect("windows"), "q8_0", "restored after the load fell: {:?}", o.decisions);
    assert_eq!(o.summary.failed, 0);
}

/// The comparison table's smooth traces and the long-prompt chat sessions (one hour, seed 1, as
/// in `docs/benchmarks.md`): Pacer holds at least llm-d's attainment at no more than half its
/// replica-seconds, and keeps the attainment and cost against the bound it has today
/// (deterministic, so any change that loses them fails here). On the chat sessions the TTFT
/// floor of long prompts sits near the target: summing the percentiles of the waits and of the
/// prefill (not the percentile of their sum) ran 2.52× the bound there, and taking the
/// bucketed prompt length at the percentile up as fast as the mean 1.78×. `rag-mix` was
/// written after both, and held out.
#[test]
fn pacer_beats_the_llmd_law_on_the_smooth_traces_and_chat_and_keeps_its_figures() {
    let c = config("");
    for (shape, attainment, vs_bound) in [
        (Shape::Step, 0.98, 1.36),
        (Shape::Ramp, 1.0, 1.04),
        (Shape::Diurnal, 1.0, 1.20),
        (Shape::ChatSessions, 1.0, 1.48),
        (Shape::RagMix, 1.0, 1.26),
    ] {
        let cal = compare::calibrate(&c, &compare::mix_of(&shape, 1).expect("mix")).expect("calibration");
        let t = compare::trace_for(&shape, &cal, 1.0, 1).expect("trace");
        let pacer = compare::run_one(&c, &t, &PolicyName::Pacer, &cal).expect("pacer").summary;
        let llmd = compare::run_one(&c, &t, &PolicyName::LlmdSlo, &cal).expect("llmd").summary;
        let name = shape.name();
        assert!(
            pacer.attainment >= llmd.attainment,
            "{name}: {} vs llm-d's {}",
            pacer.attainment,
            llmd.attainment
        );
        assert!(
            pacer.replica_seconds <= 0.5 * llmd.replica_seconds,
            "{name}: {} replica-seconds vs llm-d's {}",
            pacer.replica_seconds,
            llmd.replica_seconds
        );
        assert!(pacer.attainment >= attainment, "{name}: attainment {}", pacer.attainment);
        let cost = pacer.vs_bound.expect("bound");
        assert!(cost <= vs_bound, "{name}: {cost:.3}× the bound");
        assert_eq!(pacer.failed, 0);
    }
}

/// The held-out flash crowd (`docs/benchmarks.md`, one hour, seed 1): the crowd needs more than
/// the 8 replicas allowed, so no policy holds every window (`static:8` holds 93.3 %); Pacer holds
/// at least llm-d's windows (91.7 % against 88.3 %) for at most 0.7× its replica-seconds, and
/// keeps its cost against the bound (1.34× in the table), with no request failed.
#[test]
fn pacer_holds_the_flash_crowd_at_least_as_well_as_llmd_for_less() {
    let c = config("");
    let shape = Shape::FlashCrowd;
    let cal = compare::calibrate(&c, &compare::mix_of(&shape, 1).expect("mix")).expect("calibration");
    let t = compare::trace_for(&shape, &cal, 1.0, 1).expect("trace");
    let pacer = compare::run_one(&c, &t, &PolicyName::Pacer, &cal).expect("pacer").summary;
    let llmd = compare::run_one(&c, &t, &PolicyName::LlmdSlo, &cal).expect("llmd").summary;
    assert!(pacer.attainment >= llmd.attainment, "{} vs llm-d's {}", pacer.attainment, llmd.attainment);
    assert!(pacer.attainment >= 0.9, "attainment {}", pacer.attainment);
    assert!(
        pacer.replica_seconds <= 0.7 * llmd.replica_seconds,
        "{} replica-seconds vs llm-d's {}",
        pacer.replica_seconds,
        llmd.replica_seconds
    );
    let cost = pacer.vs_bound.expect("bound");
    assert!(cost <= 1.36, "{cost:.3}× the bound");
    assert_eq!(pacer.failed, 0);
}

/// The hindsight references (`docs/benchmarks.md`, one hour, seed 1): on the step trace a
/// schedule that knows the future holds every window at 1.15× the bound, and the same schedule
/// learnt only as each window opens (a perfect, instant detector held back by the pod start)
/// loses the window after the doubling; on the bursty trace even foresight needs far more than
/// the bound, whose Poisson capacities cannot see bursts shorter than a window.
#[test]
fn the_hindsight_references_show_what_no_policy_can_reach() {
    let c = config("");
    let run = |shape: Shape, name: &str| {
        let cal = compare::calibrate(&c, &compare::mix_of(&shape, 1).expect("mix")).expect("calibration");
        let t = compare::trace_for(&shape, &cal, 1.0, 1).expect("trace");
        compare::run_one(&c, &t, &name.parse().expect("policy"), &cal).expect("run").summary
    };
    let ahead = run(Shape::Step, "hindsight");
    assert!(ahead.attainment >= 0.99, "foresight holds every window: {}", ahead.attainment);
    assert!(ahead.vs_bound.expect("bound") <= 1.2, "{:?}", ahead.vs_bound);
    let late = run(Shape::Step, "hindsight-no-lead");
    assert!(late.attainment < 0.99, "the doubling window is lost without foresight: {}", late.attainment);
    let bursty = run(Shape::Bursty, "hindsight");
    assert!(bursty.attainment >= 0.99, "{}", bursty.attainment);
    assert!(bursty.vs_bound.expect("bound") >= 1.4, "{:?}", bursty.vs_bound);
}

/// A leader failover mid-step (issue: a new leader started from an empty history): a new
/// leader that starts from the memory the old one left in the status makes exactly the
/// decisions the old one would have, wherever the failover falls; one that starts from nothing
/// does not.
#[test]
fn a_failover_mid_step_keeps_the_old_leaders_course() {
    use pacer_simulator::pacer::{Failover, Takeover};
    let c = config("");
    let one = calibrate::capacity(&c, 1, &LENGTHS.into()).expect("capacity");
    let t = trace(Shape::Step, 2.0 * one, 5400.0, 5);
    let moves = |o: &pacer_simulator::score::Outcome| -> Vec<(u64, Levers, Levers)> {
        o.decisions.iter().map(|d| (d.t as u64, d.from, d.to)).collect()
    };
    let base = simulate(&c, &t, &mut Pacer::new(&c.spec, c.profiles.clone())).expect("run");
    assert!(base.decisions.len() >= 3, "a step with moves to fail over between: {:?}", base.decisions);
    // Just after each move (a scale-up whose pods are starting, a scale-down in its
    // stabilization) and halfway between moves.
    let mut at: Vec<f64> = base.decisions.iter().map(|d| d.t + 20.0).collect();
    at.extend(base.decisions.windows(2).map(|w| (w[0].t + w[1].t) / 2.0));
    let mut empty_differs = Vec::new();
    for &at in &at {
        let run = |takeover| {
            let mut policy = Failover::new(Pacer::new(&c.spec, c.profiles.clone()), at, takeover);
            simulate(&c, &t, &mut policy).expect("run")
        };
        let remembered = run(Takeover::FromStatus);
        assert_eq!(moves(&remembered), moves(&base), "a failover at {at} s changed the course");
        assert_eq!(remembered.summary.replica_seconds, base.summary.replica_seconds);
        let forgot = run(Takeover::Empty);
        if moves(&forgot) != moves(&base) {
            empty_differs.push(at);
        }
    }
    assert!(!empty_differs.is_empty(), "an empty history never changed the course: the test proves nothing");
    eprintln!("an empty history changed the course after failovers at {empty_differs:?} of {at:?}");
}

/// The simulated engine composes a step as `pacer-engine` does: on the same running sequences
/// and token budget (no ITL budget, KV to spare), both feed the same tokens to the same
/// sequences, decodes first, then prompt chunks in batch order.
#[test]
fn the_simulated_step_is_the_engines_step() {
    use pacer_engine::scheduler::plan::{SeqView, StepBudget, blocks_for, plan_step_with};
    use pacer_simulator::replica::compose_step;
    let mut rng = pacer_bench::load::Rng::new(7);
    for case in 0..5000 {
        let n = 1 + (rng.next_u64() % 12) as usize;
        let left: Vec<u32> =
            (0..n).map(|_| if rng.uniform() < 0.5 { 0 } else { 1 + (rng.next_u64() % 900) as u32 }).collect();
        let budget = 1 + (rng.next_u64() % 700) as u32;
        let ours: Vec<(usize, usize)> =
            compose_step(&left, budget, None).into_iter().map(|(i, t)| (i, t as usize)).collect();
        let views: Vec<SeqView> = left
            .iter()
            .map(|&l| {
                // A decoding row holds its prompt and what it generated; a prompt holds nothing yet.
                let cached = if l == 0 { 100 + (rng.next_u64() % 400) as usize } else { 0 };
                let blocks = blocks_for(cached);
                SeqView { cached, blocks, reclaimable: blocks, prefill_left: l as usize }
            })
            .collect();
        let engine = plan_step_with(
            &views,
            StepBudget { tokens: budget as usize, attention_equiv: 0, time: None },
            1_000_000,
        );
        assert_eq!(ours, engine.feeds, "case {case}: prefill left {left:?}, budget {budget}");
        assert!(engine.preempt.is_empty());
    }
}

/// The vLLM service of `VLLM_SPEC` on the derived vLLM-like profiles (bf16 and fp8).
fn vllm_config() -> SimConfig {
    let spec = read_spec(pacer_simulator::VLLM_SPEC).expect("spec");
    assert_eq!(spec.engine.runtime, pacer_crds::Runtime::Vllm);
    let c = SimConfig::new(&spec, vec![vllm_profile(Tier::Bf16), vllm_profile(Tier::Fp8)]).expect("config");
    assert!(c.spec.batch_rolls, "vLLM reads its batch settings at start");
    c
}

/// A vLLM deployment on the held-out flash crowd (`docs/vllm.md`, one hour, seed 1): with batch
/// settings that roll the pods and a 110 s pod start, Pacer holds at least llm-d's windows
/// (81.7 % against 76.7 %) for fewer replica-seconds, and so does the planner given no profile
/// (it learns the steps from the metrics, as it must for vLLM; 76.7 % at 1.68× the bound against
/// llm-d's 1.74×). The step trace's figures are in the same table (about 80 s more here, so not
/// run in CI).
#[test]
fn on_vllm_the_planner_holds_the_flash_crowd_with_slow_batch_levers_and_no_profile() {
    let c = vllm_config();
    let shape = Shape::FlashCrowd;
    let cal = compare::calibrate(&c, &compare::mix_of(&shape, 1).expect("mix")).expect("calibration");
    let t = compare::trace_for(&shape, &cal, 1.0, 1).expect("trace");
    let run = |p: PolicyName| compare::run_one(&c, &t, &p, &cal).expect("run").summary;
    let (pacer, online, llmd) =
        (run(PolicyName::Pacer), run(PolicyName::PacerOnline), run(PolicyName::LlmdSlo));
    let line = |s: &pacer_simulator::score::Summary| {
        format!("{:.1} % of windows, {:.2}× the bound", 100.0 * s.attainment, s.vs_bound.unwrap_or(f64::NAN))
    };
    println!("pacer {}; pacer-online {}; llm-d {}", line(&pacer), line(&online), line(&llmd));
    assert!(pacer.attainment >= llmd.attainment, "{} vs llm-d's {}", pacer.attainment, llmd.attainment);
    assert!(pacer.replica_seconds <= llmd.replica_seconds, "more replica-seconds than llm-d");
    assert!(
        online.attainment >= llmd.attainment,
        "online {} vs llm-d's {}",
        online.attainment,
        llmd.attainment
    );
    assert!(online.replica_seconds <= llmd.replica_seconds, "online: more replica-seconds than llm-d");
    assert_eq!((pacer.failed, online.failed), (0, 0));
}
