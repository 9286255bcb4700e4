//! Non-negative least squares over a handful of terms, through the normal equations: the step
//! models' one fitting method, used by `pacer-engine profile` (on measured steps) and by
//! the planner's online step models (on the metrics' mean steps).
//!
//! With few coefficients the exact non-negative optimum is found by solving the unconstrained
//! problem on every subset of them (the rest held at 0) and keeping the best feasible one: the
//! constrained optimum is the unconstrained optimum of its own support.

use serde::{Deserialize, Serialize};

/// `XᵀX` and `Xᵀy` of a least-squares problem in `N` terms, summed over its rows (with an
/// optional fading weight on the older ones).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Normal<const N: usize> {
    #[serde(with = "square")]
    xx: [[f64; N]; N],
    #[serde(with = "row")]
    xy: [f64; N],
}

impl<const N: usize> Default for Normal<N> {
    fn default() -> Self {
        Normal { xx: [[0.0; N]; N], xy: [0.0; N] }
    }
}

impl<const N: usize> Normal<N> {
    /// Adds the row `x → y`, after weighting what was there by `keep` (1 keeps every row
    /// alike; below 1 older rows fade).
    pub fn add(&mut self, x: [f64; N], y: f64, keep: f64) {
        for i in 0..N {
            for j in 0..N {
                self.xx[i][j] = keep * self.xx[i][j] + x[i] * x[j];
            }
            self.xy[i] = keep * self.xy[i] + x[i] * y;
        }
    }

    /// The non-negative coefficients that minimise the squared residuals, among those
    /// `accept` admits; `None` when no subset of the terms gives one.
    pub fn fit(&self, accept: impl Fn(&[f64; N]) -> bool) -> Option<[f64; N]> {
        let mut best: Option<([f64; N], f64)> = None;
        for support in 1u32..(1 << N) {
            let idx: Vec<usize> = (0..N).filter(|i| support & (1 << i) != 0).collect();
            let Some(sub) = self.solve(&idx) else { continue };
            if sub.iter().any(|c| *c < 0.0 || !c.is_finite()) {
                continue;
            }
            let mut coef = [0.0; N];
            for (&i, c) in idx.iter().zip(sub) {
                coef[i] = c;
            }
            if !accept(&coef) {
                continue;
            }
            let loss = self.loss(&coef);
            if best.is_none_or(|(_, l)| loss < l) {
                best = Some((coef, loss));
            }
        }
        best.map(|(c, _)| c)
    }

    /// The squared residuals of `coef` less `Σy²`, which every candidate shares:
    /// `βᵀ(XᵀX)β − 2βᵀ(Xᵀy)`.
    fn loss(&self, coef: &[f64; N]) -> f64 {
        let mut loss = 0.0;
        for i in 0..N {
            loss -= 2.0 * coef[i] * self.xy[i];
            for j in 0..N {
                loss += coef[i] * self.xx[i][j] * coef[j];
            }
        }
        loss
    }

    /// The unconstrained least squares on the terms `idx` alone, by Gaussian elimination with
    /// partial pivoting on columns scaled to unit norm (token counts reach 10⁴ where the
    /// constant term is 1, and unscaled normal equations would lose most of their precision);
    /// `None` when the rows do not tell the terms apart.
    fn solve(&self, idx: &[usize]) -> Option<Vec<f64>> {
        let n = idx.len();
        let scale: Vec<f64> = idx.iter().map(|&i| self.xx[i][i].sqrt()).collect();
        if scale.iter().any(|s| *s <= 0.0 || !s.is_finite()) {
            return None;
        }
        let mut a: Vec<Vec<f64>> = (0..n)
            .map(|r| {
                (0..n)
                    .map(|c| self.xx[idx[r]][idx[c]] / (scale[r] * scale[c]))
                    .chain([self.xy[idx[r]] / scale[r]])
                    .collect()
            })
            .collect();
        for col in 0..n {
            let pivot = (col..n).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
            if a[pivot][col].abs() < 1e-12 {
                return None;
            }
            a.swap(col, pivot);
            let pivot_row = a[col].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / pivot_row[col];
                    for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                        *x -= f * p;
                    }
                }
            }
        }
        Some((0..n).map(|r| a[r][n] / a[r][r] / scale[r]).collect())
    }
}

/// Serde for `[[f64; N]; N]` (serde's arrays stop at 32 and need a length it can name).
mod square {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, const N: usize>(v: &[[f64; N]; N], s: S) -> Result<S::Ok, S::Error> {
        v.iter().map(|r| r.to_vec()).collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<[[f64; N]; N], D::Error> {
        let rows: Vec<Vec<f64>> = Vec::deserialize(d)?;
        let mut out = [[0.0; N]; N];
        if rows.len() != N || rows.iter().any(|r| r.len() != N) {
            return Err(serde::de::Error::custom(format!("expected a {N}×{N} matrix")));
        }
        for (o, r) in out.iter_mut().zip(rows) {
            o.copy_from_slice(&r);
        }
        Ok(out)
    }
}

/// Serde for `[f64; N]`.
mod row {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, const N: usize>(v: &[f64; N], s: S) -> Result<S::Ok, S::Error> {
        v.to_vec().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<[f64; N], D::Error> {
        let v: Vec<f64> = Vec::deserialize(d)?;
        v.try_into().map_err(|_| serde::de::Error::custom(format!("expected {N} numbers")))
    }
}

#[cfg(test)]
mod tests {
    use super::Normal;

    #[test]
    fn exact_rows_give_their_coefficients_and_a_negative_one_is_clamped() {
        let mut n = Normal::<3>::default();
        for (a, b) in [(1.0, 10.0), (2.0, 5.0), (3.0, 40.0), (4.0, 1.0), (5.0, 22.0)] {
            n.add([1.0, a, b], 0.5 + 0.25 * a + 0.01 * b, 1.0);
        }
        let c = n.fit(|_| true).expect("fit");
        for (got, want) in c.iter().zip([0.5, 0.25, 0.01]) {
            assert!((got - want).abs() < 1e-9, "{c:?}");
        }
        let mut neg = Normal::<2>::default();
        for a in [1.0, 2.0, 3.0, 4.0] {
            neg.add([1.0, a], 5.0 - a, 1.0);
        }
        let c = neg.fit(|_| true).expect("fit");
        assert_eq!(c[1], 0.0, "a falling line is no non-negative slope: {c:?}");
        assert!(c[0] > 0.0);
        let json = serde_json::to_string(&neg).expect("json");
        assert_eq!(serde_json::from_str::<Normal<2>>(&json).expect("back"), neg);
        assert!(serde_json::from_str::<Normal<3>>(&json).is_err(), "a 2×2 matrix is no 3×3 one");
    }
}
