//! A paired harness for tierlimit's benches, and the fixtures they share.
//!
//! Absolute times on the machines these benches run on drift by ±30 % from one
//! run to the next, so no target is an absolute time. Every target is the
//! ratio of two things measured side by side in one run: A, the code under
//! test, and B, its baseline. [`Harness::compare`] runs them alternately,
//! A, B, A, B…, with the same number of operations per sample, takes the ratio
//! A ÷ B of each pair, and reports the median ratio over the pairs (7 by
//! default, never fewer than 5), its spread (the smallest and largest per-pair
//! ratio) and the median nanoseconds per operation of each side.
//!
//! # Why not criterion or divan
//!
//! Both measure one function at a time: a comparison group runs all of one
//! function's samples, then all of the next one's, so the two sides of a ratio
//! are measured seconds apart and whatever the machine did in between (another
//! tenant, frequency scaling, a compaction) lands in the ratio. Neither can
//! interleave two functions sample by sample. What is needed here (calibrate,
//! alternate, take medians, write JSON lines) is a page of code and adds no
//! dependency to build on a 2-core machine.
//!
//! # Output
//!
//! Each bench binary writes JSON lines, one per result, to
//! `<out>/<bench>.jsonl`, where `<out>` is `$TIERLIMIT_BENCH_OUT` or else
//! `target/tierlimit-benches` at the workspace root. `benches/render.py` turns
//! them into `BENCHMARKS.md`; `benches/run.sh` does both.
//!
//! # Choosing cases
//!
//! Arguments after `--` that are not flags filter the cases by id:
//! `cargo bench -p tierlimit-benches --bench local -- fallback/1-key` runs the
//! cases whose id contains `fallback/1-key` (and writes only those).
//!
//! # Quick mode
//!
//! Run without `--bench` (as `cargo test --benches` runs it), a bench takes
//! tiny samples, may shrink its largest cases, and writes nothing: it only
//! shows that every case still runs.
//!
//! # Examples
//!
//! ```no_run
//! use std::hint::black_box;
//! use std::time::Instant;
//! use tierlimit_benches::{Case, Harness};
//!
//! let mut harness = Harness::from_args("example");
//! harness.compare(
//!     Case::new("sum/1000", "wrapping sum vs checked sum", "wrapping", "checked").target(1.10),
//!     |ops| {
//!         let started = Instant::now();
//!         for i in 0..ops {
//!             black_box(black_box(i).wrapping_add(1));
//!         }
//!         started.elapsed()
//!     },
//!     |ops| {
//!         let started = Instant::now();
//!         for i in 0..ops {
//!             black_box(black_box(i).checked_add(1));
//!         }
//!         started.elapsed()
//!     },
//! );
//! ```
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod fixtures;
mod minimal;

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

pub use fixtures::{
    GENEROUS_BURST, GENEROUS_RATE_PER_SECOND, dead_redis_url, fcall_args, generous_quota,
    generous_set, healthy_limiter, library_function, poll_ready, runtime, tripped_limiter,
};
pub use minimal::MINIMAL_SCRIPTS;

/// Fewer pairs than this cannot give a median worth a target.
pub const MIN_PAIRS: usize = 5;
/// Pairs per comparison unless a case asks for fewer (never below [`MIN_PAIRS`]).
pub const DEFAULT_PAIRS: usize = 7;
/// How long one sample of one side should take once calibrated: long enough
/// that timer resolution and a stray interrupt are noise, short enough that 14
/// samples of every case fit the run's budget.
const SAMPLE: Duration = Duration::from_millis(100);
const QUICK_SAMPLE: Duration = Duration::from_millis(1);

/// One comparison: what A and B are, and what A ÷ B should stay under.
#[derive(Debug, Clone)]
pub struct Case {
    id: String,
    title: String,
    a: String,
    b: String,
    target: Option<f64>,
    ops: Option<u64>,
    pairs: usize,
}

impl Case {
    /// A comparison named `id` (unique within its bench, e.g. `fallback/1000-keys`),
    /// described by `title`, of side `a` against baseline `b`.
    pub fn new(id: &str, title: &str, a: &str, b: &str) -> Case {
        Case {
            id: id.into(),
            title: title.into(),
            a: a.into(),
            b: b.into(),
            target: None,
            ops: None,
            pairs: DEFAULT_PAIRS,
        }
    }

    /// The target: the median ratio A ÷ B must be at most `max`.
    pub fn target(mut self, max: f64) -> Case {
        self.target = Some(max);
        self
    }

    /// Operations per sample, instead of calibrating to about 100 ms (e.g. one
    /// pass over a million keys).
    pub fn ops(mut self, ops: u64) -> Case {
        self.ops = Some(ops.max(1));
        self
    }

    /// Pairs to measure (at least [`MIN_PAIRS`]; default [`DEFAULT_PAIRS`]).
    pub fn pairs(mut self, pairs: usize) -> Case {
        self.pairs = pairs.max(MIN_PAIRS);
        self
    }
}

/// The median, smallest and largest of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
}

impl Spread {
    /// The spread of `samples`; `None` when there are none or one is NaN.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        if samples.is_empty() || samples.iter().any(|s| s.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 {
            sorted[mid]
        } else {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        };
        Some(Spread {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "median": self.median, "min": self.min, "max": self.max })
    }
}

/// What [`Harness::compare`] measured.
#[derive(Debug, Clone)]
pub struct Paired {
    /// A ÷ B, one per pair.
    pub ratios: Vec<f64>,
    /// The spread of [`ratios`](Self::ratios).
    pub ratio: Spread,
    /// Nanoseconds per operation of A, over the pairs.
    pub a_ns: Spread,
    /// Nanoseconds per operation of B, over the pairs.
    pub b_ns: Spread,
    /// Operations per sample.
    pub ops: u64,
}

/// Runs comparisons and records their results; one per bench binary.
#[derive(Debug)]
pub struct Harness {
    bench: String,
    quick: bool,
    sample: Duration,
    filters: Vec<String>,
    out: Option<(PathBuf, BufWriter<File>)>,
}

impl Harness {
    /// The harness of bench `bench`: quick mode unless the arguments hold
    /// `--bench` (what `cargo bench` passes). Outside quick mode it truncates
    /// `<out>/<bench>.jsonl`; panics if it cannot.
    pub fn from_args(bench: &str) -> Harness {
        let quick = !std::env::args().any(|a| a == "--bench");
        let filters = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        Harness::with(bench, quick, filters)
    }

    /// The harness of a bench binary (`cargo run --bin`, where there is no
    /// `--bench` flag): quick mode when `quick` (the binary's `--quick`),
    /// else it truncates `<out>/<bench>.jsonl` as
    /// [`from_args`](Self::from_args) does; every case runs (no filters).
    pub fn for_binary(bench: &str, quick: bool) -> Harness {
        Harness::with(bench, quick, Vec::new())
    }

    fn with(bench: &str, quick: bool, filters: Vec<String>) -> Harness {
        let out = (!quick).then(|| {
            let dir = std::env::var_os("TIERLIMIT_BENCH_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tierlimit-benches")
                });
            fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            let path = dir.join(format!("{bench}.jsonl"));
            let file = File::create(&path)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
            (path, BufWriter::new(file))
        });
        if quick {
            eprintln!("{bench}: quick mode: tiny samples, nothing written");
        }
        Harness {
            bench: bench.into(),
            quick,
            sample: if quick { QUICK_SAMPLE } else { SAMPLE },
            filters,
            out,
        }
    }

    /// True when case `id` is to run: no filter was given, or one is part of
    /// `id`. [`compare`](Self::compare) skips the others by itself; a bench
    /// asks first only to skip an expensive set-up.
    pub fn wants(&self, id: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| id.contains(f.as_str()))
    }

    /// True in quick mode: a bench may shrink its largest cases.
    pub fn quick(&self) -> bool {
        self.quick
    }

    /// Measures `a` against `b`, alternately, and records the result; `None`
    /// when a filter leaves the case out.
    ///
    /// Each side is called with a number of operations to perform and returns
    /// how long they took (so a side times only what it means to measure, and
    /// a side that runs threads times them from a common start). Both sides get
    /// the same count: calibrated on A so that a sample takes about 100 ms, or
    /// the case's [`ops`](Case::ops). Each side runs once unmeasured first.
    pub fn compare(
        &mut self,
        case: Case,
        mut a: impl FnMut(u64) -> Duration,
        mut b: impl FnMut(u64) -> Duration,
    ) -> Option<Paired> {
        if !self.wants(&case.id) {
            return None;
        }
        let ops = match case.ops {
            Some(ops) if !self.quick => {
                a(ops);
                ops
            }
            Some(ops) => {
                // Quick mode: a sliver of a fixed-size sample.
                let ops = ops.clamp(1, 1_000);
                a(ops);
                ops
            }
            None => calibrate(&mut a, self.sample),
        };
        b(ops);
        let pairs = case.pairs.max(MIN_PAIRS);
        let (mut ratios, mut a_ns, mut b_ns) = (vec![], vec![], vec![]);
        for _ in 0..pairs {
            let ta = a(ops).as_nanos() as f64;
            let tb = b(ops).as_nanos() as f64;
            ratios.push(ta / tb.max(1.0));
            a_ns.push(ta / ops as f64);
            b_ns.push(tb / ops as f64);
        }
        let spread = |v: &[f64]| Spread::of(v).expect("at least MIN_PAIRS finite samples");
        let paired = Paired {
            ratio: spread(&ratios),
            a_ns: spread(&a_ns),
            b_ns: spread(&b_ns),
            ratios,
            ops,
        };
        let verdict = match case.target {
            Some(max) if paired.ratio.median <= max => format!(" (target <= {max:.2}: met)"),
            Some(max) => format!(" (target <= {max:.2}: MISSED)"),
            None => String::new(),
        };
        println!(
            "{}/{}: {} / {} = {:.3} [{:.3}-{:.3}] over {pairs} pairs; {:.1} ns vs {:.1} ns per op{verdict}",
            self.bench,
            case.id,
            case.a,
            case.b,
            paired.ratio.median,
            paired.ratio.min,
            paired.ratio.max,
            paired.a_ns.median,
            paired.b_ns.median,
        );
        self.record(serde_json::json!({
            "kind": "ratio",
            "id": case.id,
            "title": case.title,
            "a": case.a,
            "b": case.b,
            "target_max": case.target,
            "pairs": pairs,
            "ops_per_sample": ops,
            "ratio": paired.ratio.json(),
            "ratios": paired.ratios,
            "a_ns": paired.a_ns.json(),
            "b_ns": paired.b_ns.json(),
        }));
        Some(paired)
    }

    /// Writes one result line (with `"bench"` added) unless in quick mode.
    pub fn record(&mut self, mut value: serde_json::Value) {
        if let Some(map) = value.as_object_mut() {
            map.insert("bench".into(), self.bench.clone().into());
        }
        if let Some((path, out)) = &mut self.out {
            writeln!(out, "{value}")
                .and_then(|()| out.flush())
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        }
    }
}

/// Doubles the operation count until A takes an eighth of a sample, then
/// scales it to a whole sample.
fn calibrate(a: &mut impl FnMut(u64) -> Duration, sample: Duration) -> u64 {
    let mut ops = 1u64;
    loop {
        let took = a(ops);
        if took >= sample / 8 || ops >= 1 << 40 {
            let scaled = ops as f64 * sample.as_secs_f64() / took.as_secs_f64().max(1e-9);
            return (scaled as u64).max(1);
        }
        ops *= 2;
    }
}

/// Whether `binary` (a tool of the redis-tools package, such as
/// `redis-benchmark`) runs here; `Err` says how to install it.
pub fn redis_tool(binary: &str) -> Result<(), String> {
    std::process::Command::new(binary)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(drop)
        .map_err(|_| {
            format!(
                "{binary} is not on PATH: install it with `sudo apt-get install -y redis-tools`"
            )
        })
}

/// Pins the server to core 0 and this process (every thread, and the
/// children it starts later, redis-benchmark's included) to core 1, so the
/// load and the server do not share a core. False when it could not (no
/// `taskset`, or one core).
pub fn pin_server_and_load(server_pid: u32) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        return false;
    }
    let run = |core: &str, pid: u32| {
        std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", core, &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    run("0", server_pid) && run("1", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_odd_and_even_counts() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).expect("three samples");
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]).expect("four samples");
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert!(Spread::of(&[]).is_none());
        assert!(Spread::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn calibration_scales_to_a_sample() {
        // A fake side that "takes" 1 µs per operation.
        let mut side = |ops: u64| Duration::from_micros(ops);
        let ops = calibrate(&mut side, Duration::from_millis(100));
        assert!((99_000..=101_000).contains(&ops), "{ops}");
    }

    #[test]
    fn pairs_alternate_and_never_fall_below_the_minimum() {
        let calls = std::cell::RefCell::new(Vec::new());
        let mut harness = Harness {
            bench: "test".into(),
            quick: true,
            sample: QUICK_SAMPLE,
            filters: vec![],
            out: None,
        };
        let case = Case::new("alternation", "A then B", "a", "b")
            .ops(10)
            .pairs(2);
        let paired = harness
            .compare(
                case,
                |_| {
                    calls.borrow_mut().push('a');
                    Duration::from_nanos(300)
                },
                |_| {
                    calls.borrow_mut().push('b');
                    Duration::from_nanos(100)
                },
            )
            .expect("no filter");
        // One unmeasured run each, then MIN_PAIRS pairs, A first in each.
        let expected: String = "ab".repeat(1 + MIN_PAIRS);
        assert_eq!(calls.borrow().iter().collect::<String>(), expected);
        assert_eq!(paired.ratios, vec![3.0; MIN_PAIRS]);
        assert_eq!(paired.ratio.median, 3.0);
    }
}
