//! One side of the local bench at a time, for counting instructions: checks
//! `n` times over 1,000 `String` keys, either through `HybridLimiter::check`
//! with the breaker Open (LocalFallback, FailOpen or FailClosed) or through a
//! bare governor keyed limiter, the local bench's baseline.
//!
//! Timings on these machines drift by ±30 % between runs; instruction counts
//! do not. `benches/instructions.sh` runs this binary under valgrind's
//! cachegrind for two values of `n` and divides the difference by the extra
//! checks: instructions per check, without start-up, for each side.
//!
//! ```sh
//! cargo run --release -p tierlimit-benches --bin local-instructions -- fallback 100000
//! ```

use std::hint::black_box;
use std::process::ExitCode;

use governor::RateLimiter;
use tierlimit::{LocalConfig, Policy};
use tierlimit_benches::{generous_quota, generous_set, poll_ready, runtime, tripped_limiter};

/// Distinct keys the checks cycle through.
const KEYS: usize = 1_000;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(side), Some(Ok(n))) = (args.first(), args.get(1).map(|n| n.parse::<u64>())) else {
        eprintln!("usage: local-instructions governor|fallback|fail-open|fail-closed <checks>");
        return ExitCode::FAILURE;
    };
    let policy = match side.as_str() {
        "governor" => None,
        "fallback" => Some(Policy::LocalFallback),
        "fail-open" => Some(Policy::FailOpen),
        "fail-closed" => Some(Policy::FailClosed),
        other => {
            eprintln!("local-instructions: unknown side {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i:07}")).collect();
    let rt = runtime();
    let _entered = rt.enter();
    match policy {
        None => {
            let gov = RateLimiter::keyed(generous_quota());
            for key in keys.iter().cycle().take(KEYS + n as usize) {
                drop(black_box(gov.check_key(key)));
            }
        }
        Some(policy) => {
            let limiter = tripped_limiter(&rt, LocalConfig::default());
            let set = generous_set("instructions", 1).with_policy(policy);
            for key in keys.iter().cycle().take(KEYS + n as usize) {
                black_box(poll_ready(limiter.check(key, &set, 1)).ok());
            }
        }
    }
    ExitCode::SUCCESS
}
