//! Load shapes and synthetic requests: when each request is sent (open loop at a constant,
//! Poisson or gamma-bursty rate; or closed loop at a fixed concurrency), and what it asks for
//! (prompts of a chosen length built locally, no tokenizer or network needed).

use serde::Serialize;

/// SplitMix64 with the distributions a load generator needs; a seed reproduces a run's schedule
/// and prompts. The same generator as the engine's sampler (`pacer_engine::sampling`), so seeded
/// schedules never change with a dependency; a test holds the two streams equal.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits (SplitMix64).
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1): never 0, so `ln` is always finite.
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
    /// Gamma(shape, scale) by Marsaglia–Tsang (shape < 1 boosted by U^(1/shape)).
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        if shape < 1.0 {
            return self.gamma(shape + 1.0, scale) * self.uniform().powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrivals {
    /// A fixed number of requests in flight; the next starts when one ends.
    Closed {
        /// Requests in flight.
        concurrency: usize,
    },
    /// Requests at `rate` per second regardless of how fast they finish. Inter-arrival times
    /// are gamma-distributed with shape `burstiness` (1 = Poisson; < 1 burstier; ∞ = constant).
    Open {
        /// Mean requests per second.
        rate: f64,
        /// Gamma shape of the inter-arrival times.
        burstiness: f64,
        /// Ramp: the rate grows linearly from `rate` (first request) to this (last request).
        ramp_to: Option<f64>,
    },
}

impl Arrivals {
    /// Send times (seconds from start) of `n` open-loop requests; all zeros for closed loop
    /// (their send time is whenever a slot frees).
    pub fn schedule(&self, n: usize, rng: &mut Rng) -> Vec<f64> {
        match *self {
            Arrivals::Closed { .. } => vec![0.0; n],
            Arrivals::Open { rate: first, burstiness, ramp_to } => {
                let mut t = 0.0;
                (0..n)
                    .map(|i| {
                        let at = t;
                        let rate = match ramp_to {
                            Some(last) if n > 1 => first + (last - first) * i as f64 / (n - 1) as f64,
                            _ => first,
                        };
                        t += if burstiness.is_infinite() {
                            1.0 / rate
                        } else {
                            rng.gamma(burstiness, 1.0 / (rate * burstiness))
                        };
                        at
                    })
                    .collect()
            }
        }
    }
}

/// A length distribution, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Length {
    /// Always `n`.
    Fixed {
        /// Tokens.
        n: usize,
    },
    /// Uniform in `min..=max`.
    Uniform {
        /// Smallest.
        min: usize,
        /// Largest.
        max: usize,
    },
    /// Normal, rounded and clamped to at least 1.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        sd: f64,
    },
}

impl std::str::FromStr for Length {
    type Err = String;
    /// `N`, `uniform:MIN:MAX` or `normal:MEAN:SD`.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |x: &str| x.parse::<f64>().map_err(|_| format!("`{x}` in `{s}` is not a number"));
        match parts.as_slice() {
            [n] => Ok(Length::Fixed { n: num(n)? as usize }),
            ["uniform", a, b] if num(a)? <= num(b)? => {
                Ok(Length::Uniform { min: num(a)? as usize, max: num(b)? as usize })
            }
            ["normal", m, sd] => Ok(Length::Normal { mean: num(m)?, sd: num(sd)? }),
            _ => Err(format!("`{s}`: expected N, uniform:MIN:MAX or normal:MEAN:SD")),
        }
    }
}

impl Length {
    /// Draws one length (at least 1).
    pub fn sample(&self, rng: &mut Rng) -> usize {
        match *self {
            Length::Fixed { n } => n.max(1),
            Length::Uniform { min, max } => {
                (min + (rng.uniform() * (max - min + 1) as f64) as usize).clamp(min.max(1), max.max(1))
            }
            Length::Normal { mean, sd } => (mean + sd * rng.normal()).round().max(1.0) as usize,
        }
    }
}

/// Everyday words; random sequences of them tokenize to about one token per word in
/// byte-level BPE vocabularies, so a prompt of N words is about N tokens.
const WORDS: &[&str] = &[
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
];

/// A prompt of about `words` tokens; `shared_prefix` words (the same for every request of a
/// run) start it, as a common system prompt would.
pub fn synthetic_prompt(words: usize, shared_prefix: usize, rng: &mut Rng) -> String {
    let mut prefix_rng = Rng::new(0x5eed);
    let mut out = Vec::with_capacity(words);
    for i in 0..words {
        let r = if i < shared_prefix { &mut prefix_rng } else { &mut *rng };
        out.push(WORDS[(r.uniform() * WORDS.len() as f64) as usize % WORDS.len()]);
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_schedule_has_the_requested_mean_rate_and_gamma_controls_burstiness() {
        let mut rng = Rng::new(1);
        let gaps = |b: f64, rng: &mut Rng| {
            let s = Arrivals::Open { rate: 10.0, burstiness: b, ramp_to: None }.schedule(20_001, rng);
            let g: Vec<f64> = s.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = g.iter().sum::<f64>() / g.len() as f64;
            let cv2 = g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / g.len() as f64 / (mean * mean);
            (mean, cv2)
        };
        let (mean, cv2) = gaps(1.0, &mut rng);
        assert!((mean - 0.1).abs() < 0.003, "{mean}");
        assert!((cv2 - 1.0).abs() < 0.06, "Poisson: squared CV 1, got {cv2}");
        let (_, cv2) = gaps(0.25, &mut rng);
        assert!((cv2 - 4.0).abs() < 0.4, "gamma shape 0.25: squared CV 4, got {cv2}");
        let s = Arrivals::Open { rate: 4.0, burstiness: f64::INFINITY, ramp_to: None }.schedule(3, &mut rng);
        assert_eq!(s, vec![0.0, 0.25, 0.5]);
        // A ramp from 1 to 3 req/s: gaps 1 s, then 1/2 s (rate 2 at the middle request).
        let s =
            Arrivals::Open { rate: 1.0, burstiness: f64::INFINITY, ramp_to: Some(3.0) }.schedule(3, &mut rng);
        assert_eq!(s, vec![0.0, 1.0, 1.5]);
    }

    #[test]
    fn lengths_parse_and_sample_in_range() {
        let mut rng = Rng::new(7);
        assert_eq!("128".parse::<Length>(), Ok(Length::Fixed { n: 128 }));
        let u: Length = "uniform:10:20".parse().unwrap();
        assert!((0..1000).map(|_| u.sample(&mut rng)).all(|n| (10..=20).contains(&n)));
        assert!("uniform:20:10".parse::<Length>().is_err());
        let n: Length = "normal:100:10".parse().unwrap();
        let mean = (0..5000).map(|_| n.sample(&mut rng) as f64).sum::<f64>() / 5000.0;
        assert!((mean - 100.0).abs() < 1.0, "{mean}");
    }

    #[test]
    fn prompts_share_their_prefix_and_have_the_requested_length() {
        let mut rng = Rng::new(3);
        let a = synthetic_prompt(50, 20, &mut rng);
        let b = synthetic_prompt(50, 20, &mut rng);
        assert_eq!(a.split(' ').count(), 50);
        let prefix = |s: &str| s.split(' ').take(20).collect::<Vec<_>>().join(" ");
        assert_eq!(prefix(&a), prefix(&b));
        assert_ne!(a, b);
    }
}
