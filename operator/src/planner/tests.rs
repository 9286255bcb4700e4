//! Table tests per rule and guard, and property tests over random observations.

use super::capacity::tests::test_step;
use super::*;
use pacer_crds::Tier;
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
        tiers: vec![Tier::Native, Tier::Q4_0],
        preferred_tier: Tier::Native,
        allow_degrade: true,
        enforce: true,
        evaluation_interval: 15.0,
        scale_up_stabilization: 30.0,
        scale_down_stabilization: 120.0,
    }
}

fn model() -> CapacityModel {
    let mut fast = test_step();
    fast.per_decode_row_s *= 0.6;
    fast.base_s *= 0.7;
    CapacityModel::from_steps([(Tier::Native, test_step()), (Tier::Q4_0, fast)])
}

fn levers(replicas: i32) -> Levers {
    Levers { replicas, max_batch_size: 8, batch_wait_ms: 0, tier: Tier::Native }
}

/// A fresh observation with the given percentiles (seconds), at `rate` requests/s of 200-token
/// prompts and 100-token answers, every replica ready.
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
            prompt_token_rate: Some(rate * 200.0),
            output_token_rate: Some(rate * 100.0),
            running: None,
            waiting: None,
            kv_usage: None,
            reporting_replicas: Some(f64::from(replicas)),
        },
        ready_replicas: replicas,
        desired_replicas: replicas,
    }
}

/// Runs `decide` at `now` and returns the decision.
fn at(now: f64, obs: &Observation, current: &Levers, history: &History) -> Decision {
    decide(&spec(), &model(), obs, current, history, now)
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
fn a_ttft_violation_adds_replicas_after_stabilization_and_not_again_while_they_start() {
    let cur = levers(1);
    let obs = observe(1.5, 0.03, 2.0, 1);
    let d0 = at(0.0, &obs, &cur, &History::default());
    assert_eq!((d0.levers, d0.reason, d0.sla), (cur, Reason::Stabilizing, SlaState::Violated));
    let d1 = at(30.0, &obs, &cur, &d0.history);
    assert_eq!(d1.reason, Reason::TtftViolated, "{}", d1.message);
    assert!(d1.levers.replicas > 1 && d1.levers.replicas <= 4, "{:?}", d1.levers);
    let change = d1.change.clone().expect("a change");
    assert_eq!((change.lever, change.direction), (Lever::Replicas, Direction::Up));
    // The new replicas are still starting: no cascade.
    let mut starting = observe(1.5, 0.03, 2.0, 1);
    starting.desired_replicas = d1.levers.replicas;
    let d2 = at(45.0, &starting, &d1.levers, &d1.history);
    assert_eq!((d2.levers, d2.reason), (d1.levers, Reason::ScaleUpInProgress));
}

#[test]
fn an_itl_violation_shrinks_the_batch_first() {
    let cur = levers(2);
    let obs = observe(0.2, 0.09, 1.0, 2);
    let d0 = at(0.0, &obs, &cur, &History::default());
    let d = at(40.0, &obs, &cur, &d0.history);
    assert_eq!(d.reason, Reason::ItlViolated, "{}", d.message);
    assert_eq!(d.levers.replicas, 2);
    assert!(d.levers.max_batch_size < 8 && d.levers.max_batch_size >= 2, "{:?}", d.levers);
}

#[test]
fn an_itl_violation_under_more_load_than_the_replicas_carry_adds_replicas() {
    let cur = levers(1);
    // Eight requests a second is several replicas' worth for the test model.
    let obs = observe(0.3, 0.09, 8.0, 1);
    let d0 = at(0.0, &obs, &cur, &History::default());
    let d = at(40.0, &obs, &cur, &d0.history);
    assert_eq!(d.reason, Reason::ItlViolated, "{}", d.message);
    assert!(d.levers.replicas > 1 && d.levers.max_batch_size == 8, "{:?}: {}", d.levers, d.message);
}

#[test]
fn the_batch_moves_once_per_half_window() {
    let cur = levers(2);
    let obs = observe(0.2, 0.09, 1.0, 2);
    let d0 = at(0.0, &obs, &cur, &History::default());
    let d1 = at(40.0, &obs, &cur, &d0.history);
    assert_eq!(d1.reason, Reason::ItlViolated, "{}", d1.message);
    // Ten seconds later the window still holds the old steps: no second cut yet.
    let d2 = at(50.0, &obs, &d1.levers, &d1.history);
    assert_eq!((d2.reason, d2.levers), (Reason::Stabilizing, d1.levers), "{}", d2.message);
    // Half a window on, ITL has come down but not enough: the next cut.
    let half = spec().window / 2.0;
    let better = observe(0.2, 0.06, 1.0, 2);
    let d3 = at(40.0 + half, &better, &d1.levers, &d2.history);
    assert_eq!(d3.reason, Reason::ItlViolated, "{}", d3.message);
    assert!(d3.levers.max_batch_size < d1.levers.max_batch_size, "{}", d3.message);
    assert_eq!(d3.levers.replicas, 2);
}

#[test]
fn a_batch_cut_that_did_not_lower_itl_is_followed_by_replicas() {
    let cur = levers(2);
    let obs = observe(0.2, 0.09, 1.0, 2);
    let d0 = at(0.0, &obs, &cur, &History::default());
    let d1 = at(40.0, &obs, &cur, &d0.history);
    assert!(d1.levers.max_batch_size < 8, "{}", d1.message);
    // Half a window later ITL is where it was: not the batch, so more replicas.
    let d2 = at(40.0 + spec().window / 2.0, &obs, &d1.levers, &d1.history);
    assert_eq!(d2.reason, Reason::ItlViolated, "{}", d2.message);
    assert_eq!(
        (d2.levers.max_batch_size, d2.levers.replicas > 2),
        (d1.levers.max_batch_size, true),
        "{}",
        d2.message
    );
    assert!(d2.message.contains("did not lower"), "{}", d2.message);
}

#[test]
fn ttft_over_target_with_itl_headroom_gives_the_batch_back_first() {
    // An earlier ITL cut left the batch at 2 of its 8; now requests queue and ITL is far under.
    let cur = Levers { max_batch_size: 2, ..levers(4) };
    let obs = observe(1.5, 0.01, 8.0, 4);
    let d0 = at(0.0, &obs, &cur, &History::default());
    let d = at(40.0, &obs, &cur, &d0.history);
    assert_eq!(d.reason, Reason::TtftViolated, "{}", d.message);
    assert_eq!(
        (d.levers.max_batch_size, d.levers.replicas, d.levers.tier),
        (4, 4, cur.tier),
        "{}",
        d.message
    );
    // With ITL near its target the batch stays and the other levers act.
    let tight = observe(1.5, 0.045, 8.0, 4);
    let d0 = at(0.0, &tight, &cur, &History::default());
    let d = at(40.0, &tight, &cur, &d0.history);
    assert_eq!(d.levers.max_batch_size, 2, "{}", d.message);
}

#[test]
fn at_max_replicas_the_tier_degrades_only_when_allowed() {
    let cur = levers(4);
    let obs = observe(1.5, 0.03, 8.0, 4);
    let d0 = at(0.0, &obs, &cur, &History::default());
    let d = at(40.0, &obs, &cur, &d0.history);
    assert_eq!((d.reason, d.levers.tier, d.degraded), (Reason::DegradedForLatency, Tier::Q4_0, true));
    let mut strict = spec();
    strict.allow_degrade = false;
    let d = decide(&strict, &model(), &obs, &cur, &d0.history, 40.0);
    assert_eq!((d.reason, d.levers, d.scaling_limited), (Reason::AtMaxReplicas, cur, true));
}

#[test]
fn headroom_restores_precision_before_shedding_replicas() {
    let cur = Levers { tier: Tier::Q4_0, ..levers(3) };
    let obs = observe(0.05, 0.015, 0.3, 3);
    let d0 = at(0.0, &obs, &cur, &History::default());
    assert_eq!((d0.levers, d0.reason), (cur, Reason::SlaMet), "waits for the stabilization window");
    let d1 = at(130.0, &obs, &cur, &d0.history);
    assert_eq!((d1.reason, d1.levers.tier, d1.levers.replicas), (Reason::PrecisionRestored, Tier::Native, 3));
    // The next step back waits for another stabilization window, then sheds replicas.
    let d2 = at(140.0, &obs, &d1.levers, &d1.history);
    assert_eq!(d2.levers, d1.levers);
    let d3 = at(260.0, &obs, &d1.levers, &d2.history);
    assert_eq!(d3.reason, Reason::ReplicasShed, "{}", d3.message);
    assert!(
        d3.levers.replicas < 3 && d3.levers.replicas >= 2,
        "at most a quarter, at least one: {:?}",
        d3.levers
    );
}

#[test]
fn a_scale_in_the_sla_undoes_is_not_repeated_at_the_same_load() {
    let at3 = observe(0.2, 0.02, 3.0, 3);
    let d0 = at(0.0, &at3, &levers(3), &History::default());
    let d1 = at(130.0, &at3, &levers(3), &d0.history);
    assert_eq!(d1.reason, Reason::ReplicasShed, "{}", d1.message);
    let two = d1.levers;
    // Two replicas do not hold the same load after all.
    let hot = observe(0.9, 0.02, 3.0, two.replicas);
    let d2 = at(200.0, &hot, &two, &d1.history);
    let d3 = at(240.0, &hot, &two, &d2.history);
    assert!(d3.levers.replicas > two.replicas, "{}: {}", d3.reason.as_str(), d3.message);
    assert!(d3.history.shed_floor.is_some(), "the flap is remembered");
    // Headroom again at three: no second scale-in while the load is as high...
    let back = d3.levers;
    let calm = observe(0.2, 0.02, 3.0, back.replicas);
    let mut d = d3;
    for tick in 0..10 {
        d = at(300.0 + 60.0 * f64::from(tick), &calm, &back, &d.history);
        assert_eq!(d.levers, back, "{}: {}", d.reason.as_str(), d.message);
    }
    assert_eq!(d.reason, Reason::ShedFloor, "{}", d.message);
    // ...but once the load has fallen, replicas go.
    let lighter = observe(0.2, 0.02, 1.0, back.replicas);
    let mut shed = false;
    for tick in 0..4 {
        d = at(1000.0 + 60.0 * f64::from(tick), &lighter, &back, &d.history);
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
    assert_eq!((d1.reason, d1.levers.replicas), (Reason::ReplicasShed, 2));
}

#[test]
fn rising_load_adds_replicas_before_the_sla_breaks() {
    let cur = levers(1);
    // 85 % of the TTFT target, at a rate one replica cannot hold.
    let obs = observe(0.425, 0.03, 6.0, 1);
    let d = at(0.0, &obs, &cur, &History::default());
    assert_eq!(d.reason, Reason::LoadPredicted, "{}", d.message);
    assert!(d.levers.replicas > 1);
}

#[test]
fn advisory_mode_only_recommends() {
    let mut s = spec();
    s.enforce = false;
    let cur = levers(1);
    let obs = observe(1.5, 0.03, 2.0, 1);
    let d0 = decide(&s, &model(), &obs, &cur, &History::default(), 0.0);
    let d = decide(&s, &model(), &obs, &cur, &d0.history, 40.0);
    assert_eq!(d.levers, cur);
    assert!(d.recommended.replicas > 1 && d.change.is_some());
    assert!(d.message.starts_with("advisory"), "{}", d.message);
    assert_eq!(d.history.pending_scale_up, None);
}

#[test]
fn levers_outside_the_spec_are_brought_inside() {
    let cur = Levers { replicas: 9, max_batch_size: 64, ..levers(1) };
    let d = at(0.0, &observe(0.1, 0.01, 1.0, 9), &cur, &History::default());
    assert_eq!(d.reason, Reason::OutOfRange);
    assert_eq!((d.levers.replicas, d.levers.max_batch_size), (4, 32));
}

#[test]
fn the_correction_learns_only_after_a_still_window() {
    let cur = levers(2);
    let obs = observe(0.3, 0.03, 1.0, 2);
    let mut history = History::default();
    history.last_change.insert("replicas_up".into(), 0.0);
    let d = at(60.0, &obs, &cur, &history);
    assert!(d.history.correction.is_empty(), "the window still mixes configurations");
    let d = at(200.0, &obs, &cur, &history);
    let c = d.history.correction.get(&correction_key(Tier::Native, 8)).expect("learned");
    assert!(c.ttft != 1.0 && c.ttft.is_finite());
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
        freshness in arb_freshness(),
        replicas in 1i32..=4,
        ready_short in 0i32..=2,
        batch in 2u32..=32,
        degraded in any::<bool>(),
        allow_degrade in any::<bool>(),
        pending in any::<bool>(),
        since in prop::option::of(0.0f64..500.0),
        now in 0.0f64..1000.0,
    ) -> (PlannerSpec, Observation, Levers, History, f64) {
        let mut s = spec();
        s.allow_degrade = allow_degrade;
        let tier = if degraded && allow_degrade { Tier::Q4_0 } else { Tier::Native };
        let current = Levers { replicas, max_batch_size: batch, batch_wait_ms: 0, tier };
        let mut history = History { violating_since: since, headroom_since: since, ..History::default() };
        if pending {
            history.pending_scale_up = Some((replicas, now - 10.0));
        }
        let mut obs = observe(0.1, 0.01, rate.unwrap_or(0.0), replicas);
        obs.freshness = freshness;
        obs.metrics.ttft = ttft;
        obs.metrics.itl = itl;
        obs.metrics.request_rate = rate;
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
        prop_assert!(s.tiers.contains(&d.levers.tier));
        prop_assert!(!d.message.is_empty());
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
    fn never_degrades_when_not_allowed((s, obs, cur, history, now) in arb_case()) {
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
    fn never_scales_up_while_the_last_scale_up_starts((s, obs, cur, history, now) in arb_case()) {
        let d = decide(&s, &model(), &obs, &cur, &history, now);
        if history.pending_scale_up.is_some() && obs.ready_replicas < cur.replicas {
            prop_assert!(d.levers.replicas <= cur.replicas);
        }
    }
}
