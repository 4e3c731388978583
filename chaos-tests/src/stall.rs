//! The machine's stalls, seen from outside the apps.
//!
//! A decision's latency, as an app logs it, is wall time: when the whole
//! machine stops (a virtual machine descheduled by its host, seen in CI as two
//! apps going 20 ms over the deadline at the same instant), every app's checks
//! come back late together, and no limiter could have answered sooner. The
//! controller therefore runs a [`StallWatch`]: a thread that asks to sleep
//! [`TICK`] at a time and notes every wake-up later than [`STALL_MIN`] beyond
//! it. The watch shares nothing with the apps, so a stall it sees is the
//! machine's, not a limiter's. A thread waking from sleep is scheduled ahead
//! of busy ones, so a merely busy machine makes none: beside two CPU-bound
//! processes the watch saw no stall. What does make one is the machine
//! stopping, or a burst of many new threads at once (docker's tools at the
//! end of a docker run made some of 5-13 ms), which holds up the apps' tasks
//! just as much.
//!
//! The analyzer uses the stalls only to explain the end of a decision that
//! came back during one ([`crate::analyze`]): a stall in the middle of a wait
//! delays nothing and excuses nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::unix_us;

use serde::Serialize;

/// How long the watch sleeps at a time.
pub const TICK: Duration = Duration::from_millis(1);

/// How much later than asked a wake-up must come to count as a stall.
pub const STALL_MIN: Duration = Duration::from_millis(5);

/// A stretch of time in which the machine ran nothing the watch could see:
/// from when its wake-up was due to when it came, µs since the run's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stall {
    /// When the watch should have woken.
    pub from: u64,
    /// When it did.
    pub to: u64,
}

impl Stall {
    /// Its length, µs.
    pub fn length_us(&self) -> u64 {
        self.to.saturating_sub(self.from)
    }
}

/// The watch thread; [`stop`](Self::stop) ends it and returns what it saw
/// (dropping it ends it too, as when a scenario fails midway).
#[derive(Debug)]
pub struct StallWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Stall>>>,
}

impl StallWatch {
    /// Starts watching; times are µs since `start_unix_us` (the run's start).
    pub fn start(start_unix_us: u64) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("stall-watch".into())
            .spawn(move || {
                let mut stalls = Vec::new();
                while !stopped.load(Ordering::Relaxed) {
                    // Wall time anchors the stall to the apps' clocks (a
                    // stall before the run's start is of no interest); the
                    // monotonic clock measures it.
                    let asleep_at = unix_us().checked_sub(start_unix_us);
                    let asleep = Instant::now();
                    std::thread::sleep(TICK);
                    let slept = asleep.elapsed();
                    if let Some(asleep_at) = asleep_at
                        && slept > TICK + STALL_MIN
                    {
                        stalls.push(Stall {
                            from: asleep_at + TICK.as_micros() as u64,
                            to: asleep_at + slept.as_micros() as u64,
                        });
                    }
                }
                stalls
            })?;
        Ok(StallWatch {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the watch: every stall it saw, in order.
    pub fn stop(mut self) -> Vec<Stall> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stops this whole process for `ms` (every thread, as a host
    /// descheduling the machine would) with SIGSTOP and SIGCONT sent from a
    /// shell, and waits until it has run again.
    fn stop_this_process(ms: u64) {
        let pid = std::process::id();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "kill -STOP {pid}; sleep {}; kill -CONT {pid}",
                ms as f64 / 1e3
            ))
            .status()
            .expect("sh runs");
        assert!(status.success(), "the shell stopped and continued us");
    }

    #[test]
    fn a_stopped_process_is_seen_as_one_stall_of_its_length() {
        let start = unix_us();
        let watch = StallWatch::start(start).expect("the watch starts");
        // Let it take a few ticks first, then stop everything for 150 ms.
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_millis(20) {
            std::thread::yield_now();
        }
        let before = unix_us() - start;
        stop_this_process(150);
        let after = unix_us() - start;
        let stalls = watch.stop();
        let long: Vec<&Stall> = stalls.iter().filter(|s| s.length_us() >= 100_000).collect();
        assert_eq!(long.len(), 1, "one long stall: {stalls:?}");
        let s = long[0];
        // The stop may land up to a tick after the watch's last wake-up, and
        // after it either thread may run first.
        let tick = TICK.as_micros() as u64;
        assert!(
            s.from + tick >= before && s.to <= after + tick,
            "the stall {s:?} lies within the stop ({before}..{after} µs)"
        );
        assert!(
            s.length_us() + tick >= 150_000,
            "it spans the whole stop: {s:?}"
        );
    }
}
