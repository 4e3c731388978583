//! The chaos suite of tierlimit: fault scenarios run during steady load from
//! several limiter instances sharing one Redis, judged against the bounds the
//! hybrid limiter promises, with a report a person can read.
//!
//! * [`scenario`]: what is done to Redis or to an app, and when (written once).
//! * [`driver`]: where Redis and the apps run and how faults are made: the
//!   [`ProcessDriver`](driver::ProcessDriver) (processes, signals, the fault
//!   proxy) and the [`DockerDriver`](driver::DockerDriver) (containers,
//!   `docker kill`/`pause`/`network disconnect`, and [`proxy`] in a container
//!   of its own for latency and resets).
//! * [`app`]: one app instance (`chaos-app`): a `HybridLimiter` under load,
//!   logging every decision.
//! * [`run`] runs a scenario, [`analyze`] judges it, [`report`] writes JSON,
//!   Markdown and an SVG chart. Meanwhile a [`StallWatch`](tierlimit_test::StallWatch)
//!   watches for stalls of the whole machine, which no limiter could answer
//!   through.
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod analyze;
pub mod app;
pub mod driver;
pub mod plan;
pub mod proxy;
pub mod report;
pub mod run;
pub mod scenario;

/// Wall-clock time, µs since the Unix epoch: the clock the controller and
/// every app (processes or containers on one machine) share.
pub(crate) fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
