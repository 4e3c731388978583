//! Writing an outage ledger back: arguments and replies of `lua/reconcile.lua`.

use redis::{Cmd, Value};
use tierlimit_core::{Error, LedgerEntry, RedisFailure, Result};

use crate::RECONCILE;
use crate::failure::classify_server;

/// How long past an entry's last relevant moment its batch marker is kept, so
/// a batch re-sent late (after a long outage, or across clock skew between
/// this host and Redis) is still recognised.
const MARKER_MARGIN_MS: u64 = 60_000;

/// What one [`RedisTier::reconcile`](crate::RedisTier::reconcile) batch did.
///
/// # Examples
///
/// ```no_run
/// # async fn run(tier: &tierlimit_redis::RedisTier, entries: &[tierlimit_core::LedgerEntry]) -> tierlimit_core::Result<()> {
/// let report = tier.reconcile("batch-0001", entries).await?;
/// println!(
///     "{} units written back; {} entries already were; {} had expired",
///     report.applied_units, report.already_applied, report.expired
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Units written back by this call (capped by the script at one window's worth).
    pub applied_units: u64,
    /// Entries this batch id had already written back (a re-sent batch).
    pub already_applied: usize,
    /// Entries whose window had passed: nothing left to change.
    pub expired: usize,
}

/// `EVALSHA` of the reconcile script for one entry (see `lua/reconcile.lua`).
pub(crate) fn reconcile_cmd(
    entry: &LedgerEntry,
    batch_id: &str,
    now_arg: &str,
    local_now_us: u64,
) -> Cmd {
    let rule = &entry.rule;
    let marker_ms = entry
        .expires_at_us()
        .saturating_sub(local_now_us)
        .div_ceil(1_000)
        .saturating_add(MARKER_MARGIN_MS);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(RECONCILE.get_hash())
        .arg(2)
        .arg(&entry.storage_key)
        .arg(format!("{}:rc:{batch_id}", entry.storage_key))
        .arg(now_arg)
        .arg(rule.algorithm().code())
        .arg(rule.limit())
        .arg(rule.period_micros())
        .arg(rule.capacity())
        .arg(i64::from(rule.utc_offset_secs()) * 1_000_000)
        .arg(entry.units)
        .arg(entry.first_us)
        .arg(entry.last_us)
        .arg(marker_ms)
        .arg(batch_id);
    cmd
}

/// Adds one entry's reply to `report`; an error reply or a malformed one is an error.
pub(crate) fn tally(report: &mut ReconcileReport, reply: Value) -> Result<()> {
    if let Value::ServerError(e) = reply {
        return Err(classify_server(e));
    }
    let (status, applied): (i64, i64) = redis::from_redis_value(reply)
        .map_err(|e| malformed(format!("reconcile script reply: {e}")))?;
    let applied =
        u64::try_from(applied).map_err(|_| malformed(format!("reconcile applied {applied}")))?;
    match status {
        1 => report.applied_units += applied,
        0 => report.already_applied += 1,
        2 => report.expired += 1,
        other => return Err(malformed(format!("reconcile status {other}"))),
    }
    Ok(())
}

fn malformed(what: String) -> Error {
    Error::redis(RedisFailure::MalformedReply, Some(what.into()))
}
