//! The machine's stalls, seen from outside the code under test.
//!
//! A latency a test measures is wall time: when the whole machine stops (a
//! virtual machine descheduled by its host, seen in CI as two chaos apps
//! going 20 ms over the deadline at the same instant), every check in flight
//! comes back late together, and no limiter could have answered sooner. A
//! [`StallWatch`] is a thread that asks to sleep [`TICK`] at a time and notes
//! every wake-up later than [`STALL_MIN`] beyond it. It shares nothing with
//! the code under test, so a stall it sees is the machine's. A thread waking
//! from sleep is scheduled ahead of busy ones, so a merely busy machine makes
//! none: beside two CPU-bound processes the watch saw no stall. What does make
//! one is the machine stopping, or a burst of many new threads at once
//! (docker's tools at the end of a docker run made some of 5-13 ms), which
//! holds up every other task just as much.
//!
//! A stall excuses only the end of a call that came back during it or just
//! after ([`RESUME`]): the part of the stall the call spent waiting
//! ([`held_at_end`]). A stall in the middle of a wait delays nothing, since
//! the deadline's timer runs on, and excuses nothing. So a latency bound
//! judged with [`Stalls::judge`] is as tight as before for a slow limiter,
//! or for a process that stalls alone.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the watch sleeps at a time.
pub const TICK: Duration = Duration::from_millis(1);

/// How much later than asked a wake-up must come to count as a stall.
pub const STALL_MIN: Duration = Duration::from_millis(5);

/// How soon after a stall a call may come back and still have been held up
/// by it: once the machine runs again the due timers fire together, and the
/// tasks they wake take well under a millisecond each.
pub const RESUME: Duration = Duration::from_millis(5);

/// A stretch in which the machine ran nothing the watch could see: from when
/// its wake-up was due to when it came, since the watch's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// When the watch should have woken.
    pub from: Duration,
    /// When it did.
    pub to: Duration,
}

impl Stall {
    /// Its length.
    pub fn length(&self) -> Duration {
        self.to.saturating_sub(self.from)
    }
}

/// The part of a call's latency that `stalls` explain, for a call started at
/// `start` (since the stalls' origin) that took `latency`: the part of each
/// stall within the call that its end fell in or came [`RESUME`] after.
pub fn held_at_end(stalls: &[Stall], start: Duration, latency: Duration) -> Duration {
    let end = start + latency;
    stalls
        .iter()
        .filter(|s| s.from < end && s.to + RESUME >= end)
        .map(|s| s.to.min(end).saturating_sub(s.from.max(start)))
        .sum()
}

/// The watch thread; [`stop`](Self::stop) ends it and returns what it saw
/// (dropping it ends it too, as when a test fails midway).
#[derive(Debug)]
pub struct StallWatch {
    origin: Instant,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Stall>>>,
}

impl StallWatch {
    /// Starts watching; stalls are timed from `origin`, and those that end
    /// before it (it may lie ahead) are left out.
    pub fn start(origin: Instant) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("stall-watch".into())
            .spawn(move || {
                let mut stalls = Vec::new();
                while !stopped.load(Ordering::Relaxed) {
                    let asleep = Instant::now();
                    std::thread::sleep(TICK);
                    let woke = Instant::now();
                    if woke - asleep > TICK + STALL_MIN && woke > origin {
                        stalls.push(Stall {
                            from: (asleep + TICK).saturating_duration_since(origin),
                            to: woke - origin,
                        });
                    }
                }
                stalls
            })?;
        Ok(StallWatch {
            origin,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the watch: every stall it saw, in order.
    pub fn stop(mut self) -> Stalls {
        self.stop.store(true, Ordering::Relaxed);
        let list = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        Stalls {
            origin: self.origin,
            list,
        }
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a [`StallWatch`] saw; its `Display` names the longest stall, for a
/// failing bound's message.
#[derive(Debug, Clone)]
pub struct Stalls {
    origin: Instant,
    list: Vec<Stall>,
}

impl Stalls {
    /// What the stalls are timed from.
    pub(crate) fn origin(&self) -> Instant {
        self.origin
    }

    /// The longest stall's length (zero if there was none).
    pub fn longest(&self) -> Duration {
        self.list
            .iter()
            .map(Stall::length)
            .max()
            .unwrap_or_default()
    }

    /// Every stall, in order, timed from the watch's origin.
    pub fn into_list(self) -> Vec<Stall> {
        self.list
    }

    /// `latency` of a call started at `started`, less what stalls at its end
    /// explain ([`held_at_end`]).
    pub fn own_latency(&self, started: Instant, latency: Duration) -> Duration {
        let start = started.saturating_duration_since(self.origin);
        latency.saturating_sub(held_at_end(&self.list, start, latency))
    }

    /// Judges `timings` against `bound`: the slowest call's own latency
    /// ([`own_latency`](Self::own_latency)) if within it, else a message that
    /// gives both latencies and the longest stall.
    pub fn judge(&self, timings: &Timings, bound: Duration) -> Result<Duration, String> {
        let own = timings
            .calls
            .iter()
            .map(|&(started, took)| self.own_latency(started, took))
            .max()
            .unwrap_or_default();
        if own <= bound {
            return Ok(own);
        }
        Err(format!(
            "the slowest of {} calls took {own:?} (less the machine's stalls at its end; {:?} as measured), over {bound:?}; {self}",
            timings.calls.len(),
            timings.slowest(),
        ))
    }
}

impl fmt::Display for Stalls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.list.is_empty() {
            return f.write_str("the machine never stalled");
        }
        write!(
            f,
            "the machine stalled {} times, the longest {:?}",
            self.list.len(),
            self.longest()
        )
    }
}

/// Calls timed by a test, judged against a latency bound once the stalls of
/// their run are known ([`Stalls::judge`]).
#[derive(Clone, Default)]
pub struct Timings {
    calls: Vec<(Instant, Duration)>,
}

impl Timings {
    /// Records a call started at `started` that took `took`.
    pub fn add(&mut self, started: Instant, took: Duration) {
        self.calls.push((started, took));
    }

    /// Awaits `call`, recording when it started and how long it took.
    pub async fn time<F: Future>(&mut self, call: F) -> F::Output {
        let started = Instant::now();
        let output = call.await;
        self.add(started, started.elapsed());
        output
    }

    /// Adds every call of `other`.
    pub fn merge(&mut self, other: Timings) {
        self.calls.extend(other.calls);
    }

    /// The slowest call's latency, as measured.
    pub fn slowest(&self) -> Duration {
        self.calls
            .iter()
            .map(|&(_, took)| took)
            .max()
            .unwrap_or_default()
    }
}

impl fmt::Debug for Timings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timings")
            .field("calls", &self.calls.len())
            .field("slowest", &self.slowest())
            .finish()
    }
}

/// Runs `call` under a watch of its own: its output, and its latency judged
/// against `bound` as [`Stalls::judge`] does.
pub async fn judged<F: Future>(call: F, bound: Duration) -> (F::Output, Result<Duration, String>) {
    let watch = StallWatch::start(Instant::now()).expect("the stall watch's thread starts");
    let mut timings = Timings::default();
    let output = timings.time(call).await;
    (output, watch.stop().judge(&timings, bound))
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
        let origin = Instant::now();
        let watch = StallWatch::start(origin).expect("the watch starts");
        // Let it take a few ticks first, then stop everything for 150 ms.
        while origin.elapsed() < Duration::from_millis(20) {
            std::thread::yield_now();
        }
        let before = origin.elapsed();
        stop_this_process(150);
        let after = origin.elapsed();
        let stalls = watch.stop();
        let long: Vec<&Stall> = stalls
            .list
            .iter()
            .filter(|s| s.length() >= Duration::from_millis(100))
            .collect();
        assert_eq!(long.len(), 1, "one long stall: {stalls:?}");
        let s = long[0];
        // The stop may land up to a tick after the watch's last wake-up, and
        // after it either thread may run first.
        assert!(
            s.from + TICK >= before && s.to <= after + TICK,
            "the stall {s:?} lies within the stop ({before:?}..{after:?})"
        );
        assert!(
            s.length() + TICK >= Duration::from_millis(150),
            "it spans the whole stop: {s:?}"
        );
    }

    fn ms(ms: f64) -> Duration {
        Duration::from_micros((ms * 1e3).round() as u64)
    }

    /// Calls of 67.5 ms from 1,000 ms, judged against 65 ms, with `stalls`
    /// (from, to in ms).
    fn judged(took: f64, stalls: &[(f64, f64)]) -> Result<Duration, String> {
        let origin = Instant::now();
        let stalls = Stalls {
            origin,
            list: stalls
                .iter()
                .map(|&(from, to)| Stall {
                    from: ms(from),
                    to: ms(to),
                })
                .collect(),
        };
        let mut timings = Timings::default();
        timings.add(origin + ms(1_000.0), ms(took));
        timings.add(origin + ms(500.0), ms(10.0));
        stalls.judge(&timings, ms(65.0))
    }

    #[test]
    fn a_machine_stall_excuses_only_a_call_that_ended_in_it() {
        let none = judged(67.5, &[]).expect_err("over the bound with no stall");
        assert!(
            none.contains("took 67.5ms") && none.ends_with("the machine never stalled"),
            "{none}"
        );
        // A 16 ms stall that ended 1.5 ms before the call did held it up.
        assert_eq!(judged(67.5, &[(1_050.0, 1_066.0)]), Ok(ms(51.5)));
        // The same stall in the middle of the wait held nothing up.
        let middle = judged(67.5, &[(1_020.0, 1_036.0)]).expect_err("a stall mid-wait");
        assert!(
            middle.contains("took 67.5ms") && middle.ends_with("the longest 16ms"),
            "{middle}"
        );
        // A stall too short to explain the excess leaves the call over.
        let short = judged(90.0, &[(1_083.0, 1_090.0)]).expect_err("a short stall");
        assert!(
            short.contains("took 83ms") && short.contains("90ms as measured"),
            "{short}"
        );
        // A stall the call's end fell in excuses its part before the end;
        // one that began after the end, nothing.
        assert_eq!(judged(67.5, &[(1_060.0, 1_080.0)]), Ok(ms(60.0)));
        let later = judged(67.5, &[(1_068.0, 1_080.0)]).expect_err("a stall after the end");
        assert!(later.contains("took 67.5ms"), "{later}");
    }
}
