//! Sample summaries (pure): medians and tail percentiles by nearest rank, ratios of medians.

use std::time::Duration;

/// Summary of a set of wall-time samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Median (nearest rank), milliseconds.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank), milliseconds.
    pub p99_ms: f64,
    /// Arithmetic mean, milliseconds.
    pub mean_ms: f64,
}

/// Summarizes `samples`; `None` when there are none.
pub fn summarize(samples: &[Duration]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let mean_ms = ms.iter().sum::<f64>() / ms.len() as f64;
    Some(Summary {
        n: ms.len(),
        p50_ms: nearest_rank(&ms, 50.0),
        p99_ms: nearest_rank(&ms, 99.0),
        mean_ms,
    })
}

/// The `pct`-th percentile of sorted `sorted` by the nearest-rank method (always a sample, so
/// a p99 of 20 samples is their maximum rather than an interpolation).
fn nearest_rank(sorted: &[f64], pct: f64) -> f64 {
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `subject / baseline`, or `None` when the baseline is zero.
pub fn ratio(subject: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0).then(|| subject / baseline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn percentiles_are_samples_by_nearest_rank() {
        let s = summarize(&ms(&[5, 1, 4, 2, 3])).unwrap();
        assert_eq!(s.n, 5);
        assert_eq!(s.p50_ms, 3.0);
        assert_eq!(s.p99_ms, 5.0);
        assert_eq!(s.mean_ms, 3.0);
        let hundred: Vec<u64> = (1..=100).collect();
        let s = summarize(&ms(&hundred)).unwrap();
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
    }

    #[test]
    fn no_samples_no_summary_and_zero_baseline_no_ratio() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
    }
}
