//! Striping: one hot user key spread over K sub-keys, each with a share of
//! every rule's limit (see [`RuleSet::with_stripes`](crate::RuleSet::with_stripes)).

use std::borrow::Cow;

use crate::Rule;
use crate::error::{Error, Result};

/// The most stripes (sub-keys) one rule set may spread a user key over.
///
/// A check of a saturated striped key asks every stripe before it is denied,
/// so the bound keeps that worst case to a few dozen round trips; beyond a
/// few stripes per Redis Cluster master, more stripes add nothing but those
/// round trips.
pub const MAX_STRIPES: u32 = 64;

/// Between an escaped user key and a stripe's number inside the hash tag:
/// [`escape_key`](crate::escape_key) writes `%` only as the start of `%25`,
/// `%7B` or `%7D`, so `%s` never appears in an escaped key.
const STRIPE_MARK: &str = "%s";

/// Stripe `stripe`'s share of `total` units over `stripes` stripes: `total /
/// stripes`, plus one for each of the first `total % stripes` stripes. The
/// shares of all stripes add up to `total` exactly, and for `u <= total`
/// every stripe's share of `u` is at most its share of `total`. No stripes
/// counts as one.
///
/// # Panics
///
/// Never for `stripes >= 1`; 0 stripes is a bug in the caller.
///
/// # Examples
///
/// ```
/// use tierlimit_core::stripe_share;
///
/// let shares: Vec<u64> = (0..4).map(|i| stripe_share(10, 4, i)).collect();
/// assert_eq!(shares, [3, 3, 2, 2]);
/// ```
pub fn stripe_share(total: u64, stripes: u32, stripe: u32) -> u64 {
    // 0 stripes (no set has them) is one: a division by zero panicked.
    let k = u64::from(stripes.max(1));
    total / k + u64::from(u64::from(stripe) < total % k)
}

/// The escaped user key of stripe `stripe`, what goes inside its storage
/// keys' hash tag: stripe 0 is the escaped key itself (so a key striped after
/// it was not keeps its state on stripe 0, and K = 1 is no striping), stripe
/// `i > 0` is `<escaped key>%s<i>`.
///
/// No two pairs of (user key, stripe) give one result: an escaped key never
/// holds `%s` (see [`escape_key`](crate::escape_key)), so the last `%s` of a
/// result ends the user key and the decimal digits after it are the stripe.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{escape_key, stripe_key};
///
/// assert_eq!(stripe_key(&escape_key("tenant{7}"), 0), "tenant%7B7%7D");
/// assert_eq!(stripe_key(&escape_key("tenant{7}"), 3), "tenant%7B7%7D%s3");
/// ```
pub fn stripe_key(escaped_key: &str, stripe: u32) -> Cow<'_, str> {
    if stripe == 0 {
        return Cow::Borrowed(escaped_key);
    }
    Cow::Owned(format!("{escaped_key}{STRIPE_MARK}{stripe}"))
}

/// The storage key of stripe `stripe` for the storage key of stripe 0
/// (`tl:{<escaped key>}:<set>:<rule id>`): [`stripe_key`] applied inside the
/// hash tag, so `tl:{<escaped key>%s<i>}:<set>:<rule id>`.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Rule, RuleSet, stripe_key, stripe_storage_key};
///
/// let set = RuleSet::new("api", [Rule::per_second(8)?])?;
/// let whole = set.storage_key("t", 0);
/// assert_eq!(stripe_storage_key(&whole, 2), set.storage_key(&stripe_key("t", 2), 0));
/// assert_eq!(stripe_storage_key(&whole, 2), "tl:{t%s2}:api:g1000000");
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
pub fn stripe_storage_key(storage_key: &str, stripe: u32) -> String {
    if stripe == 0 {
        return storage_key.to_owned();
    }
    // An escaped key holds no `}`: the first one ends the hash tag.
    match storage_key.find('}') {
        Some(end) => format!(
            "{}{STRIPE_MARK}{stripe}{}",
            &storage_key[..end],
            &storage_key[end..]
        ),
        None => format!("{storage_key}{STRIPE_MARK}{stripe}"),
    }
}

impl Rule {
    /// This rule's share on stripe `stripe` of `stripes`: the same algorithm,
    /// period and UTC offset (so the same [id](Rule::id)), with the
    /// [`stripe_share`] of the limit and, when a burst is set, of the burst.
    /// The stripes' limits add up to this rule's limit, and their capacities
    /// to its capacity.
    ///
    /// [`Error::StripesOutOfRange`] for 0 or more than [`MAX_STRIPES`]
    /// stripes, [`Error::StripeOutOfRange`] for a `stripe` past the last
    /// (`stripes - 1`), [`Error::StripesExceedRule`] when the limit or the
    /// capacity is below `stripes`; a share that breaks another bound of
    /// [`Rule`] is that bound's error.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::Rule;
    ///
    /// let rule = Rule::per_second(10)?.with_burst(6)?;
    /// let last = rule.stripe(4, 3)?;
    /// assert_eq!((last.limit(), last.capacity()), (2, 1));
    /// assert_eq!(last.id(), rule.id());
    /// assert!(rule.stripe(7, 0).is_err()); // a burst of 6 over 7 stripes
    /// assert!(rule.stripe(4, 4).is_err()); // stripes 0 to 3
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn stripe(&self, stripes: u32, stripe: u32) -> Result<Rule> {
        self.check_stripes(stripes, 0)?;
        if stripe >= stripes {
            return Err(Error::StripeOutOfRange { stripe, stripes });
        }
        // Made by its algorithm from the start, as this rule was: a window's
        // share may count more than one unit per µs, which GCRA refuses.
        let mut share = Rule::new(
            stripe_share(self.limit(), stripes, stripe),
            self.period(),
            self.algorithm(),
        )?;
        if let Some(burst) = self.burst() {
            share = share.with_burst(stripe_share(burst, stripes, stripe))?;
        }
        if self.is_calendar() {
            share = share.with_utc_offset(i64::from(self.utc_offset_secs()))?;
        }
        Ok(share)
    }

    /// Whether this rule, rule `index` of its set, can be striped over `stripes`.
    pub(crate) fn check_stripes(&self, stripes: u32, index: usize) -> Result<()> {
        if stripes == 0 || stripes > MAX_STRIPES {
            return Err(Error::StripesOutOfRange {
                stripes: u64::from(stripes),
                max: MAX_STRIPES,
            });
        }
        for (what, value) in [("limit", self.limit()), ("capacity", self.capacity())] {
            if value < u64::from(stripes) {
                return Err(Error::StripesExceedRule {
                    stripes,
                    rule: index,
                    what,
                    value,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, escape_key};

    /// Public, so total: 0 stripes divided by zero.
    #[test]
    fn no_stripes_is_one_stripe() {
        assert_eq!(stripe_share(10, 0, 0), 10);
    }

    /// A stripe past the last is an error, not another stripe's share;
    /// and a window's share is made as a window, though it counts more than
    /// one unit per µs (GCRA refuses that rate).
    #[test]
    fn stripes_are_in_range_and_made_by_their_algorithm() {
        let rule = Rule::per_second(10).expect("valid");
        assert!(matches!(
            rule.stripe(4, 4),
            Err(Error::StripeOutOfRange {
                stripe: 4,
                stripes: 4
            })
        ));
        let second = std::time::Duration::from_secs(1);
        let wide = Rule::new(4_000_000, second, Algorithm::FixedWindow).expect("valid");
        let share = wide.stripe(2, 1).expect("a window's share");
        assert_eq!(share.limit(), 2_000_000);
        assert_eq!(share.algorithm(), Algorithm::FixedWindow);
    }

    #[test]
    fn shares_add_up_for_awkward_totals() {
        for stripes in [1, 2, 3, 4, 7, MAX_STRIPES] {
            for total in [
                u64::from(stripes),
                u64::from(stripes) + 1,
                u64::from(stripes) * 3 - 1,
                97,
                1_000,
                crate::MAX_LIMIT,
            ] {
                if total < u64::from(stripes) {
                    continue;
                }
                let shares: Vec<u64> = (0..stripes)
                    .map(|i| stripe_share(total, stripes, i))
                    .collect();
                assert_eq!(shares.iter().sum::<u64>(), total, "{total} over {stripes}");
                assert!(shares.iter().all(|&s| s >= 1));
                let (min, max) = (shares.iter().min(), shares.iter().max());
                assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1));
                // Fewer units never give a stripe more than its share of the total:
                // what a write-back spreads fits under every stripe's limit.
                for used in [0, 1, total / 2, total - 1, total] {
                    for i in 0..stripes {
                        assert!(stripe_share(used, stripes, i) <= shares[i as usize]);
                    }
                }
            }
        }
    }

    #[test]
    fn stripe_rules_split_limit_and_burst_for_every_algorithm() {
        let rules = [
            Rule::per_minute(10).expect("valid"),
            Rule::per_minute(10)
                .and_then(|r| r.with_burst(7))
                .expect("valid"),
            Rule::per_minute(10)
                .and_then(|r| r.with_algorithm(Algorithm::TokenBucket))
                .and_then(|r| r.with_burst(5))
                .expect("valid"),
            Rule::per_minute(9)
                .and_then(|r| r.with_algorithm(Algorithm::SlidingLog))
                .expect("valid"),
            Rule::per_minute(11)
                .and_then(|r| r.with_algorithm(Algorithm::SlidingWindow))
                .expect("valid"),
            Rule::per_natural_day(4, 8 * 3600).expect("valid"),
        ];
        for rule in rules {
            let shares: Vec<Rule> = (0..4)
                .map(|i| rule.stripe(4, i).expect("striped"))
                .collect();
            assert_eq!(shares.iter().map(Rule::limit).sum::<u64>(), rule.limit());
            assert_eq!(
                shares.iter().map(Rule::capacity).sum::<u64>(),
                rule.capacity()
            );
            for s in &shares {
                assert_eq!(s.id(), rule.id());
                assert_eq!(s.algorithm(), rule.algorithm());
                assert_eq!(s.burst().is_some(), rule.burst().is_some());
            }
        }
    }

    #[test]
    fn stripe_counts_out_of_range_are_refused() {
        let rule = Rule::per_second(100).expect("valid");
        for bad in [0, MAX_STRIPES + 1] {
            assert!(matches!(
                rule.stripe(bad, 0),
                Err(Error::StripesOutOfRange {
                    max: MAX_STRIPES,
                    ..
                })
            ));
        }
        let small = Rule::per_second(3).expect("valid");
        assert!(matches!(
            small.stripe(4, 0),
            Err(Error::StripesExceedRule {
                what: "limit",
                value: 3,
                ..
            })
        ));
        let low_burst = Rule::per_second(30)
            .and_then(|r| r.with_burst(2))
            .expect("valid");
        assert!(matches!(
            low_burst.stripe(4, 0),
            Err(Error::StripesExceedRule {
                what: "capacity",
                value: 2,
                ..
            })
        ));
    }

    /// Every (user key, stripe) pair has a hash tag of its own, whatever the
    /// user key holds (braces, `%`, text that looks like a stripe mark).
    #[test]
    fn stripe_keys_are_injective() {
        let keys = [
            "t", "t%s1", "t%s", "%s1", "t%", "t%25", "t{", "t}", "{t}", "t%7B", "t1", "t%s10",
            "t%s1%s1", "%", "}%s{",
        ];
        let mut seen = std::collections::HashMap::new();
        for key in keys {
            let escaped = escape_key(key);
            assert!(
                !escaped.contains(STRIPE_MARK),
                "{key:?} escapes to {escaped}"
            );
            for stripe in [0, 1, 2, 10, 11, MAX_STRIPES - 1] {
                let tag = stripe_key(&escaped, stripe).into_owned();
                assert!(!tag.contains(['{', '}']), "{tag}");
                if let Some(other) = seen.insert(tag.clone(), (key, stripe)) {
                    panic!("{tag:?} from both {other:?} and {:?}", (key, stripe));
                }
            }
        }
    }

    #[test]
    fn stripe_storage_keys_match_stripe_keys() {
        let set = crate::RuleSet::new("api", [Rule::per_second(8).expect("valid")]).expect("valid");
        for key in ["plain", "a{b}%c", "%s1"] {
            let escaped = escape_key(key);
            let whole = set.storage_key(&escaped, 0);
            for stripe in 0..4 {
                assert_eq!(
                    stripe_storage_key(&whole, stripe),
                    set.storage_key(&stripe_key(&escaped, stripe), 0)
                );
            }
        }
    }
}
