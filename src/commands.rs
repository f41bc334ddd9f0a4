//! From the command line to the commands: each `cli` argument struct becomes the plain options
//! its command takes, and the command runs. The only module that knows both sides.

use crate::cli::{AttachArgs, CacheArgs, Cli, Command, DemoArgs, PackArgs, ProfileArgs, ReportArgs, RunArgs};
use crate::{attach, cache, check_advice, check_run, offline, profile, run as run_cmd};
use std::path::Path;

/// Runs the command the user asked for (`profile` on the built-in default when none); returns
/// the exit code: `run`'s is its program's, the others' 0.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let command = cli.command.unwrap_or_else(|| Command::Profile(Box::default()));
    if let Err(why) = outputs(&command).into_iter().try_for_each(|(flag, p)| check_output(flag, p)) {
        // A usage error, as clap's are: nothing has started.
        crate::progress::say(&format!("error: {why}"));
        return Ok(2);
    }
    if let Command::Run(a) = command {
        return run_and_check(a);
    }
    run_other(command).map(|()| 0)
}

/// `run`, then `--check-advice`'s re-runs when asked for and the program ended well. The
/// re-runs need the run's summary: written to a temporary file when `--summary` was not given.
fn run_and_check(a: RunArgs) -> anyhow::Result<i32> {
    if !a.check_advice {
        return run_cmd::run(&run_options(a));
    }
    if let Some(why) = check_run::stdin_refusal() {
        anyhow::bail!(why);
    }
    let check = check_run::Options {
        command: a.command.clone(),
        steps: a.steps.unwrap_or(check_run::DEFAULT_STEPS),
        sample_hz: a.sample_hz,
        no_gpu: a.no_gpu,
    };
    let mut opts = run_options(a);
    // The summary the re-runs need, when not asked for: in a private folder of its own (a
    // random name, 0700), never at a name in the shared temp folder another user could take.
    let own = opts
        .summary
        .is_none()
        .then(|| check_advice::TempDir::private("pipeprof-run"))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let summary = match &own {
        Some(d) => d.path().join("summary.json"),
        None => opts.summary.clone().unwrap_or_default(),
    };
    opts.summary = Some(summary.clone());
    let code = run_cmd::run(&opts);
    let read = std::fs::read(&summary);
    drop(own);
    let code = code?;
    if code != 0 || crate::signal::stopping() {
        crate::progress::out(&format!("\ncheck-advice: the program did not end well (exit code {code}): no re-runs\n"));
        return Ok(code);
    }
    let text = read.map_err(|e| anyhow::anyhow!("cannot read the run's summary {}: {e}", summary.display()))?;
    let s: crate::aggregate::Summary = serde_json::from_slice(&text)
        .map_err(|e| anyhow::anyhow!("cannot read the run's summary {}: {e}", summary.display()))?;
    let verdict = crate::diagnose::diagnose_finished(&s);
    check_run::run(&check, &s, &verdict);
    Ok(code)
}

/// The files a command will write, by flag.
fn outputs(command: &Command) -> Vec<(&'static str, &Path)> {
    let (summary, trace, out) = match command {
        Command::Run(a) => (&a.summary, &a.trace, None),
        Command::Profile(a) => (&a.summary, &a.trace, None),
        Command::Attach(a) => (&a.summary, &a.trace, None),
        Command::Report(a) => (&a.summary, &None, None),
        Command::Cache(a) => (&None, &None, Some(a.out.as_path())),
        Command::Pack(a) => (&None, &None, Some(a.out.as_path())),
        Command::DemoData(_) => (&None, &None, None),
    };
    let named = [("--summary", summary.as_deref()), ("--trace", trace.as_deref()), ("--out", out)];
    named.into_iter().filter_map(|(flag, p)| Some((flag, p?))).collect()
}

/// Refuses an output file whose folder does not exist (or that names a folder) before anything
/// starts: found at the end, it cost the run's summary, and `run` its program's exit code.
pub fn check_output(flag: &str, path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if path.is_dir() {
        return Err(format!("{flag} {}: is a folder; name a file in it", path.display()));
    }
    if !dir.is_dir() {
        let why = if dir.exists() { "is not a folder" } else { "does not exist" };
        return Err(format!(
            "{flag} {}: the folder {} {why}: create it first, or name a file in a folder that exists",
            path.display(),
            dir.display()
        ));
    }
    Ok(())
}

fn run_options(a: RunArgs) -> run_cmd::Options {
    run_cmd::Options {
        command: a.command,
        once: a.once,
        summary_asked: a.summary.is_some(),
        summary: a.summary,
        trace: a.trace,
        sample_hz: a.sample_hz,
        no_gpu: a.no_gpu,
        stop_timeout: std::time::Duration::from_secs_f64(a.stop_timeout),
        metrics_listen: a.metrics.metrics_listen,
        metrics_allow_remote: a.metrics.metrics_allow_remote,
    }
}

fn run_other(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(_) => Ok(()),
        Command::Profile(a) => profile(*a),
        Command::Attach(a) => attach::run(&attach_options(a)).map(|_| ()),
        Command::Report(a) => offline::run(&report_options(a)),
        Command::Cache(a) => cache::run(&cache_options(a)),
        Command::Pack(a) => cache::pack(&pack_options(a)),
        Command::DemoData(a) => demo_data(a),
    }
}

/// `profile`, then `--check-advice`'s follow-up runs when asked for and the run was not stopped.
fn profile(a: ProfileArgs) -> anyhow::Result<()> {
    let opts = profile_options(a);
    let run = profile::run(&opts)?;
    if opts.check_advice && !run.interrupted {
        let s = &run.done.summary;
        check_advice::run(opts.model.as_deref(), opts.steps, &run.data, s, &run.done.verdict());
    }
    Ok(())
}

pub fn profile_options(a: ProfileArgs) -> profile::Options {
    profile::Options {
        model: a.model,
        data: a.data,
        val_data: a.val_data,
        epochs: a.epochs,
        steps: a.steps,
        batch_size: a.batch_size,
        workers: a.workers,
        prefetch: a.prefetch,
        seed: a.seed,
        device: a.device,
        summary: a.summary,
        trace: a.trace,
        trace_level: a.trace_level.into(),
        sample_hz: a.sample_hz,
        no_gpu: a.no_gpu,
        throttle_read: a.throttle_read,
        slow: a.slow,
        panic_at_step: a.panic_at_step,
        panic_in_loader_at_step: a.panic_in_loader_at_step,
        no_tui: a.no_tui,
        check_advice: a.check_advice,
        channel_capacity: a.channel_capacity,
        metrics_listen: a.metrics.metrics_listen,
        metrics_allow_remote: a.metrics.metrics_allow_remote,
        stall_after: a.stall_after,
    }
}

fn attach_options(a: AttachArgs) -> attach::Options {
    attach::Options {
        target: a.targets.first().cloned(),
        also: a.targets.iter().skip(1).cloned().collect(),
        once: a.once,
        duration: a.duration,
        summary: a.summary,
        trace: a.trace,
        list: a.list,
        no_tui: a.no_tui,
        metrics_listen: a.metrics.metrics_listen,
        metrics_allow_remote: a.metrics.metrics_allow_remote,
    }
}

fn report_options(a: ReportArgs) -> offline::Options {
    offline::Options { files: a.files, repair: a.repair, summary: a.summary }
}

fn cache_options(a: CacheArgs) -> cache::CacheOptions {
    cache::CacheOptions { model: a.model, data: a.data, out: a.out, workers: a.workers, abort_after: a.abort_after }
}

fn pack_options(a: PackArgs) -> cache::PackOptions {
    let size = match (a.size, a.shorter, a.as_stored) {
        (Some((height, width)), _, _) => cache::Size::Fixed { height, width },
        (_, Some(shorter), _) => cache::Size::Shorter { shorter },
        (_, _, true) => cache::Size::AsStored,
        _ => cache::Size::Common,
    };
    cache::PackOptions { data: a.data, out: a.out, size, workers: a.workers }
}

fn demo_data(a: DemoArgs) -> anyhow::Result<()> {
    // Past a million images per class the demo writes for hours: refuse before writing.
    crate::config::validate::in_range("--per-class", a.per_class, 1, 1_000_000).map_err(anyhow::Error::msg)?;
    let spec = crate::data::demo::DemoSpec {
        classes: a.classes,
        per_class: a.per_class,
        size: a.size,
        format: a.format.into(),
        seed: a.seed,
    };
    let n = spec.write(&a.dir).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", a.dir.display()))?;
    crate::progress::out(&format!("wrote {n} images in {} classes to {}\n", spec.classes, a.dir.display()));
    Ok(())
}
