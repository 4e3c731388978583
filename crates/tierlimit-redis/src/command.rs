//! The check script's call (`EVALSHA` or `FCALL`), written straight into one
//! command buffer.
//!
//! A check is on every request's path, so its command is built without
//! intermediate strings: redis-rs's `Cmd` holds the bytes of every argument in
//! one buffer (plus one vector of where each ends), sized here up front; the
//! storage keys are formatted into it and the rules' arguments are copied from
//! what the [`RuleSet`] formatted once when it was built.

use std::fmt;

use redis::{Cmd, RedisWrite};
use tierlimit_core::RuleSet;

use crate::batch::Queued;
use crate::script::Head;

/// Arguments the check script takes per call besides its keys and the rules'
/// numbers: now, cost, nonce.
const CALL_ARGS: usize = 3;

/// Arguments the batch script takes per check besides its keys and, when the
/// batch holds several rule sets, the check's set: its cost.
const BATCH_CHECK_ARGS: usize = 1;

/// The most bytes a `u64` takes in decimal.
const U64_DIGITS: usize = 20;

/// `<head> <numkeys> KEYS... now cost nonce rule...`
/// for `set` (see `lua/check.lua`), `head` being `EVALSHA <sha>` or `FCALL
/// <function>` of the check; `escaped_key` comes from
/// [`escape_key`](tierlimit_core::escape_key), `now` is 0 for the server's time.
pub(crate) fn check(
    head: Head,
    set: &RuleSet,
    escaped_key: &str,
    now: u64,
    cost: u64,
    nonce: u64,
) -> Cmd {
    let rules = set.rules().len();
    let keys_len: usize = (0..rules)
        .map(|i| StorageKey::new(set, escaped_key, i).len())
        .sum();
    let rule_args_len: usize = (0..rules).map(|i| set.script_arg(i).len()).sum();
    let mut cmd = Cmd::with_capacity(
        3 + rules + CALL_ARGS + rules,
        head.len() + U64_DIGITS * (1 + CALL_ARGS) + keys_len + rule_args_len,
    );
    head.write(&mut cmd);
    cmd.arg(rules);
    for i in 0..rules {
        // Cmd writes a Display straight into its buffer (no String between).
        cmd.write_arg_fmt(StorageKey::new(set, escaped_key, i));
    }
    cmd.arg(now).arg(cost).arg(nonce);
    for i in 0..rules {
        cmd.arg(set.script_arg(i));
    }
    cmd
}

/// `<head> <numkeys> KEYS... n g nonce now (rules rule...)... ([set] cost)...`
/// of the batch script (or function: `head`) for `batch`, in order (see
/// `lua/check_batch.lua`): each distinct rule set's numbers once, each check
/// naming its set when there are several, one nonce for the call (the first
/// check's) and one now, at which every check is decided: 0 (the server's
/// time) when the checks' are, else the latest of them (a client clock's).
pub(crate) fn check_batch(head: Head, batch: &[Queued]) -> Cmd {
    // Sets are told apart by their numbers (what the script reads), so two
    // sets of equal rules share one entry. Few sets per batch: a linear scan.
    let mut sets: Vec<&RuleSet> = Vec::new();
    let mut set_of: Vec<usize> = Vec::with_capacity(batch.len());
    for q in batch {
        let found = sets.iter().position(|s| same_numbers(s, &q.set));
        set_of.push(match found {
            Some(i) => i,
            None => {
                sets.push(&q.set);
                sets.len() - 1
            }
        });
    }
    let keys: usize = batch.iter().map(|q| q.set.rules().len()).sum();
    let keys_len: usize = batch
        .iter()
        .map(|q| {
            (0..q.set.rules().len())
                .map(|i| StorageKey::new(&q.set, &q.escaped, i).len())
                .sum::<usize>()
        })
        .sum();
    let sets_len: usize = sets
        .iter()
        .map(|s| {
            U64_DIGITS
                + (0..s.rules().len())
                    .map(|i| s.script_arg(i).len())
                    .sum::<usize>()
        })
        .sum();
    let set_args: usize = sets.iter().map(|s| 1 + s.rules().len()).sum();
    let named = sets.len() > 1;
    let per_check = BATCH_CHECK_ARGS + usize::from(named);
    let mut cmd = Cmd::with_capacity(
        7 + keys + set_args + batch.len() * per_check,
        head.len() + 5 * U64_DIGITS + keys_len + sets_len + batch.len() * U64_DIGITS * per_check,
    );
    head.write(&mut cmd);
    cmd.arg(keys);
    for q in batch {
        for i in 0..q.set.rules().len() {
            cmd.write_arg_fmt(StorageKey::new(&q.set, &q.escaped, i));
        }
    }
    let nonce = batch.first().map_or(0, |q| q.nonce);
    let now = batch.iter().map(|q| q.now).max().unwrap_or(0);
    cmd.arg(batch.len()).arg(sets.len()).arg(nonce).arg(now);
    for s in &sets {
        cmd.arg(s.rules().len());
        for i in 0..s.rules().len() {
            cmd.arg(s.script_arg(i));
        }
    }
    for (q, set) in batch.iter().zip(set_of) {
        if named {
            cmd.arg(set + 1);
        }
        cmd.arg(q.cost);
    }
    cmd
}

/// Whether the script reads the same numbers for `a` and `b`.
fn same_numbers(a: &RuleSet, b: &RuleSet) -> bool {
    a.rules().len() == b.rules().len()
        && (0..a.rules().len()).all(|i| a.script_arg(i) == b.script_arg(i))
}

/// [`RuleSet::storage_key`], formatted where it is written.
struct StorageKey<'a> {
    escaped_key: &'a str,
    suffix: &'a str,
}

impl<'a> StorageKey<'a> {
    const PREFIX: &'static str = "tl:{";
    const TAG_END: &'static str = "}";

    fn new(set: &'a RuleSet, escaped_key: &'a str, index: usize) -> Self {
        StorageKey {
            escaped_key,
            suffix: set.storage_key_suffix(index),
        }
    }

    fn len(&self) -> usize {
        Self::PREFIX.len() + self.escaped_key.len() + Self::TAG_END.len() + self.suffix.len()
    }
}

impl fmt::Display for StorageKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        f.write_str(self.escaped_key)?;
        f.write_str(Self::TAG_END)?;
        f.write_str(self.suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CHECK;
    use crate::script::{Routine, ScriptMode};
    use tierlimit_core::{Rule, escape_key};

    fn sets() -> [RuleSet; 2] {
        [
            RuleSet::new("one", [Rule::per_second(7).expect("valid")]).expect("valid"),
            RuleSet::new(
                "three",
                [
                    Rule::per_second(3).expect("valid"),
                    Rule::per_minute(5)
                        .and_then(|r| r.with_burst(2))
                        .expect("valid"),
                    Rule::per_natural_day(1000, -8 * 3600).expect("valid"),
                ],
            )
            .expect("valid"),
        ]
    }

    /// The command as it was built before it went into one buffer: every key
    /// from `RuleSet::storage_key`, every number formatted per call.
    fn reference(set: &RuleSet, key: &str, now: u64, cost: u64, nonce: u64) -> Cmd {
        let escaped = escape_key(key);
        let rules = set.rules();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(CHECK.get_hash()).arg(rules.len());
        for i in 0..rules.len() {
            cmd.arg(set.storage_key(&escaped, i));
        }
        cmd.arg(now.to_string())
            .arg(cost.to_string())
            .arg(nonce.to_string());
        for rule in rules {
            cmd.arg(rule.script_arg().to_string());
        }
        cmd
    }

    #[test]
    fn sends_the_same_bytes_as_one_string_per_argument() {
        for set in sets() {
            for key in ["user:42", "a{b}%c", "{}{}%%", "k"] {
                for (now, cost, nonce) in [(0, 1, 0), (u64::MAX, u64::MAX, u64::MAX)] {
                    let head = Routine::Check.head(ScriptMode::Scripts);
                    let ours = check(head, &set, &escape_key(key), now, cost, nonce);
                    let theirs = reference(&set, key, now, cost, nonce);
                    assert_eq!(
                        String::from_utf8_lossy(&ours.get_packed_command()),
                        String::from_utf8_lossy(&theirs.get_packed_command()),
                        "{} / {key}",
                        set.name()
                    );
                    // The FCALL differs in its first two arguments only, and
                    // turns back into the same EVALSHA.
                    let head = Routine::Check.head(ScriptMode::Functions);
                    let fcall = check(head, &set, &escape_key(key), now, cost, nonce);
                    let back = crate::script::as_evalsha(&fcall).expect("a check call");
                    assert_eq!(
                        back.get_packed_command(),
                        theirs.get_packed_command(),
                        "{} / {key}",
                        set.name()
                    );
                }
            }
        }
    }
}
