//! The docker driver: a compose project (`chaos-tests/docker-compose.yml`) per
//! scenario with a Redis container, a fault-proxy container in front of it and
//! one container per app; faults by `docker kill`, `restart`, `pause`/`unpause`
//! and `network disconnect` on Redis, and by the proxy for latency and resets.
//!
//! Each scenario gets its own project, `<prefix>x<n>` (prefix `tlchaos<pid>`,
//! or `CHAOS_PROJECT` when set), so a leftover from one scenario never meets
//! the next. The apps reach Redis through the proxy, `redis://proxy:6379/` on
//! the project's network; the proxy (`chaos-proxy`, see [`crate::proxy`])
//! forwards to `redis:6379`, looked up per connection, and takes faults on a
//! control port that compose publishes on host loopback. This process reaches
//! Redis itself through the port compose publishes for it, looked up again on
//! every [`controller_url`] call because a restarted container gets a new one.
//!
//! Environment: `CHAOS_COMPOSE` (the compose command, e.g. `docker-compose`;
//! otherwise `docker compose` when `docker compose version` works, else
//! `docker-compose`), `CHAOS_COMPOSE_FILE` (another compose file), and the
//! image variables the compose file reads (`CHAOS_REDIS_IMAGE`,
//! `CHAOS_APP_IMAGE`, `CHAOS_PULL_POLICY`), which pass through to compose.
//!
//! [`controller_url`]: Driver::controller_url

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tierlimit_test::Fault;

use super::{Action, ClusterTarget, Driver};
use crate::plan::AppPlan;
use crate::proxy;

/// Redis as the apps reach it: through the proxy service on the project's network.
const APP_REDIS_URL: &str = "redis://proxy:6379/";
/// The proxy's control port inside its container (see the compose file).
const PROXY_CONTROL_PORT: &str = "7000/tcp";
/// The run directory inside the app containers.
const MOUNT: &str = "/chaos";
/// App services in the compose file.
const APP_SERVICES: usize = 3;
/// Cluster node services in the compose file (`node0`..`node5`, profile `cluster`).
const CLUSTER_NODES: usize = 6;
/// How long Redis gets to answer PING after it is started.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// The compose label holding a container's or network's project name.
const PROJECT_LABEL: &str = "com.docker.compose.project";

/// Projects started by this process so far, for unique names.
static PROJECTS: AtomicU32 = AtomicU32::new(0);

/// Runs Redis and the apps as containers (see `chaos-tests/docker-compose.yml`
/// and `chaos-tests/README.md`).
#[derive(Debug)]
pub struct DockerDriver {
    /// The compose command (`docker compose` or `docker-compose`), found on first use.
    compose: Option<Vec<String>>,
    compose_file: PathBuf,
    prefix: String,
    project: Option<Project>,
}

/// One scenario's compose project.
#[derive(Debug)]
struct Project {
    name: String,
    /// Variables every compose command of this project gets, so that compose
    /// computes the same configuration each time and never recreates Redis.
    env: Vec<(String, String)>,
    redis: String,
    network: String,
    /// The proxy's control port on host loopback.
    proxy_control: Option<SocketAddr>,
    paused: bool,
    cut: bool,
    /// App container ids, by index.
    apps: Vec<String>,
    /// Whether `KillApp` killed each app (its non-zero exit is then expected).
    killed: Vec<bool>,
    /// The run directory on the host, and each app's plan as its container
    /// reads it, with how many new processes it had.
    dir: PathBuf,
    plans: Vec<(AppPlan, usize)>,
    /// Containers of new processes (`StartApp`): (app, id, killed).
    restarted: Vec<(usize, String, bool)>,
    /// Redis as the apps reach it: through the proxy, or the cluster's nodes.
    app_url: String,
    /// The cluster's node containers, by index, and the cluster aimed at its
    /// victim (the cluster scenarios).
    cluster: Option<(Vec<String>, ClusterTarget)>,
}

impl Default for DockerDriver {
    fn default() -> Self {
        let compose_file = std::env::var_os("CHAOS_COMPOSE_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("docker-compose.yml"));
        // Compose project names: lower-case letters, digits, '-' and '_'.
        let prefix: String = std::env::var("CHAOS_PROJECT")
            .unwrap_or_else(|_| format!("tlchaos{}", std::process::id()))
            .to_lowercase()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        DockerDriver {
            compose: None,
            compose_file,
            prefix: if prefix.is_empty() {
                "tlchaos".into()
            } else {
                prefix
            },
            project: None,
        }
    }
}

/// Runs a command and returns its trimmed stdout, or an error naming the
/// command with its exit status and stderr.
fn run(cmd: &mut Command) -> Result<String, String> {
    let shown = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`{shown}` could not start: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "`{shown}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn docker(args: &[&str]) -> Result<String, String> {
    run(Command::new("docker").args(args))
}

/// The last lines a container wrote, stdout and stderr.
fn logs(id: &str) -> String {
    match Command::new("docker")
        .args(["logs", "--tail", "20", id])
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("(docker logs: {e})"),
    }
}

/// Whether Redis at `addr` answers PING.
fn answers_ping(addr: SocketAddr) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(b"PING\r\n")?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply)?;
        Ok(&reply == b"+PONG\r\n")
    };
    attempt().unwrap_or(false)
}

/// The host loopback address docker publishes `port` (e.g. `6379/tcp`) of
/// container `id` at.
fn published(id: &str, port: &str) -> Result<SocketAddr, String> {
    let out = docker(&["port", id, port])?;
    out.lines()
        .find_map(|l| {
            l.trim()
                .parse::<SocketAddr>()
                .ok()
                .filter(|a| a.ip().is_loopback())
        })
        .ok_or_else(|| format!("{port} is not published on loopback (`docker port` says {out:?})"))
}

/// `path` relative to `dir`, for a file that must be under `dir`.
fn under(dir: &Path, path: &Path) -> Result<PathBuf, String> {
    let outside = || {
        format!(
            "{} is not under the run directory {}",
            path.display(),
            dir.display()
        )
    };
    let rel = match path.strip_prefix(dir) {
        Ok(rel) => rel.to_path_buf(),
        Err(_) => {
            // Compare real paths: `dir` may be relative or reached through a link.
            let real_dir = dir
                .canonicalize()
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let parent = path.parent().ok_or_else(outside)?;
            let name = path.file_name().ok_or_else(outside)?;
            let real_parent = parent
                .canonicalize()
                .map_err(|e| format!("{}: {e}", parent.display()))?;
            real_parent
                .join(name)
                .strip_prefix(&real_dir)
                .map_err(|_| outside())?
                .to_path_buf()
        }
    };
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(outside());
    }
    Ok(rel)
}

impl DockerDriver {
    /// The compose command: `CHAOS_COMPOSE`, else `docker compose` if it
    /// works, else `docker-compose`.
    fn compose_cmd(&mut self) -> Result<Vec<String>, String> {
        if let Some(c) = &self.compose {
            return Ok(c.clone());
        }
        let works = |cmd: &[&str]| {
            Command::new(cmd[0])
                .args(&cmd[1..])
                .arg("version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let chosen: Vec<String> = match std::env::var("CHAOS_COMPOSE") {
            Ok(c) if !c.trim().is_empty() => c.split_whitespace().map(str::to_string).collect(),
            _ if works(&["docker", "compose"]) => vec!["docker".into(), "compose".into()],
            _ if works(&["docker-compose"]) => vec!["docker-compose".into()],
            _ => return Err("neither `docker compose` nor `docker-compose` works (set CHAOS_COMPOSE to a compose command)".into()),
        };
        self.compose = Some(chosen.clone());
        Ok(chosen)
    }

    /// Runs `compose -f <file> -p <project> <args>` with the project's variables.
    fn compose(&mut self, args: &[&str]) -> Result<String, String> {
        let compose = self.compose_cmd()?;
        let project = self
            .project
            .as_ref()
            .ok_or("no compose project is running")?;
        let mut cmd = Command::new(&compose[0]);
        cmd.args(&compose[1..])
            .arg("-f")
            .arg(&self.compose_file)
            .args(["-p", &project.name])
            .args(args)
            .envs(project.env.iter().map(|(k, v)| (k, v)));
        run(&mut cmd)
    }

    fn project(&mut self) -> Result<&mut Project, String> {
        self.project
            .as_mut()
            .ok_or_else(|| "Redis is not started".to_string())
    }

    /// The id of the container of `service` in the current project.
    fn container(&self, service: &str) -> Result<String, String> {
        let name = &self
            .project
            .as_ref()
            .ok_or("no compose project is running")?
            .name;
        let out = docker(&[
            "ps",
            "-a",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label={PROJECT_LABEL}={name}"),
            "--filter",
            &format!("label=com.docker.compose.service={service}"),
        ])?;
        match out.lines().collect::<Vec<_>>()[..] {
            [id] => Ok(id.to_string()),
            [] => Err(format!("project {name} has no {service} container")),
            _ => Err(format!(
                "project {name} has several {service} containers:\n{out}"
            )),
        }
    }

    /// Where this process reaches Redis now: the published loopback port.
    fn controller_addr(&mut self) -> Result<SocketAddr, String> {
        let redis = self.project()?.redis.clone();
        published(&redis, "6379/tcp")
    }

    /// The proxy's control port, found on first use (the proxy container is
    /// never restarted, so its port stays).
    fn proxy_control(&mut self) -> Result<SocketAddr, String> {
        if let Some(addr) = self.project()?.proxy_control {
            return Ok(addr);
        }
        let proxy = self.container("proxy")?;
        let addr = published(&proxy, PROXY_CONTROL_PORT)?;
        self.project()?.proxy_control = Some(addr);
        Ok(addr)
    }

    /// Sets a fault on the proxy.
    fn proxy_fault(&mut self, fault: Fault) -> Result<(), String> {
        let control = self.proxy_control()?;
        proxy::send(control, fault)
    }

    /// Waits until the proxy takes faults on its control port.
    fn wait_proxy(&mut self) -> Result<(), String> {
        let end = Instant::now() + READY_TIMEOUT;
        loop {
            match self.proxy_fault(Fault::None) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= end => {
                    let id = self.container("proxy").unwrap_or_default();
                    return Err(format!(
                        "the fault proxy did not answer within {READY_TIMEOUT:?} ({e}); its log ends:\n{}",
                        logs(&id)
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Waits until Redis answers PING through its published port.
    fn wait_ready(&mut self) -> Result<(), String> {
        let end = Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < end {
            match self.controller_addr() {
                Ok(addr) if answers_ping(addr) => return Ok(()),
                Ok(addr) => last = format!("{addr} does not answer PING"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let redis = self.project()?.redis.clone();
        Err(format!(
            "Redis did not answer PING within {READY_TIMEOUT:?} ({last}); its log ends:\n{}",
            logs(&redis)
        ))
    }

    /// SIGKILLs an app's container, which must still be running: one that
    /// ended before its kill (a crash) would pass for killed.
    fn kill_app(&self, id: &str) -> Result<(), String> {
        if docker(&["inspect", "-f", "{{.State.Running}}", id]).as_deref() == Ok("false") {
            let code = docker(&["inspect", "-f", "{{.State.ExitCode}}", id]).unwrap_or_default();
            return Err(format!("it had already ended, exit code {code}"));
        }
        self.kill(id)
    }

    /// SIGKILLs a container and waits until docker reports it stopped.
    fn kill(&self, id: &str) -> Result<(), String> {
        if let Err(e) = docker(&["kill", id]) {
            // Already stopped (an app that finished by itself) is fine.
            if docker(&["inspect", "-f", "{{.State.Running}}", id]).as_deref() != Ok("false") {
                return Err(e);
            }
        }
        docker(&["wait", id]).map(drop)
    }
}

impl DockerDriver {
    /// Tears down the last project and starts naming a new one; refuses when
    /// images are missing and must not be pulled.
    fn new_project(&mut self, redis_args: String, app_url: String) -> Result<(), String> {
        self.teardown();
        // `pull_policy: never` is honoured by `docker compose` v2; docker-compose
        // 1.29 accepts it but still pulls a missing image. Refuse before that.
        if std::env::var("CHAOS_PULL_POLICY").as_deref() == Ok("never") {
            for (var, default) in [
                ("CHAOS_REDIS_IMAGE", "redis:7.4"),
                ("CHAOS_APP_IMAGE", "rust:1.88"),
            ] {
                let image = std::env::var(var).unwrap_or_else(|_| default.into());
                if docker(&["image", "inspect", "-f", "{{.Id}}", &image]).is_err() {
                    return Err(format!(
                        "image {image} ({var}) is not on this engine and CHAOS_PULL_POLICY=never: build it with chaos-tests/images/build.sh"
                    ));
                }
            }
        }
        // Process-wide, so two drivers in one process never share a project.
        let n = PROJECTS.fetch_add(1, Ordering::Relaxed) + 1;
        self.project = Some(Project {
            name: format!("{}x{n}", self.prefix),
            env: vec![("CHAOS_REDIS_ARGS".into(), redis_args)],
            redis: String::new(),
            network: String::new(),
            proxy_control: None,
            paused: false,
            cut: false,
            apps: Vec::new(),
            killed: Vec::new(),
            dir: PathBuf::new(),
            plans: Vec::new(),
            restarted: Vec::new(),
            app_url,
            cluster: None,
        });
        Ok(())
    }

    /// The container of the cluster's victim master, or of its replica with `replica`.
    fn cluster_node(&mut self, replica: bool) -> Result<(String, String), String> {
        let (ids, target) = self
            .project()?
            .cluster
            .as_ref()
            .ok_or("no cluster is started")?;
        let i = if replica {
            target.replica
        } else {
            target.victim
        };
        Ok((ids[i].clone(), target.nodes[i].clone()))
    }
}

impl Driver for DockerDriver {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn start_redis(&mut self, maxmemory: Option<u64>) -> Result<String, String> {
        let redis_args = maxmemory
            .map(|m| format!("--maxmemory {m} --maxmemory-policy noeviction"))
            .unwrap_or_default();
        self.new_project(redis_args, APP_REDIS_URL.into())?;
        self.compose(&["up", "-d", "--no-deps", "redis", "proxy"]).map_err(|e| {
            format!(
                "{e}\n(without a registry build the images first: chaos-tests/images/build.sh, and set CHAOS_REDIS_IMAGE and CHAOS_APP_IMAGE as chaos-tests/run.sh does)"
            )
        })?;
        let redis = self.container("redis")?;
        let networks = docker(&[
            "inspect",
            "-f",
            "{{range $name, $net := .NetworkSettings.Networks}}{{$name}}\n{{end}}",
            &redis,
        ])?;
        let network = match networks
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect::<Vec<_>>()[..]
        {
            [one] => one.to_string(),
            _ => {
                return Err(format!(
                    "expected Redis on one network, it is on: {networks:?}"
                ));
            }
        };
        let project = self.project()?;
        project.redis = redis;
        project.network = network;
        self.wait_ready()?;
        self.wait_proxy()?;
        Ok(APP_REDIS_URL.into())
    }

    fn controller_url(&mut self) -> Result<String, String> {
        Ok(format!("redis://{}/", self.controller_addr()?))
    }

    fn start_cluster(&mut self, victim_key: &str) -> Result<(String, ClusterTarget), String> {
        self.new_project(String::new(), String::new())?;
        let services: Vec<String> = (0..CLUSTER_NODES).map(|i| format!("node{i}")).collect();
        let mut args = vec!["up", "-d", "--no-deps"];
        args.extend(services.iter().map(String::as_str));
        self.compose(&args).map_err(|e| {
            format!("{e}\n(without a registry build the images first: chaos-tests/images/build.sh)")
        })?;
        let ids = services
            .iter()
            .map(|s| self.container(s))
            .collect::<Result<Vec<_>, _>>()?;
        // Each node at its address on the project's network, which this
        // host reaches directly (a Linux bridge) as the apps do: a cluster
        // announces its nodes' own addresses, so no published port would do.
        let mut nodes = Vec::new();
        for id in &ids {
            let ip = docker(&[
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}\n{{end}}",
                id,
            ])?;
            let ip = ip
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .ok_or_else(|| format!("cluster node {id} has no address: {ip:?}"))?;
            let addr: SocketAddr = format!("{ip}:6379")
                .parse()
                .map_err(|e| format!("cluster node address {ip}: {e}"))?;
            let end = Instant::now() + READY_TIMEOUT;
            while !answers_ping(addr) {
                if Instant::now() >= end {
                    return Err(format!(
                        "cluster node {addr} did not answer PING within {READY_TIMEOUT:?}; its log ends:\n{}",
                        logs(id)
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            nodes.push(addr.to_string());
        }
        tierlimit_test::create_cluster(&nodes)?;
        for node in &nodes {
            let _: () = tierlimit_test::query_node(
                node,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("cluster-require-full-coverage")
                    .arg("no"),
            )
            .map_err(|e| format!("CONFIG SET on {node}: {e}"))?;
        }
        tierlimit_test::wait_cluster_ready(&nodes, Duration::from_secs(30))?;
        let target = super::aim(nodes, victim_key)?;
        let url = format!("redis+cluster://{}/", target.nodes.join(","));
        let project = self.project()?;
        project.app_url = url.clone();
        project.cluster = Some((ids, target.clone()));
        Ok((url, target))
    }

    fn start_apps(&mut self, dir: &Path, plans: &[AppPlan]) -> Result<(), String> {
        if plans.len() > APP_SERVICES {
            return Err(format!(
                "the compose file has {APP_SERVICES} app services, not {}",
                plans.len()
            ));
        }
        if !self.project()?.apps.is_empty() {
            return Err("the apps of this project are already started".into());
        }
        let real_dir = dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut services = Vec::new();
        let mut inside_plans = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            let rel = under(dir, &plan.out)?;
            let file = format!("app{i}.json");
            if rel == Path::new(&file) {
                return Err(format!(
                    "app {i}'s log {} would overwrite its plan",
                    plan.out.display()
                ));
            }
            let mut inside = plan.clone();
            inside.out = Path::new(MOUNT).join(&rel);
            inside.redis_url = self.project()?.app_url.clone();
            let json = serde_json::to_string_pretty(&inside).map_err(|e| e.to_string())?;
            let path = real_dir.join(&file);
            std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
            services.push(format!("app{i}"));
            inside_plans.push((inside, 0));
        }
        let project = self.project()?;
        project.env.retain(|(k, _)| k != "CHAOS_DIR");
        project
            .env
            .push(("CHAOS_DIR".into(), real_dir.to_string_lossy().into_owned()));
        let mut args = vec!["up", "-d", "--no-deps"];
        args.extend(services.iter().map(String::as_str));
        self.compose(&args)?;
        let apps = services
            .iter()
            .map(|s| self.container(s))
            .collect::<Result<Vec<_>, _>>()?;
        let project = self.project()?;
        project.killed = vec![false; apps.len()];
        project.apps = apps;
        project.plans = inside_plans;
        project.dir = real_dir;
        Ok(())
    }

    fn act(&mut self, action: Action) -> Result<(), String> {
        let p = self.project()?;
        let redis = p.redis.clone();
        match action {
            Action::KillRedis => {
                self.kill(&redis)?;
                self.project()?.paused = false;
            }
            Action::StartRedis => {
                // Kills it first if it still runs (even paused); no persistence,
                // so it comes back empty, without scripts, on a new host port.
                // While the network is cut nothing can reach it to check.
                let cut = p.cut;
                docker(&["restart", "-t", "0", &redis])?;
                self.project()?.paused = false;
                if !cut {
                    self.wait_ready()?;
                }
            }
            Action::PauseRedis if !p.paused => {
                docker(&["pause", &redis])?;
                self.project()?.paused = true;
            }
            Action::ResumeRedis if p.paused => {
                docker(&["unpause", &redis])?;
                self.project()?.paused = false;
            }
            Action::PauseRedis | Action::ResumeRedis => {}
            Action::CutNetwork if !p.cut => {
                let network = p.network.clone();
                docker(&["network", "disconnect", &network, &redis])?;
                self.project()?.cut = true;
            }
            Action::RestoreNetwork if p.cut => {
                let network = p.network.clone();
                docker(&["network", "connect", "--alias", "redis", &network, &redis])?;
                self.project()?.cut = false;
            }
            Action::CutNetwork | Action::RestoreNetwork => {}
            Action::KillApp(i) => {
                // Its newest container.
                if let Some(n) = p.restarted.iter().rposition(|(a, _, _)| *a == i) {
                    let id = p.restarted[n].1.clone();
                    self.kill_app(&id)
                        .map_err(|e| format!("killing app {i}: {e}"))?;
                    self.project()?.restarted[n].2 = true;
                } else {
                    let id = p
                        .apps
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("no app {i}"))?;
                    self.kill_app(&id)
                        .map_err(|e| format!("killing app {i}: {e}"))?;
                    self.project()?.killed[i] = true;
                }
            }
            Action::StartApp(i) => {
                let (first, generation) =
                    p.plans.get_mut(i).ok_or_else(|| format!("no app {i}"))?;
                *generation += 1;
                let mut plan = first.clone();
                plan.out = super::restarted_log(&first.out, *generation);
                let file = format!("app{i}-r{generation}.json");
                let path = p.dir.join(&file);
                let json = serde_json::to_string_pretty(&plan).map_err(|e| e.to_string())?;
                std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
                // A one-off container of the app's service with the new plan;
                // compose prints its name.
                let service = format!("app{i}");
                let inside = format!("{MOUNT}/{file}");
                let out =
                    self.compose(&["run", "-d", "--no-deps", &service, "chaos-app", &inside])?;
                let id = out
                    .lines()
                    .map(str::trim)
                    .rfind(|l| !l.is_empty())
                    .ok_or_else(|| format!("compose run printed no container for app {i}"))?
                    .to_string();
                self.project()?.restarted.push((i, id, false));
            }
            Action::KillMaster => {
                let (id, _) = self.cluster_node(false)?;
                self.kill(&id)?;
            }
            Action::PauseMaster => {
                docker(&["pause", &self.cluster_node(false)?.0])?;
            }
            Action::ResumeMaster => {
                docker(&["unpause", &self.cluster_node(false)?.0])?;
            }
            Action::FailoverMaster => {
                let (_, replica) = self.cluster_node(true)?;
                let _: String =
                    tierlimit_test::query_node(&replica, redis::cmd("CLUSTER").arg("FAILOVER"))
                        .map_err(|e| format!("CLUSTER FAILOVER on {replica}: {e}"))?;
            }
            Action::ResetConnections => self.proxy_fault(Fault::Reset)?,
            Action::Latency(ms) => self.proxy_fault(Fault::Latency(Duration::from_millis(ms)))?,
            Action::ClearNetworkFault => self.proxy_fault(Fault::None)?,
        }
        Ok(())
    }

    fn wait_apps(&mut self, by: Instant) -> Result<(), String> {
        let p = self.project()?;
        let mut apps: Vec<(String, String, bool)> = p
            .apps
            .iter()
            .zip(&p.killed)
            .enumerate()
            .map(|(i, (id, killed))| (format!("app {i}"), id.clone(), *killed))
            .collect();
        apps.extend(
            p.restarted
                .iter()
                .map(|(i, id, killed)| (format!("app {i} (restarted)"), id.clone(), *killed)),
        );
        for (app, id, killed) in apps {
            let code = super::wait_until(&app, by, Duration::from_millis(200), || {
                let state = docker(&[
                    "inspect",
                    "-f",
                    "{{.State.Running}} {{.State.ExitCode}}",
                    &id,
                ])?;
                Ok(match state.split_once(' ') {
                    Some(("false", code)) => Some(code.to_string()),
                    _ => None,
                })
            })?;
            // A killed app exits by SIGKILL (128 + 9); that is the scenario.
            // Any other end (an abort, a panic, the OOM killer) is a failure.
            let expected = if killed { "137" } else { "0" };
            if code != expected {
                return Err(format!(
                    "{app} exited with status {code}{}; its output ends:\n{}",
                    if killed {
                        " (killed: 137 expected)"
                    } else {
                        ""
                    },
                    logs(&id)
                ));
            }
        }
        Ok(())
    }

    fn teardown(&mut self) {
        let Some(project) = self.project.as_ref() else {
            return;
        };
        let name = project.name.clone();
        if let Err(e) = self.compose(&["down", "-v", "--remove-orphans", "-t", "1"]) {
            eprintln!("docker driver: {e}");
        }
        // Whatever `down` left (it failed, or a container was being created
        // meanwhile): remove it by the project label.
        let label = format!("label={PROJECT_LABEL}={name}");
        if let Ok(ids) = docker(&["ps", "-a", "-q", "--filter", &label]) {
            for id in ids.lines().filter(|l| !l.is_empty()) {
                if let Err(e) = docker(&["rm", "-f", "-v", id]) {
                    eprintln!("docker driver: {e}");
                }
            }
        }
        if let Ok(ids) = docker(&["network", "ls", "-q", "--filter", &label]) {
            for id in ids.lines().filter(|l| !l.is_empty()) {
                if let Err(e) = docker(&["network", "rm", id]) {
                    eprintln!("docker driver: {e}");
                }
            }
        }
        self.project = None;
    }
}

impl Drop for DockerDriver {
    fn drop(&mut self) {
        self.teardown();
    }
}
