//! A limiter built from a [`Config`], and reloaded from one: once
//! ([`HybridLimiter::reload`], [`HybridLimiter::reload_file`]) or on every
//! change of the file ([`HybridLimiter::watch_config`], feature `watch`).
//!
//! What a reload changes live: the rule sets (their rules, policies and
//! reconcile settings, added and removed sets) and the default policy, which
//! a reload writes into every set of the file that names no policy of its
//! own, and which answers for the sets a caller builds that name none.
//! Everything else (the Redis URL, TLS, the deadline, the breaker, the
//! local bounds, reconciliation, instances, names) shapes connections and
//! tasks that live as long as the limiter: a reload that changes them
//! applies the rule sets, keeps those settings, and names them in
//! [`ReloadReport::needs_restart`] (and a warning).

use std::path::Path;

use tierlimit_core::{Result, RuleSet};

use crate::config::{Config, ConfigError};
use crate::limiter::{HybridLimiter, Inner};
use crate::named::ReloadReport;

/// The file's rule sets, each with the file's default policy when it names
/// none (the library's, [`Policy::LocalFallback`](crate::Policy::LocalFallback), when the file names no
/// default either), so a reload that changes or removes the default changes
/// those sets too.
fn resolved_sets(config: &Config) -> Vec<RuleSet> {
    let default = config.default_policy().unwrap_or_default();
    config
        .rule_sets()
        .iter()
        .map(|set| match set.policy() {
            None => set.clone().with_policy(default),
            Some(_) => set.clone(),
        })
        .collect()
}

impl HybridLimiter {
    /// A limiter with every setting of `config` and its rule sets, held by
    /// name (see [`check_by_name`](Self::check_by_name)); to be
    /// [reloaded](Self::reload) from a later version of the file.
    ///
    /// # Errors
    ///
    /// As [`HybridLimiterBuilder::build`](crate::HybridLimiterBuilder::build):
    /// only outside a Tokio runtime, since loading checked every setting.
    pub fn from_config(config: &Config) -> Result<HybridLimiter> {
        let limiter = config.builder().rule_sets(resolved_sets(config)).build()?;
        limiter.inner().set_built_from(config.clone());
        Ok(limiter)
    }

    /// Puts the rule sets and policies of `config` in force, whole and at
    /// once (see [`replace_rule_sets`](Self::replace_rule_sets) for what
    /// happens to checks in flight and to the usage of a changed limit).
    /// Settings that cannot change while the limiter runs are kept and named
    /// in [`ReloadReport::needs_restart`].
    ///
    /// # Errors
    ///
    /// None in practice: a loaded [`Config`] has no two sets of one name.
    pub fn reload(&self, config: &Config) -> Result<ReloadReport> {
        self.inner().reload(config)
    }

    /// Loads the file at `path` and [reloads](Self::reload) from it. A file
    /// that does not load changes nothing: the rule sets in force stay, the
    /// error is returned, logged as a warning and counted in
    /// `tierlimit_config_reloads_total{result="rejected"}`.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of a file that does not load, with every problem.
    pub fn reload_file(&self, path: impl AsRef<Path>) -> Result<ReloadReport, ConfigError> {
        self.inner().reload_file(path.as_ref())
    }
}

impl Inner {
    pub(crate) fn reload(&self, config: &Config) -> Result<ReloadReport> {
        // Two at once (the watcher and a SIGHUP handler, say) could leave
        // one file's sets in force with the other's default policy.
        let mut in_force = self
            .in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut report = self.replace_rule_sets(resolved_sets(config))?;
        let (before, after) = (
            self.default_policy.get(),
            config.default_policy().unwrap_or_default(),
        );
        self.default_policy.set(after);
        if before != after {
            // Sets without a policy of their own (routes built in code, say)
            // now answer an outage otherwise.
            tracing::warn!(?before, ?after, "config reload changed the default policy");
            report.default_policy = Some((before, after));
        }
        *in_force = Some(config.clone());
        report.needs_restart = self.restart_changes(config);
        if !report.needs_restart.is_empty() {
            tracing::warn!(
                settings = ?report.needs_restart,
                "reloaded config changes settings that only apply at start: they are kept until a restart"
            );
        }
        Ok(report)
    }

    /// Whether `loaded` is the config in force.
    #[cfg(feature = "watch")]
    fn is_in_force(&self, loaded: &Result<Config, ConfigError>) -> bool {
        let in_force = self
            .in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loaded.as_ref().is_ok_and(|c| in_force.as_ref() == Some(c))
    }

    pub(crate) fn reload_file(&self, path: &Path) -> Result<ReloadReport, ConfigError> {
        self.reload_loaded(path, Config::load(path))
    }

    /// Puts `loaded`, the file at `path` as it was read, in force, or logs
    /// and counts why it cannot be.
    fn reload_loaded(
        &self,
        path: &Path,
        loaded: Result<Config, ConfigError>,
    ) -> Result<ReloadReport, ConfigError> {
        match loaded {
            Ok(config) => self.reload(&config).map_err(ConfigError::from_error),
            Err(e) => {
                self.labels.reload(false);
                tracing::warn!(
                    file = %path.display(),
                    error = %e,
                    "config reload rejected; the config in force is kept"
                );
                Err(e)
            }
        }
    }
}

#[cfg(feature = "watch")]
pub use watch::ConfigWatch;

#[cfg(feature = "watch")]
mod watch {
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Weak};
    use std::time::Duration;

    use notify::event::ModifyKind;
    use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;

    use crate::config::{Config, ConfigError};
    use crate::limiter::{HybridLimiter, Inner, in_range};

    /// The longest a reload waits for quiet, in debounces after the first
    /// change it follows: see [`HybridLimiter::watch_config`].
    const MAX_DEBOUNCES: u32 = 10;

    /// The longest debounce [`HybridLimiter::watch_config`] takes.
    const MAX_DEBOUNCE: Duration = Duration::from_secs(24 * 60 * 60);

    /// Watches a config file and reloads the limiter when it changes; see
    /// [`HybridLimiter::watch_config`]. Dropping it stops watching.
    #[derive(Debug)]
    pub struct ConfigWatch {
        _watcher: RecommendedWatcher,
        task: JoinHandle<()>,
    }

    impl Drop for ConfigWatch {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl HybridLimiter {
        /// Reloads from the file at `path` whenever it changes, until the
        /// returned [`ConfigWatch`] is dropped (or the limiter is).
        ///
        /// Changes are debounced: a reload runs once the file has been quiet
        /// for `debounce`, so an editor's several writes make one reload
        /// (and at the latest ten debounces after the first change:
        /// a directory that is never quiet still gets its reloads). The
        /// file's directory is watched, not the file, so a file replaced by a
        /// rename (editors, Kubernetes config maps) is seen too; writes to
        /// other files there, and reads of any, wake nothing. A change that
        /// leaves the file's bytes as they were reloads nothing. When the
        /// watch starts, the file is reloaded at once unless it is the config
        /// in force (the one the limiter was built from or last reloaded):
        /// a change made before the watch began is not missed. Each
        /// reload is [`reload_file`](Self::reload_file): a file that does not
        /// load (or no longer exists) keeps the config in force, and is
        /// logged and counted, once until its bytes change.
        ///
        /// Needs a Tokio runtime; the `watch` feature (on by default).
        ///
        /// # Errors
        ///
        /// A [`ConfigError`] when the file's directory cannot be watched, or
        /// `debounce` is longer than a day.
        pub fn watch_config(
            &self,
            path: impl AsRef<Path>,
            debounce: Duration,
        ) -> Result<ConfigWatch, ConfigError> {
            let path = path.as_ref().to_path_buf();
            let cannot = |e: &dyn std::fmt::Display| {
                ConfigError::io(format!("cannot watch {}: {e}", path.display()))
            };
            // A reload waits at most `MAX_DEBOUNCES` debounces: a debounce of
            // days is surely a mistake (a change would wait weeks), and one
            // far longer put that deadline past the clock's range, a panic in
            // the task and no reload ever after (`Duration::MAX` did).
            in_range("debounce", debounce, Duration::ZERO, MAX_DEBOUNCE)
                .map_err(ConfigError::from_error)?;
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let handle = tokio::runtime::Handle::try_current().map_err(|e| cannot(&e))?;
            let name = path.file_name().map(OsString::from).unwrap_or_default();
            let (tx, rx) = mpsc::unbounded_channel();
            let mut watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
                // The task compares the file's bytes. The receiver is gone
                // only when the watch is dropped.
                // An error may have hidden a change: compare the bytes.
                if event.is_err() || event.is_ok_and(|e| may_change(&e, &name)) {
                    let _ = tx.send(());
                }
            })
            .map_err(|e| cannot(&e))?;
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| cannot(&e))?;
            // Read here, once the directory is watched, not in the task: a
            // change after this returns is then one the watcher sees.
            let read = std::fs::read(&path);
            let task = handle.spawn(run(Arc::downgrade(self.inner()), path, read, debounce, rx));
            Ok(ConfigWatch {
                _watcher: watcher,
                task,
            })
        }
    }

    /// Whether `event` in the watched directory may have changed the file
    /// named `name`. Not a read or an open (the watcher's own reads of the
    /// file woke it again, forever), nor a write to another file (a log
    /// written beside the config kept the directory from ever being quiet).
    /// Anything created, removed or renamed may be: a Kubernetes config map
    /// swaps a symlink (`..data`) the file's path goes through.
    fn may_change(event: &Event, name: &OsString) -> bool {
        if event.need_rescan() {
            // Events were lost (the kernel's queue overflowed): any of them
            // may have been the file's.
            return true;
        }
        match event.kind {
            EventKind::Access(_) => false,
            EventKind::Create(_)
            | EventKind::Remove(_)
            | EventKind::Modify(ModifyKind::Name(_)) => true,
            _ => event
                .paths
                .iter()
                .any(|p| p.file_name() == Some(name.as_os_str())),
        }
    }

    async fn run(
        inner: Weak<Inner>,
        path: PathBuf,
        read: std::io::Result<Vec<u8>>,
        debounce: Duration,
        mut events: mpsc::UnboundedReceiver<()>,
    ) {
        // The file as the watch started, against the config in force: a
        // change made between loading the file and watching it is applied
        // now, not at the file's next change (nor ever, were that never to
        // come).
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if read.is_ok() {
            let loaded = Config::from_file_bytes(&path, read.as_deref());
            if !strong.is_in_force(&loaded) {
                let _ = strong.reload_loaded(&path, loaded);
            }
        }
        drop(strong);
        // The bytes last read, None when the file could not be read: each
        // read is compared with it, and what a reload parses is that same
        // read (a second one could see a later write, and the bytes
        // remembered would not be what was put in force or rejected).
        let mut last = read.ok();
        while events.recv().await.is_some() {
            // Quiet for `debounce` before reading: one reload per burst of
            // writes, and one at the latest after `MAX_DEBOUNCES`.
            let latest = tokio::time::Instant::now() + debounce.saturating_mul(MAX_DEBOUNCES);
            loop {
                let quiet = (tokio::time::Instant::now() + debounce).min(latest);
                match tokio::time::timeout_at(quiet, events.recv()).await {
                    Ok(Some(())) if tokio::time::Instant::now() < latest => continue,
                    Ok(Some(())) | Err(_) => break,
                    Ok(None) => return,
                }
            }
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let read = std::fs::read(&path);
            // Remembered whether it loads or not, or could not be read: a
            // bad or missing file is rejected (logged and counted) once, not
            // again at every wake until fixed.
            if read.as_ref().ok() == last.as_ref() {
                continue;
            }
            let _ = inner.reload_loaded(&path, Config::from_file_bytes(&path, read.as_deref()));
            last = read.ok();
        }
    }

    #[cfg(test)]
    mod tests {
        use notify::event::{CreateKind, Flag};

        use super::*;

        /// Lost events (the kernel's queue overflowed) say nothing of which
        /// file changed: the watcher compares the file's bytes again. A
        /// rescan names no path, and was taken for another file's event.
        #[test]
        fn a_rescan_may_have_changed_the_file() {
            let name = OsString::from("tierlimit.toml");
            let rescan = Event::new(EventKind::Other).set_flag(Flag::Rescan);
            assert!(may_change(&rescan, &name));
            let other = Event::new(EventKind::Other);
            assert!(!may_change(&other, &name), "no path, no rescan");
            let created = Event::new(EventKind::Create(CreateKind::File));
            assert!(may_change(&created, &name));
        }
    }
}
