//! What a tick learns: the online step fit's samples and its check against the window, and
//! the corrections of the configuration running (observed / predicted percentile).

use super::super::capacity::Workload;
use super::super::choose::engine_config;
use super::super::{History, correction_for, correction_key};
use super::{LEARNING_RATE, LEARNING_RATE_UP, Round};

impl Round<'_> {
    /// Adds this window's mean step to the online fit of the current tier when no profile covers
    /// it, every replica is ready and no rollout is under way (the window would mix two tiers).
    /// Returns whether the model needs the online fits (some allowed tier has no profile).
    pub(super) fn learn_steps(&self, history: &mut History) -> bool {
        let unprofiled = |t: &crate::Tier| self.model.step(*t).is_none();
        if !self.spec.tiers.iter().any(unprofiled) && !unprofiled(&self.current.tier) {
            return false;
        }
        let ready = self.obs.ready_replicas >= self.current.replicas;
        if unprofiled(&self.current.tier)
            && ready
            && !self.in_cooldown(history)
            && let Some(sample) =
                crate::online::StepSample::from_metrics(&self.obs.metrics, self.current.replicas)
        {
            history.online.entry(self.current.tier.as_str().to_string()).or_default().add(sample);
        }
        true
    }

    /// Whether this window shows the configuration running alone: the levers still for a whole
    /// window (else it mixes two configurations) and every replica ready.
    pub(super) fn settled(&self, history: &History) -> bool {
        self.still_for(history) >= self.spec.window && self.obs.ready_replicas >= self.current.replicas
    }

    /// On a [`Round::settled`] window: updates the correction of the current configuration
    /// (observed / predicted), then checks the online fit of the tier running, if it has one,
    /// against the window with that correction: the fit is used only while its corrected
    /// percentiles come near the measured ones ([`crate::online::StepFit::check`]).
    pub(super) fn learn(&self, history: &mut History) {
        if !self.settled(history) {
            return;
        }
        let m = &self.obs.metrics;
        let Some(load) = Workload::from_metrics(m) else { return };
        let config = engine_config(&self.current, self.spec);
        let Some(p) = self.model.predict(&config, self.current.replicas, &load, self.spec.quantile()) else {
            return;
        };
        if p.stable() {
            let start = correction_for(history, &config);
            let entry = history.correction.entry(correction_key(&config)).or_insert(start);
            let update = |old: f64, observed: Option<f64>, predicted: f64| match observed {
                Some(o) if predicted > 0.0 => {
                    let ratio = (o / predicted).clamp(0.25, 4.0);
                    let rate = if ratio > old { LEARNING_RATE_UP } else { LEARNING_RATE };
                    (1.0 - rate) * old + rate * ratio
                }
                _ => old,
            };
            entry.ttft = update(entry.ttft, m.ttft.seconds(), p.ttft);
            entry.itl = update(entry.itl, m.itl.seconds(), p.itl);
        }
        let c = correction_for(history, &config);
        if let (Some(fit), Some(ttft), Some(itl)) = (
            history.online.get_mut(self.current.tier.as_str()).filter(|f| f.ready()),
            m.ttft.seconds(),
            m.itl.seconds(),
        ) {
            fit.check((c.ttft * p.ttft, c.itl * p.itl), (ttft, itl));
        }
    }
}
