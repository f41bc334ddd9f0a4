//! The command line or code a [`Change`] stands for ([`Change::command`]): pipeprof's flags
//! spelled by [`crate::flags`], a pack and its reader for a program's folder, with the folder
//! written as a shell word and a Python string.

use super::{Change, PackSize};
use crate::flags;

/// The packed cache's file name in the advised `pipeprof cache` command.
pub const CACHE_FILE: &str = "data.ppk";

impl Change {
    /// The command line or flag that makes this change, when pipeprof has one.
    pub fn command(&self) -> Option<String> {
        match self {
            Change::Workers(n) => Some(flags::with_value(flags::WORKERS, n)),
            Change::BatchSize(n) => Some(flags::with_value(flags::BATCH_SIZE, n)),
            Change::Prefetch(n) => Some(flags::with_value(flags::PREFETCH, n)),
            Change::Cache { model, data } => Some(format!(
                "pipeprof cache {} {} {}",
                flags::with_value(flags::MODEL, model),
                flags::with_value(flags::DATA, data),
                flags::with_value(flags::OUT, CACHE_FILE)
            )),
            Change::UseDevice(d) => Some(flags::with_value(flags::DEVICE, d)),
            Change::PackFolder { keras, data, size } => Some(pack_lines(*keras, data, *size)),
            Change::CopyLocal
            | Change::PackOwnLoader
            | Change::FreeCores
            | Change::PreResize { .. }
            | Change::CheaperAugment
            | Change::U8Batches
            | Change::PersistentWorkers
            | Change::Saved => None,
        }
    }
}

/// `pipeprof pack DIR data.ppk --size S`, then the reader in place of the folder reader, for
/// a PyTorch (`keras` false) or Keras program; `DIR` where the run did not say.
fn pack_lines(keras: bool, data: &str, size: PackSize) -> String {
    let (dir, py) = if data.is_empty() {
        ("DIR".to_string(), "DIR".to_string())
    } else {
        let clean = crate::aggregate::settings::clean_name(data, crate::aggregate::settings::MAX_PATH_SHOWN);
        (shell_word(&clean), python_str(&clean))
    };
    // Keras lists a folder its own way (no hidden classes, its extensions): the pack takes its
    // rules, and packed_dataset reads only such a file.
    let layout = if keras { " --layout keras" } else { "" };
    let pack = format!("pipeprof pack {dir} {CACHE_FILE} {}{layout}", size.flag());
    if keras {
        format!("{pack}, then pipeprof.keras.packed_dataset(\"{CACHE_FILE}\", ...) in place of image_dataset_from_directory({py}, ...)")
    } else {
        format!(
            "{pack}, then pipeprof.data.PackedImageFolder(\"{CACHE_FILE}\", transform=...) in place of ImageFolder({py}, ...)"
        )
    }
}

/// What a pack stores for this program: Keras's `image_size` is the model's input (what
/// `image_dataset_from_directory` resizes to); PyTorch's is its transforms' leading resize,
/// else the images as stored.
pub(super) fn pack_size(keras: bool, st: &crate::aggregate::RunSettings) -> PackSize {
    use crate::aggregate::settings::LeadingResize;
    let [_, height, width] = st.input;
    match (keras, st.leading_resize) {
        (true, _) if height == 0 || width == 0 => PackSize::Unknown,
        (true, _) => PackSize::Exact { height, width },
        (false, Some(LeadingResize::Shorter(s))) => PackSize::Shorter(s),
        (false, Some(LeadingResize::Exact { height, width })) => PackSize::Exact { height, width },
        (false, None) => PackSize::AsStored,
    }
}

/// `text` as a Python string literal: `"…"` with `\\` and `"` escaped, letters of any script
/// kept, and every other character that is not printable ASCII (a combining accent of a
/// decomposed name, a no-break or zero-width space) escaped as Python reads it (`\uXXXX`,
/// `\UXXXXXXXX`): Rust's `{:?}` writes `\u{301}`, which Python refuses.
fn python_str(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (' '..='~').contains(&c) || c.is_alphanumeric() => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// `text` as one shell word: as it is when it is plain, else in single quotes.
fn shell_word(text: &str) -> String {
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c)) {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}
