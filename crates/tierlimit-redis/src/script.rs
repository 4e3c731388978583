//! The Lua scripts, from the workspace's `lua/` folder (one file per algorithm).

use std::sync::LazyLock;

use redis::Script;

/// `lua/common.lua` and the algorithm fragments, in front of a main body: the
/// check and the reconcile script share one copy of each algorithm's state
/// format (its load and store functions).
macro_rules! with_algorithms {
    ($main:literal) => {
        concat!(
            include_str!("../lua/common.lua"),
            include_str!("../lua/gcra.lua"),
            include_str!("../lua/token_bucket.lua"),
            include_str!("../lua/sliding_log.lua"),
            include_str!("../lua/sliding_window.lua"),
            include_str!("../lua/fixed_window.lua"),
            include_str!($main),
        )
    };
}

/// `lua/gcra.lua`: the GCRA fragment of [`CHECK`] (`gcra_check`, `gcra_commit`).
///
/// # Examples
///
/// ```
/// // The fragment defines its two functions and states its protocol up front.
/// assert!(tierlimit_redis::GCRA.starts_with("-- gcra.lua"));
/// assert!(tierlimit_redis::GCRA.contains("local function gcra_check("));
/// assert!(tierlimit_redis::CHECK_SOURCE.contains(tierlimit_redis::GCRA));
/// ```
pub const GCRA: &str = include_str!("../lua/gcra.lua");

/// `lua/token_bucket.lua`: the token bucket fragment of [`CHECK`].
///
/// # Examples
///
/// ```
/// assert!(tierlimit_redis::TOKEN_BUCKET.contains("local function token_bucket_commit("));
/// assert!(tierlimit_redis::CHECK_SOURCE.contains(tierlimit_redis::TOKEN_BUCKET));
/// ```
pub const TOKEN_BUCKET: &str = include_str!("../lua/token_bucket.lua");

/// `lua/sliding_log.lua`: the sliding window log fragment of [`CHECK`].
///
/// # Examples
///
/// ```
/// assert!(tierlimit_redis::SLIDING_LOG.contains("local function sliding_log_check("));
/// assert!(tierlimit_redis::CHECK_SOURCE.contains(tierlimit_redis::SLIDING_LOG));
/// ```
pub const SLIDING_LOG: &str = include_str!("../lua/sliding_log.lua");

/// `lua/sliding_window.lua`: the sliding window counter fragment of [`CHECK`],
/// whose header comment derives the algorithm's error bound.
///
/// # Examples
///
/// ```
/// assert!(tierlimit_redis::SLIDING_WINDOW.contains("Error bound."));
/// assert!(tierlimit_redis::CHECK_SOURCE.contains(tierlimit_redis::SLIDING_WINDOW));
/// ```
pub const SLIDING_WINDOW: &str = include_str!("../lua/sliding_window.lua");

/// `lua/fixed_window.lua`: the fixed (and calendar) window fragment of [`CHECK`].
///
/// # Examples
///
/// ```
/// assert!(tierlimit_redis::FIXED_WINDOW.contains("local function fixed_window_check("));
/// assert!(tierlimit_redis::CHECK_SOURCE.contains(tierlimit_redis::FIXED_WINDOW));
/// ```
pub const FIXED_WINDOW: &str = include_str!("../lua/fixed_window.lua");

/// The whole check script: `lua/common.lua`, the algorithm fragments and
/// `lua/decide.lua` (the decision) followed by `lua/check.lua`, its main body, whose header states the protocol (KEYS, ARGV, reply).
///
/// # Examples
///
/// ```
/// // The fragments come first, so check.lua's dispatch table can name their functions.
/// let src = tierlimit_redis::CHECK_SOURCE;
/// assert!(src.find("local function gcra_check").unwrap() < src.find("local CHECKS").unwrap());
/// ```
pub const CHECK_SOURCE: &str = concat!(
    with_algorithms!("../lua/decide.lua"),
    include_str!("../lua/check.lua")
);

/// The batch script: [`CHECK_SOURCE`]'s fragments followed by
/// `lua/check_batch.lua`, which decides many checks in one call, one after the
/// other, each as [`CHECK`] would alone (see its header for the protocol).
pub(crate) static CHECK_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(CHECK_BATCH_SOURCE));

const CHECK_BATCH_SOURCE: &str = concat!(
    with_algorithms!("../lua/decide.lua"),
    include_str!("../lua/check_batch.lua")
);

/// The check script ([`CHECK_SOURCE`]), ready for `EVALSHA`: one call checks a
/// request against every rule of a rule set and commits it only if all admit.
///
/// [`RedisTier::check`](crate::RedisTier::check) builds its arguments; calling
/// it by hand follows the protocol in `lua/check.lua`. The script checks every
/// argument before it reads or writes anything and answers bad input with an
/// error reply (`ERR tierlimit check: ...`): numbers must be decimal integer
/// strings within the bounds [`Rule`](tierlimit_core::Rule) enforces (cost and
/// limits at most [`MAX_LIMIT`](tierlimit_core::MAX_LIMIT), a sliding log's limit
/// at most [`MAX_SLIDING_LOG_LIMIT`](tierlimit_core::MAX_SLIDING_LOG_LIMIT), ...),
/// the cost at most every rule's capacity, and no key may appear twice. A key
/// holding another algorithm's type is refused with `WRONGTYPE` before any
/// write. A call therefore writes every rule or none.
///
/// # Examples
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// // One GCRA rule, 3 per second, burst 3, server time, cost 1.
/// let reply: Vec<i64> = tierlimit_redis::CHECK
///     .key("tl:{user:42}:api:g1000000")
///     .arg("0").arg(1).arg(12345u64) // now (server TIME), cost, nonce
///     .arg("1:3:1000000:3:0") // the rule: code:limit:period_us:capacity:utc_offset_us
///     .invoke_async(conn)
///     .await?;
/// // One rule: the server time, retry-after (0: admitted), remaining, reset-after.
/// let (allowed, remaining) = (reply[1] == 0, reply[2]);
/// # let _ = (allowed, remaining);
/// # Ok(()) }
/// ```
pub static CHECK: LazyLock<Script> = LazyLock::new(|| Script::new(CHECK_SOURCE));

/// `lua/heartbeat.lua`: records one limiter instance as alive in a sorted set
/// and returns how many are (see [`RedisTier::heartbeat`](crate::RedisTier::heartbeat)).
///
/// # Examples
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// let alive: u64 = tierlimit_redis::HEARTBEAT
///     .key("tl:{instances}:default")
///     .arg("0").arg("instance-a").arg(3_000_000) // now (server TIME), id, ttl_us
///     .invoke_async(conn)
///     .await?;
/// assert!(alive >= 1);
/// # Ok(()) }
/// ```
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(HEARTBEAT_SOURCE));

const HEARTBEAT_SOURCE: &str = concat!(
    include_str!("../lua/common.lua"),
    include_str!("../lua/heartbeat.lua")
);

/// `lua/reconcile.lua`: writes units admitted locally during an outage back to
/// one rule's key, once per batch id (see
/// [`RedisTier::reconcile`](crate::RedisTier::reconcile)).
///
/// Its server work is bounded by the rule, not by the units owed: a sliding
/// log skips the units already out of its window by bisection and writes at
/// most `limit` members. Like [`CHECK`], it refuses bad arguments (and a key
/// of another type) before writing anything.
///
/// # Examples
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// // 4 units admitted locally under a GCRA rule of 10 per minute.
/// let key = "tl:{user:42}:api:g60000000";
/// let (status, applied): (i64, i64) = tierlimit_redis::RECONCILE
///     .key(key)
///     .key(format!("{key}:rc:batch-1")) // the batch marker
///     .arg("0").arg("1:10:60000000:10:0") // now, the rule (as CHECK takes it)
///     .arg(4).arg(1_700_000_000_000_000u64).arg(1_700_000_001_000_000u64) // units, first_us, last_us
///     .arg(120_000).arg("batch-1") // marker TTL in ms, batch id
///     .invoke_async(conn)
///     .await?;
/// assert!(status == 1 || applied == 0);
/// # Ok(()) }
/// ```
pub static RECONCILE: LazyLock<Script> = LazyLock::new(|| Script::new(RECONCILE_SOURCE));

const RECONCILE_SOURCE: &str = with_algorithms!("../lua/reconcile.lua");

/// What runs a check on the server: the scripts above by `EVALSHA`, or the
/// same code as one Redis Functions library by `FCALL`.
///
/// A tier chooses when it first talks to a server (see
/// [`RedisTier::script_mode`](crate::RedisTier::script_mode)): Functions when
/// the server has them (Redis 7 and later) and lets this user load the
/// library, scripts otherwise. Both decide the same way: the library is built
/// from the same `lua/` files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScriptMode {
    /// `FCALL` of the library's functions, loaded once per server with
    /// `FUNCTION LOAD`: the algorithms are defined once, not on every call.
    Functions,
    /// `EVALSHA` of the scripts ([`CHECK`] and the others), for servers
    /// older than Redis 7 or users the ACL does not let load functions.
    Scripts,
}

/// One of the programs a tier runs on the server, as a script or as a
/// function of the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Routine {
    Check,
    CheckBatch,
    Heartbeat,
    Reconcile,
}

impl Routine {
    const ALL: [Routine; 4] = [
        Routine::Check,
        Routine::CheckBatch,
        Routine::Heartbeat,
        Routine::Reconcile,
    ];

    /// The script of this routine, for `EVALSHA`.
    pub(crate) fn script(self) -> &'static Script {
        match self {
            Routine::Check => &CHECK,
            Routine::CheckBatch => &CHECK_BATCH,
            Routine::Heartbeat => &HEARTBEAT,
            Routine::Reconcile => &RECONCILE,
        }
    }

    /// The name of this routine's function in the library, for `FCALL`.
    pub(crate) fn function(self) -> &'static str {
        let names = &LIBRARY.functions;
        match self {
            Routine::Check => &names[0],
            Routine::CheckBatch => &names[1],
            Routine::Heartbeat => &names[2],
            Routine::Reconcile => &names[3],
        }
    }

    /// The head of a call of this routine in `mode`: the command and what it
    /// names (the script's SHA1 or the function).
    pub(crate) fn head(self, mode: ScriptMode) -> Head {
        match mode {
            ScriptMode::Functions => Head {
                command: "FCALL",
                name: self.function(),
            },
            ScriptMode::Scripts => Head {
                command: "EVALSHA",
                name: self.script().get_hash(),
            },
        }
    }

    /// The routine a call (`EVALSHA <sha>` or `FCALL <function>`) names, and
    /// how it is called; `None` for any other command.
    pub(crate) fn of(cmd: &redis::Cmd) -> Option<(Routine, ScriptMode)> {
        let mut args = cmd.args_iter();
        let (Some(redis::Arg::Simple(command)), Some(redis::Arg::Simple(name))) =
            (args.next(), args.next())
        else {
            return None;
        };
        let mode = if command.eq_ignore_ascii_case(b"FCALL") {
            ScriptMode::Functions
        } else if command.eq_ignore_ascii_case(b"EVALSHA") {
            ScriptMode::Scripts
        } else {
            return None;
        };
        Routine::ALL
            .into_iter()
            .find(|r| r.head(mode).name.as_bytes() == name)
            .map(|r| (r, mode))
    }
}

/// The first two arguments of a script call: `EVALSHA <sha>` or
/// `FCALL <function>`; the keys and arguments after them are the same.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head {
    pub(crate) command: &'static str,
    pub(crate) name: &'static str,
}

impl Head {
    /// Bytes the two arguments take.
    pub(crate) fn len(self) -> usize {
        self.command.len() + self.name.len()
    }

    /// Writes the two arguments into `cmd`.
    pub(crate) fn write(self, cmd: &mut redis::Cmd) {
        cmd.arg(self.command).arg(self.name);
    }
}

/// `cmd`, a call of a routine, as an `EVALSHA` of its script (the same keys
/// and arguments); `None` when `cmd` is no such call.
pub(crate) fn as_evalsha(cmd: &redis::Cmd) -> Option<redis::Cmd> {
    let (routine, _) = Routine::of(cmd)?;
    let mut out = redis::cmd("EVALSHA");
    out.arg(routine.script().get_hash());
    for arg in cmd.args_iter().skip(2) {
        match arg {
            redis::Arg::Simple(bytes) => out.arg(bytes),
            // Our calls have no cursor (a SCAN's): nothing else to copy.
            _ => return None,
        };
    }
    Some(out)
}

/// The Functions library: the check, batch, heartbeat and reconcile scripts'
/// code as one Lua library, and the names it registers.
pub(crate) struct Library {
    /// The library's source, for `FUNCTION LOAD`.
    pub(crate) source: String,
    /// The functions of [`Routine::ALL`], in that order.
    functions: [String; 4],
}

/// The library, named after the SHA1 of its source, as scripts are: two
/// versions of tierlimit sharing a server each find their own functions, and
/// a load never replaces another version's.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let hash = Script::new(LIBRARY_TEMPLATE).get_hash().to_owned();
    let id = &hash[..16];
    let functions = ["check", "check_batch", "heartbeat", "reconcile"]
        .map(|routine| format!("tierlimit_{routine}_{id}"));
    let mut source = LIBRARY_TEMPLATE.replace("@ID@", id);
    source.insert_str(0, &format!("#!lua name=tierlimit_{id}\n"));
    Library { source, functions }
});

/// The Functions library a tier loads (`FUNCTION LOAD`) and calls by `FCALL`
/// on Redis 7: the check, batch, heartbeat and reconcile code of `lua/`,
/// defined once per server. Its first line names it `tierlimit_<id>` and its
/// functions are `tierlimit_check_<id>`, `tierlimit_check_batch_<id>`,
/// `tierlimit_heartbeat_<id>` and `tierlimit_reconcile_<id>`, where `<id>`
/// is drawn from the hash of its code, so each version of tierlimit finds
/// its own.
///
/// A tier loads it by itself when the first call finds it missing. Load it
/// by hand for users the ACL lets run `FCALL` but not `FUNCTION LOAD`: an
/// administrator's `FUNCTION LOAD` of this source serves them (without it,
/// such a user's tier runs the same code by `EVALSHA`). Unlike the scripts,
/// the library keeps a bounded memo of the rule arguments and costs it has
/// checked, so a rule set's numbers are checked once per server rather than
/// on every check.
///
/// # Examples
///
/// ```
/// let source = tierlimit_redis::library_source();
/// assert!(source.starts_with("#!lua name=tierlimit_"));
/// assert!(source.contains("redis.register_function('tierlimit_check_"));
/// ```
pub fn library_source() -> &'static str {
    &LIBRARY.source
}

/// The library, its names still to be filled in (`@ID@`).
///
/// The fragments (algorithms, decision) are defined once, when the library
/// loads; each registered function is one script's main body. The
/// fragments read `KEYS` and `ARGV` as scripts do, so the library declares
/// them once as locals every function sets to its own keys and arguments on
/// entry, and resets decide.lua's `server_now` (read at most once per call).
/// It also turns on common.lua's memos of checked arguments, which only a
/// library keeps from one call to the next. No function is `no-writes`
/// (every one may write), so none is called with `FCALL_RO`.
const LIBRARY_TEMPLATE: &str = concat!(
    "local KEYS, ARGV = {}, {}\n",
    with_algorithms!("../lua/decide.lua"),
    "\nRULES_SEEN, INTS_SEEN = {}, {}\n",
    "\nredis.register_function('tierlimit_check_@ID@', function(keys, args)\n",
    "KEYS, ARGV, server_now = keys, args, nil\n",
    include_str!("../lua/check.lua"),
    "\nend)\n",
    "redis.register_function('tierlimit_check_batch_@ID@', function(keys, args)\n",
    "KEYS, ARGV, server_now = keys, args, nil\n",
    include_str!("../lua/check_batch.lua"),
    "\nend)\n",
    "redis.register_function('tierlimit_heartbeat_@ID@', function(keys, args)\n",
    "KEYS, ARGV = keys, args\n",
    include_str!("../lua/heartbeat.lua"),
    "\nend)\n",
    "redis.register_function('tierlimit_reconcile_@ID@', function(keys, args)\n",
    "KEYS, ARGV = keys, args\n",
    include_str!("../lua/reconcile.lua"),
    "\nend)\n",
);

/// The source of one of this crate's scripts, for a `SCRIPT LOAD` sent to one
/// chosen Cluster node (redis-rs's `Script` keeps its source to itself, and
/// its own load goes to every node at once, failing while one is down).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn source_of(script: &Script) -> Option<&'static str> {
    let hash = script.get_hash();
    [
        (&*CHECK, CHECK_SOURCE),
        (&*CHECK_BATCH, CHECK_BATCH_SOURCE),
        (&*HEARTBEAT, HEARTBEAT_SOURCE),
        (&*RECONCILE, RECONCILE_SOURCE),
    ]
    .into_iter()
    .find(|(known, _)| known.get_hash() == hash)
    .map(|(_, source)| source)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script's source is found by its hash, and hashes to it.
    #[test]
    fn every_script_has_its_source() {
        for script in [&*CHECK, &*CHECK_BATCH, &*HEARTBEAT, &*RECONCILE] {
            let source = source_of(script).expect("a script of this crate");
            assert_eq!(Script::new(source).get_hash(), script.get_hash());
        }
        assert!(source_of(&Script::new("return 1")).is_none());
    }
}
