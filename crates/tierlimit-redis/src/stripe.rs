//! Striped checks: a hot key spread over the stripes of its rule set (see
//! [`RuleSet::with_stripes`]), each stripe a key of its own with a share of
//! every rule.
//!
//! A check asks one stripe chosen at random, then, while they deny it, the
//! next ones in turn, until one admits or every stripe has denied it; all
//! under the one deadline of the check. The answer speaks for the whole key
//! (see [`whole`]).

use redis::Value;
use tierlimit_core::{Result, RuleSet, stripe_share};
use tokio::time::Instant;

use crate::batch::{CheckKey, Checked};
use crate::failure::timeout;
use crate::reconcile::{Part, Parts, fold, reconcile_cmd, stripe_entry, written, written_parts};
use crate::script::Routine;
use crate::{CheckRequest, RedisTier, Verdict, WriteBack, Written};

/// The stripe a check asks first: one at random, so checks of a hot key from
/// every process spread over all stripes without sharing a counter; 0 for an
/// unstriped set.
pub(crate) fn first_stripe(set: &RuleSet) -> u32 {
    match set.stripes() {
        0 | 1 => 0,
        k => fastrand::u32(..k),
    }
}

/// Stripe `stripe`'s rule set (the set itself when it is not striped).
pub(crate) fn stripe_set(set: &RuleSet, stripe: u32) -> &RuleSet {
    set.stripe(stripe).unwrap_or(set)
}

/// A stripe's verdict as the answer for the whole key of `set`: each rule's
/// remaining is the stripe's times the number of stripes (the others were not
/// read; checks spread evenly, so they hold about as much), at most the
/// rule's capacity, and the decision's limit is the whole rule's.
pub(crate) fn whole(mut verdict: Verdict, set: &RuleSet) -> Verdict {
    let k = u64::from(set.stripes());
    if k == 1 {
        return verdict;
    }
    for (state, rule) in verdict.rules.iter_mut().zip(set.rules()) {
        state.remaining = state.remaining.saturating_mul(k).min(rule.capacity());
    }
    let d = &mut verdict.decision;
    if let (Some(rule), Some(state)) = (set.rules().get(d.rule), verdict.rules.get(d.rule)) {
        d.limit = rule.limit();
        if d.allowed {
            d.remaining = state.remaining;
        }
    }
    verdict
}

impl RedisTier {
    /// [`check_key`](RedisTier::check_key) of a striped set.
    pub(crate) async fn check_striped(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
    ) -> Checked {
        if let Err(e) = set.validate_cost(cost) {
            return Checked {
                result: Err(e),
                counts_call: false,
            };
        }
        let deadline = Instant::now() + self.deadline();
        let first = first_stripe(set);
        let checked = self.stripe_call(key, set, cost, first, deadline).await;
        self.continue_striped(key, set, cost, first, checked, deadline)
            .await
    }

    /// A striped check whose stripe `first` answered `checked`: done when it
    /// admitted (or failed); otherwise asks the other stripes in turn, from
    /// the one after `first`, until one admits. When every stripe denies, the
    /// denial is the one with the earliest retry-after. A Redis fault on any
    /// stripe is the answer (the policy decides), as for an unstriped key.
    pub(crate) async fn continue_striped(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
        first: u32,
        checked: Checked,
        deadline: Instant,
    ) -> Checked {
        let mut counts_call = checked.counts_call;
        let mut denied = match checked.result {
            Ok(v) if v.decision.allowed || set.stripes() == 1 => {
                return Checked {
                    result: Ok(whole(v, set)),
                    counts_call,
                };
            }
            Ok(v) => v,
            Err(e) => {
                return Checked {
                    result: Err(e),
                    counts_call,
                };
            }
        };
        let k = set.stripes();
        for n in 1..k {
            let stripe = (first + n) % k;
            let next = self.stripe_call(key, set, cost, stripe, deadline).await;
            counts_call |= next.counts_call;
            match next.result {
                Ok(v) if v.decision.allowed => {
                    return Checked {
                        result: Ok(whole(v, set)),
                        counts_call,
                    };
                }
                Ok(v) => {
                    if v.decision.retry_after < denied.decision.retry_after {
                        denied = v;
                    }
                }
                Err(e) => {
                    return Checked {
                        result: Err(e),
                        counts_call: next.counts_call,
                    };
                }
            }
        }
        Checked {
            result: Ok(whole(denied, set)),
            counts_call,
        }
    }

    /// One stripe's check, ended by `deadline` (that of the whole striped
    /// check): past it, a timeout whose call reports itself (a lone one as
    /// abandoned, a batch's as it ends: see
    /// [`RedisTier::on_unheard`](crate::RedisTier::on_unheard)), so it does
    /// not count here too.
    async fn stripe_call(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
        stripe: u32,
        deadline: Instant,
    ) -> Checked {
        let striped = key.striped(stripe);
        let call = self.check_whole(&striped, stripe_set(set, stripe), cost);
        match tokio::time::timeout_at(deadline, call).await {
            Ok(checked) => checked,
            Err(_) => Checked {
                result: Err(timeout()),
                counts_call: false,
            },
        }
    }

    /// Finishes the striped checks of a [`check_many`](RedisTier::check_many)
    /// whose first stripes (`first[i]`) answered `results[i]`, one after
    /// another, by `deadline`; other checks' results are passed through.
    pub(crate) async fn finish_striped_many(
        &self,
        checks: &[CheckRequest<'_>],
        first: &[u32],
        results: Vec<Result<Verdict>>,
        deadline: Instant,
    ) -> Vec<Result<Verdict>> {
        let mut out = Vec::with_capacity(results.len());
        for ((check, &stripe), result) in checks.iter().zip(first).zip(results) {
            if check.set.stripes() == 1 {
                out.push(result);
                continue;
            }
            let key = match CheckKey::new(check.key) {
                Ok(key) => key,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            let checked = Checked {
                result,
                counts_call: false,
            };
            let done = self
                .continue_striped(&key, check.set, check.cost, stripe, checked, deadline)
                .await;
            out.push(done.result);
        }
        out
    }
}

/// Units of one striped write-back that stripes could not take (full at their
/// share), and the stripes that took all they were sent.
struct Spill {
    write: usize,
    left: u64,
    takers: Vec<u32>,
}

impl RedisTier {
    /// The outcome of each write-back from the replies of its commands:
    /// one each when `parts` is `None` (nothing striped), else `parts[i]` for
    /// write-back `i` (see [`settle_stripes`](Self::settle_stripes)), its
    /// spills sent by `deadline`, the call's.
    pub(crate) async fn outcomes(
        &self,
        writes: &[WriteBack<'_>],
        parts: Parts,
        replies: impl IntoIterator<Item = Result<Value>>,
        deadline: Instant,
    ) -> Vec<Result<Written>> {
        match parts {
            None => replies.into_iter().map(|r| r.and_then(written)).collect(),
            Some(parts) => {
                let raw = written_parts(replies, &parts);
                self.settle_stripes(writes, &parts, raw, deadline).await
            }
        }
    }

    /// The outcome of each write-back from its commands' (`raw`, one per
    /// [`Part`]). A striped write-back whose stripes could not all take their
    /// even share (a stripe already near its share of the limit, from checks
    /// that happened to land there) spills what they refused over the
    /// stripes that took everything, in at most `stripes - 1` more round
    /// trips, so the key as a whole is charged every unit while it has room
    /// anywhere. Only the counting algorithms (fixed and sliding windows,
    /// sliding log) say how much a stripe refused; GCRA and the token bucket
    /// cap a stripe's debt at a full bucket, as without striping.
    ///
    /// A spill goes under an id of its own per round (`<id>.<round>`). A
    /// write-back re-sent after an unknown outcome finds its first round
    /// applied (nothing to measure) and spills nothing; a spill round that
    /// fails, or is not answered by `deadline` (the call's: the spills are
    /// part of it), is not retried. Both lose at most the refused units,
    /// never count a unit twice.
    pub(crate) async fn settle_stripes(
        &self,
        writes: &[WriteBack<'_>],
        parts: &[Vec<Part>],
        raw: Vec<Vec<Result<Written>>>,
        deadline: Instant,
    ) -> Vec<Result<Written>> {
        let mut spills = Vec::new();
        for (write, (sent, got)) in parts.iter().zip(&raw).enumerate() {
            if writes.get(write).is_none_or(|w| w.entry.stripes <= 1) {
                continue;
            }
            let mut spill = Spill {
                write,
                left: 0,
                takers: Vec::new(),
            };
            for (&(stripe, units), outcome) in sent.iter().zip(got) {
                if let Ok(Written::Applied(n)) = outcome {
                    if *n < units {
                        spill.left += units - n;
                    } else {
                        spill.takers.push(stripe);
                    }
                }
            }
            // Stripes sent nothing (fewer units than stripes) may take some.
            let k = writes[write].entry.stripes;
            spill
                .takers
                .extend((0..k).filter(|i| !sent.iter().any(|&(s, _)| s == *i)));
            if spill.left > 0 && !spill.takers.is_empty() {
                spills.push(spill);
            }
        }
        let mut more = vec![0u64; raw.len()];
        if !spills.is_empty() {
            self.spill(writes, spills, &mut more, deadline).await;
        }
        raw.into_iter()
            .zip(more)
            .map(|(got, more)| fold(got, more))
            .collect()
    }

    /// Sends spills round by round until nothing is left, no stripe takes
    /// more, or a round fails or meets `deadline`; adds what each
    /// write-back's spills applied to `more`.
    async fn spill(
        &self,
        writes: &[WriteBack<'_>],
        mut spills: Vec<Spill>,
        more: &mut [u64],
        deadline: Instant,
    ) {
        let (now_arg, local_now_us) = (self.now_arg(), self.local_now_us());
        let head = self.head(Routine::Reconcile);
        let mut round = 1;
        while !spills.is_empty() {
            round += 1;
            let mut cmds = Vec::new();
            let mut sent: Vec<Vec<Part>> = Vec::with_capacity(spills.len());
            for s in &spills {
                let w = &writes[s.write];
                let id = format!("{}.{round}", w.id);
                let takers = u32::try_from(s.takers.len()).unwrap_or(u32::MAX);
                let mut parts = Vec::new();
                for (n, &stripe) in (0u32..).zip(&s.takers) {
                    let units = stripe_share(s.left, takers, n);
                    if let Some(e) = (units > 0)
                        .then(|| stripe_entry(w.entry, stripe, units))
                        .flatten()
                    {
                        let slot = self.slot_of_key(&e.storage_key);
                        cmds.push((reconcile_cmd(head, &e, &id, now_arg, local_now_us), slot));
                        parts.push((stripe, units));
                    }
                }
                sent.push(parts);
            }
            let sent_by = tokio::time::timeout_at(deadline, self.send_writebacks(cmds)).await;
            let replies = match sent_by.map(|sent| sent.result) {
                Ok(Ok(replies)) => replies,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "spilling a striped write-back failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("spilling a striped write-back met the call's deadline");
                    return;
                }
            };
            let got = written_parts(replies, &sent);
            let mut next = Vec::new();
            for ((s, parts), got) in spills.into_iter().zip(&sent).zip(got) {
                let mut again = Spill {
                    write: s.write,
                    left: 0,
                    takers: s.takers,
                };
                // A stripe that refused some is full; one that answered
                // otherwise says nothing of its room: both are left out. A
                // taker sent nothing this round (fewer units than takers)
                // stays one.
                for (&(stripe, units), outcome) in parts.iter().zip(got) {
                    let took = match outcome {
                        Ok(Written::Applied(n)) => {
                            more[s.write] += n;
                            again.left += units - n.min(units);
                            n >= units
                        }
                        _ => false,
                    };
                    if !took {
                        again.takers.retain(|&t| t != stripe);
                    }
                }
                if again.left > 0 && !again.takers.is_empty() {
                    next.push(again);
                }
            }
            spills = next;
        }
    }
}
