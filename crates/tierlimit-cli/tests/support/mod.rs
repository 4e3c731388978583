//! What the CLI's tests share: the built binary, a child process that is
//! killed when dropped, and the facade's documented metric names.

#![allow(dead_code, reason = "each test binary uses a part")]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::thread;
use std::time::{Duration, Instant};

/// The `tierlimit` binary cargo built for these tests.
pub(crate) fn tierlimit() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tierlimit"));
    // The demo must start its own redis-server, never a caller's Redis.
    command.env_remove("REDIS_URL");
    command
}

/// A running `tierlimit` whose stdout and stderr lines arrive on channels;
/// killed (SIGKILL) if still running when dropped.
pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) stdout: Receiver<String>,
    pub(crate) stderr: Receiver<String>,
}

impl Running {
    pub(crate) fn start(mut command: Command) -> Running {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start the tierlimit binary");
        let stdout = lines(child.stdout.take().expect("piped"));
        let stderr = lines(child.stderr.take().expect("piped"));
        Running {
            child,
            stdout,
            stderr,
        }
    }

    /// The next stdout line matching `want`, within `timeout`; the lines
    /// before it are returned too (in order, the match last).
    pub(crate) fn stdout_until(
        &self,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        until(&self.stdout, timeout, want, "stdout")
    }

    pub(crate) fn stderr_until(
        &self,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        until(&self.stderr, timeout, want, "stderr")
    }

    /// Waits for the process to exit, at most `timeout`; its exit code.
    pub(crate) fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("tierlimit did not exit within {timeout:?}");
    }

    /// Every stdout line left, once the process has exited.
    pub(crate) fn rest_of_stdout(&self) -> Vec<String> {
        self.stdout.iter().collect()
    }

    pub(crate) fn rest_of_stderr(&self) -> Vec<String> {
        self.stderr.iter().collect()
    }
}

impl Running {
    /// Sends `signal` (e.g. "INT", "KILL") to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} failed");
    }
}

impl Drop for Running {
    /// Interrupts a process still running (so it stops what it started),
    /// and kills it only if it has not exited 10 s later.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .status();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(stream: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn until(
    rx: &Receiver<String>,
    timeout: Duration,
    want: impl Fn(&str) -> bool,
    name: &str,
) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let found = want(&line);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => panic!(
                "no matching {name} line within {timeout:?}; saw:\n{}",
                seen.join("\n")
            ),
        }
    }
}

/// True while a process with this pid exists (a zombie counts as gone: it
/// no longer runs).
pub(crate) fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Polls until `pid` is gone, at most `timeout`; true when gone.
pub(crate) fn gone_within(pid: u32, timeout: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if !process_alive(pid) {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    !process_alive(pid)
}

/// The metric names in the facade's documentation table (the crate docs of
/// `tierlimit`, which its own test checks against what it describes).
pub(crate) fn documented_metrics() -> BTreeSet<String> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tierlimit/src/lib.rs");
    let text = std::fs::read_to_string(&lib)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", lib.display()));
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("//! | `"))
        .filter_map(|l| l.split('`').next())
        .filter(|name| name.starts_with("tierlimit_"))
        .map(str::to_owned)
        .collect();
    assert!(
        names.len() >= 19,
        "the facade's metrics table looks unreadable from here: {names:?}"
    );
    names
}
