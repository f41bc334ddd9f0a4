//! The run's settings, as pipeprof knows them or as a program, a socket or a file said them:
//! merged key by key, each value range-checked, each name capped and stripped of control
//! characters. Pure.
//!
//! Settings come from outside: a producer's hello or settings frame (any local process of the
//! run), an attached program, a trace or summary read back. A number out of range
//! (`{"cores": 1e11}` sized a table of 10^11 cores) is refused like a key whose value does not
//! read: listed in [`RunSettings::unreadable`], the others kept. A name (a 900 KB program name
//! became 533 MB of report) is cut to [`MAX_NAME`] characters before anything formats it.

use super::{Device, Framework};
use crate::limits::{in_range, MAX_BATCH_SIZE, MAX_EPOCHS, MAX_PREFETCH, MAX_WORKERS};
use crate::model_source::ModelSource;
use serde::{Deserialize, Serialize};

/// Most cores a run may claim (the views size their tables and candidate pipelines by it).
pub const MAX_CORES: usize = 1 << 16;
/// Largest side or channel count of the input.
pub const MAX_INPUT_SIDE: usize = 1 << 16;
/// Most images in a data set.
pub const MAX_IMAGES: usize = 1 << 40;
/// Most parameters of a model.
pub const MAX_PARAMS: usize = 1 << 44;
/// Longest name kept (a program, model, data folder, class, device, framework), in characters.
pub const MAX_NAME: usize = 256;
/// Most entries kept in a list of notes (simulated slowdowns, `--workers auto` steps, refused
/// keys).
pub const MAX_LISTED: usize = 4096;
/// Most classes (ImageNet-21k has 21,841).
pub const MAX_CLASSES: usize = 1 << 17;

/// Settings of the run, echoed in the report and summary.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default)]
pub struct RunSettings {
    /// Where the model came from (the built-in, a `cnn.toml`, a program's own name); written
    /// as its name.
    pub model: ModelSource,
    /// The machine this run is on, within its training job (`pipeprof run`: host name or
    /// `--node`, the job's id, the node's rank); absent for pipeprof's own training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<probes::NodeId>,
    pub data: String,
    pub images: usize,
    pub classes: Vec<String>,
    /// The device the run trains on, as it named it (`"cuda:0"`, `"cpu"`); `""` unseen.
    #[schemars(with = "String")]
    pub device: Device,
    pub workers: usize,
    pub cores: usize,
    pub batch_size: usize,
    pub prefetch: usize,
    pub epochs: usize,
    pub max_steps: Option<u64>,
    pub seed: u64,
    pub input: [usize; 3],
    pub params: usize,
    /// Simulated slowdowns active in this run (`--throttle-read 2MB/s`, `--slow decode=+5ms`),
    /// shown in every report and flagged by the diagnosis.
    pub simulated: Vec<String>,
    /// How `--workers auto` chose the worker count, step by step (empty for a fixed count).
    pub auto_workers: Vec<String>,
    /// Files in class folders that are not images pipeprof reads, by extension ("3 .txt,
    /// 1 .heic"); empty when there were none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ignored: String,
    /// The framework of an attached or `pipeprof run` program ("pytorch", "keras"); empty for
    /// pipeprof's own training. Advice names that framework's knobs.
    #[serde(skip_serializing_if = "Framework::is_own")]
    #[schemars(with = "String")]
    pub framework: Framework,
    /// PyTorch `DataLoader(pin_memory=…)`, when the run said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_memory: Option<bool>,
    /// PyTorch `DataLoader(persistent_workers=…)`, when the run said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_workers: Option<bool>,
    /// The program reports no correct-prediction counts (a PyTorch loop profiled with no edit):
    /// views show no accuracy rather than 0%.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_accuracy: bool,
    /// The program's host→device copies are not timed apart (a PyTorch loop profiled with no
    /// edit: timing them would need `Tensor.to` replaced): they are inside compute, and views
    /// show the transfer as `-`, not 0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transfer_unmeasured: bool,
    /// PyTorch `DataLoader(prefetch_factor=…)`: batches queued per worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_factor: Option<usize>,
    /// Threads the program's compute runs on (`torch.get_num_threads()`, TensorFlow's or JAX's
    /// pool, pipeprof's own rayon pool), when the run said: on the CPU they hold the cores
    /// loader workers would use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_threads: Option<usize>,
    /// TensorFlow's sampled host-trace windows (`python/pipeprof/_tf.py`): tf.data's stages
    /// are measured inside them only, a span per function run (an element's, or a batch's), so
    /// their cost per image is their total over the images of the sampled steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tf_trace: Option<TfTrace>,
    /// A Keras program's data is a `tf.data.Dataset`: its parallelism is the pipeline's own
    /// (`num_parallel_calls`), not loader workers.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tf_data: bool,
    /// The program's dataset is torchvision's `ImageFolder`/`DatasetFolder` with its default
    /// loader and class listing: what `pipeprof.data.PackedImageFolder` replaces as it is.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub folder_dataset: bool,
    /// The resize the program's transforms begin with (a bilinear `Resize`), when they do: the
    /// size `pipeprof pack` stores, so that the program's own resize becomes a no-op and its
    /// later transforms (a crop) see the pixels they saw before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leading_resize: Option<LeadingResize>,
    /// What the program's own loader work costs fed against between its slow reads, timed by
    /// the hook at the program's end where its reads were slow (`python/pipeprof/_cold.py`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold_cpu: Option<ColdCpu>,
    /// Class names of the loader's transforms pipeprof does not classify, timed as the
    /// `transform` stage (the program's own code).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transforms: Vec<String>,
    /// Settings the run sent that did not read ("input = \"3x150x150\": …"): the others
    /// are kept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// A leading resize of the program's transforms: torchvision's `Resize(S)` (the shorter side
/// to S, aspect kept) or `Resize((H, W))`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeadingResize {
    Shorter(usize),
    Exact { height: usize, width: usize },
}

impl LeadingResize {
    /// Its smallest and largest side, for the range check.
    fn sides(self) -> (usize, usize) {
        match self {
            LeadingResize::Shorter(s) => (s, s),
            LeadingResize::Exact { height, width } => (height.min(width), height.max(width)),
        }
    }
}

/// A loader's CPU work per image cold and fed: `images` of the program's own data set, each
/// decoded and transformed right after its read from where the program read it (blocked
/// `after_wait_ms` on average), then all of them back to back; and the transform alone on
/// each image as `pipeprof pack` stores it. By the thread's CPU clock, ms per image.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ColdCpu {
    /// How long each read was blocked, ms.
    pub after_wait_ms: f64,
    /// Images timed.
    pub images: usize,
    /// Decode and transform right after the read.
    pub cold_ms: f64,
    /// Decode and transform back to back: a copy's loader.
    pub fed_ms: f64,
    /// The transform alone, back to back, on images as the pack stores them: the packed
    /// file's loader. `None` without a transform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packed_ms: Option<f64>,
}

impl ColdCpu {
    /// How much more the work cost cold than fed: at least 1.
    pub fn factor(&self) -> f64 {
        (self.cold_ms / self.fed_ms).max(1.0)
    }

    /// Every figure finite, the costs positive and at most [`MAX_COLD_MS`].
    fn check(&self) -> Result<(), String> {
        let ok = |x: f64| x.is_finite() && x > 0.0 && x <= MAX_COLD_MS;
        let all = [self.cold_ms, self.fed_ms, self.packed_ms.unwrap_or(1.0)];
        if all.into_iter().all(ok) && self.after_wait_ms.is_finite() && self.after_wait_ms >= 0.0 {
            Ok(())
        } else {
            Err(format!(
                "settings.cold_cpu: costs {} / {} / {:?} ms (0–{MAX_COLD_MS}) after {} ms",
                self.cold_ms, self.fed_ms, self.packed_ms, self.after_wait_ms
            ))
        }
    }
}

/// Largest per-image cost in [`ColdCpu`] accepted, ms.
pub const MAX_COLD_MS: f64 = 60_000.0;

/// What TensorFlow's sampled host trace covered.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default)]
pub struct TfTrace {
    /// Windows taken.
    pub windows: u64,
    /// Training steps inside them.
    pub sampled_steps: u64,
    /// What taking them cost the training thread, ms.
    pub cost_ms: f64,
}

/// Whether `c` from outside (a file or folder name, a name another process sent) may be
/// printed as it is: not a control character (escape codes, carriage returns, line breaks,
/// bells) nor a bidirectional override that reorders what a terminal shows. The one rule
/// every printer applies: [`clean_name`], [`shown`] and `progress::clean`.
pub fn printable(c: char) -> bool {
    !c.is_control() && !matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` without terminal escape sequences: CSI (`ESC [` … a final byte, the colours and bold
/// of Python 3.13's tracebacks), OSC (`ESC ]` … BEL or `ESC \\`: titles, links) and two-character
/// `ESC x`. They are formatting, not text: removed whole, so "ValueError" stays readable where
/// [`clean_name`] alone would leave `?[1mValueError?[0m`. A sequence cut short ends the text.
/// (Hand-written: ECMA-48's three forms are a dozen lines; a crate would bring a terminal
/// parser into the pure core.)
pub fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut it = text.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match it.next() {
            // Parameters and intermediates (0x20–0x3F), then one final byte (0x40–0x7E).
            Some('[') => {
                for c in it.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(c) = it.next() {
                    if c == '\u{7}' || (c == '\u{1b}' && it.next_if_eq(&'\\').is_some()) {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// `name` with every character that is not [`printable`] replaced by `?` and cut to `max`
/// characters (an ellipsis marks the cut): safe to print anywhere, on one line.
pub fn clean_name(name: &str, max: usize) -> String {
    let mut out: String = name.chars().take(max).map(|c| if printable(c) { c } else { '?' }).collect();
    if name.chars().nth(max).is_some() {
        out.pop();
        out.push('…');
    }
    out
}

/// Longest path a message shows (a longer one is cut, with an ellipsis).
pub const MAX_PATH_SHOWN: usize = 4096;

/// A path for a message: [`clean_name`], so a file or folder named with escape codes or a line
/// break shows as `?` on the one line it belongs to.
pub fn shown(path: &std::path::Path) -> String {
    clean_name(&path.to_string_lossy(), MAX_PATH_SHOWN)
}

impl RunSettings {
    /// Every number in the range pipeprof accepts, or the first that is not.
    pub fn check_ranges(&self) -> Result<(), String> {
        let opt = |v: Option<usize>| v.unwrap_or(0);
        let checks = [
            in_range("settings.cores", self.cores, 0, MAX_CORES),
            in_range("settings.workers", self.workers, 0, MAX_WORKERS),
            in_range("settings.batch_size", self.batch_size, 0, MAX_BATCH_SIZE),
            in_range("settings.prefetch", self.prefetch, 0, MAX_PREFETCH),
            in_range("settings.prefetch_factor", opt(self.prefetch_factor), 0, MAX_PREFETCH),
            in_range("settings.compute_threads", opt(self.compute_threads), 0, MAX_CORES),
            in_range("settings.transforms", self.transforms.len(), 0, MAX_LISTED),
            in_range("settings.epochs", self.epochs, 0, MAX_EPOCHS),
            in_range("settings.images", self.images, 0, MAX_IMAGES),
            in_range("settings.params", self.params, 0, MAX_PARAMS),
            in_range("settings.input", self.input.iter().copied().max().unwrap_or(0), 0, MAX_INPUT_SIDE),
            in_range("settings.classes", self.classes.len(), 0, MAX_CLASSES),
            in_range("settings.leading_resize", self.leading_resize.map_or(1, |r| r.sides().0), 1, MAX_INPUT_SIDE),
            in_range("settings.leading_resize", self.leading_resize.map_or(1, |r| r.sides().1), 1, MAX_INPUT_SIDE),
        ];
        checks.into_iter().find(Result::is_err).unwrap_or(Ok(()))?;
        self.cold_cpu.map_or(Ok(()), |c| c.check())
    }

    /// Names capped at [`MAX_NAME`] and free of control characters, lists at [`MAX_LISTED`].
    pub fn clean_names(&mut self) {
        let name = self.model.name();
        if name.len() > MAX_NAME || !name.chars().all(printable) {
            self.model = std::mem::take(&mut self.model).map_name(|n| clean_name(n, MAX_NAME));
        }
        let clean = |s: &str| {
            if s.len() > MAX_NAME || !s.chars().all(printable) {
                clean_name(s, MAX_NAME)
            } else {
                s.to_string()
            }
        };
        for s in [&mut self.data, &mut self.ignored] {
            *s = clean(s);
        }
        self.device = Device::from(clean(self.device.name()));
        self.framework = Framework::from(clean(self.framework.name()));
        if let Some(n) = &mut self.node {
            n.name = probes::node::clean(&n.name).unwrap_or_else(|| "?".into());
            n.job = n.job.as_deref().and_then(probes::node::clean);
        }
        self.classes.truncate(MAX_CLASSES);
        for list in [&mut self.simulated, &mut self.auto_workers, &mut self.unreadable, &mut self.transforms] {
            list.truncate(MAX_LISTED);
        }
        for list in
            [&mut self.classes, &mut self.simulated, &mut self.auto_workers, &mut self.unreadable, &mut self.transforms]
        {
            for s in list.iter_mut() {
                if s.len() > MAX_NAME || !s.chars().all(printable) {
                    *s = clean_name(s, MAX_NAME);
                }
            }
        }
    }

    /// Merges settings sent as JSON, key by key: a key whose value does not read, or reads
    /// out of range, is listed in [`RunSettings::unreadable`] and the others are kept (one bad
    /// key never drops them all). Keys pipeprof does not know are ignored. Names are cleaned
    /// ([`RunSettings::clean_names`]). Returns the refused keys' messages.
    pub fn merge_json(&mut self, v: &serde_json::Value) -> Vec<String> {
        let Some(obj) = v.as_object() else {
            if v.is_null() {
                return Vec::new();
            }
            let why = format!("settings are not a JSON object: {}", clean_name(&v.to_string(), MAX_NAME));
            self.unreadable.push(why.clone());
            return vec![why];
        };
        let Ok(mut cur) = serde_json::to_value(&*self) else { return Vec::new() };
        let mut refused = Vec::new();
        for (k, val) in obj {
            // The node is the run's (`pipeprof run` on that machine), never the program's.
            if k == "unreadable" || k == "node" {
                continue;
            }
            let mut trial = cur.clone();
            if let Some(o) = trial.as_object_mut() {
                o.insert(k.clone(), val.clone());
            }
            let shown = || format!("{} = {}", clean_name(k, MAX_NAME), clean_name(&val.to_string(), MAX_NAME));
            match serde_json::from_value::<RunSettings>(trial.clone()) {
                Ok(s) => match s.check_ranges() {
                    Ok(()) => {
                        let unreadable = std::mem::take(&mut self.unreadable);
                        *self = RunSettings { unreadable, ..s };
                        cur = trial;
                    }
                    Err(why) => refused.push(format!("{}: out of range ({why})", shown())),
                },
                Err(e) => refused.push(format!("{}: {e}", shown())),
            }
        }
        self.unreadable.extend(refused.iter().cloned());
        self.clean_names();
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escape_sequences_are_removed_whole() {
        let table = [
            // Python 3.13's coloured traceback line.
            ("\u{1b}[1;35mValueError\u{1b}[0m: \u{1b}[35mbad label\u{1b}[0m", "ValueError: bad label"),
            ("plain text", "plain text"),
            // A window title (OSC, ended by BEL, then by ESC \\).
            ("\u{1b}]0;title\u{7}after", "after"),
            ("\u{1b}]8;;http://x\u{1b}\\link", "link"),
            // Two-character escapes; a sequence cut short ends the text.
            ("a\u{1b}cb", "ab"),
            ("cut \u{1b}[1", "cut "),
            ("end\u{1b}", "end"),
            // Other control characters stay for clean_name to mark.
            ("tab\there", "tab\there"),
        ];
        for (text, want) in table {
            assert_eq!(strip_escapes(text), want, "{text:?}");
        }
    }

    #[test]
    fn numbers_out_of_range_are_listed_as_unreadable_and_the_rest_kept() {
        let mut s = RunSettings::default();
        let refused = s.merge_json(&json!({
            "cores": 100_000_000_000u64,
            "workers": 4,
            "batch_size": 1u64 << 40,
            "prefetch_factor": 1_000_000,
            "input": [3, 150, 150],
            "framework": "pytorch",
        }));
        assert_eq!((s.cores, s.workers, s.batch_size, s.prefetch_factor), (0, 4, 0, None));
        assert_eq!((s.input, &s.framework), ([3, 150, 150], &Framework::PyTorch));
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(
            refused.iter().any(|r| r.starts_with("cores = 100000000000: out of range (settings.cores")),
            "{refused:?}"
        );
        assert_eq!(s.unreadable, refused);
        assert!(s.check_ranges().is_ok());
        // A float where a count goes does not read at all.
        assert_eq!(s.merge_json(&json!({"cores": 1e11})).len(), 1);
        assert_eq!(s.cores, 0);
    }

    #[test]
    fn names_are_capped_and_cannot_drive_a_terminal() {
        let mut s = RunSettings::default();
        let huge = "x".repeat(900_000);
        s.merge_json(&json!({
            "model": huge,
            "data": "/data\u{1b}]0;pwned\u{7}\r\nfake line",
            "classes": vec!["c"; MAX_CLASSES + 10],
        }));
        assert_eq!(s.model.name().chars().count(), MAX_NAME);
        assert!(s.model.name().ends_with('…'));
        assert_eq!(s.data, "/data?]0;pwned???fake line");
        assert_eq!(s.classes.len(), 0, "too many classes is out of range: {:?}", s.unreadable);
        assert_eq!(clean_name("short", 10), "short");
        assert_eq!(clean_name("abcdef", 3), "ab…");
    }

    #[test]
    fn settings_merge_key_by_key_and_keep_what_reads() {
        // (sent, batch_size, workers, input, refused keys)
        type Row = (serde_json::Value, usize, usize, [usize; 3], Vec<&'static str>);
        let table: Vec<Row> = vec![
            (json!({"batch_size": 32, "workers": 2}), 32, 2, [0, 0, 0], vec![]),
            // The bad key of the original report: the others stay.
            (json!({"input": "3x150x150", "batch_size": 32, "workers": 4}), 32, 4, [0, 0, 0], vec!["input"]),
            (json!({"input": [3, 64, 64], "workers": "many"}), 0, 0, [3, 64, 64], vec!["workers"]),
            // Keys pipeprof does not know are ignored, not refused.
            (json!({"optimizer": "adam", "batch_size": 8}), 8, 0, [0, 0, 0], vec![]),
            (json!(null), 0, 0, [0, 0, 0], vec![]),
        ];
        for (sent, batch, workers, input, refused) in table {
            let mut st = RunSettings::default();
            let why = st.merge_json(&sent);
            assert_eq!((st.batch_size, st.workers, st.input), (batch, workers, input), "{sent}");
            let keys: Vec<&str> = why.iter().map(|w| w.split(' ').next().unwrap_or("")).collect();
            assert_eq!(keys, refused, "{sent}: {why:?}");
            assert_eq!(st.unreadable, why, "{sent}");
        }
        let mut st = RunSettings::default();
        assert_eq!(st.merge_json(&json!([1, 2])).len(), 1, "not an object");
        // Later settings win, and earlier refusals stay listed.
        let mut st2 = RunSettings::default();
        st2.merge_json(&json!({"input": "3x1", "workers": 1}));
        st2.merge_json(&json!({"workers": 3, "framework": "pytorch", "pin_memory": true}));
        assert_eq!((st2.workers, &st2.framework, st2.pin_memory), (3, &Framework::PyTorch, Some(true)));
        assert_eq!(st2.unreadable.len(), 1);
    }

    #[test]
    fn the_hooks_cold_and_fed_costs_read_and_nonsense_is_refused() {
        let mut s = RunSettings::default();
        let ok =
            json!({"cold_cpu": {"after_wait_ms": 12.5, "images": 16, "cold_ms": 1.5, "fed_ms": 1.2, "packed_ms": 0.1}});
        assert!(s.merge_json(&ok).is_empty());
        let c = s.cold_cpu.unwrap();
        assert!((c.factor() - 1.25).abs() < 1e-9 && c.packed_ms == Some(0.1), "{c:?}");
        // Fed dearer than cold: no factor below 1.
        let mut t = RunSettings::default();
        t.merge_json(&json!({"cold_cpu": {"after_wait_ms": 1.0, "images": 2, "cold_ms": 1.0, "fed_ms": 2.0}}));
        assert_eq!(t.cold_cpu.map(|c| c.factor()), Some(1.0));
        for bad in [
            json!({"after_wait_ms": 1.0, "images": 2, "cold_ms": 0.0, "fed_ms": 1.0}),
            json!({"after_wait_ms": 1.0, "images": 2, "cold_ms": 1.0, "fed_ms": 1e9}),
            json!({"after_wait_ms": -1.0, "images": 2, "cold_ms": 1.0, "fed_ms": 1.0}),
            json!({"after_wait_ms": 1.0, "images": 2, "cold_ms": 1.0, "fed_ms": 1.0, "packed_ms": -2.0}),
            json!({"images": 2, "cold_ms": 1.0, "fed_ms": 1.0}),
        ] {
            let mut u = RunSettings::default();
            let refused = u.merge_json(&json!({ "cold_cpu": bad }));
            assert_eq!((refused.len(), u.cold_cpu), (1, None), "{bad}: {refused:?}");
            assert!(refused[0].starts_with("cold_cpu = "), "{refused:?}");
        }
    }
}
