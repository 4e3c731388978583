//! Writing an outage ledger back: arguments and replies of `lua/reconcile.lua`.

use redis::{Cmd, RedisWrite, Value};
use tierlimit_core::{
    Algorithm, Error, LedgerEntry, RedisFailure, Result, owed_after_us, stripe_share,
    stripe_storage_key,
};

use crate::failure::classify_server;
use crate::script::Head;

/// How long past an entry's last relevant moment its batch marker is kept, so
/// a batch re-sent late (after a long outage, or across clock skew between
/// this host and Redis) is still recognised.
const MARKER_MARGIN_MS: u64 = 60_000;

/// One ledger entry to write back, under the id that makes sending it twice
/// harmless (the script remembers per key the ids it applied).
#[derive(Debug, Clone, Copy)]
pub struct WriteBack<'a> {
    /// The write-back's id, checked like a user key.
    pub id: &'a str,
    /// What is written back.
    pub entry: &'a LedgerEntry,
}

impl<'a> WriteBack<'a> {
    /// A write-back of `entry` under `id`.
    pub fn new(id: &'a str, entry: &'a LedgerEntry) -> Self {
        WriteBack { id, entry }
    }
}

/// What Redis did with one [`WriteBack`].
///
/// # Examples
///
/// ```no_run
/// # async fn run(tier: &tierlimit_redis::RedisTier, entry: &tierlimit_core::LedgerEntry) -> tierlimit_core::Result<()> {
/// use tierlimit_redis::{WriteBack, Written};
///
/// for outcome in tier.reconcile(&[WriteBack::new("wb-0001", entry)]).await? {
///     match outcome? {
///         Written::Applied(units) => println!("{units} units written back"),
///         Written::AlreadyApplied => println!("sent before; nothing changed twice"),
///         Written::Expired => println!("its window has passed"),
///         Written::Refused(why) => println!("Redis refuses this entry: {why}"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Written {
    /// Written now: this many units. The counting algorithms answer the
    /// units they counted (a window's count or a sliding log short of room,
    /// or a log's units that already left its window, take fewer); GCRA and
    /// the token bucket answer every unit, their debt capped at a full bucket.
    Applied(u64),
    /// This id was applied to this key before (a re-sent write-back).
    AlreadyApplied,
    /// The units count no more (their window has passed, or their bucket
    /// refilled since): none applied. A bucket keeps where they end, in the
    /// past, for the write-backs of other instances to stack after.
    Expired,
    /// Redis refused this entry on its own (a key of the wrong type, say):
    /// sending it again changes nothing. The server's message.
    Refused(String),
}

/// A call (`head`: `EVALSHA` or `FCALL`) of the reconcile script for one
/// entry (see `lua/reconcile.lua`), written into one buffer sized up front
/// (`now_arg` 0 means server time).
pub(crate) fn reconcile_cmd(
    head: Head,
    entry: &LedgerEntry,
    batch_id: &str,
    now_arg: u64,
    local_now_us: u64,
) -> Cmd {
    /// Numbers among the arguments (the rule's five among them, with the
    /// colons between them), each at most 20 digits (a `u64`).
    const NUMBERS: usize = 11;
    let (units, first_us) = newest_that_matter(entry);
    let marker_ms = entry
        .expires_at_us()
        .saturating_sub(local_now_us)
        .div_ceil(1_000)
        .saturating_add(MARKER_MARGIN_MS);
    let key = &entry.storage_key;
    // The head's two, numkeys, two keys and eight arguments.
    let mut cmd = Cmd::with_capacity(
        13,
        head.len() + 2 * key.len() + MARKER.len() + 2 * batch_id.len() + 21 * NUMBERS,
    );
    head.write(&mut cmd);
    cmd.arg(2).arg(key);
    cmd.write_arg_fmt(format_args!("{key}{MARKER}{batch_id}"));
    cmd.arg(now_arg);
    cmd.write_arg_fmt(entry.rule.script_arg());
    cmd.arg(units)
        .arg(first_us)
        .arg(entry.last_us)
        .arg(marker_ms)
        .arg(batch_id);
    // On server time, the clock the entry's times are on as of now: the
    // script moves them onto the server's (lua/reconcile.lua, ARGV[8]).
    cmd.arg(if now_arg == 0 { local_now_us } else { 0 });
    cmd
}

/// One command of a write-back: the stripe it charges (0 when not striped)
/// and the units it sends.
pub(crate) type Part = (u32, u64);

/// The commands of each write-back of a batch when any is striped (see
/// [`add_reconcile_cmds`]); `None` when none is: one command each.
pub(crate) type Parts = Option<Vec<Vec<Part>>>;

/// Hands the reconcile commands of one write-back to `add` (each with the
/// storage key it writes, for its hash slot), and answers what
/// each sends: one command, or for a striped entry one per stripe that gets
/// units, each stripe its [`stripe_share`] of the units under its share of
/// the rule, so no stripe is charged beyond its share of the limit while the
/// stripes together are charged every unit. Each stripe's key keeps its own
/// marker of the batch id, so a re-sent write-back changes no stripe twice.
pub(crate) fn add_reconcile_cmds(
    mut add: impl FnMut(Cmd, &str),
    head: Head,
    entry: &LedgerEntry,
    batch_id: &str,
    now_arg: u64,
    local_now_us: u64,
) -> Vec<Part> {
    let k = entry.stripes;
    let parts: Option<Vec<(Part, LedgerEntry)>> = if k > 1 {
        (0..k)
            .map(|i| (i, stripe_share(entry.units, k, i)))
            .filter(|&(_, units)| units > 0)
            .map(|(i, units)| Some(((i, units), stripe_entry(entry, i, units)?)))
            .collect()
    } else {
        None
    };
    match parts {
        Some(parts) => parts
            .into_iter()
            .map(|(part, e)| {
                add(
                    reconcile_cmd(head, &e, batch_id, now_arg, local_now_us),
                    &e.storage_key,
                );
                part
            })
            .collect(),
        // Not striped, or a rule that no longer splits over the stripes (a
        // hand-made entry: a striped set's rules always do): all on stripe 0,
        // whose key the entry names, so nothing is lost.
        None => {
            add(
                reconcile_cmd(head, entry, batch_id, now_arg, local_now_us),
                &entry.storage_key,
            );
            vec![(0, entry.units)]
        }
    }
}

/// `units` of a striped `entry` as an entry of stripe `stripe`: its key, its
/// share of the rule. `None` when the rule does not split over the stripes.
pub(crate) fn stripe_entry(entry: &LedgerEntry, stripe: u32, units: u64) -> Option<LedgerEntry> {
    let rule = entry.rule.stripe(entry.stripes, stripe).ok()?;
    Some(LedgerEntry::new(
        stripe_storage_key(&entry.storage_key, stripe),
        rule,
        units,
        entry.first_us,
        entry.last_us,
    ))
}

/// The outcome of each command from its reply (or its pipeline's failure),
/// grouped by write-back (`parts[i].len()` commands for write-back `i`, in
/// order; see [`add_reconcile_cmds`]).
pub(crate) fn written_parts(
    replies: impl IntoIterator<Item = Result<Value>>,
    parts: &[Vec<Part>],
) -> Vec<Vec<Result<Written>>> {
    let mut replies = replies.into_iter();
    parts
        .iter()
        .map(|p| {
            replies
                .by_ref()
                .take(p.len())
                .map(|r| r.and_then(written))
                .collect()
        })
        .collect()
}

/// One write-back's outcome from its commands': the first error (the whole
/// write-back is re-sent under its id; stripes that applied it answer
/// [`Written::AlreadyApplied`] then), else a refusal, else the units applied
/// now over all stripes (plus `more`, applied by spilling), else expired when
/// every stripe's window passed.
pub(crate) fn fold(parts: Vec<Result<Written>>, more: u64) -> Result<Written> {
    let (mut applied, mut expired, mut refused) = (None::<u64>, true, None);
    for part in parts {
        match part? {
            Written::Applied(n) => {
                applied = Some(applied.unwrap_or(0).saturating_add(n));
                expired = false;
            }
            Written::AlreadyApplied => expired = false,
            Written::Expired => {}
            Written::Refused(why) => {
                refused.get_or_insert(why);
            }
        }
    }
    Ok(match (refused, applied) {
        (Some(why), _) => Written::Refused(why),
        (None, Some(n)) => Written::Applied(n.saturating_add(more)),
        (None, None) if expired => Written::Expired,
        (None, None) => Written::AlreadyApplied,
    })
}

/// Between a storage key and a batch id in the batch marker's key.
const MARKER: &str = ":rc:";

/// The units of `entry` that can still change a decision, and when the first
/// of them was admitted: no rule counts more than its capacity within a window,
/// so of more units only the newest `capacity` matter. Keeps every number the
/// script gets exact: a ledger entry saturated at `u64::MAX` (a hot key under
/// FailOpen) becomes `capacity` units, the newest.
///
/// GCRA and the token bucket charge the units back to back from `first_us`
/// (see [`owed_since_us`](tierlimit_core::owed_since_us)), so the newest
/// start where the skipped ones' run ends ([`owed_after_us`]); the other algorithms' units are
/// taken as spread evenly over `[first_us, last_us]`. Spread evenly, a
/// burst's run came out short: 10 units at once and 10 more over the next
/// second (10 a second) were written back as ending at 1.5 s, not 2 s.
fn newest_that_matter(entry: &LedgerEntry) -> (u64, u64) {
    let cap = entry.rule.capacity();
    if entry.units <= cap {
        return (entry.units, entry.first_us);
    }
    let skipped = entry.units - cap;
    let first = match entry.rule.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            owed_after_us(&entry.rule, entry.first_us, skipped)
        }
        _ => {
            let span = u128::from(entry.last_us.saturating_sub(entry.first_us));
            let shift = span * u128::from(skipped) / u128::from(entry.units - 1);
            entry
                .first_us
                .saturating_add(u64::try_from(shift).unwrap_or(u64::MAX))
        }
    };
    (cap, first.min(entry.last_us))
}

/// One entry's reply. A server error that is the entry's own (the key holds
/// another type, or the script refused its arguments) is [`Written::Refused`];
/// any other (out of memory, read-only, loading...) is an error: it may pass.
pub(crate) fn written(reply: Value) -> Result<Written> {
    if let Value::ServerError(e) = reply {
        if matches!(e.code(), "WRONGTYPE" | "ERR") {
            return Ok(Written::Refused(format!("{e}")));
        }
        return Err(classify_server(e));
    }
    let (status, applied): (i64, i64) = redis::from_redis_value(reply)
        .map_err(|e| malformed(format!("reconcile script reply: {e}")))?;
    let applied =
        u64::try_from(applied).map_err(|_| malformed(format!("reconcile applied {applied}")))?;
    match status {
        1 => Ok(Written::Applied(applied)),
        0 => Ok(Written::AlreadyApplied),
        2 => Ok(Written::Expired),
        other => Err(malformed(format!("reconcile status {other}"))),
    }
}

fn malformed(what: String) -> Error {
    Error::redis(RedisFailure::MalformedReply, Some(what.into()))
}
