//! What the check script answers, read into types.

use std::time::Duration;

use redis::Value;
use tierlimit_core::{Decision, Error, RedisFailure, Result, RuleSet, RuleState, Tier};

use crate::failure::classify_server;

/// The global tier's answer to one check: the decision, plus every rule's
/// state, which seeds the local tier when Redis later becomes unreachable.
///
/// # Examples
///
/// ```no_run
/// # async fn run(tier: &tierlimit_redis::RedisTier, set: &tierlimit_core::RuleSet) -> tierlimit_core::Result<()> {
/// let verdict = tier.check("user:42", set, 1).await?;
/// if verdict.decision.allowed {
///     for (i, rule) in verdict.rules.iter().enumerate() {
///         println!("rule {i}: {} left, full again in {:?}", rule.remaining, rule.reset_after);
///     }
/// } else {
///     println!("denied by rule {}", verdict.decision.rule);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verdict {
    /// The decision, from [`Tier::Redis`].
    pub decision: Decision,
    /// One entry per rule, in the rule set's order. When admitted: each rule
    /// after this request. When denied nothing was consumed anywhere: each rule
    /// as it stands.
    pub rules: Vec<RuleState>,
    /// The time the script decided at, µs since the Unix epoch: the server's
    /// clock, or in client-time mode the one this process sent.
    pub server_time_us: u64,
}

/// One check of [`RedisTier::check_many`](crate::RedisTier::check_many).
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Rule, RuleSet};
/// use tierlimit_redis::CheckRequest;
///
/// let set = RuleSet::new("api", [Rule::per_second(10)?])?;
/// let batch = [CheckRequest::new("user:1", &set, 1), CheckRequest::new("user:2", &set, 3)];
/// assert_eq!(batch[1].cost, 3);
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CheckRequest<'a> {
    /// The user key.
    pub key: &'a str,
    /// The rules to check it against.
    pub set: &'a RuleSet,
    /// Units to take from every rule.
    pub cost: u64,
}

impl<'a> CheckRequest<'a> {
    /// A check of `cost` units for `key` against `set`.
    pub fn new(key: &'a str, set: &'a RuleSet, cost: u64) -> Self {
        CheckRequest { key, set, cost }
    }
}

/// Reads the check script's reply (see `lua/check.lua`): the server time,
/// then the check's reply as the batch script gives it (see [`parse_batch`]).
///
/// Read in place: the only allocation is the verdict's own list of rules.
pub(crate) fn parse_verdict(reply: Value, set: &RuleSet) -> Result<Verdict> {
    let items = match &reply {
        Value::Array(items) | Value::Set(items) => items.as_slice(),
        other => return Err(malformed(format!("not an array: {other:?}"))),
    };
    server_error(items)?;
    let expected = 1 + reply_len(set);
    if items.len() != expected {
        return Err(malformed(format!(
            "{} items for {} rules, expected {expected}",
            items.len(),
            set.rules().len()
        )));
    }
    parse_items(&items[1..], set, unsigned(items, 0)?)
}

/// Reads the batch script's reply (see `lua/check_batch.lua`): one flat
/// array, the call's time first (at which every check was decided), then
/// each check's reply in a row, `retry_after_us, remaining, reset_after_us`
/// for a set of one rule and `retry_after_us, rule, (remaining_i,
/// reset_after_us_i)...` for more, or one error in their place. `sets` are
/// the batch's checks' sets, in order. One result per check, or what did not
/// add up, for every check of the call.
pub(crate) fn parse_batch<'s>(
    reply: Value,
    sets: impl ExactSizeIterator<Item = &'s RuleSet>,
) -> std::result::Result<Vec<Result<Verdict>>, String> {
    let items = match &reply {
        Value::Array(items) => items.as_slice(),
        other => return Err(format!("not an array: {other:?}")),
    };
    let time = match items.first() {
        Some(Value::Int(t)) if *t > 0 => *t as u64,
        other => return Err(format!("no time first: {other:?}")),
    };
    let count = sets.len();
    let mut results = Vec::with_capacity(count);
    let mut at = 1;
    for set in sets {
        if let Some(Value::ServerError(e)) = items.get(at) {
            results.push(Err(classify_server(e.clone())));
            at += 1;
            continue;
        }
        let len = reply_len(set);
        let Some(part) = items.get(at..at + len) else {
            return Err(format!("{} items, too few for {count} checks", items.len()));
        };
        results.push(server_error(part).and_then(|()| parse_items(part, set, time)));
        at += len;
    }
    if at != items.len() {
        return Err(format!(
            "{} items, {} more than {count} checks' replies",
            items.len(),
            items.len() - at
        ));
    }
    Ok(results)
}

/// The number of items of one check's reply under `set`, less the server
/// time: `retry_after_us, remaining, reset_after_us` for one rule,
/// `retry_after_us, rule, (remaining_i, reset_after_us_i)...` for more.
fn reply_len(set: &RuleSet) -> usize {
    match set.rules().len() {
        1 => 3,
        rules => 2 + 2 * rules,
    }
}

/// One check's reply (see [`reply_len`]), with no error among its items
/// (the callers look for one first), decided at `server_time_us`: a
/// retry-after of 0 is an admission.
fn parse_items(items: &[Value], set: &RuleSet, server_time_us: u64) -> Result<Verdict> {
    if set.rules().len() == 1 {
        return verdict(set, items, 0, 1, server_time_us);
    }
    verdict(set, items, int(items, 1)?, 2, server_time_us)
}

/// The verdict whose deciding rule is `deciding`, whose retry-after (0: an
/// admission) is item 0 and whose rules' (remaining, reset-after) pairs
/// start at item `states`.
fn verdict(
    set: &RuleSet,
    items: &[Value],
    deciding: i64,
    states: usize,
    server_time_us: u64,
) -> Result<Verdict> {
    let rules = set.rules().len();
    let rule = usize::try_from(deciding)
        .ok()
        .filter(|r| *r < rules)
        .ok_or_else(|| malformed(format!("deciding rule {deciding} of {rules}")))?;
    let retry_after = Duration::from_micros(unsigned(items, 0)?);
    let mut list = Vec::with_capacity(rules);
    for i in 0..rules {
        list.push(RuleState::new(
            unsigned(items, states + 2 * i)?,
            Duration::from_micros(unsigned(items, states + 1 + 2 * i)?),
        ));
    }
    let limit = set.rules()[rule].limit();
    let deciding = list[rule];
    let decision = if retry_after.is_zero() {
        Decision::allowed(
            limit,
            deciding.remaining,
            deciding.reset_after,
            rule,
            Tier::Redis,
        )
    } else {
        Decision::denied(limit, deciding.reset_after, retry_after, rule, Tier::Redis)
    };
    Ok(Verdict {
        decision,
        rules: list,
        server_time_us,
    })
}

/// An error inside the array is the server's, as redis-rs would report it.
fn server_error(items: &[Value]) -> Result<()> {
    match items.iter().find_map(|item| match item {
        Value::ServerError(e) => Some(e),
        _ => None,
    }) {
        Some(e) => Err(classify_server(e.clone())),
        None => Ok(()),
    }
}

/// Item `i` as an integer.
fn int(items: &[Value], i: usize) -> Result<i64> {
    match items.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        Some(other) => redis::from_redis_value_ref::<i64>(other)
            .map_err(|e| malformed(format!("item {i} is not an integer: {e}"))),
        None => Err(malformed(format!("no item {i}"))),
    }
}

/// Item `i` as an integer of at least 0.
fn unsigned(items: &[Value], i: usize) -> Result<u64> {
    let n = int(items, i)?;
    u64::try_from(n).map_err(|_| malformed(format!("item {i} is {n}")))
}

fn malformed(what: String) -> Error {
    Error::redis(
        RedisFailure::MalformedReply,
        Some(format!("check script reply: {what}").into()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierlimit_core::Rule;

    fn set() -> RuleSet {
        RuleSet::new(
            "s",
            [
                Rule::per_second(3).expect("valid"),
                Rule::per_minute(5).expect("valid"),
            ],
        )
        .expect("valid")
    }

    fn reply(items: &[i64]) -> Value {
        Value::Array(items.iter().map(|i| Value::Int(*i)).collect())
    }

    #[test]
    fn reads_an_admission() {
        let v = parse_verdict(reply(&[1_000, 0, 1, 2, 333_334, 1, 48_000_000]), &set())
            .expect("well formed");
        assert!(v.decision.allowed);
        assert_eq!(v.decision.rule, 1);
        assert_eq!(v.decision.limit, 5);
        assert_eq!(v.decision.remaining, 1);
        assert_eq!(v.decision.reset_after, Duration::from_secs(48));
        assert_eq!(v.server_time_us, 1_000);
        assert_eq!(
            v.rules[0],
            RuleState::new(2, Duration::from_micros(333_334))
        );
    }

    #[test]
    fn reads_a_denial() {
        let v = parse_verdict(reply(&[7, 250, 0, 0, 900, 3, 10]), &set()).expect("ok");
        assert!(!v.decision.allowed);
        assert_eq!(v.decision.retry_after, Some(Duration::from_micros(250)));
        assert_eq!(v.decision.remaining, 0);
        assert_eq!(v.decision.reset_after, Duration::from_micros(900));
        assert_eq!(v.server_time_us, 7);
    }

    /// A set of one rule: no deciding rule in the reply, and a retry-after
    /// of 0 is the admission.
    #[test]
    fn reads_one_rules_reply() {
        let one = one_rule();
        let v = parse_verdict(reply(&[5, 0, 2, 333]), &one).expect("well formed");
        assert!(v.decision.allowed);
        assert_eq!((v.decision.rule, v.decision.remaining), (0, 2));
        assert_eq!(v.decision.reset_after, Duration::from_micros(333));
        assert_eq!(v.server_time_us, 5);
        let v = parse_verdict(reply(&[5, 40, 0, 333]), &one).expect("well formed");
        assert!(!v.decision.allowed);
        assert_eq!(v.decision.retry_after, Some(Duration::from_micros(40)));
        let err = parse_verdict(reply(&[5, 0, 2, 333, 1]), &one).expect_err("one item too many");
        assert_eq!(err.redis_failure(), Some(RedisFailure::MalformedReply));
    }

    #[test]
    fn an_error_inside_the_reply_is_the_servers() {
        let oom = Value::ServerError(
            redis::make_extension_error("OOM".to_string(), Some("used memory".into()))
                .try_into()
                .expect("a server error"),
        );
        let mut items: Vec<Value> = (0..7).map(Value::Int).collect();
        items[4] = oom;
        let err = parse_verdict(Value::Array(items), &set()).expect_err("an error reply");
        assert_eq!(err.redis_failure(), Some(RedisFailure::OutOfMemory));
    }

    #[test]
    fn refuses_wrong_shapes() {
        let bad = [
            reply(&[1, 0, 0, 2, 3]),               // too short
            reply(&[1, 0, 0, 2, 3, 4, 5, 6]),      // too long
            reply(&[1, 0, 2, 2, 3, 4, 5]),         // no rule 2
            reply(&[1, 0, 0, -2, 3, 4, 5]),        // negative remaining
            reply(&[1, -7, 0, 2, 3, 4, 5]),        // negative retry-after
            reply(&[-1, 0, 0, 2, 3, 4, 5]),        // negative server time
            Value::SimpleString("OK".to_string()), // not an array
            Value::Array(vec![
                Value::Int(1),
                Value::Nil,
                Value::Int(0),
                Value::Int(2),
                Value::Int(3),
                Value::Int(4),
                Value::Int(5),
            ]), // not an integer
        ];
        for value in bad {
            let err = parse_verdict(value, &set()).expect_err("malformed");
            assert_eq!(err.redis_failure(), Some(RedisFailure::MalformedReply));
        }
    }

    fn one_rule() -> RuleSet {
        RuleSet::new("one", [Rule::per_second(3).expect("valid")]).expect("valid")
    }

    fn oom() -> Value {
        Value::ServerError(
            redis::make_extension_error("OOM".to_string(), Some("used memory".into()))
                .try_into()
                .expect("a server error"),
        )
    }

    #[test]
    fn a_batch_reply_is_read_check_by_check_by_each_sets_rules() {
        let (one, two) = (one_rule(), set());
        // The call's time, then: one rule admitted (retry 0); two rules,
        // denied by rule 1 for 40 µs.
        let mut items: Vec<Value> = [7, 0, 2, 333_334]
            .into_iter()
            .chain([40, 1, 1, 5, 0, 60])
            .map(Value::Int)
            .collect();
        // The third check failed alone: one error where its replies would be.
        items.push(oom());
        items.extend([0, 1, 666_667].map(Value::Int));
        let sets = [&one, &two, &two, &one];
        let results = parse_batch(Value::Array(items), sets.into_iter()).expect("adds up");
        assert_eq!(results.len(), 4);
        let first = results[0].as_ref().expect("admitted");
        assert!(first.decision.allowed);
        assert_eq!((first.decision.remaining, first.server_time_us), (2, 7));
        let second = results[1].as_ref().expect("denied");
        assert!(!second.decision.allowed);
        assert_eq!(second.decision.rule, 1);
        assert_eq!(second.decision.retry_after, Some(Duration::from_micros(40)));
        assert_eq!(second.rules.len(), 2);
        assert_eq!(
            second.rules[1],
            RuleState::new(0, Duration::from_micros(60))
        );
        assert_eq!(
            results[2].as_ref().expect_err("the error").redis_failure(),
            Some(RedisFailure::OutOfMemory)
        );
        // Every check was decided at the call's time.
        let last = results[3].as_ref().expect("admitted");
        assert_eq!((last.decision.remaining, last.server_time_us), (1, 7));
    }

    #[test]
    fn a_batch_reply_that_does_not_add_up_is_refused_whole() {
        let one = one_rule();
        let three = || [0, 2, 333_334].map(Value::Int);
        let with_time = |parts: &[[Value; 3]]| -> Vec<Value> {
            std::iter::once(Value::Int(7))
                .chain(parts.iter().flatten().cloned())
                .collect()
        };
        let short = with_time(&[three()]);
        let long = with_time(&[three(), three()]);
        for (items, checks) in [(short, 2), (long, 1)] {
            let sets = vec![&one; checks];
            assert!(parse_batch(Value::Array(items), sets.into_iter()).is_err());
        }
        // No time first (the check's items alone), or a zero or negative one.
        let untimed: Vec<Value> = three().to_vec();
        let zero: Vec<Value> = std::iter::once(Value::Int(0)).chain(three()).collect();
        let negative: Vec<Value> = std::iter::once(Value::Int(-1)).chain(three()).collect();
        for items in [untimed, zero, negative] {
            assert!(parse_batch(Value::Array(items), [&one].into_iter()).is_err());
        }
        assert!(parse_batch(Value::Okay, [&one].into_iter()).is_err());
    }
}
