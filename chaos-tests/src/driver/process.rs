//! The process driver: `redis-server` child processes on loopback, signals, the
//! in-repo fault proxy between the apps and Redis, and apps as child processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tierlimit_test::{Fault, FaultProxy, RedisCluster, RedisServer};

use super::{Action, ClusterTarget, Driver};
use crate::plan::AppPlan;

/// Runs everything as processes on this machine.
#[derive(Debug)]
pub struct ProcessDriver {
    app_bin: PathBuf,
    runtime: tokio::runtime::Runtime,
    redis: Option<RedisServer>,
    proxy: Option<FaultProxy>,
    /// A cluster (the cluster scenarios), aimed at its victim master.
    cluster: Option<(RedisCluster, ClusterTarget)>,
    apps: Vec<Child>,
    /// Every app's plan, by index, and how many new processes it had.
    plans: Vec<(AppPlan, usize)>,
    /// New processes started by `StartApp`, waited for with the others.
    restarted: Vec<(usize, Child)>,
    /// The process ids `KillApp` killed: their death by signal is the
    /// scenario; any other app's is a failure.
    killed: Vec<u32>,
}

impl ProcessDriver {
    /// A driver that starts apps from the `chaos-app` binary at `app_bin`.
    pub fn new(app_bin: PathBuf) -> Result<Self, String> {
        if !app_bin.exists() {
            return Err(format!(
                "chaos-app binary not found at {}: build it with `cargo build -p chaos-tests`",
                app_bin.display()
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        Ok(ProcessDriver {
            app_bin,
            runtime,
            redis: None,
            proxy: None,
            cluster: None,
            apps: Vec::new(),
            plans: Vec::new(),
            restarted: Vec::new(),
            killed: Vec::new(),
        })
    }

    fn redis(&mut self) -> Result<&mut RedisServer, String> {
        self.redis
            .as_mut()
            .ok_or_else(|| "Redis is not started".to_string())
    }

    /// The cluster's victim master, or its replica with `replica`.
    fn cluster_node(&mut self, replica: bool) -> Result<&mut RedisServer, String> {
        let (cluster, target) = self
            .cluster
            .as_mut()
            .ok_or_else(|| "no cluster is started".to_string())?;
        Ok(cluster.node_mut(if replica {
            target.replica
        } else {
            target.victim
        }))
    }

    fn proxy(&self) -> Result<&FaultProxy, String> {
        self.proxy
            .as_ref()
            .ok_or_else(|| "the fault proxy is not started".to_string())
    }
}

impl ProcessDriver {
    fn spawn(&self, plan: &AppPlan) -> Result<Child, String> {
        let plan_path = plan.out.with_extension("json");
        let json = serde_json::to_string_pretty(plan).map_err(|e| e.to_string())?;
        std::fs::write(&plan_path, json).map_err(|e| format!("{}: {e}", plan_path.display()))?;
        Command::new(&self.app_bin)
            .arg(&plan_path)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.app_bin.display()))
    }
}

/// A panic mid-scenario (an action that gave up) unwinds past `teardown`:
/// the apps and servers must not outlive the driver and load the next test.
impl Drop for ProcessDriver {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Driver for ProcessDriver {
    fn name(&self) -> &'static str {
        "process"
    }

    fn start_redis(&mut self, maxmemory: Option<u64>) -> Result<String, String> {
        let mem = maxmemory.map(|m| m.to_string());
        let args: Vec<&str> = match &mem {
            Some(m) => vec!["--maxmemory", m, "--maxmemory-policy", "noeviction"],
            None => vec![],
        };
        let server = RedisServer::start_with(&args);
        let proxy = self.runtime.block_on(FaultProxy::start(server.addr()));
        let url = proxy.url();
        self.redis = Some(server);
        self.proxy = Some(proxy);
        Ok(url)
    }

    fn controller_url(&mut self) -> Result<String, String> {
        Ok(self.redis()?.url())
    }

    fn start_cluster(&mut self, victim_key: &str) -> Result<(String, ClusterTarget), String> {
        // The harness panics with what went wrong; a scenario that cannot
        // start is an error of the run, not a crash of the controller.
        let cluster = std::panic::catch_unwind(RedisCluster::start)
            .map_err(|e| panic_message(&e, "the cluster did not start"))?;
        self.runtime.block_on(cluster.serve_partial_coverage());
        let nodes = cluster
            .nodes()
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let target = super::aim(nodes, victim_key)?;
        let url = cluster.cluster_url();
        self.cluster = Some((cluster, target.clone()));
        Ok((url, target))
    }

    fn start_apps(&mut self, _dir: &Path, plans: &[AppPlan]) -> Result<(), String> {
        for plan in plans {
            let child = self.spawn(plan)?;
            self.apps.push(child);
            self.plans.push((plan.clone(), 0));
        }
        Ok(())
    }

    fn act(&mut self, action: Action) -> Result<(), String> {
        match action {
            Action::KillRedis => self.redis()?.kill9(),
            Action::StartRedis => self.redis()?.restart(),
            Action::PauseRedis => self.redis()?.pause(),
            Action::ResumeRedis => self.redis()?.resume(),
            Action::CutNetwork => self.proxy()?.set(Fault::Blackhole),
            Action::ResetConnections => self.proxy()?.set(Fault::Reset),
            Action::Latency(ms) => self.proxy()?.set(Fault::Latency(Duration::from_millis(ms))),
            Action::RestoreNetwork | Action::ClearNetworkFault => self.proxy()?.set(Fault::None),
            Action::KillMaster => self.cluster_node(false)?.kill9(),
            Action::PauseMaster => self.cluster_node(false)?.pause(),
            Action::ResumeMaster => self.cluster_node(false)?.resume(),
            Action::FailoverMaster => {
                let replica = self.cluster_node(true)?.port();
                let _: String = tierlimit_test::query_node(
                    &format!("127.0.0.1:{replica}"),
                    redis::cmd("CLUSTER").arg("FAILOVER"),
                )
                .map_err(|e| format!("CLUSTER FAILOVER: {e}"))?;
            }
            Action::KillApp(i) => {
                // Its newest process.
                let app = match self.restarted.iter_mut().rev().find(|(a, _)| *a == i) {
                    Some((_, child)) => child,
                    None => self.apps.get_mut(i).ok_or_else(|| format!("no app {i}"))?,
                };
                // One that ended before its kill (a crash) would pass for killed.
                if let Ok(Some(status)) = app.try_wait() {
                    return Err(format!(
                        "killing app {i}: it had already ended with {status}"
                    ));
                }
                self.killed.push(app.id());
                app.kill().map_err(|e| format!("killing app {i}: {e}"))?;
                let _ = app.wait();
            }
            Action::StartApp(i) => {
                let (first, generation) =
                    self.plans.get_mut(i).ok_or_else(|| format!("no app {i}"))?;
                *generation += 1;
                let mut plan = first.clone();
                plan.out = super::restarted_log(&first.out, *generation);
                let child = self.spawn(&plan)?;
                self.restarted.push((i, child));
            }
        }
        Ok(())
    }

    fn wait_apps(&mut self, by: Instant) -> Result<(), String> {
        let apps = self
            .apps
            .iter_mut()
            .enumerate()
            .map(|(i, app)| (i, "", app));
        let restarted = self
            .restarted
            .iter_mut()
            .map(|(i, app)| (*i, " (restarted)", app));
        for (i, which, app) in apps.chain(restarted) {
            let pid = app.id();
            let status = super::wait_until(
                &format!("app {i}{which}"),
                by,
                Duration::from_millis(20),
                || {
                    app.try_wait()
                        .map_err(|e| format!("waiting for app {i}{which}: {e}"))
                },
            )?;
            // An app the scenario killed dies by signal; any other death
            // (an abort, the OOM killer) is a failure.
            let killed = status.code().is_none() && self.killed.contains(&pid);
            if !status.success() && !killed {
                return Err(format!("app {i}{which} ended with {status}"));
            }
        }
        Ok(())
    }

    fn teardown(&mut self) {
        for app in &mut self.apps {
            let _ = app.kill();
            let _ = app.wait();
        }
        self.apps.clear();
        for (_, app) in &mut self.restarted {
            let _ = app.kill();
            let _ = app.wait();
        }
        self.restarted.clear();
        self.killed.clear();
        self.plans.clear();
        self.proxy = None;
        self.redis = None;
        self.cluster = None;
    }
}

/// The message of a caught panic.
fn panic_message(e: &Box<dyn std::any::Any + Send>, what: &str) -> String {
    let text = e
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| e.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    format!("{what}: {text}")
}
