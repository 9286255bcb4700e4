//! Table tests of the decision rule and its guards, and property tests over random
//! observations.

use super::capacity::tests::test_step;
use super::choose::{self, Choice};
use super::decide::{MARGIN, SHED_MARGIN, note};
use super::*;
use crate::Tier;
use proptest::prelude::*;

fn spec() -> PlannerSpec {
    PlannerSpec {
        percentile: 95.0,
        ttft_target: 0.5,
        itl_target: 0.05,
        e2e_target: None,
        window: 120.0,
        min_replicas: 1,
        max_replicas: 4,
        batch_min: 2,
        batch_max: 32,
        batch_initial: 8,
        budget_min: 64,
        budget_max: 512,
        budget_initial: 512,
        tiers: vec![Tier::Native, Tier::Q4_0],
        preferred_tier: Tier::Native,
        allow_degrade: true,
        enforce: true,
        evaluation_interval: 15.0,
        scale_up_stabilization: 30.0,
        scale_down_stabilization: 120.0,
        // The engines' ITL budget is off here: these tests pin the decision rule on the
        // token budget alone; `capacity::tests` and the simulator cover the budget.
        max_step_ms: 0,
        batch_rolls: false,
    }
}

fn model() -> CapacityModel {
    let mut fast = test_step();
    fast.per_decode_row_s *= 0.6;
    fast.base_s *= 0.7;
    CapacityModel::from_steps([(Tier::Native, test_step()), (Tier::Q4_0, fast)])
}

fn levers(replicas: i32) -> Levers {
    Levers { replicas, max_batch_size: 8, batch_wait_ms: 0, max_num_batched_tokens: 512, tier: Tier::Native }
}

/// A fresh observation with the given percentiles (seconds), at `rate` requests/s (both
/// windows) of 200-token prompts and 100-token answers, every replica ready, nothing queued.
fn observe(ttft: f64, itl: f64, rate: f64, replicas: i32) -> Observation {
    let samples = rate * 120.0;
    Observation {
        at: 0.0,
        freshness: Freshness::Fresh,
        metrics: ServiceMetrics {
            ttft: Quantile::from_parts(Some(ttft), Some(samples)),
            itl: Quantile::from_parts(Some(itl), Some(samples * 100.0)),
            e2e: Quantile::Missing,
            request_rate: Some(rate),
            request_rate_short: Some(rate),
            prompt_token_rate: Some(rate * 200.0),
            prompt_tokens_tail: None,
            output_token_rate: Some(rate * 100.0),
            running: Some(0.0),
            running_mean: Some(0.0),
            waiting: Some(0.0),
            queued_prompt_tokens: Some(0.0),
            kv_usage: None,
            reporting_replicas: Some(f64::from(replicas)),
            applied: Default::default(),
        },
        ready_replicas: replicas,
        desired_replicas: replicas,
    }
}

/// Runs `decide` at `now` and returns the decision.
fn at(now: f64, obs: &Observation, current: &Levers, history: &History) -> Decision {
    let mut obs = obs.clone();
    obs.at = now;
    decide(&spec(), &model(), &obs, current, history, now)
}

/// The per-replica capacity of `levers` in the test model within `margin`.
fn per_replica(levers: &Levers, margin: f64) -> f64 {
    let shape = Workload { request_rate: 1.0, prompt_tokens: 200.0, output_tokens: 100.0, prompt_tail: None };
    choose::per_replica(&spec(), &model(), &History::default(), levers, &shape, margin).expect("profiled")
}

#[test]
fn missing_or_stale_metrics_hold_the_last_decision() {
    let cur = levers(2);
    let mut obs = observe(2.0, 0.2, 1.0, 2);
    obs.freshness = Freshness::Missing { reason: "connection refused".into() };
    let d = at(100.0, &obs, &cur, &History::default());
    assert_eq!((d.levers, d.reason, d.sla), (cur, Reason::MetricsMissing, SlaState::Unknown));
    assert!(d.message.contains("connection refused"), "{}", d.message);
    obs.freshness = Freshness::Stale { age: 300.0 };
    let d = at(100.0, &obs, &cur, &History::default());
    assert_eq!((d.levers, d.reason), (cur, Reason::MetricsStale));
}

#[test]
fn too_few_samples_under_traffic_hold() {
    let cur = levers(2);
    let mut obs = observe(2.0, 0.2, 1.0, 2);
    obs.metrics.ttft = Quantile::from_parts(Some(2.0), Some(5.0));
    obs.metrics.itl = Quantile::Missing;
    let d = at(100.0, &obs, &cur, &History::default());
    assert_eq!((d.levers, d.reason), (cur, Reason::TooFewSamples));
}

#[test]
fn a_load_the_replicas_cannot_carry_is_sized_in_one_step_before_the_sla_breaks() {
    let one = per_replica(&levers(1), MARGIN);
    // Several replicas' worth, with the percentiles still fine: the forecast acts, not the lag.
    let obs = observe(0.2, 0.02, 2.6 * one, 1);
    let d = at(0.0, &obs, &levers(1), &History::default());
    assert_eq!(d.reason, Reason::LoadPredicted, "{}", d.message);
    let chosen = per_replica(&Levers { replicas: 1, ..d.levers }, MARGIN);
    let needed = (2.6 * one * decide::LOAD_HEADROOM / chosen).ceil() as i32;
    assert!(needed >= 2, "{needed}");
    assert_eq!(d.levers.replicas, needed, "one step to the model's count: {:?} ({})", d.levers, d.message);
    assert!(d.message.contains("forecast") && d.message.contains("predict P95 TTFT"), "{}", d.message);
    let change = d.change.clone().expect("a change");
    assert_eq!((change.lever, change.direction), (Lever::Replicas, Direction::Up));
    assert_eq!(d.history.pending_scale_up.map(|p| p.0), Some(d.levers.replicas));
    // While they start, the same forecast asks for nothing more: starting replicas count.
    let mut starting = observe(0.2, 0.02, 2.6 * one, 1);
    starting.desired_replicas = d.levers.replicas;
    let d2 = at(15.0, &starting, &d.levers, &d.history);
    assert_eq!(d2.levers.replicas, d.levers.replicas, "{}", d2.message);
}

#[test]
fn the_short_window_leads_the_long_one() {
    let one = per_replica(&levers(2), MARGIN);
    // The long window still shows what two replicas carry; the last 30 s show twice that.
    let mut obs = observe(0.2, 0.02, 1.5 * one, 2);
    obs.metrics.request_rate_short = Some(3.0 * one);
    let d = at(0.0, &obs, &levers(2), &History::default());
    assert!(d.levers.replicas > 2, "{:?}: {}", d.reason, d.message);
    // Within the short window's noise, nothing moves.
    let mut calm = observe(0.2, 0.02, 1.5 * one, 2);
    calm.metrics.request_rate_short = Some(1.5 * one + 0.1);
    let d = at(0.0, &calm, &levers(2), &History::default());
    assert_eq!(d.levers, levers(2), "{}", d.message);
}

#[test]
fn a_growing_queue_makes_the_planner_evaluate_early() {
    let s = spec();
    let mut history = History { evaluated_at: Some(100.0), ..History::default() };
    let mut obs = observe(0.2, 0.02, 1.0, 1);
    for (t, waiting) in [(103.0, 1.0), (106.0, 3.0)] {
        obs.metrics.waiting = Some(waiting);
        obs.at = t;
        assert!(!due(&s, &obs, &history, t), "not due at {t}");
        note(&obs, &mut history);
    }
    obs.metrics.waiting = Some(6.0);
    assert!(due(&s, &obs, &history, 109.0), "the queue grew over two observations");
    obs.metrics.waiting = Some(2.0);
    assert!(!due(&s, &obs, &history, 109.0), "a queue that shrank is no signal");
    assert!(due(&s, &obs, &history, 115.0), "the interval passed");
}

#[test]
fn requests_in_flight_growing_count_as_arrivals() {
    let one = per_replica(&levers(2), MARGIN);
    let cur = levers(2);
    let mut first = observe(0.2, 0.02, 1.5 * one, 2);
    first.metrics.running = Some(8.0);
    let d0 = at(0.0, &first, &cur, &History::default());
    assert_eq!(d0.levers, cur, "{}", d0.message);
    // 15 s later 45 more requests are in flight than finished: 3 requests/s arriving unseen.
    let mut second = first.clone();
    second.metrics.running = Some(16.0);
    second.metrics.waiting = Some(37.0);
    let d1 = at(15.0, &second, &cur, &d0.history);
    assert!(d1.levers.replicas > 2, "{:?}: {}", d1.reason, d1.message);
}

#[test]
fn the_token_budget_is_a_lever_of_the_search() {
    // Long prompts cut into 56-token chunks wait through many steps for their first token:
    // TTFT over target. A larger budget, not another replica, is the cheapest fix.
    let cur = Levers { max_num_batched_tokens: 64, ..levers(2) };
    let mut obs = observe(0.6, 0.02, 1.0, 2);
    obs.metrics.prompt_token_rate = Some(500.0);
    let d = at(0.0, &obs, &cur, &History::default());
    assert_eq!(d.levers.replicas, 2, "{:?}: {}", d.reason, d.message);
    assert!(d.levers.max_num_batched_tokens > 64, "{:?}: {}", d.levers, d.message);
    assert_eq!(d.change.as_ref().map(|c| c.lever), Some(Lever::Batch), "{}", d.message);
    assert!(d.message.contains("tokens per step"), "{}", d.message);
}

#[test]
fn a_start_the_ready_replicas_cannot_cover_tightens_the_batch_settings_and_gives_them_back() {
    let cur = Levers { max_num_batched_tokens: 512, ..levers(1) };
    let one = per_replica(&cur, MARGIN);
    let mut obs = observe(0.3, 0.03, 2.5 * one, 1);
    obs.metrics.prompt_token_rate = Some(2.5 * one * 600.0);
    let d = at(0.0, &obs, &cur, &History::default());
    assert!(d.levers.replicas > 1, "{}", d.message);
    if let Some((batch, budget)) = d.history.cover {
        // Covered: the batch settings moved in the same decision, and come back once the
        // replicas are ready.
        assert_eq!((batch, budget), (cur.max_batch_size, cur.max_num_batched_tokens));
        assert!(d.changes.iter().any(|c| c.lever == Lever::Batch), "{:?}", d.changes);
        let mut ready = obs.clone();
        ready.ready_replicas = d.levers.replicas;
        ready.desired_replicas = d.levers.replicas;
        let d2 = at(60.0, &ready, &d.levers, &d.history);
        assert_eq!(d2.reason, Reason::BatchRestored, "{}", d2.message);
        assert_eq!(d2.levers.max_num_batched_tokens, cur.max_num_batched_tokens);
        assert_eq!(d2.history.cover, None);
    } else {
        assert!(d.message.contains("replicas 1 →"), "{}", d.message);
    }
}

#[test]
fn where_batch_settings_roll_the_pods_a_scale_up_keeps_them_and_a_move_costs_its_rollout() {
    let rolls = PlannerSpec { batch_rolls: true, ..spec() };
    // The case of the cover test above: the live-settings planner tightens the batch to cover
    // the start; where that would roll every pod, the replicas come alone.
    let cur = Levers { max_num_batched_tokens: 512, ..levers(1) };
    let one = per_replica(&cur, MARGIN);
    let mut obs = observe(0.3, 0.03, 2.5 * one, 1);
    obs.metrics.prompt_token_rate = Some(2.5 * one * 600.0);
    let d = decide(&rolls, &model(), &obs, &cur, &History::default(), 0.0);
    assert!(d.levers.replicas > 1, "{}", d.message);
    assert_eq!(d.history.cover, None, "{}", d.message);
    assert_eq!(
        (d.levers.max_batch_size, d.levers.max_num_batched_tokens),
        (cur.max_batch_size, cur.max_num_batched_tokens),
        "{}",
        d.message
    );
    // The search charges a batch move its rollout: replicas × pod start over the time the
    // settings run (4 × 60 s over the 120 s scale-down stabilization here: 2 replicas).
    let four = levers(4);
    assert_eq!(choose::roll_cost(&spec(), &History::default(), &four), 0.0);
    assert!((choose::roll_cost(&rolls, &History::default(), &four) - 2.0).abs() < 1e-9);
    // A batch move that rolls the pods starts the rollout cooldown, which lasts a pod start.
    let budget = Levers { max_num_batched_tokens: 64, ..levers(2) };
    let mut long = observe(0.6, 0.02, 1.0, 2);
    long.metrics.prompt_token_rate = Some(500.0);
    let moved = decide(&rolls, &model(), &long, &budget, &History::default(), 0.0);
    assert_eq!(moved.change.as_ref().map(|c| c.lever), Some(Lever::Batch), "{}", moved.message);
    assert!(moved.message.contains("a rolling update"), "{}", moved.message);
    assert_eq!(moved.history.tier_changed_at, Some(0.0));
}

#[test]
fn without_a_profile_the_steps_are_learnt_from_the_metrics_and_then_predict() {
    // No profile at all: each still window with sequences running adds a sample; once the
    // batches span enough, the fit predicts (the sentence names a prediction).
    let empty = CapacityModel::default();
    let truth = test_step();
    let mut history = History::default();
    let cur = levers(2);
    let mut last = None;
    for (i, rate) in [1.0, 1.5, 2.0, 2.5, 3.0, 2.0, 1.2, 2.8, 1.8, 2.2].into_iter().enumerate() {
        let mut obs = observe(0.2, 0.02, rate, 2);
        // Running per replica from Little's law at that rate, and the output rate the truth's
        // steps give: each running sequence gains a token per step.
        let rows = 2.0 + 3.0 * rate;
        let step = truth.step_seconds(rows, rate * 100.0, 0.0);
        obs.metrics.running_mean = Some(2.0 * rows);
        obs.metrics.output_token_rate = Some(2.0 * rows / step);
        let now = 30.0 * i as f64;
        let d = decide(&spec(), &empty, &obs, &cur, &history, now);
        history = d.history.clone();
        last = Some(d);
    }
    let fit = &history.online[Tier::Native.as_str()];
    assert!(fit.ready() && fit.agrees, "{fit:?}");
    let d = last.expect("decided");
    assert!(d.message.contains("predict"), "{:?}: {}", d.reason, d.message);
    // The same fit on a window where TTFT is far from what it predicts (a prefill the mean
    // steps cannot show): not used; the percentiles alone decide.
    let mut far = observe(0.45, 0.02, 2.0, 2);
    far.metrics.running_mean = None;
    let d = decide(&spec(), &empty, &far, &cur, &history, 400.0);
    assert!(!d.history.online[Tier::Native.as_str()].agrees);
    assert!(!d.message.contains("predict"), "{:?}: {}", d.reason, d.message);
}

#[test]
fn without_a_model_replicas_go_back_only_to_a_load_one_has_carried() {
    let empty = CapacityModel::default();
    let cur = levers(2);
    // Far under every target at 4 req/s on 2 replicas: a latency ratio alone would shed, but
    // one replica has never been seen carrying 4 req/s.
    let obs = observe(0.05, 0.005, 4.0, 2);
    let mut history = History::default();
    for i in 0..12 {
        let d = decide(&spec(), &empty, &obs, &cur, &history, 15.0 * f64::from(i));
        assert_eq!(d.levers.replicas, 2, "{}", d.message);
        history = d.history;
    }
    assert!((history.carried[Tier::Native.as_str()] - 2.0).abs() < 1e-9);
    // Once a replica has carried 4 req/s with the SLA met, the same calm sheds one.
    history.carried.insert(Tier::Native.as_str().into(), 4.0);
    let d = decide(&spec(), &empty, &obs, &cur, &history, 400.0);
    assert_eq!((d.reason, d.levers.replicas), (Reason::ReplicasShed, 1), "{}", d.message);
}

#[test]
fn a_violation_the_model_did_not_predict_is_learned_and_met_with_a_replica() {
    let cur = levers(2);
    // A light load the model says two replicas carry easily, yet TTFT is over target.
    let obs = observe(0.9, 0.02, 0.5, 2);
    let mut history = History::default();
    history.last_change.insert("replicas_up".into(), -1000.0);
    let d0 = at(0.0, &obs, &cur, &history);
    assert_eq!(d0.reason, Reason::Stabilizing, "{}", d0.message);
    let d1 = at(40.0, &obs, &cur, &d0.history);
    assert_eq!((d1.reason, d1.levers.replicas), (Reason::TtftViolated, 3), "{}", d1.message);
    let key = correction_key(&choose::engine_config(&cur, &spec()));
    assert!(d1.history.correction[&key].ttft > 1.5, "{:?}", d1.history.correction);
    // While the replica starts, no second one for the same evidence.
    let mut starting = obs.clone();
    starting.desired_replicas = 3;
    let d2 = at(55.0, &starting, &d1.levers, &d1.history);
    assert_eq!(d2.levers.replicas, 3, "{}", d2.message);
}

#[test]
fn at_max_replicas_the_tier_degrades_only_when_allowed() {
    // The batch settings are fixed here, so the tier is the only lever left at max replicas.
    let mut s = spec();
    (s.batch_min, s.batch_max, s.budget_min) = (8, 8, 512);
    let at = |now: f64, obs: &Observation, cur: &Levers, h: &History| decide(&s, &model(), obs, cur, h, now);
    let cur = levers(4);
    let native_max = 4.0 * per_replica(&cur, MARGIN);
    let q4 = 4.0 * per_replica(&Levers { tier: Tier::Q4_0, ..cur }, MARGIN);
    assert!(q4 > native_max * 1.1, "the faster tier carries more: {q4} vs {native_max}");
    let obs = observe(0.3, 0.03, 0.5 * (native_max + q4) / decide::LOAD_HEADROOM, 4);
    let d = at(0.0, &obs, &cur, &History::default());
    assert_eq!(
        (d.reason, d.levers.tier, d.degraded),
        (Reason::DegradedForLatency, Tier::Q4_0, true),
        "{}",
        d.message
    );
    assert_eq!(d.levers.replicas, 4);
    let mut strict = s.clone();
    strict.allow_degrade = false;
    let d = decide(&strict, &model(), &obs, &cur, &History::default(), 0.0);
    assert_eq!(d.levers.tier, Tier::Native, "{}", d.message);
    assert_eq!(d.levers.replicas, 4);
    // Below max replicas a load the faster tier alone could carry adds replicas first.
    let d = at(0.0, &obs, &levers(2), &History::default());
    assert_eq!((d.levers.tier, d.levers.replicas), (Tier::Native, 4), "{}", d.message);
}

#[test]
fn headroom_restores_precision_before_shedding_replicas() {
    let cur = Levers { tier: Tier::Q4_0, ..levers(3) };
    let obs = observe(0.05, 0.015, 0.3, 3);
    let d0 = at(0.0, &obs, &cur, &History::default());
    assert_eq!(
        (d0.levers, d0.reason),
        (cur, Reason::SlaMet),
        "waits for the stabilization window: {}",
        d0.message
    );
    let d1 = at(130.0, &obs, &cur, &d0.history);
    assert_eq!(
        (d1.reason, d1.levers.tier, d1.levers.replicas),
        (Reason::PrecisionRestored, Tier::Native, 3),
        "{}",
        d1.message
    );
    // The next step waits for the rollout's cooldown and another stabilization window, then
    // sheds replicas, to the count the model says in one step (one carries this load).
    let d2 = at(140.0, &obs, &d1.levers, &d1.history);
    assert_eq!(d2.levers, d1.levers);
    let d3 = at(270.0, &obs, &d1.levers, &d2.history);
    assert_eq!(d3.reason, Reason::ReplicasShed, "{}", d3.message);
    let one = per_replica(&Levers { replicas: 1, ..d1.levers }, SHED_MARGIN);
    assert!(one >= 0.3 * decide::SHED_HEADROOM, "one replica carries the load: {one}");
    assert_eq!(d3.levers.replicas, 1, "in one step: {:?}", d3.levers);
}

#[test]
fn a_quiet_minute_of_a_bursty_load_does_not_shed() {
    let one = per_replica(&levers(3), SHED_MARGIN);
    let cur = levers(3);
    let busy = observe(0.2, 0.02, 2.5 * one, 3);
    let mut d = at(0.0, &busy, &cur, &History::default());
    // Two minutes of a light load: the peak of the stabilization window still needs three.
    let quiet = observe(0.2, 0.02, 0.5 * one, 3);
    for k in 1..=8 {
        d = at(15.0 * f64::from(k), &quiet, &cur, &d.history);
        assert_eq!(d.levers, cur, "{}", d.message);
    }
    // Once the peak has left the window, replicas go.
    let mut shed = false;
    for k in 9..=30 {
        d = at(15.0 * f64::from(k), &quiet, &d.levers, &d.history);
        shed |= d.reason == Reason::ReplicasShed;
    }
    assert!(shed, "{}", d.message);
}

#[test]
fn an_idle_service_gives_back_replicas() {
    let cur = levers(3);
    let mut obs = observe(0.0, 0.0, 0.0, 3);
    obs.metrics.ttft = Quantile::from_parts(Some(f64::NAN), Some(0.0));
    obs.metrics.itl = Quantile::from_parts(Some(f64::NAN), Some(0.0));
    let d0 = at(0.0, &obs, &cur, &History::default());
    assert_eq!((d0.levers, d0.reason), (cur, Reason::TooFewSamples));
    let d1 = at(130.0, &obs, &cur, &d0.history);
    // No load figures, so the unprofiled rule: one replica at a time.
    assert_eq!((d1.reason, d1.levers.replicas), (Reason::ReplicasShed, 2), "{}", d1.message);
}

#[test]
fn advisory_mode_only_recommends() {
    let mut s = spec();
    s.enforce = false;
    let cur = levers(1);
    let obs = observe(0.2, 0.02, 3.0 * per_replica(&cur, MARGIN), 1);
    let d = decide(&s, &model(), &obs, &cur, &History::default(), 0.0);
    assert_eq!(d.levers, cur);
    assert!(d.recommended.replicas > 1 && d.change.is_some());
    assert!(d.message.starts_with("advisory"), "{}", d.message);
    assert_eq!(d.history.pending_scale_up, None);
}

#[test]
fn levers_outside_the_spec_are_brought_inside() {
    let cur = Levers { replicas: 9, max_batch_size: 64, max_num_batched_tokens: 8, ..levers(1) };
    let d = at(0.0, &observe(0.1, 0.01, 1.0, 9), &cur, &History::default());
    assert_eq!(d.reason, Reason::OutOfRange);
    assert_eq!((d.levers.replicas, d.levers.max_batch_size, d.levers.max_num_batched_tokens), (4, 32, 64));
}

#[test]
fn the_correction_learns_only_after_a_still_window_and_neighbours_borrow_it() {
    let cur = levers(2);
    let obs = observe(0.3, 0.03, 1.0, 2);
    let mut history = History::default();
    history.last_change.insert("replicas_up".into(), 0.0);
    let d = at(60.0, &obs, &cur, &history);
    assert!(d.history.correction.is_empty(), "the window still mixes configurations");
    let d = at(200.0, &obs, &cur, &history);
    let config = choose::engine_config(&cur, &spec());
    let c = d.history.correction.get(&correction_key(&config)).copied().expect("learned");
    assert!(c.ttft != 1.0 && c.ttft.is_finite());
    // A configuration never tried borrows from the nearest one learned.
    let other = EngineConfig { max_batch_size: 16, ..config };
    assert_eq!(correction_for(&d.history, &other), c);
    let far = EngineConfig { tier: Tier::Q4_0, ..config };
    assert_eq!(correction_for(&d.history, &far), c, "another tier borrows when nothing nearer was learned");
    assert_eq!(correction_for(&History::default(), &config), Correction::default());
}

fn arb_quantile() -> impl Strategy<Value = Quantile> {
    prop_oneof![
        (0.001f64..5.0, 20.0f64..10_000.0).prop_map(|(s, n)| Quantile::Value { seconds: s, samples: n }),
        (0.0f64..19.0).prop_map(|n| Quantile::TooFewSamples { samples: n }),
        Just(Quantile::Missing),
    ]
}

fn arb_freshness() -> impl Strategy<Value = Freshness> {
    prop_oneof![
        3 => Just(Freshness::Fresh),
        1 => (1.0f64..1000.0).prop_map(|age| Freshness::Stale { age }),
        1 => Just(Freshness::Missing { reason: "down".into() }),
    ]
}

prop_compose! {
    fn arb_case()(
        ttft in arb_quantile(),
        itl in arb_quantile(),
        rate in prop::option::of(0.0f64..20.0),
        short in prop::option::of(0.0f64..20.0),
        waiting in prop::option::of(0.0f64..50.0),
        prompt in 10.0f64..1500.0,
        freshness in arb_freshness(),
        replicas in 1i32..=4,
        ready_short in 0i32..=2,
        batch in 2u32..=32,
        budget in 64u32..=512,
        degraded in any::<bool>(),
        allow_degrade in any::<bool>(),
        pending in any::<bool>(),
        since in prop::option::of(0.0f64..500.0),
        now in 0.0f64..1000.0,
    ) -> (PlannerSpec, Observation, Levers, History, f64) {
        let mut s = spec();
        s.allow_degrade = allow_degrade;
        let tier = if degraded && allow_degrade { Tier::Q4_0 } else { Tier::Native };
        let current = Levers {
            replicas,
            max_batch_size: batch,
            batch_wait_ms: 0,
            max_num_batched_tokens: budget.max(batch),
            tier,
        };
        let mut history = History { violating_since: since, headroom_since: since, ..History::default() };
        if pending {
            history.pending_scale_up = Some((replicas, now - 10.0));
        }
        let mut obs = observe(0.1, 0.01, rate.unwrap_or(0.0), replicas);
        obs.at = now;
        obs.freshness = freshness;
        obs.metrics.ttft = ttft;
        obs.metrics.itl = itl;
        obs.metrics.request_rate = rate;
        obs.metrics.request_rate_short = short;
        obs.metrics.waiting = waiting;
        obs.metrics.prompt_token_rate = rate.map(|r| r * prompt);
        obs.ready_replicas = if pending { replicas - ready_short } else { replicas };
        (s, obs, current, history, now)
    }
}

proptest! {
    #[test]
    fn decisions_stay_within_bounds((s, obs, cur, history, now) in arb_case()) {
        let d = decide(&s, &model(), &obs, &cur, &history, now);
        prop_assert!((s.min_replicas..=s.max_replicas).contains(&d.levers.replicas));
        prop_assert!((s.batch_min..=s.batch_max).contains(&d.levers.max_batch_size));
        prop_assert!((s.budget_min..=s.budget_max).contains(&d.levers.max_num_batched_tokens));
        prop_assert!(d.levers.max_num_batched_tokens >= d.levers.max_batch_size);
        prop_assert!(s.tiers.contains(&d.levers.tier));
        prop_assert!(!d.message.is_empty());
        prop_assert_eq!(d.change.clone(), d.changes.first().cloned());
    }

    #[test]
    fn never_acts_on_stale_or_missing_data((s, obs, cur, history, now) in arb_case()) {
        let d = decide(&s, &model(), &obs, &cur, &history, now);
        if obs.freshness != Freshness::Fresh {
            prop_assert_eq!(d.levers, cur);
            prop_assert!(d.reason.is_blind());
        }
    }

    #[test]
    fn never_degrades_when_not_allowed_and_only_at_max_replicas((s, obs, cur, history, now) in arb_case()) {
        let d = decide(&s, &model(), &obs, &cur, &history, now);
        if !s.allow_degrade {
            prop_assert_eq!(d.levers.tier, s.preferred_tier);
        }
        if d.levers.tier != cur.tier && d.levers.tier == Tier::Q4_0 {
            prop_assert_eq!(cur.replicas, s.max_replicas, "degrades only at max replicas");
        }
    }

    #[test]
    fn restores_precision_before_shedding_replicas((s, obs, cur, history, now) in arb_case()) {
        let d = decide(&s, &model(), &obs, &cur, &history, now);
        if cur.tier != s.preferred_tier {
            prop_assert!(d.levers.replicas >= cur.replicas, "shed while degraded: {:?} → {:?}", cur, d.levers);
        }
    }

    #[test]
    fn a_scale_down_never_leaves_a_predicted_violation((s, obs, cur, history, now) in arb_case()) {
        let d = decide(&s, &model(), &obs, &cur, &history, now);
        if d.levers.replicas < cur.replicas
            && d.sla != SlaState::Unknown
            && let Some(shape) = Workload::from_metrics(&obs.metrics)
        {
            let rate = [obs.metrics.request_rate, obs.metrics.request_rate_short]
                .into_iter()
                .flatten()
                .fold(0.0, f64::max);
            let ratio = choose::worst_ratio(&s, &model(), &d.history, &d.levers, &shape, rate);
            prop_assert!(ratio <= 1.0, "{:?} → {:?} predicts {ratio} at {rate} req/s: {}", cur, d.levers, d.message);
        }
    }

    #[test]
    fn the_choice_is_the_cheapest_configuration_predicted_to_hold(
        rate in 0.05f64..30.0,
        prompt in 20.0f64..1200.0,
        allow_degrade in any::<bool>(),
        batch in 2u32..=32,
    ) {
        let mut s = spec();
        s.allow_degrade = allow_degrade;
        let shape = Workload { request_rate: rate, prompt_tokens: prompt, output_tokens: 100.0, prompt_tail: None };
        let cur = Levers { max_batch_size: batch, ..levers(1) };
        let tiers = choose::tiers(&s);
        let h = History::default();
        let m = model();
        let search = choose::Search { spec: &s, model: &m, history: &h, current: &cur, shape: &shape };
        let ask = choose::Ask { rate, margin: MARGIN, replicas: None, tiers: &tiers };
        let choice = choose::cheapest(&search, &ask).expect("profiled");
        if let Choice::Holds(c) = choice {
            // It holds...
            prop_assert!(f64::from(c.levers.replicas) * c.per_replica >= rate - 1e-9);
            let ratio = choose::worst_ratio(&s, &model(), &h, &c.levers, &shape, rate);
            // Within the margin, but for the share of the TTFT floor (a lone request's TTFT,
            // which no replica count lowers) that is exempt from it.
            let config = choose::engine_config(&c.levers, &s);
            let lone = m.predict(&config, 1, &shape.at_rate(1e-6), s.quantile()).expect("profiled");
            let floor = lone.ttft / s.ttft_target;
            prop_assert!(ratio <= MARGIN + (1.0 - MARGIN) * floor + 1e-6, "{ratio} (floor {floor})");
            prop_assert!(ratio <= 1.0, "{ratio}");
            // ...and nothing as precise with fewer replicas does, at any batch setting tried.
            if c.levers.replicas > s.min_replicas && c.degradation == 0 {
                for b in [2u32, 4, 8, 16, 32] {
                    for budget in [64u32, 128, 256, 512] {
                        if budget < b { continue; }
                        let fewer = Levers { replicas: c.levers.replicas - 1, max_batch_size: b, max_num_batched_tokens: budget, ..c.levers };
                        let cap = choose::per_replica(&s, &model(), &h, &fewer, &shape, MARGIN).expect("profiled");
                        prop_assert!(f64::from(fewer.replicas) * cap < rate, "{fewer:?} carries {} of {rate}", f64::from(fewer.replicas) * cap);
                    }
                }
            }
        }
    }
}
