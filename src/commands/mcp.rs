//! `pipeprof mcp`: a Model Context Protocol server over stdio, for coding agents. Its tools
//! answer "why is my training slow and what do I change" with `--json`'s document
//! (`pipeprof.verdict/2`): run a command under pipeprof for N steps, check the advice by
//! re-running it, report a saved run, compare two. Built on `rmcp`, the protocol's official Rust
//! SDK. Each tool runs this same binary as a child (`pipeprof run --once --json …`), so the
//! agent gets exactly what the command line gives; a run is bounded in steps (the start-up
//! hook stops the program after them) and in time (past it, the child is stopped as Ctrl-C
//! would, its program group with it), and a client that goes away stops every run it started.

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Steps of a run the agent starts, unless it asks.
pub const DEFAULT_STEPS: u64 = 40;
/// Most steps a run may ask for.
pub const MAX_STEPS: u64 = 100_000;
/// Seconds a run may take, unless the agent asks (and at most [`MAX_TIMEOUT_S`]).
pub const DEFAULT_TIMEOUT_S: u64 = 600;
pub const MAX_TIMEOUT_S: u64 = 3600;
/// After its time (or a cancel), a run is interrupted as Ctrl-C interrupts it; `pipeprof run`
/// then gives its program `STOP_TIMEOUT` to end, ends its group, kills it `KILL_AFTER` later,
/// and prints the verdict: killed only past all of that, with a margin.
const STOP_GRACE: Duration = pipeprof_core::signal::STOP_TIMEOUT
    .saturating_add(pipeprof_core::signal::KILL_AFTER)
    .saturating_add(Duration::from_secs(10));
/// After `pipeprof` ends, how long its pipes may take to give their last bytes (a process its
/// program left behind may hold stderr open: its tail is what was read by then).
const DRAIN: Duration = Duration::from_secs(5);
/// The longest line of the child's stderr kept.
const MAX_LINE: usize = 500;
/// The lines of the child's stderr an error carries.
const ERROR_LINES: usize = 20;

/// `run_training`'s and `check_advice`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunArgs {
    /// The program and its arguments, e.g. ["python", "train.py", "--epochs", "1"].
    pub command: Vec<String>,
    /// Training steps before the program is stopped (default 40; check_advice: per re-run).
    pub steps: Option<u64>,
    /// Seconds before the run is stopped, whatever it is doing (default 600, at most 3600).
    pub timeout_s: Option<u64>,
    /// The folder to run it in (default: the server's).
    pub cwd: Option<String>,
    /// Also write the run's summary file here (what report_summary and compare_runs read).
    pub summary: Option<String>,
}

/// `report_summary`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReportArgs {
    /// A summary (`--summary`) or trace (`--trace`) file of a run.
    pub path: String,
}

/// `compare_runs`' arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompareArgs {
    /// The baseline run's summary or trace.
    pub base: String,
    /// The new run's.
    pub new: String,
    /// Fail when the new run is more than this many percent slower.
    pub max_slowdown_pct: Option<f64>,
    /// Fail when the new run is input-bound at this severity or worse: "moderate" or "high".
    pub fail_if_input_bound: Option<String>,
}

/// The server: its tools.
#[derive(Debug, Clone)]
pub struct Server {
    #[allow(dead_code, reason = "read by #[tool_handler]'s code, which the lint does not see")]
    tool_router: ToolRouter<Server>,
    exe: PathBuf,
}

#[tool_router]
impl Server {
    fn new(exe: PathBuf) -> Server {
        Server { tool_router: Self::tool_router(), exe }
    }

    #[tool(
        description = "Run a training command (PyTorch, Keras, TensorFlow; unmodified) under pipeprof for a bounded number of steps and return the verdict as JSON (schema pipeprof.verdict/2): what limits the run (storage, CPU preprocessing, transfer, compute, per-step overhead), the evidence as figures, and the advice with the code to change and its predicted gain."
    )]
    async fn run_training(
        &self,
        Parameters(a): Parameters<RunArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let plan = plan_run(&a, false)?;
        self.verdict(plan, &ctx).await
    }

    #[tool(
        description = "Like run_training, then run the program again briefly once as it is and once per piece of advice pipeprof can apply without an edit (DataLoader workers, batch size, a local copy or a pack of the image folder), and return the verdict with each advice's measured speed-up (advice[].measured). The program really runs again each time: its side effects are its own."
    )]
    async fn check_advice(
        &self,
        Parameters(a): Parameters<RunArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let plan = plan_run(&a, true)?;
        self.verdict(plan, &ctx).await
    }

    #[tool(
        description = "The verdict of a saved run (a pipeprof summary or trace file), judged again, as JSON (schema pipeprof.verdict/2)."
    )]
    async fn report_summary(
        &self,
        Parameters(a): Parameters<ReportArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let plan = Plan::of(vec!["report".into(), a.path, "--json".into()], DEFAULT_TIMEOUT_S, None);
        self.verdict(plan, &ctx).await
    }

    #[tool(
        description = "Compare two saved runs (summaries or traces): images/s, step split and each stage base → new, whether the verdict changed, and the gate (max_slowdown_pct, fail_if_input_bound) as passed/failures (schema pipeprof.compare/1)."
    )]
    async fn compare_runs(
        &self,
        Parameters(a): Parameters<CompareArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let plan = plan_compare(a)?;
        self.verdict(plan, &ctx).await
    }
}

#[tool_handler]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("pipeprof", env!("CARGO_PKG_VERSION")))
            .with_instructions(
            "pipeprof diagnoses why ML training is slow (an idle GPU, a data pipeline on slow storage or too few CPU workers, a tiny model's per-step overhead). Start with run_training on the user's training command; read `limiter`, `evidence` and `advice[].command`; check_advice measures the advice; compare_runs checks a change.",
        )
    }
}

/// One child run of this binary: its arguments, how long it may take, where.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub args: Vec<String>,
    pub timeout: Duration,
    pub cwd: Option<PathBuf>,
    /// `PIPEPROF_CHECK` for the program: the steps it is stopped after.
    pub check_env: Option<String>,
}

impl Plan {
    fn of(args: Vec<String>, timeout_s: u64, cwd: Option<PathBuf>) -> Plan {
        Plan { args, timeout: Duration::from_secs(timeout_s), cwd, check_env: None }
    }
}

fn invalid(msg: String) -> McpError {
    McpError::invalid_params(msg, None)
}

/// The child run of `run_training` (`check`: `check_advice`), its bounds checked. Pure.
fn plan_run(a: &RunArgs, check: bool) -> Result<Plan, McpError> {
    if a.command.is_empty() || a.command[0].is_empty() {
        return Err(invalid(
            "command is empty: give the program and its arguments, e.g. [\"python\", \"train.py\"]".into(),
        ));
    }
    let steps = a.steps.unwrap_or(DEFAULT_STEPS);
    if !(2..=MAX_STEPS).contains(&steps) {
        return Err(invalid(format!("steps {steps}: give 2 to {MAX_STEPS}")));
    }
    let timeout_s = a.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
        return Err(invalid(format!("timeout_s {timeout_s}: give 1 to {MAX_TIMEOUT_S}")));
    }
    let cwd = a.cwd.as_ref().map(PathBuf::from);
    if let Some(d) = cwd.as_ref().filter(|d| !d.is_dir()) {
        return Err(invalid(format!("cwd {}: not a folder", d.display())));
    }
    let mut args: Vec<String> = vec!["run".into(), "--once".into(), "--json".into()];
    if let Some(p) = &a.summary {
        args.extend(["--summary".into(), p.clone()]);
    }
    if check {
        args.extend(["--check-advice".into(), "--steps".into(), steps.to_string()]);
    }
    args.push("--".into());
    args.extend(a.command.iter().cloned());
    // The main run too is stopped after its steps (check_advice's re-runs set their own).
    let check_env = Some(super::run::check::env_value(None, steps, None, super::run::check::Back::default()));
    Ok(Plan { args, timeout: Duration::from_secs(timeout_s), cwd, check_env })
}

/// The child run of `compare_runs`. Pure.
fn plan_compare(a: CompareArgs) -> Result<Plan, McpError> {
    let mut args: Vec<String> = vec!["compare".into(), "--json".into()];
    if let Some(p) = a.max_slowdown_pct {
        if !(p.is_finite() && p >= 0.0) {
            return Err(invalid(format!("max_slowdown_pct {p}: give a percentage ≥ 0")));
        }
        args.extend(["--max-slowdown".into(), p.to_string()]);
    }
    match a.fail_if_input_bound.as_deref() {
        None => {}
        Some(s @ ("moderate" | "high")) => args.push(format!("--fail-if-input-bound={s}")),
        Some(other) => return Err(invalid(format!("fail_if_input_bound {other:?}: give \"moderate\" or \"high\""))),
    }
    args.extend([a.base, a.new]);
    Ok(Plan::of(args, DEFAULT_TIMEOUT_S, None))
}

impl Server {
    /// Runs `plan`'s child and returns its stdout's JSON document; its exit code is not the
    /// tool's (a program that failed still has a verdict; a compare gate that failed is data).
    /// A child that gave no document is a tool error (`isError`, with `error` and its last
    /// lines of stderr), as the protocol has tools report failures the agent can act on;
    /// arguments out of bounds are the protocol's invalid-params error, before anything runs.
    async fn verdict(&self, plan: Plan, ctx: &RequestContext<RoleServer>) -> Result<CallToolResult, McpError> {
        let (stdout, tail, end) = run_child(&self.exe, &plan, ctx)
            .await
            .map_err(|e| McpError::internal_error(format!("cannot start pipeprof: {e}"), None))?;
        let timed_out = end == End::TimedOut;
        match serde_json::from_slice::<serde_json::Value>(&stdout) {
            Ok(doc) => {
                let mut r = CallToolResult::structured(doc);
                if timed_out {
                    r.content.push(ContentBlock::text(format!(
                        "stopped after its {} s: the verdict covers the steps it ran",
                        plan.timeout.as_secs()
                    )));
                }
                Ok(r)
            }
            Err(_) => {
                let why = match end {
                    End::TimedOut => format!("stopped after {} s with no verdict", plan.timeout.as_secs()),
                    End::Cancelled => "cancelled: stopped with no verdict".to_string(),
                    End::Done => "pipeprof gave no verdict".to_string(),
                };
                Ok(CallToolResult::structured_error(
                    serde_json::json!({ "error": format!("{why}: {tail}"), "stderr": tail }),
                ))
            }
        }
    }
}

/// How a child run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Done,
    TimedOut,
    Cancelled,
}

/// Keeps the last `n` non-blank lines of what it is fed, each cut at [`MAX_LINE`]. Pure.
#[derive(Debug, Default)]
struct Tail {
    lines: std::collections::VecDeque<String>,
}

impl Tail {
    fn push(&mut self, line: &str, n: usize) {
        if line.trim().is_empty() {
            return;
        }
        if self.lines.len() == n {
            self.lines.pop_front();
        }
        self.lines.push_back(line.chars().take(MAX_LINE).collect());
    }

    fn text(&self) -> String {
        self.lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

/// A child `pipeprof` this server started. Dropped before it ended (a call cancelled, the
/// client gone), it is interrupted as Ctrl-C interrupts it: it passes the interrupt to its
/// program and ends the program's group. Signals go by `Child::id`, `None` once the child is
/// reaped: never to a pid another process has since been given.
struct Running(tokio::process::Child);

impl Running {
    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.0.id() {
            // SAFETY: a signal to a child of this server that has not been reaped.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal(libc::SIGINT);
    }
}

/// The command `plan` runs: this binary with its arguments, no stdin, stdout and stderr
/// piped, interrupted when the server dies (and not started if it already has).
fn child_command(exe: &std::path::Path, plan: &Plan) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(&plan.args).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    cmd.stderr(std::process::Stdio::piped());
    if let Some(d) = &plan.cwd {
        cmd.current_dir(d);
    }
    if let Some(v) = &plan.check_env {
        cmd.env(probes::env::CHECK_ENV, v);
    }
    let server = std::process::id();
    // SAFETY: only async-signal-safe calls between fork and exec. The server gone (killed,
    // its client gone), the child is interrupted and ends its program; the server runs on one
    // thread, the one that forks, so the signal comes when the process ends. A server already
    // gone before the request was made: the child does not start.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
            if libc::getppid() != server as libc::pid_t {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd
}

/// Runs the child to its end, its time or the call's cancel: (its stdout, the last lines of
/// its stderr, how it ended). Interrupted, it has [`STOP_GRACE`] to end before it is killed.
async fn run_child(
    exe: &std::path::Path,
    plan: &Plan,
    ctx: &RequestContext<RoleServer>,
) -> std::io::Result<(Vec<u8>, String, End)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut child = Running(child_command(exe, plan).spawn()?);
    let (out, err) = (child.0.stdout.take(), child.0.stderr.take());
    // stdout is pipeprof's own (its program's output goes to stderr under --json): it closes
    // when pipeprof ends.
    let stdout = tokio::spawn(async move {
        let mut b = Vec::new();
        if let Some(mut o) = out {
            let _ = o.read_to_end(&mut b).await;
        }
        b
    });
    let tail = std::sync::Arc::new(std::sync::Mutex::new(Tail::default()));
    let kept = tail.clone();
    let stderr = tokio::spawn(async move {
        let Some(e) = err else { return };
        let mut lines = tokio::io::BufReader::new(e).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            kept.lock().unwrap_or_else(|p| p.into_inner()).push(&line, ERROR_LINES);
        }
    });
    let end = tokio::select! {
        _ = child.0.wait() => End::Done,
        () = tokio::time::sleep(plan.timeout) => End::TimedOut,
        () = ctx.ct.cancelled() => End::Cancelled,
    };
    if end != End::Done {
        child.signal(libc::SIGINT);
        if tokio::time::timeout(STOP_GRACE, child.0.wait()).await.is_err() {
            child.signal(libc::SIGKILL);
            let _ = child.0.wait().await;
        }
    }
    let stdout = tokio::time::timeout(DRAIN, stdout).await.ok().and_then(Result::ok).unwrap_or_default();
    // A process the program left behind may keep stderr open: its tail is what came by now.
    let mut stderr = stderr;
    if tokio::time::timeout(DRAIN, &mut stderr).await.is_err() {
        stderr.abort();
    }
    let text = tail.lock().unwrap_or_else(|p| p.into_inner()).text();
    Ok((stdout, text, end))
}

/// Serves MCP on stdin/stdout until the client goes away; every run still going is stopped.
pub fn run() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    // One thread: the children's parent-death signal is tied to the thread that forked them.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let service = Server::new(exe)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("MCP start-up failed: {e}"))?;
        service.waiting().await.map_err(|e| anyhow::anyhow!("MCP server: {e}"))?;
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(command: &[&str], steps: Option<u64>, timeout_s: Option<u64>) -> RunArgs {
        RunArgs { command: command.iter().map(|s| s.to_string()).collect(), steps, timeout_s, cwd: None, summary: None }
    }

    #[test]
    fn a_run_is_bounded_in_steps_and_time() {
        let p = plan_run(&args(&["python", "train.py"], None, None), false).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.args, ["run", "--once", "--json", "--", "python", "train.py"]);
        assert_eq!(p.timeout, Duration::from_secs(DEFAULT_TIMEOUT_S));
        let env: serde_json::Value = serde_json::from_str(p.check_env.as_deref().unwrap_or("")).unwrap_or_default();
        assert_eq!(env["steps"], DEFAULT_STEPS);
        let p = plan_run(&args(&["python", "t.py"], Some(12), Some(60)), true).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.args, ["run", "--once", "--json", "--check-advice", "--steps", "12", "--", "python", "t.py"]);
        let env: serde_json::Value = serde_json::from_str(p.check_env.as_deref().unwrap_or("")).unwrap_or_default();
        assert_eq!(env["steps"], 12, "check-advice's main run is bounded too");
    }

    #[test]
    fn out_of_bounds_arguments_are_invalid_params_naming_the_argument() {
        let cases = [
            (args(&[], None, None), "command"),
            (args(&["python"], Some(1), None), "steps"),
            (args(&["python"], Some(MAX_STEPS + 1), None), "steps"),
            (args(&["python"], None, Some(0)), "timeout_s"),
            (args(&["python"], None, Some(MAX_TIMEOUT_S + 1)), "timeout_s"),
        ];
        for (a, what) in cases {
            let e = plan_run(&a, false).err().map(|e| e.message.to_string()).unwrap_or_default();
            assert!(e.starts_with(what), "{what}: {e}");
        }
        let bad = CompareArgs {
            base: "a".into(),
            new: "b".into(),
            max_slowdown_pct: None,
            fail_if_input_bound: Some("low".into()),
        };
        assert!(plan_compare(bad).is_err());
        let good = CompareArgs {
            base: "a".into(),
            new: "b".into(),
            max_slowdown_pct: Some(10.0),
            fail_if_input_bound: Some("high".into()),
        };
        let p = plan_compare(good).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.args, ["compare", "--json", "--max-slowdown", "10", "--fail-if-input-bound=high", "a", "b"]);
    }

    #[test]
    fn an_error_carries_the_last_lines_cut_short() {
        let mut t = Tail::default();
        for l in ["a", "", "b", "c"] {
            t.push(l, 2);
        }
        assert_eq!(t.text(), "b\nc");
        t.push(&"x".repeat(MAX_LINE * 2), 2);
        assert_eq!(t.text().lines().last().map(str::len), Some(MAX_LINE));
        assert_eq!(Tail::default().text(), "");
    }
}
