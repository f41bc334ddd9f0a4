//! From the command line to the commands: each `cli` argument struct becomes the plain options
//! its command takes, and the command runs. The only module that knows both sides.

use crate::cli::{
    AttachArgs, CacheArgs, Cli, Command, CompareArgs, DemoArgs, InputBound, PackArgs, ReportArgs, RunArgs,
};
use pipeprof_trainer::cache;
use std::path::Path;

pub mod attach;
pub mod compare;
pub mod mcp;
pub mod profile;
pub mod report;
pub mod rerun;
pub mod run;
pub mod scratch;

/// Runs the command the user asked for (`profile` on the built-in default when none); returns
/// the exit code: `run`'s is its program's, the others' 0.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let command = with_node(cli.command.unwrap_or_else(|| Command::Profile(Box::default())));
    let checked = outputs(&command).into_iter().try_for_each(|(flag, p)| check_output(flag, p));
    let checked = checked.and_then(|()| distinct_files(&outputs(&command), inputs(&command)));
    let checked = checked.and_then(|()| html_to_stdout(&command).map_or(Ok(()), Err));
    if let Err(why) = checked.and_then(|()| json_conflict(&command).map_or(Ok(()), Err)) {
        // A usage error, as clap's are: nothing has started.
        pipeprof_trainer::progress::say(&format!("error: {why}"));
        return Ok(2);
    }
    if json_wanted(&command) {
        pipeprof_trainer::progress::keep_stdout_for_json();
    }
    if let Command::Run(a) = command {
        return run_and_check(a);
    }
    if let Command::Compare(a) = command {
        return compare::run(&compare_options(a));
    }
    if let Command::Mcp = command {
        return mcp::run().map(|()| 0);
    }
    run_other(command).map(|()| 0)
}

/// `run`'s node found (flags, the launcher's environment, the command, the host name) and
/// `{node}` in its output paths replaced by its name; other commands as they are.
fn with_node(command: Command) -> Command {
    let Command::Run(mut a) = command else { return command };
    let program: Vec<String> = a.command.iter().map(|w| w.to_string_lossy().into_owned()).collect();
    let host = probes::NodeId::host_name();
    let src = probes::node::Sources {
        node: a.node.as_deref(),
        job: a.job.as_deref(),
        program: &program,
        host: host.as_deref(),
    };
    let node = probes::NodeId::detect(&src, |k| std::env::var(k).ok());
    for p in [&mut a.out.summary, &mut a.out.trace, &mut a.out.html] {
        if let Some(path) = p.as_mut() {
            *path = node.fill(path);
        }
    }
    a.node_id = node;
    Command::Run(a)
}

/// `run`, then `--check-advice`'s re-runs when asked for and the program ended well, judged
/// on the run's own summary and verdict.
fn run_and_check(a: RunArgs) -> anyhow::Result<i32> {
    let json = a.json;
    if !a.check_advice {
        let ran = run::run(&run_options(a))?;
        print_json(json, &ran.done, &[])?;
        return Ok(ran.code);
    }
    if let Some(why) = run::check::stdin_refusal() {
        anyhow::bail!(why);
    }
    let check = run::check::Options {
        command: a.command.clone(),
        steps: a.steps.unwrap_or(rerun::DEFAULT_STEPS),
        sample_hz: a.sample_hz,
        no_gpu: a.no_gpu,
    };
    let ran = run::run(&run_options(a))?;
    if ran.code != 0 || pipeprof_core::signal::stopping() {
        let code = ran.code;
        pipeprof_trainer::progress::out(&format!(
            "\ncheck-advice: the program did not end well (exit code {code}): no re-runs\n"
        ));
        print_json(json, &ran.done, &[])?;
        return Ok(code);
    }
    let checked = run::check::run(&check, &ran.done.summary, &ran.done.verdict());
    print_json(json, &ran.done, &checked)?;
    Ok(ran.code)
}

/// `--json`'s document on stdout, when asked for: the run's verdict, with what each checked
/// advice measured.
fn print_json(
    json: bool,
    done: &pipeprof_core::diagnose::Diagnosed,
    checked: &[Option<crate::report::json::Checked>],
) -> anyhow::Result<()> {
    if json {
        let doc = crate::report::json::VerdictJson::of(done, checked);
        pipeprof_trainer::progress::json_out(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    Ok(())
}

/// Whether the command prints `--json`'s document, which then holds stdout alone.
fn json_wanted(command: &Command) -> bool {
    match command {
        Command::Run(a) => a.json,
        Command::Profile(a) => a.json,
        Command::Attach(a) => a.json,
        Command::Report(a) => a.json,
        _ => false,
    }
}

/// `--json` with another output that wants stdout.
fn json_conflict(command: &Command) -> Option<String> {
    let Command::Report(a) = command else { return None };
    if !a.json {
        return None;
    }
    let dash = |p: &Option<std::path::PathBuf>| p.as_deref() == Some(Path::new("-"));
    (dash(&a.html) || dash(&a.html_fragment))
        .then(|| "--json and --html -: stdout takes one of them; name a file for the HTML".into())
}

/// The files a command will write, by flag (`report`'s `-`, stdout, is no file).
fn outputs(command: &Command) -> Vec<(&'static str, &Path)> {
    let (summary, trace, out, html, fragment) = match command {
        Command::Run(a) => (&a.out.summary, &a.out.trace, None, &a.out.html, &None),
        Command::Profile(a) => (&a.summary, &a.trace, None, &a.html, &None),
        Command::Attach(a) => (&a.out.summary, &a.out.trace, None, &a.out.html, &None),
        Command::Report(a) => (&a.summary, &None, None, &a.html, &a.html_fragment),
        Command::Compare(_) | Command::Mcp => (&None, &None, None, &None, &None),
        Command::Cache(a) => (&None, &None, Some(a.out.as_path()), &None, &None),
        Command::Pack(a) => (&None, &None, Some(a.out.as_path()), &None, &None),
        Command::DemoData(_) => (&None, &None, None, &None, &None),
    };
    let named = [
        ("--summary", summary.as_deref()),
        ("--trace", trace.as_deref()),
        ("--out", out),
        ("--html", html.as_deref()),
        ("--html-fragment", fragment.as_deref()),
    ];
    let stdout = |flag: &str, p: &Path| flag.starts_with("--html") && p == Path::new("-");
    let report = matches!(command, Command::Report(_));
    named.into_iter().filter_map(|(flag, p)| Some((flag, p?))).filter(|(f, p)| !(report && stdout(f, p))).collect()
}

/// The files a command reads that an output could overwrite: `report`'s saved runs.
fn inputs(command: &Command) -> &[std::path::PathBuf] {
    match command {
        Command::Report(a) => &a.files,
        _ => &[],
    }
}

/// Refuses two outputs that name one file (`--summary s --html s`: the page overwrote the
/// summary), and an output that names an input (`report s.json --html s.json` replaced the
/// saved run with its page), before anything starts. Links and `..` are followed.
fn distinct_files(outputs: &[(&str, &Path)], inputs: &[std::path::PathBuf]) -> Result<(), String> {
    let files: Vec<_> =
        outputs.iter().filter(|(_, p)| *p != Path::new("-")).map(|&(f, p)| (f, p, one_name(p))).collect();
    for (i, (flag, p, name)) in files.iter().enumerate() {
        if let Some((other, ..)) = files[..i].iter().find(|(_, _, n)| n == name) {
            return Err(format!("{flag} {}: is also the {other} file; name two different files", p.display()));
        }
        if inputs.iter().any(|input| one_name(input) == *name) {
            return Err(format!(
                "{flag} {}: is the file being read; writing there would replace it: name another file",
                p.display()
            ));
        }
    }
    Ok(())
}

/// One name for the file `path` names, whether it exists or not: resolved whole when it does
/// (a link to it is it), else its folder resolved and its own name kept.
fn one_name(path: &Path) -> Option<std::path::PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    Some(folder_of(path).canonicalize().ok()?.join(path.file_name()?))
}

/// The folder a file name is in: `.` for a bare name.
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// `--html -` where stdout is the program's and the report's own (`run`, `profile`, `attach`).
fn html_to_stdout(command: &Command) -> Option<String> {
    let html = match command {
        Command::Run(a) => &a.out.html,
        Command::Profile(a) => &a.html,
        Command::Attach(a) => &a.out.html,
        _ => return None,
    };
    (html.as_deref() == Some(Path::new("-"))).then(|| {
        "--html -: the program's output and the text report go to stdout; name a file (pipeprof report \
         SUMMARY --html - writes a saved run's HTML to stdout)"
            .to_string()
    })
}

/// Refuses an output file whose folder does not exist (or that names a folder) before anything
/// starts: found at the end, it cost the run's summary, and `run` its program's exit code.
fn check_output(flag: &str, path: &Path) -> Result<(), String> {
    let dir = folder_of(path);
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

fn run_options(a: RunArgs) -> run::Options {
    run::Options {
        command: a.command,
        once: a.once,
        summary: a.out.summary,
        trace: a.out.trace,
        html: a.out.html,
        sample_hz: a.sample_hz,
        no_gpu: a.no_gpu,
        stop_timeout: std::time::Duration::from_secs_f64(a.stop_timeout),
        metrics_listen: a.metrics.metrics_listen,
        metrics_allow_remote: a.metrics.metrics_allow_remote,
        node: a.node_id,
    }
}

fn run_other(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(_) | Command::Compare(_) | Command::Mcp => Ok(()),
        Command::Profile(a) => profile(*a),
        Command::Attach(a) => {
            let json = a.json;
            let done = attach::run(&attach_options(a))?;
            print_json(json, &done, &[])
        }
        Command::Report(a) => {
            let json = a.json;
            let done = report::run(&report_options(a))?;
            done.map_or(Ok(()), |d| print_json(json, &d, &[]))
        }
        Command::Cache(a) => cache::run(&cache_options(a)),
        Command::Pack(a) => cache::pack(&pack_options(a)),
        Command::DemoData(a) => demo_data(a),
    }
}

/// `profile`, then `--check-advice`'s follow-up runs when asked for and the run was not stopped.
fn profile(opts: profile::Options) -> anyhow::Result<()> {
    let run = profile::run(&opts)?;
    let mut checked = Vec::new();
    if opts.check_advice && !run.interrupted {
        checked = profile::check::run(&opts, &run.data, &run.done.summary, &run.done.verdict());
    }
    print_json(opts.json, &run.done, &checked)
}

fn attach_options(a: AttachArgs) -> attach::Options {
    attach::Options {
        target: a.targets.first().cloned(),
        also: a.targets.iter().skip(1).cloned().collect(),
        once: a.once,
        duration: a.duration,
        summary: a.out.summary,
        trace: a.out.trace,
        html: a.out.html,
        list: a.list,
        no_tui: a.no_tui,
        metrics_listen: a.metrics.metrics_listen,
        metrics_allow_remote: a.metrics.metrics_allow_remote,
    }
}

fn compare_options(a: CompareArgs) -> compare::Options {
    use pipeprof_core::diagnose::Severity;
    compare::Options {
        base: a.base,
        new: a.new,
        gate: pipeprof_core::diagnose::compare::Gate {
            max_slowdown_pct: a.max_slowdown,
            fail_if_input_bound: a.fail_if_input_bound.map(|b| match b {
                InputBound::Moderate => Severity::Moderate,
                InputBound::High => Severity::High,
            }),
        },
        json: a.json,
    }
}

fn report_options(a: ReportArgs) -> report::Options {
    report::Options {
        files: a.files,
        repair: a.repair,
        summary: a.summary,
        html: a.html,
        html_fragment: a.html_fragment,
        json: a.json,
    }
}

fn cache_options(a: CacheArgs) -> cache::CacheOptions {
    cache::CacheOptions { model: a.model, data: a.data, out: a.out, workers: a.workers, abort_after: a.abort_after }
}

/// `pipeprof pack`'s flags as the command's options (public for the tests that round-trip a
/// rebuild command through the parser).
pub fn pack_options(a: PackArgs) -> cache::PackOptions {
    let size = match (a.size, a.shorter, a.as_stored) {
        (Some((height, width)), _, _) => cache::Size::Fixed { height, width },
        (_, Some(shorter), _) => cache::Size::Shorter { shorter },
        (_, _, true) => cache::Size::AsStored,
        _ => cache::Size::Common,
    };
    cache::PackOptions { data: a.data, out: a.out, size, layout: a.layout.into(), workers: a.workers }
}

fn demo_data(a: DemoArgs) -> anyhow::Result<()> {
    let spec = pipeprof_trainer::data::demo::DemoSpec {
        classes: a.classes,
        per_class: a.per_class,
        size: a.size,
        format: a.format.into(),
        seed: a.seed,
    };
    let n = spec.write(&a.dir).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", a.dir.display()))?;
    pipeprof_trainer::progress::out(&format!("wrote {n} images in {} classes to {}\n", spec.classes, a.dir.display()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn profile_args(args: &[std::ffi::OsString]) -> Result<profile::Options, String> {
        let argv = std::iter::once("pipeprof".into()).chain(args.iter().cloned());
        match Cli::try_parse_from(argv).map_err(|e| e.to_string())?.command {
            Some(Command::Profile(a)) => Ok(*a),
            _ => Err("not profile".into()),
        }
    }

    #[test]
    fn counts_out_of_range_are_refused_by_the_command_line_naming_the_flag() {
        for (flag, bad) in [
            ("--steps", "0"),
            ("--batch-size", "0"),
            ("--batch-size", "65537"),
            ("--prefetch", "0"),
            ("--prefetch", "1099511627776"),
            ("--epochs", "0"),
            ("--workers", "4294967296"),
            ("--workers", "0"),
            ("--channel-capacity", "0"),
            ("--channel-capacity", "16777217"),
        ] {
            let e = profile_args(&["profile".into(), flag.into(), bad.into()]).expect_err(flag);
            assert!(e.contains(&format!("invalid value '{bad}' for '{flag}")), "{flag} {bad}: {e}");
        }
        let most = profile_args(&["profile".into(), "--batch-size".into(), "65536".into()]);
        assert!(most.is_ok(), "{most:?}");
        let e = Cli::try_parse_from(["pipeprof", "demo-data", "d", "--per-class", "1000001"]).unwrap_err();
        assert!(e.to_string().contains("--per-class"), "{e}");
    }

    #[test]
    fn outputs_that_name_one_file_or_an_input_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let saved = dir.path().join("keep.json");
        std::fs::write(&saved, "{}").expect("saved run");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&saved, &link).expect("link");
        let new = dir.path().join("new.html");
        let also_new = dir.path().join("sub/../new.html");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        let inputs = [saved.clone()];
        // (outputs, inputs, the refusal's start)
        type Case<'a> = (&'a [(&'a str, &'a Path)], &'a [std::path::PathBuf], Option<&'a str>);
        let table: [Case; 6] = [
            (&[("--html", &saved)], &inputs, Some("--html")),
            (&[("--html", &link)], &inputs, Some("--html")),
            (&[("--summary", &new), ("--html", &also_new)], &[], Some("--html")),
            (&[("--summary", &new), ("--html", Path::new("-"))], &[], None),
            (&[("--summary", &new), ("--trace", &saved)], &[], None),
            (&[("--html", Path::new("-")), ("--html-fragment", Path::new("-"))], &[], None),
        ];
        for (outs, ins, refused) in table {
            let got = distinct_files(outs, ins);
            match refused {
                Some(flag) => assert!(got.as_ref().is_err_and(|e| e.starts_with(flag)), "{outs:?}: {got:?}"),
                None => assert_eq!(got, Ok(()), "{outs:?}"),
            }
        }
    }
}
