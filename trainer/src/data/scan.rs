//! ImageFolder scan: one sub-folder per class, labels in sorted name order.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// File extensions the loader decodes (compared case-insensitively): torchvision's ImageFolder
/// list, plus GIF (its first frame).
pub const EXTENSIONS: [&str; 10] = ["jpg", "jpeg", "png", "ppm", "pgm", "bmp", "tif", "tiff", "webp", "gif"];

/// torchvision's `IMG_EXTENSIONS`: a name is an image when its lower-cased form ends with one.
pub const IMAGEFOLDER_EXTENSIONS: [&str; 9] =
    [".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"];

/// Keras's `image_dataset_utils.ALLOWLIST_FORMATS`: a name is an image when its lower-cased
/// form ends with one (a GIF is read as its first frame).
pub const KERAS_EXTENSIONS: [&str; 5] = [".bmp", ".gif", ".jpeg", ".jpg", ".png"];

/// Which files make the data set, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rules {
    /// pipeprof's own loader: [`EXTENSIONS`] (GIF too), names starting with `.` skipped, a
    /// class folder without images left out, files sorted by path, each folder entered once.
    #[default]
    Pipeprof,
    /// `torchvision.datasets.ImageFolder(DIR)`'s: [`IMAGEFOLDER_EXTENSIONS`], hidden names
    /// included, every class folder a class (one without images too, so the indices are
    /// `find_classes`'), files in the order `sorted(os.walk(class_dir))` then `sorted(fnames)`
    /// gives: by their folder's path, then by name (bytes, which is code-point order for
    /// UTF-8). A folder reached twice through links is walked twice, as `os.walk` does; only a
    /// link back into its own ancestors (a loop) is not entered.
    ImageFolder,
    /// `keras.utils.image_dataset_from_directory(DIR)`'s (`index_directory`): class folders
    /// whose names start with `.` skipped (Jupyter's `.ipynb_checkpoints`), hidden names inside
    /// a class kept, [`KERAS_EXTENSIONS`], every class folder a class (one without images too),
    /// files in `sorted(os.walk(class_dir))` then `sorted(files)` order (as ImageFolder's), and
    /// a link to a folder inside a class not entered (`follow_links=False`).
    Keras,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("data folder {0} does not exist: pass --data DIR with one sub-folder per class (or run `pipeprof demo-data DIR`)")]
    Missing(PathBuf),
    #[error("data folder {0} is not a directory: expected DIR/<class>/<image>.jpg")]
    NotADir(PathBuf),
    #[error("cannot list {path}: {source}")]
    List { path: PathBuf, source: std::io::Error },
    #[error("no class folders in {0}: expected DIR/<class>/<image>.jpg (one sub-folder per class)")]
    NoClasses(PathBuf),
    #[error("no images (.jpg .jpeg .png .ppm .pgm .bmp .tif .tiff .webp .gif) under {0} ({1} other files ignored)")]
    NoImages(PathBuf, usize),
}

/// One image file and its class label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub path: PathBuf,
    pub label: u32,
}

/// An entry the scan could not use, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanProblem {
    pub path: PathBuf,
    pub reason: String,
}

/// The result of scanning an ImageFolder tree.
#[derive(Debug, Clone, Default)]
pub struct Dataset {
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Vec<Sample>,
    /// Files with other extensions, ignored.
    pub ignored: usize,
    /// The files inside class folders among `ignored`, by lower-cased extension (".txt";
    /// "(none)" for a name without one).
    pub ignored_by_ext: BTreeMap<String, usize>,
    /// Unreadable folders, symlink loops.
    pub problems: Vec<ScanProblem>,
    /// Class folders with no image file (empty, or only other extensions): left out of
    /// `classes`, so that the model has no output for a class it would never see.
    pub empty_classes: Vec<String>,
}

impl Dataset {
    /// "3 .txt, 1 .heic": the ignored files in class folders, most frequent first; `None` if
    /// there were none.
    pub fn ignored_summary(&self) -> Option<String> {
        let mut v: Vec<(&String, &usize)> = self.ignored_by_ext.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = v.iter().map(|(ext, n)| format!("{n} {ext}")).collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// Images per class, in label order.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.classes.len()];
        for s in &self.samples {
            counts[s.label as usize] += 1;
        }
        counts
    }
}

/// The warning for a class folder left out because it holds no image file.
pub fn empty_class_warning(root: &Path, class: &str) -> String {
    format!(
        "class folder {} has no .{} image: it is left out of the classes (add images to train it, or remove the folder)",
        pipeprof_core::aggregate::settings::shown(&root.join(class)),
        EXTENSIONS.join("/.")
    )
}

/// Python's `name.lower().endswith(exts)`.
fn ends_with_any(path: &Path, exts: &[&str]) -> bool {
    path.file_name().is_some_and(|n| {
        let n = n.to_string_lossy().to_lowercase();
        exts.iter().any(|e| n.ends_with(e))
    })
}

/// The warning for a class folder without images that Keras keeps as a class: a model trained
/// on it has an output it never sees.
pub fn kept_empty_class_warning(root: &Path, class: &str) -> String {
    format!(
        "class folder {} has no {} image: Keras keeps it as a class too (a model has an output it never sees); \
         add images or remove the folder",
        pipeprof_core::aggregate::settings::shown(&root.join(class)),
        KERAS_EXTENSIONS.join("/")
    )
}

fn hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

impl Rules {
    /// Whether an entry with this name inside a class folder is looked at.
    fn sees(self, name: &std::ffi::OsStr) -> bool {
        self != Rules::Pipeprof || !hidden(name)
    }

    /// Whether a folder with this name in the data folder is a class.
    fn sees_class(self, name: &std::ffi::OsStr) -> bool {
        self == Rules::ImageFolder || !hidden(name)
    }

    /// Whether a link to a folder inside a class folder is entered (Keras's `os.walk` without
    /// `followlinks` lists it and does not enter it).
    fn follows_links(self) -> bool {
        self != Rules::Keras
    }

    /// The name `pipeprof pack --layout` takes and the packed file's metadata stores.
    pub fn name(self) -> &'static str {
        match self {
            Rules::Pipeprof => "pipeprof",
            Rules::ImageFolder => "imagefolder",
            Rules::Keras => "keras",
        }
    }

    /// Whether a file with this path is an image under these rules.
    fn is_image(self, path: &Path) -> bool {
        match self {
            Rules::Pipeprof => path
                .extension()
                .map(|e| EXTENSIONS.contains(&e.to_string_lossy().to_ascii_lowercase().as_str()))
                .unwrap_or(false),
            Rules::ImageFolder => ends_with_any(path, &IMAGEFOLDER_EXTENSIONS),
            Rules::Keras => ends_with_any(path, &KERAS_EXTENSIONS),
        }
    }

    /// Sorts one class's files into this order.
    fn sort(self, files: &mut [PathBuf]) {
        use std::os::unix::ffi::OsStrExt;
        match self {
            Rules::Pipeprof => files.sort(),
            Rules::ImageFolder | Rules::Keras => files.sort_by(|a, b| {
                let key = |p: &PathBuf| {
                    let dir = p.parent().map(|d| d.as_os_str().as_bytes().to_vec()).unwrap_or_default();
                    (dir, p.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default())
                };
                key(a).cmp(&key(b))
            }),
        }
    }
}

/// Scans `root` with pipeprof's own [`Rules::Pipeprof`]: each non-hidden sub-folder is a
/// class; images are found recursively inside it, following symlinks but never entering a
/// folder twice (no infinite walk through loops).
pub fn scan(root: &Path) -> Result<Dataset, ScanError> {
    scan_with(root, Rules::Pipeprof)
}

/// Scans `root` with `rules` (see [`Rules`]).
pub fn scan_with(root: &Path, rules: Rules) -> Result<Dataset, ScanError> {
    let meta = fs::metadata(root).map_err(|_| ScanError::Missing(root.to_path_buf()))?;
    if !meta.is_dir() {
        return Err(ScanError::NotADir(root.to_path_buf()));
    }
    let mut ds = Dataset { root: root.to_path_buf(), ..Dataset::default() };
    let mut class_dirs: Vec<(String, PathBuf)> = Vec::new();
    let entries = fs::read_dir(root).map_err(|source| ScanError::List { path: root.to_path_buf(), source })?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !rules.sees_class(&name) {
            continue;
        }
        let path = entry.path();
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() => class_dirs.push((name.to_string_lossy().into_owned(), path)),
            Ok(_) => ds.ignored += 1,
            Err(e) => ds.problems.push(ScanProblem { path, reason: e.to_string() }),
        }
    }
    class_dirs.sort();
    if class_dirs.is_empty() {
        return Err(ScanError::NoClasses(root.to_path_buf()));
    }
    let mut visited = HashSet::new();
    visited.insert((meta.dev(), meta.ino()));
    for (name, dir) in &class_dirs {
        let mut files = Vec::new();
        walk(dir, rules, &mut visited, &mut files, &mut ds);
        if files.is_empty() {
            ds.empty_classes.push(name.clone());
            if rules == Rules::Pipeprof {
                continue;
            }
        }
        rules.sort(&mut files);
        let label = ds.classes.len() as u32;
        ds.classes.push(name.clone());
        ds.samples.extend(files.into_iter().map(|path| Sample { path, label }));
    }
    if ds.samples.is_empty() {
        return Err(ScanError::NoImages(root.to_path_buf(), ds.ignored));
    }
    Ok(ds)
}

/// Collects the images under `dir`. `visited`: the folders entered so far (pipeprof's rules:
/// each folder once) or the folders above this one (ImageFolder's: only loops are refused).
fn walk(dir: &Path, rules: Rules, visited: &mut HashSet<(u64, u64)>, files: &mut Vec<PathBuf>, ds: &mut Dataset) {
    let meta = match fs::metadata(dir) {
        Ok(m) => m,
        Err(e) => {
            ds.problems.push(ScanProblem { path: dir.to_path_buf(), reason: e.to_string() });
            return;
        }
    };
    let key = (meta.dev(), meta.ino());
    if !visited.insert(key) {
        ds.problems.push(ScanProblem {
            path: dir.to_path_buf(),
            reason: "folder already visited (symlink loop or duplicate link): not entered again".into(),
        });
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            ds.problems.push(ScanProblem { path: dir.to_path_buf(), reason: e.to_string() });
            return;
        }
    };
    for entry in entries.flatten() {
        if !rules.sees(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        let link = entry.file_type().is_ok_and(|t| t.is_symlink());
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() && link && !rules.follows_links() => {}
            Ok(m) if m.is_dir() => walk(&path, rules, visited, files, ds),
            // A FIFO, socket or device named like an image: reading it may never return.
            Ok(m) if rules.is_image(&path) && !m.is_file() => ds.problems.push(ScanProblem {
                path,
                reason: "not a regular file (a FIFO, socket or device): skipped, reading it may never return".into(),
            }),
            Ok(_) if rules.is_image(&path) => files.push(path),
            Ok(_) => {
                ds.ignored += 1;
                let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy().to_lowercase()));
                *ds.ignored_by_ext.entry(ext.unwrap_or_else(|| "(none)".into())).or_default() += 1;
            }
            Err(e) => ds.problems.push(ScanProblem { path, reason: format!("broken link or unreadable: {e}") }),
        }
    }
    if rules != Rules::Pipeprof {
        visited.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_names_are_images_under_each_rules() {
        // (name, pipeprof's loader, ImageFolder's, Keras's)
        let table = [
            ("a.jpg", true, true, true),
            ("a.JPEG", true, true, true),
            ("a.gif", true, false, true),
            ("a.webp", true, true, false),
            ("a.tif", true, true, false),
            ("a.ppm", true, true, false),
            ("a.BMP", true, true, true),
            ("a.txt", false, false, false),
            (".jpg", false, true, true), // no extension to Path, ends with ".jpg" to Python
            ("jpg", false, false, false),
            ("a.tar.png", true, true, true),
            ("a.png.txt", false, false, false),
        ];
        for (name, own, imagefolder, keras) in table {
            let p = Path::new("/d/c").join(name);
            let got = (Rules::Pipeprof.is_image(&p), Rules::ImageFolder.is_image(&p), Rules::Keras.is_image(&p));
            assert_eq!(got, (own, imagefolder, keras), "{name}");
        }
    }

    #[test]
    fn which_folders_are_classes_and_which_names_are_seen_under_each_rules() {
        // (rules, a hidden class folder is a class, a hidden name inside a class is seen,
        // a link to a folder inside a class is entered)
        let hidden = std::ffi::OsStr::new(".ipynb_checkpoints");
        for (rules, class, inside, links) in [
            (Rules::Pipeprof, false, false, true),
            (Rules::ImageFolder, true, true, true),
            (Rules::Keras, false, true, false),
        ] {
            assert_eq!(
                (rules.sees_class(hidden), rules.sees(hidden), rules.follows_links()),
                (class, inside, links),
                "{rules:?}"
            );
        }
    }

    #[test]
    fn imagefolder_order_is_by_folder_path_then_name() {
        let mut files: Vec<PathBuf> =
            ["c/z.png", "c/sub/c/a.png", "c/sub-x/a.png", "c/sub/b.png", "c/.h.png", "c/B.png"]
                .map(PathBuf::from)
                .into();
        Rules::ImageFolder.sort(&mut files);
        let want = ["c/.h.png", "c/B.png", "c/z.png", "c/sub/b.png", "c/sub-x/a.png", "c/sub/c/a.png"];
        assert_eq!(files, want.map(PathBuf::from));
        Rules::Pipeprof.sort(&mut files);
        let want = ["c/.h.png", "c/B.png", "c/sub/b.png", "c/sub/c/a.png", "c/sub-x/a.png", "c/z.png"];
        assert_eq!(files, want.map(PathBuf::from));
    }
}
