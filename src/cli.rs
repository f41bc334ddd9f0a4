//! Command-line interface: every clap type lives here but two, which live with what they
//! define: `profile`'s flags are [`crate::commands::profile::Options`] (checked and written back as flags
//! there), `--metrics-listen`'s are [`crate::metrics::MetricsArgs`]. The other commands take
//! plain option structs; `commands` converts. This module looks down only.

use clap::{Args, Parser, Subcommand, ValueEnum};
use pipeprof_core::flags;
use pipeprof_core::limits::{MAX_PER_CLASS, MAX_WORKERS};
use pipeprof_trainer::data::demo::DemoFormat;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "pipeprof",
    version,
    about = "Why is my GPU idle? Profile a training run stage by stage (read, decode, resize, \
             wait, transfer, compute) and see what limits it: your own PyTorch or Keras script \
             (`pipeprof run -- python train.py`), or a real candle CNN (`pipeprof profile`)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a CNN described in cnn.toml on an image folder and report per-stage timings.
    ///
    /// With no arguments: the built-in model (examples/cnn.toml) on a generated data set.
    Profile(Box<crate::commands::profile::Options>),
    /// Start a training program instrumented and watch it: `pipeprof run -- python train.py`.
    ///
    /// A Python script needs no edit: PyTorch DataLoader iterations and Keras `fit` are timed
    /// (wait, transfer, compute, and each DataLoader worker's fetches), and the DataLoader's
    /// settings are read. The program's exit code is pipeprof's.
    Run(RunArgs),
    /// Watch a training run in another process (instrumented with pipeprof's probes crate).
    Attach(AttachArgs),
    /// Re-read a trace or summary JSON and print its report; with two files, compare them; with
    /// one per rank of a distributed run, the ranks side by side and the straggler.
    Report(ReportArgs),
    /// Two saved runs side by side, for CI: what got slower, stage by stage, and whether the
    /// verdict changed; with a gate (`--max-slowdown`, `--fail-if-input-bound`), exits 1 naming
    /// why when the new run fails it.
    Compare(CompareArgs),
    /// Serve the Model Context Protocol on stdin/stdout for coding agents: tools that run a
    /// training command under pipeprof for N steps (bounded in time too), check its advice,
    /// report a saved run and compare two, each answering with `--json`'s document.
    ///
    /// An agent's MCP configuration names it as a stdio server: {"command": "pipeprof",
    /// "args": ["mcp"]}.
    Mcp,
    /// Write a deterministic demo data set (one folder per class) to DIR.
    DemoData(DemoArgs),
    /// Decode and resize every image once into one packed file; `profile --data FILE` trains from it.
    Cache(CacheArgs),
    /// Pack an image folder into one file of decoded pixels that PyTorch and Keras read in one
    /// line: `pipeprof.data.PackedImageFolder(OUT, transform=...)` in place of
    /// `ImageFolder(DIR, ...)`, `pipeprof.keras.packed_dataset(OUT, ...)` in place of
    /// `image_dataset_from_directory(DIR, ...)`.
    ///
    /// The images, classes and order are torchvision's ImageFolder(DIR)'s; pixels are RGB,
    /// decoded and resized (bilinear, antialiased: PIL's Image.BILINEAR, as torchvision's
    /// Resize) once, on every core. Without a size, every image must have the same size.
    Pack(PackArgs),
}

#[derive(Debug, Args, Clone)]
#[command(group = clap::ArgGroup::new("stored_size").multiple(false))]
pub struct PackArgs {
    /// Image folder with one sub-folder per class.
    #[arg(value_name = "DIR")]
    pub data: PathBuf,
    /// The packed file to write (replaced atomically; e.g. data.ppk).
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Store every image at S×S (or W×H: `--size 160x224` is 160 wide, 224 high), aspect not
    /// kept, as torchvision's Resize((S, S)) / Resize((H, W)).
    #[arg(long, value_name = "S|WxH", group = "stored_size", value_parser = parse_pack_size)]
    pub size: Option<(u32, u32)>,
    /// Store every image with its shorter side S, aspect kept, as torchvision's Resize(S).
    #[arg(long, value_name = "S", group = "stored_size", value_parser = clap::value_parser!(u32).range(1..=MAX_SIDE as i64))]
    pub shorter: Option<u32>,
    /// Store every image at the size it has.
    #[arg(long, group = "stored_size")]
    pub as_stored: bool,
    /// Whose files, classes and order to pack: torchvision's ImageFolder(DIR)'s (hidden class
    /// folders kept, .tif/.webp/.ppm/.pgm read, GIF not) or Keras's
    /// image_dataset_from_directory(DIR)'s (hidden class folders skipped, only .bmp .gif .jpeg
    /// .jpg .png). pipeprof.keras.packed_dataset reads only a keras-layout file.
    #[arg(long, value_enum, default_value_t = PackLayout::Imagefolder)]
    pub layout: PackLayout,
    /// Decode threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
}

/// `pack --layout`: whose folder rules the packed file follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PackLayout {
    /// torchvision.datasets.ImageFolder (PyTorch: pipeprof.data.PackedImageFolder).
    Imagefolder,
    /// keras.utils.image_dataset_from_directory (pipeprof.keras.packed_dataset).
    Keras,
}

impl From<PackLayout> for pipeprof_trainer::data::scan::Rules {
    fn from(l: PackLayout) -> Self {
        match l {
            PackLayout::Imagefolder => pipeprof_trainer::data::scan::Rules::ImageFolder,
            PackLayout::Keras => pipeprof_trainer::data::scan::Rules::Keras,
        }
    }
}

/// The largest side `pack` stores an image at.
pub const MAX_SIDE: u32 = 16384;

/// `pack --size`: `S` (S×S) or `WxH` (as `demo-data --size`), each side 1 to [`MAX_SIDE`];
/// returns (height, width).
fn parse_pack_size(text: &str) -> Result<(u32, u32), String> {
    if text.contains(['x', 'X', '×']) {
        return parse_size(text).map(|(w, h)| (h, w));
    }
    match text.trim().parse::<u32>() {
        Ok(v) if (1..=MAX_SIDE).contains(&v) => Ok((v, v)),
        _ => Err(format!("size must be S (S×S pixels) or WxH, each 1–{MAX_SIDE}, e.g. 224 or 160x224, got {text:?}")),
    }
}

#[derive(Debug, Args, Clone)]
pub struct CacheArgs {
    /// The model whose [input] size the images are resized to. Default: the built-in examples/cnn.toml.
    #[arg(long = flags::MODEL, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Image folder with one sub-folder per class.
    #[arg(long = flags::DATA, value_name = "DIR")]
    pub data: PathBuf,
    /// The cache file to write (replaced atomically; e.g. imgs.ppk).
    #[arg(long = flags::OUT, value_name = "FILE")]
    pub out: PathBuf,
    /// Decode threads (default: one per core).
    #[arg(long = flags::WORKERS, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_WORKERS as u64))]
    pub workers: Option<usize>,
    /// Testing hook: abort (as kill -9 would) after N images are written.
    #[arg(long, hide = true)]
    pub abort_after: Option<usize>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pipeprof compare base.json new.json\n  \
pipeprof compare --max-slowdown 10 --fail-if-input-bound=high base.json new.json   # exit 1 when either fails\n  \
pipeprof compare --json base.json new.json | python -m json.tool\n\n\
Exit status: 0 when the gates pass (or none is given), 1 when one fails (each reason on a line of\n\
stderr, \"pipeprof compare: FAILED: …\"), 2 on a usage error or a file that does not read.")]
pub struct CompareArgs {
    /// The base run: a trace (--trace) or summary (--summary) file, e.g. main's, kept as a CI
    /// artifact.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// The new run: a trace or summary file of the change being checked.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// Fail (exit 1) when NEW trains more than PCT percent fewer images/s than BASE (each at
    /// the rate its verdict reads: validation and a one-off first step left out).
    #[arg(long, value_name = "PCT", value_parser = crate::cli::percent)]
    pub max_slowdown: Option<f64>,
    /// Fail (exit 1) when NEW's verdict is input-bound (storage, preprocessing, or the loader
    /// waiting for cores) at this severity or worse (moderate: ≥ 5% of each step waiting for
    /// data; high: ≥ 20%), or has too few steps for a verdict. Alone it means moderate; a
    /// severity is given with `=` (`--fail-if-input-bound=high`).
    #[arg(long, value_name = "SEVERITY", num_args = 0..=1, require_equals = true, default_missing_value = "moderate")]
    pub fail_if_input_bound: Option<InputBound>,
    /// Print the comparison as one JSON document on stdout instead of the table (the gate's
    /// failures in it too); the exit status is the same.
    #[arg(long)]
    pub json: bool,
}

/// `--fail-if-input-bound`'s severities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputBound {
    Moderate,
    High,
}

/// A percentage from 0 to 100.
pub fn percent(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().trim_end_matches('%').parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{v} is not a percentage from 0 to 100"));
    }
    Ok(v)
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A trace (--trace) or summary (--summary) file; two files = before and after; one trace
    /// per rank of a distributed run (`--trace`'s .rankN.json files) = the per-rank table and
    /// the straggler. A folder = a job's shared folder: every node's summary and rank traces
    /// in it, as one job (the ranks of every node, the straggler named with its node, each
    /// node's machine).
    #[arg(required = true, num_args = 1.., value_name = "FILE|DIR")]
    pub files: Vec<PathBuf>,
    /// Close a trace cut short (run killed with kill -9) in place, then report it.
    #[arg(long)]
    pub repair: bool,
    /// Also write the (recomputed) summary JSON here.
    #[arg(long, value_name = "FILE")]
    pub summary: Option<PathBuf>,
    /// Also write the report as one self-contained HTML page (verdict, tables, charts; no
    /// script, nothing fetched). `-` writes it to stdout instead of the text report.
    #[arg(long = flags::HTML, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Write the HTML report's body alone: one <div class="pipeprof"> carrying its own style,
    /// to show inside another page (a notebook cell). `-` writes it to stdout instead of the
    /// text report.
    #[arg(long, value_name = "FILE")]
    pub html_fragment: Option<PathBuf>,
    /// Print the verdict as one JSON document on stdout (schema pipeprof.verdict/2:
    /// docs/schema/verdict.schema.json): the limiter, the evidence as figures, the advice as
    /// data. The report and every other line go to stderr (one run, or the ranks of one: two runs compare with `pipeprof compare --json`).
    #[arg(long)]
    pub json: bool,
}

/// The files `run` and `attach` write of what they saw.
#[derive(Args, Debug, Clone, Default)]
pub struct Outputs {
    /// Write the summary JSON of what was measured (with `failed` when the program failed).
    #[arg(long, value_name = "FILE")]
    pub summary: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace of every span seen, of every process of the run.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write the report as one self-contained HTML page at the end (charts included).
    #[arg(long = flags::HTML, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  pipeprof run -- python train.py --epochs 2\n  pipeprof run --once --summary s.json -- python -m mypkg.train\n  pipeprof run --once --check-advice --steps 30 -- python train.py   # runs train.py again, once per advice\n\n\
The live view shows on a terminal (the program's output then goes to a log file, and q or \
Ctrl-C interrupts the program); with --once, or off a terminal, the program keeps the \
terminal and the report follows when it ends."
)]
pub struct RunArgs {
    /// No live view: the program keeps the terminal; the report is printed when it ends.
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub out: Outputs,
    /// Host and GPU samples per second.
    #[arg(long, default_value_t = probes::sampler::DEFAULT_HZ, value_name = "HZ")]
    pub sample_hz: f64,
    /// Do not sample the GPU (NVML).
    #[arg(long)]
    pub no_gpu: bool,
    /// After an interrupt is passed on, how long the program has to end before pipeprof sends
    /// SIGTERM to its whole process group (its workers too), and SIGKILL 5 s later. Ctrl-C a
    /// second time sends SIGTERM at once and ends pipeprof.
    #[arg(long, default_value_t = pipeprof_core::signal::STOP_TIMEOUT.as_secs_f64(), value_name = "SECONDS", value_parser = parse_seconds)]
    pub stop_timeout: f64,
    /// After the report, run the program again, briefly, once as it is and once per piece of
    /// advice the start-up hook can apply without an edit (DataLoader num_workers,
    /// persistent_workers, prefetch_factor, pin_memory, batch_size; Keras PyDataset workers),
    /// and print predicted vs measured images/s. The program really runs again, each time:
    /// its output is hidden, but its side effects (checkpoints, logs, files it writes) are
    /// its own. Refused when its standard input is a pipe or a file (it cannot be given twice).
    #[arg(long)]
    pub check_advice: bool,
    /// With --check-advice: training steps per re-run (the hook stops the program there).
    #[arg(long, value_name = "N", requires = "check_advice", value_parser = clap::value_parser!(u64).range(2..))]
    pub steps: Option<u64>,
    /// Print the verdict as one JSON document on stdout (schema pipeprof.verdict/2:
    /// docs/schema/verdict.schema.json): the limiter, the evidence as figures, the advice as
    /// data. The report and every other line go to stderr, and so does the program's own stdout; no live view.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub metrics: crate::metrics::MetricsArgs,
    /// This machine's name in a job on several nodes (default: Slurm's SLURMD_NODENAME, else
    /// the host name). The summary, every rank's line and trace and every /metrics series
    /// carry it; `{node}` in --summary, --trace and --html is replaced by it, so every node
    /// can write into one shared folder.
    #[arg(long, value_name = "NAME", value_parser = parse_node_name)]
    pub node: Option<String>,
    /// The training job's id, the same on every node (default: torchrun's --rdzv-id in the
    /// command, SLURM_JOB_ID, TORCHELASTIC_RUN_ID).
    #[arg(long, value_name = "ID", value_parser = parse_node_name)]
    pub job: Option<String>,
    /// The program and its arguments, after `--`.
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
    /// The node this run is on, from --node, --job, the environment and the command; filled
    /// by the command before anything runs.
    #[arg(skip)]
    pub node_id: probes::NodeId,
}

#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// A PID, a socket path or HOST:PORT. Default: the one instrumented run found. Several:
    /// the ranks of a distributed run side by side (each process's RANK, else the order given).
    #[arg(value_name = "TARGET")]
    pub targets: Vec<String>,
    /// No live view: collect until the run ends (or --duration passes), then print the report.
    #[arg(long)]
    pub once: bool,
    /// Detach after this many seconds (more than 0, up to 30 days).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub out: Outputs,
    /// List the instrumented runs that can be attached to, and exit.
    #[arg(long)]
    pub list: bool,
    /// No live view even on a terminal: a progress line, then the report.
    #[arg(long)]
    pub no_tui: bool,
    /// Print the verdict as one JSON document on stdout (schema pipeprof.verdict/2:
    /// docs/schema/verdict.schema.json): the limiter, the evidence as figures, the advice as
    /// data. The report and every other line go to stderr; no live view.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub metrics: crate::metrics::MetricsArgs,
}

/// `demo-data --format` (see [`DemoFormat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoFormatArg {
    Jpeg,
    Png,
    /// Alternate JPEG and PNG.
    Mixed,
}

impl From<DemoFormatArg> for DemoFormat {
    fn from(a: DemoFormatArg) -> DemoFormat {
        match a {
            DemoFormatArg::Jpeg => DemoFormat::Jpeg,
            DemoFormatArg::Png => DemoFormat::Png,
            DemoFormatArg::Mixed => DemoFormat::Mixed,
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Folder to write (created if missing).
    pub dir: PathBuf,
    /// Number of classes (1–6: circle, cross, ring, square, stripes, triangle).
    #[arg(long, default_value_t = 4)]
    pub classes: usize,
    /// Images per class (up to a million: past that the demo writes for hours).
    #[arg(long, default_value_t = 96, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_PER_CLASS as u64))]
    pub per_class: usize,
    /// Image size WxH; default: mixed sizes between 48 and 160 pixels.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<(u32, u32)>,
    /// File format.
    #[arg(long, value_enum, default_value_t = DemoFormatArg::Mixed)]
    pub format: DemoFormatArg,
    /// Seed for the generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s.split_once(['x', 'X', '×']).ok_or_else(|| format!("size must be WxH, e.g. 150x150, got {s:?}"))?;
    let p = |v: &str| v.trim().parse::<u32>().ok().filter(|n| *n > 0 && *n <= 16384);
    match (p(w), p(h)) {
        (Some(w), Some(h)) => Ok((w, h)),
        _ => Err(format!("size must be WxH with 1–16384 pixels each, got {s:?}")),
    }
}

/// Longest `attach --duration`: 30 days.
pub const MAX_DURATION_S: f64 = 30.0 * 24.0 * 3600.0;

/// A node name or job id as given: it goes into file names and label values as it is, so
/// letters, digits, `-`, `_` and `.` only, up to 64, and not only dots.
fn parse_node_name(s: &str) -> Result<String, String> {
    match probes::node::clean(s) {
        Some(c) if c == s => Ok(c),
        _ => Err(format!(
            "{s:?}: use letters, digits, '-', '_' and '.' only (up to {} characters, not only dots): it names files and metric labels",
            probes::node::MAX_NAME
        )),
    }
}

/// A positive, finite number of seconds up to [`MAX_DURATION_S`].
fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    if !(v.is_finite() && v > 0.0 && v <= MAX_DURATION_S) {
        return Err(format!("must be more than 0 and at most {MAX_DURATION_S} seconds (30 days), got {s:?}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("150x100"), Ok((150, 100)));
        assert!(parse_size("150").is_err());
        assert!(parse_size("0x5").is_err());
    }
}
