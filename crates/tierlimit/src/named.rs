//! The limiter's named rule sets: what its builder or config file gave it,
//! looked up by name on a check, and swapped whole by a reload.
//!
//! A check takes the set it is decided by once, when it starts (a clone of an
//! `Arc`), so a reload never changes a check in flight: it finishes on the
//! rules it started with, and the next check sees the new ones. The swap is
//! one atomic pointer store ([`ArcSwap`]), so no check sees half a reload.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tierlimit_core::{Error, Policy, Result, RuleSet};

/// The named rule sets of one limiter.
#[derive(Debug)]
pub(crate) struct NamedSets {
    current: ArcSwap<Generation>,
}

/// One generation of named sets: what one build or reload installed.
#[derive(Debug, Default)]
struct Generation {
    number: u64,
    by_name: HashMap<String, RuleSet>,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadReport {
    /// Rule sets the reload added, by name, sorted.
    pub added: Vec<String>,
    /// Rule sets the reload removed, by name, sorted: checks by these names
    /// fail with [`Error::UnknownRuleSet`] from now on.
    pub removed: Vec<String>,
    /// Rule sets whose rules, policy or reconcile setting changed, by name,
    /// sorted.
    pub changed: Vec<String>,
    /// Settings of a reloaded config file that only apply when a limiter is
    /// built (the Redis URL, the deadline, the breaker, ...), by field path,
    /// whose values differ from those in force, which are the ones the
    /// limiter was built with until a restart: every reload names them again
    /// while the file and the running limiter disagree. Empty for a reload
    /// from code, and for a limiter not built from a config.
    pub needs_restart: Vec<String>,
    /// The default policy (for rule sets without a policy of their own)
    /// before and after, when the reload changed it: a config reload sets
    /// it to the file's `limiter.default_policy`, or to the default,
    /// [`Policy::LocalFallback`], when the file has none, whatever the
    /// limiter was built with. `None` when unchanged, and for a reload
    /// from code, which keeps it.
    pub default_policy: Option<(Policy, Policy)>,
    /// The generation now in force: 1 for what the limiter was built with,
    /// one more for each reload that was applied.
    pub generation: u64,
}

impl ReloadReport {
    /// True when no rule set was added, removed or changed, and the
    /// default policy was not (start-only settings named in
    /// [`needs_restart`](Self::needs_restart) aside).
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.default_policy.is_none()
    }
}

fn index(sets: Vec<RuleSet>) -> Result<HashMap<String, RuleSet>> {
    let mut by_name = HashMap::with_capacity(sets.len());
    for set in sets {
        let name = set.name().to_owned();
        if by_name.contains_key(&name) {
            return Err(Error::DuplicateRuleSet { name });
        }
        by_name.insert(name, set);
    }
    Ok(by_name)
}

impl NamedSets {
    /// The first generation; two sets of one name are an error.
    pub(crate) fn new(sets: Vec<RuleSet>) -> Result<Self> {
        Ok(NamedSets {
            current: ArcSwap::from_pointee(Generation {
                number: 1,
                by_name: index(sets)?,
            }),
        })
    }

    /// The set named `name` in the generation in force now.
    pub(crate) fn get(&self, name: &str) -> Option<RuleSet> {
        self.current.load().by_name.get(name).cloned()
    }

    /// Every set in force now, sorted by name.
    pub(crate) fn all(&self) -> Vec<RuleSet> {
        let mut sets: Vec<RuleSet> = self.current.load().by_name.values().cloned().collect();
        sets.sort_by(|a, b| a.name().cmp(b.name()));
        sets
    }

    /// Puts `sets` in force, whole, and says what changed. Two sets of one
    /// name are an error, and leave the sets in force as they were.
    pub(crate) fn replace(&self, sets: Vec<RuleSet>) -> Result<ReloadReport> {
        let by_name = index(sets)?;
        let mut report = ReloadReport::default();
        // rcu: two reloads racing each get a generation number of their own,
        // and each report compares against what it really replaced.
        self.current.rcu(|old| {
            report = ReloadReport {
                generation: old.number + 1,
                ..ReloadReport::default()
            };
            for (name, set) in &by_name {
                match old.by_name.get(name) {
                    None => report.added.push(name.clone()),
                    Some(before) if before != set => report.changed.push(name.clone()),
                    Some(_) => {}
                }
            }
            report.removed = old
                .by_name
                .keys()
                .filter(|name| !by_name.contains_key(*name))
                .cloned()
                .collect();
            Arc::new(Generation {
                number: old.number + 1,
                by_name: by_name.clone(),
            })
        });
        report.added.sort();
        report.removed.sort();
        report.changed.sort();
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierlimit_core::Rule;

    fn set(name: &str, limit: u64) -> RuleSet {
        RuleSet::new(name, [Rule::per_second(limit).expect("valid")]).expect("valid")
    }

    #[test]
    fn a_replace_reports_what_changed_and_swaps_whole() {
        let named = NamedSets::new(vec![set("a", 1), set("b", 1)]).expect("valid");
        let report = named
            .replace(vec![set("b", 2), set("c", 1)])
            .expect("valid");
        assert_eq!(report.added, ["c"]);
        assert_eq!(report.removed, ["a"]);
        assert_eq!(report.changed, ["b"]);
        assert_eq!(report.generation, 2);
        assert!(named.get("a").is_none());
        assert_eq!(named.get("b").map(|s| s.rules()[0].limit()), Some(2));
        let again = named
            .replace(vec![set("b", 2), set("c", 1)])
            .expect("valid");
        assert!(again.is_empty());
        assert_eq!(again.generation, 3);
    }

    #[test]
    fn duplicate_names_are_refused_and_keep_what_was_in_force() {
        assert!(matches!(
            NamedSets::new(vec![set("a", 1), set("a", 2)]),
            Err(Error::DuplicateRuleSet { name }) if name == "a"
        ));
        let named = NamedSets::new(vec![set("a", 1)]).expect("valid");
        assert!(matches!(
            named.replace(vec![set("x", 1), set("x", 2)]),
            Err(Error::DuplicateRuleSet { .. })
        ));
        assert_eq!(named.get("a").map(|s| s.rules()[0].limit()), Some(1));
        assert!(named.get("x").is_none());
    }
}
