//! Concurrent load with every decision recorded, for fault tests and the chaos suite.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tierlimit_core::{Decision, Error, RedisFailure, Tier};
use tokio::task::JoinHandle;

use crate::stall::{StallWatch, Stalls, Timings};

/// One check as the load saw it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the check started, from the start of the load.
    pub at: Duration,
    /// How long the check took.
    pub latency: Duration,
    /// Which stream (rule set, app instance: the caller's choice) it belonged to.
    pub stream: usize,
    /// The decision, or the error's text.
    pub result: Result<Decision, String>,
}

impl Sample {
    /// The tier that decided, if the check succeeded.
    pub fn tier(&self) -> Option<Tier> {
        self.result.as_ref().ok().map(|d| d.tier)
    }

    /// True when the check succeeded and admitted.
    pub fn allowed(&self) -> bool {
        matches!(&self.result, Ok(d) if d.allowed)
    }

    /// How the check's own Redis call failed, when the policy answered because of it.
    pub fn redis_failure(&self) -> Option<RedisFailure> {
        self.result.as_ref().ok()?.redis_failure
    }
}

/// Live counts, readable while the load runs (progress lines).
#[derive(Debug, Default)]
pub struct Live {
    /// Checks that admitted.
    pub allowed: AtomicU64,
    /// Checks that denied.
    pub denied: AtomicU64,
    /// Checks that returned an error.
    pub errors: AtomicU64,
}

/// Tasks checking in a loop until stopped, each recording its samples.
#[derive(Debug)]
pub struct Load {
    started: Instant,
    stop: StopOnDrop,
    live: Arc<Live>,
    tasks: Vec<JoinHandle<Vec<Sample>>>,
    watch: StallWatch,
}

impl Load {
    /// Starts `tasks` tasks; task `t` calls `check(t, i)` for i = 0, 1, ... and
    /// waits `pace` between calls (so the load stays below what a 2-core machine
    /// can serve and latencies measure the limiter, not a saturated scheduler).
    /// `check` returns the stream of the call and its result.
    pub fn start<F, Fut>(tasks: usize, pace: Duration, check: F) -> Load
    where
        F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = (usize, Result<Decision, Error>)> + Send + 'static,
    {
        let started = Instant::now();
        let watch = StallWatch::start(started).expect("the stall watch's thread starts");
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Live::default());
        let check = Arc::new(check);
        let tasks = (0..tasks)
            .map(|t| {
                let (stop, live, check) = (stop.clone(), live.clone(), check.clone());
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let begun = Instant::now();
                        let (stream, result) = check(t, i).await;
                        let latency = begun.elapsed();
                        let counter = match &result {
                            Ok(d) if d.allowed => &live.allowed,
                            Ok(_) => &live.denied,
                            Err(_) => &live.errors,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        samples.push(Sample {
                            at: begun - started,
                            latency,
                            stream,
                            result: result.map_err(|e| e.to_string()),
                        });
                        i += 1;
                        tokio::time::sleep(pace).await;
                    }
                    samples
                })
            })
            .collect();
        Load {
            started,
            stop: StopOnDrop(stop),
            live,
            tasks,
            watch,
        }
    }

    /// Time since the load started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The instant the load started (samples' `at` counts from it).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Live counts.
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// Stops every task and returns all samples, ordered by start time, with
    /// the machine's stalls meanwhile.
    pub async fn stop(self) -> Samples {
        self.stop.0.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.expect("a load task panicked"));
        }
        all.sort_by_key(|s| s.at);
        Samples {
            all,
            stalls: self.watch.stop(),
        }
    }
}

/// The load's stop flag, raised when the load is dropped unstopped (a test
/// failed midway), so its tasks end instead of running on beside whatever
/// the process does next (a test run again, see `tierlimit`'s `hybrid_faults`).
#[derive(Debug)]
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Every sample of a load run, with the measures the bounds are asserted on.
#[derive(Debug, Clone)]
pub struct Samples {
    /// Every sample, ordered by start time.
    pub all: Vec<Sample>,
    /// The machine's stalls while the load ran, timed from its start.
    pub stalls: Stalls,
}

impl Samples {
    /// Samples that started within `[from, to)`.
    pub fn between(&self, from: Duration, to: Duration) -> impl Iterator<Item = &Sample> {
        self.all.iter().filter(move |s| s.at >= from && s.at < to)
    }

    /// Every sample's latency, judged against `bound` as
    /// [`Stalls::judge`] does.
    pub fn judge_latency(&self, bound: Duration) -> Result<Duration, String> {
        let mut timings = Timings::default();
        for s in &self.all {
            timings.add(self.stalls.origin() + s.at, s.latency);
        }
        self.stalls.judge(&timings, bound)
    }

    /// The samples that returned an error.
    pub fn errors(&self) -> Vec<&Sample> {
        self.all.iter().filter(|s| s.result.is_err()).collect()
    }
}

/// The `q` quantile (0..=1) of some latencies, by the nearest-rank method.
pub fn quantile(latencies: impl IntoIterator<Item = Duration>, q: f64) -> Duration {
    let mut v: Vec<Duration> = latencies.into_iter().collect();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load dropped without `stop` (its test failed midway) ends its
    /// tasks: they let go of what their checks hold.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_dropped_unstopped_ends_its_tasks() {
        let held = Arc::new(());
        let checks = Arc::new(AtomicU64::new(0));
        let (h, c) = (held.clone(), checks.clone());
        let load = Load::start(4, Duration::from_millis(1), move |_, _| {
            let _held = h.clone();
            c.fetch_add(1, Ordering::Relaxed);
            async {
                (
                    0,
                    Ok(Decision::allowed(1, 0, Duration::ZERO, 0, Tier::Redis)),
                )
            }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while checks.load(Ordering::Relaxed) < 8 {
            assert!(Instant::now() < deadline, "the load never ran");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(load);
        while Arc::strong_count(&held) > 1 {
            assert!(
                Instant::now() < deadline,
                "the load's tasks still run after it was dropped ({} checks)",
                checks.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
