//! Statistics as pure functions over slices: quantiles, the Mann-Whitney U test, a
//! bootstrap confidence interval of a ratio of medians, and Holm's correction.
//!
//! Methods: quantiles interpolate linearly between order statistics (Hyndman & Fan type 7,
//! numpy's default). Mann-Whitney U uses the normal approximation with tie correction and
//! a continuity correction (Mann & Whitney 1947; as in scipy's `mannwhitneyu(method=
//! "asymptotic")`). The bootstrap is the percentile method (Efron & Tibshirani 1993, ch.
//! 13) with a seeded SplitMix64 generator, so results are reproducible. Holm's step-down
//! procedure (Holm 1979) controls the family-wise error rate.

/// Quantile `q` in [0, 1] of already sorted values; `None` when empty.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let h = (sorted.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    Some(sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo]))
}

/// Quantile `q` of unsorted values.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    quantile_sorted(&v, q)
}

pub fn median(values: &[f64]) -> Option<f64> {
    quantile(values, 0.5)
}

/// Result of a two-sided Mann-Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample: the number of pairs (a, b) with a > b, ties counting 1/2.
    pub u: f64,
    /// Two-sided p-value from the normal approximation.
    pub p: f64,
}

/// Two-sided Mann-Whitney U test of `a` against `b`. `None` when either sample is empty.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<MannWhitney> {
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    // 1. Rank the pooled sample, ties getting their mean rank.
    let mut pooled: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    pooled.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = pooled.len();
    let mut rank_sum_a = 0.0;
    let mut tie_term = 0.0; // sum of t^3 - t over tie groups
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && pooled[j].0 == pooled[i].0 {
            j += 1;
        }
        let mean_rank = (i + 1 + j) as f64 / 2.0;
        let in_a = pooled[i..j].iter().filter(|p| p.1).count() as f64;
        rank_sum_a += mean_rank * in_a;
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        i = j;
    }
    // 2. U and its null distribution's moments.
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let u = rank_sum_a - n1f * (n1f + 1.0) / 2.0;
    let mean = n1f * n2f / 2.0;
    let var = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)).max(1.0));
    if var <= 0.0 {
        // Every value tied: no evidence of a difference.
        return Some(MannWhitney { u, p: 1.0 });
    }
    // 3. Continuity-corrected z, two-sided p.
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    Some(MannWhitney {
        u,
        p: (2.0 * normal_sf(z)).min(1.0),
    })
}

/// Survival function of the standard normal, 1 - Phi(z), via erfc.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Complementary error function (W. J. Cody's rational approximations as in Numerical
/// Recipes `erfcc`, relative error below 1.2e-7, enough for p-values).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Holm's step-down adjusted p-values, in the input order (monotone, capped at 1).
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut out = vec![0.0; m];
    let mut running = 0.0f64;
    for (k, &i) in order.iter().enumerate() {
        let adj = ((m - k) as f64 * p[i]).min(1.0);
        running = running.max(adj);
        out[i] = running;
    }
    out
}

/// A small seeded generator (SplitMix64, Steele et al. 2014): reproducible bootstraps
/// without a dependency.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), by Lemire's multiply-shift (bias below 2^-32 for our n).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// Standard normal by Box-Muller; for generating synthetic traces.
    pub fn normal(&mut self) -> f64 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Percentile-bootstrap confidence interval of `median(b) / median(a)`.
///
/// `level` is the coverage (0.95 for a 95% interval). `None` when a sample is empty or a
/// resampled median of `a` is zero.
pub fn bootstrap_ratio_ci(
    a: &[f64],
    b: &[f64],
    iterations: usize,
    level: f64,
    seed: u64,
) -> Option<(f64, f64)> {
    if a.is_empty() || b.is_empty() || iterations == 0 {
        return None;
    }
    let mut rng = SplitMix64::new(seed);
    let mut ra = vec![0.0; a.len()];
    let mut rb = vec![0.0; b.len()];
    let mut ratios = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        for x in ra.iter_mut() {
            *x = a[rng.below(a.len())];
        }
        for x in rb.iter_mut() {
            *x = b[rng.below(b.len())];
        }
        ra.sort_by(f64::total_cmp);
        rb.sort_by(f64::total_cmp);
        let ma = quantile_sorted(&ra, 0.5)?;
        let mb = quantile_sorted(&rb, 0.5)?;
        if ma == 0.0 {
            return None;
        }
        ratios.push(mb / ma);
    }
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    Some((
        quantile_sorted(&ratios, tail)?,
        quantile_sorted(&ratios, 1.0 - tail)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// U by counting pairs, the definition.
    fn u_brute(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .flat_map(|&x| b.iter().map(move |&y| (x, y)))
            .map(|(x, y)| {
                if x > y {
                    1.0
                } else if x == y {
                    0.5
                } else {
                    0.0
                }
            })
            .sum()
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), Some(2.5));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&v, 1.0), Some(4.0));
        // numpy.percentile([1,2,3,4], 95) == 3.85
        assert!((quantile(&v, 0.95).unwrap() - 3.85).abs() < 1e-12);
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn mann_whitney_u_matches_pair_counting() {
        let a = [1.0, 3.0, 3.0, 5.0, 7.0, 9.0];
        let b = [2.0, 3.0, 4.0, 4.0, 8.0];
        let mw = mann_whitney(&a, &b).unwrap();
        assert_eq!(mw.u, u_brute(&a, &b));
    }

    #[test]
    fn mann_whitney_p_by_hand() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 7.0];
        let b = [6.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let mw = mann_whitney(&a, &b).unwrap();
        assert_eq!(mw.u, 1.0);
        // By hand: mean = 18, var = 6*6*13/12 = 39, z = (17 - 0.5)/sqrt(39) = 2.64211,
        // p = 2 * (1 - Phi(2.64211)) = 0.008239.
        assert!((mw.p - 0.008239).abs() < 5e-5, "{}", mw.p);
    }

    #[test]
    fn mann_whitney_ties_and_identical() {
        let a = [5.0; 8];
        assert_eq!(mann_whitney(&a, &a).unwrap().p, 1.0);
        // Tie correction: pooled [1,1,2,2] vs: by hand var = 4/12*(5 - (6+6)/12) = 4/3.
        let mw = mann_whitney(&[1.0, 2.0], &[1.0, 2.0]).unwrap();
        assert_eq!(mw.u, 2.0);
        assert_eq!(mw.p, 1.0);
    }

    #[test]
    fn erfc_known_values() {
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((erfc(1.0) - 0.157_299_207).abs() < 1e-7);
        assert!((erfc(-1.0) - 1.842_700_793).abs() < 1e-7);
        assert!((normal_sf(1.959_964) - 0.025).abs() < 1e-6);
    }

    #[test]
    fn holm_by_hand() {
        // Sorted p: 0.01, 0.02, 0.04 -> 3*0.01=0.03, 2*0.02=0.04, 1*0.04=0.04.
        let adj = holm(&[0.04, 0.01, 0.02]);
        let want = [0.04, 0.03, 0.04];
        for (x, y) in adj.iter().zip(want) {
            assert!((x - y).abs() < 1e-12, "{adj:?}");
        }
        // Monotone even when a later raw product is smaller.
        let adj = holm(&[0.001, 0.9, 0.011]);
        assert_eq!(adj, vec![0.003, 0.9, 0.022]);
        assert!(holm(&[]).is_empty());
    }

    #[test]
    fn bootstrap_ci_covers_the_true_ratio() {
        let mut rng = SplitMix64::new(7);
        let a: Vec<f64> = (0..40).map(|_| 100.0 + 5.0 * rng.normal()).collect();
        let b: Vec<f64> = (0..40).map(|_| 120.0 + 6.0 * rng.normal()).collect();
        let (lo, hi) = bootstrap_ratio_ci(&a, &b, 2000, 0.95, 1).unwrap();
        assert!(lo < 1.2 && 1.2 < hi, "{lo} {hi}");
        assert!(hi - lo < 0.1, "{lo} {hi}");
        // Seeded: the same call gives the same interval.
        assert_eq!(bootstrap_ratio_ci(&a, &b, 2000, 0.95, 1), Some((lo, hi)));
        // Identical samples: the interval holds 1.
        let (lo, hi) = bootstrap_ratio_ci(&a, &a, 2000, 0.95, 3).unwrap();
        assert!(lo <= 1.0 && 1.0 <= hi);
    }
}
