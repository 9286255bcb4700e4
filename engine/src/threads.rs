//! How many compute threads to use: the flag when given, otherwise the CPUs this process may
//! actually use (its affinity mask and its cgroup CPU quota), not the host's core count, which
//! in a container would oversubscribe the quota and stall every matmul on throttling.

use std::path::Path;

/// Parses cgroup v2 `cpu.max` ("max 100000" or "150000 100000") into a CPU count, rounded up.
pub fn cpus_from_cgroup_v2(cpu_max: &str) -> Option<usize> {
    let mut it = cpu_max.split_whitespace();
    let quota = it.next()?;
    let period: f64 = it.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    let quota: f64 = quota.parse().ok()?;
    Some(((quota / period).ceil() as usize).max(1))
}

/// Parses cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` into a CPU count, rounded up.
pub fn cpus_from_cgroup_v1(quota: &str, period: &str) -> Option<usize> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: i64 = period.trim().parse().ok()?;
    if quota <= 0 || period <= 0 {
        return None;
    }
    Some(((quota as f64 / period as f64).ceil() as usize).max(1))
}

fn cgroup_quota() -> Option<usize> {
    let read = |p: &str| std::fs::read_to_string(Path::new(p)).ok();
    if let Some(v2) = read("/sys/fs/cgroup/cpu.max") {
        return cpus_from_cgroup_v2(&v2);
    }
    cpus_from_cgroup_v1(
        &read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")?,
        &read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")?,
    )
}

/// Threads to use: `requested` if set, else min(affinity CPUs, cgroup quota).
pub fn compute_threads(requested: Option<usize>) -> usize {
    if let Some(n) = requested.filter(|&n| n > 0) {
        return n;
    }
    let affinity = std::thread::available_parallelism().map_or(1, usize::from);
    cgroup_quota().map_or(affinity, |q| q.min(affinity)).max(1)
}

static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();

/// Sizes the compute pool once per process; later calls (tests in one process) keep the first.
pub fn init_pool(threads: usize) {
    let _ = pool_with(threads);
}

fn pool_with(threads: usize) -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("pacer-compute-{i}"))
            .build()
            .unwrap_or_else(|e| panic!("cannot start {threads} compute threads: {e}"))
    })
}

/// The compute pool every kernel runs on (sized by [`compute_threads`] unless
/// [`init_pool`] ran first). A forward step runs entirely inside it (`install`), so the
/// calling thread is one of the workers: each matmul's fork/join then costs a queue push, not
/// a futex sleep and wake-up of an outside thread, which at ~150 fork/joins per decode step
/// was a fifth of the step's time.
pub fn pool() -> &'static rayon::ThreadPool {
    pool_with(compute_threads(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_quotas_round_up() {
        assert_eq!(cpus_from_cgroup_v2("max 100000\n"), None);
        assert_eq!(cpus_from_cgroup_v2("150000 100000\n"), Some(2));
        assert_eq!(cpus_from_cgroup_v2("50000 100000"), Some(1));
        assert_eq!(cpus_from_cgroup_v1("-1", "100000"), None);
        assert_eq!(cpus_from_cgroup_v1("400000\n", "100000\n"), Some(4));
    }

    #[test]
    fn an_explicit_count_wins() {
        assert_eq!(compute_threads(Some(3)), 3);
        assert!(compute_threads(None) >= 1);
    }
}
