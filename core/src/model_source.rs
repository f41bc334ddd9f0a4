//! Where a run's model came from: pipeprof's built-in, a `cnn.toml` file, or a program of the
//! user's own, by the name it gave. Carried typed from where it is known (the command line, an
//! attached program's hello) to whatever names it again (`pipeprof cache`'s command in the
//! advice and in a stale cache's message); written as the display name it always was (the
//! summary JSON, the cache file), and read back from that name in one place,
//! [`ModelSource::from_name`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

/// The built-in model's file in pipeprof's repository: what `pipeprof cache --model` names
/// for it.
pub const BUILT_IN_PATH: &str = "examples/cnn.toml";

/// Where a run's model came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// pipeprof's built-in model ([`BUILT_IN_PATH`]).
    BuiltIn,
    /// A `cnn.toml` file given with `--model`.
    File(PathBuf),
    /// A program of the user's own (an attached program, `pipeprof run`'s script), by the name
    /// it gave; empty when unknown.
    Program(String),
}

impl Default for ModelSource {
    fn default() -> ModelSource {
        ModelSource::Program(String::new())
    }
}

impl ModelSource {
    /// The source a saved name stands for: the built-in's name ("built-in
    /// examples/cnn.toml"), a path ending in `.toml` (what `pipeprof profile --model` and
    /// `pipeprof cache` write), else a program's name.
    pub fn from_name(name: &str) -> ModelSource {
        if name.strip_prefix("built-in ") == Some(BUILT_IN_PATH) {
            ModelSource::BuiltIn
        } else if name.ends_with(".toml") {
            ModelSource::File(PathBuf::from(name))
        } else {
            ModelSource::Program(name.to_string())
        }
    }

    /// The name in messages, reports and files: "built-in examples/cnn.toml", the file's path,
    /// the program's name.
    pub fn name(&self) -> Cow<'_, str> {
        match self {
            ModelSource::BuiltIn => Cow::Owned(format!("built-in {BUILT_IN_PATH}")),
            ModelSource::File(p) => p.to_string_lossy(),
            ModelSource::Program(n) => Cow::Borrowed(n),
        }
    }

    /// The `cnn.toml` the run trained, for `pipeprof cache --model`: the built-in's file or
    /// the one given; `None` for a program of the user's own.
    pub fn cnn_toml(&self) -> Option<&Path> {
        match self {
            ModelSource::BuiltIn => Some(Path::new(BUILT_IN_PATH)),
            ModelSource::File(p) => Some(p),
            ModelSource::Program(_) => None,
        }
    }

    /// No name known (a program that gave none).
    pub fn is_empty(&self) -> bool {
        matches!(self, ModelSource::Program(n) if n.is_empty())
    }

    /// The same source with its name passed through `f` (a sanitiser); the built-in's is
    /// pipeprof's own and stays.
    pub fn map_name(self, f: impl FnOnce(&str) -> String) -> ModelSource {
        match self {
            ModelSource::BuiltIn => ModelSource::BuiltIn,
            ModelSource::File(p) => ModelSource::File(PathBuf::from(f(&p.to_string_lossy()))),
            ModelSource::Program(n) => ModelSource::Program(f(&n)),
        }
    }
}

impl fmt::Display for ModelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl From<&str> for ModelSource {
    fn from(name: &str) -> ModelSource {
        ModelSource::from_name(name)
    }
}

impl From<String> for ModelSource {
    fn from(name: String) -> ModelSource {
        ModelSource::from_name(&name)
    }
}

/// Written as its name: the summary JSON's `"model"` is the string it always was.
impl Serialize for ModelSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// Written as its name (a string).
impl schemars::JsonSchema for ModelSource {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ModelSource".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "description": "The model: a cnn.toml path, the built-in one's name, or the program's." })
    }
}

impl<'de> Deserialize<'de> for ModelSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ModelSource, D::Error> {
        String::deserialize(d).map(|n| ModelSource::from_name(&n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_is_written_as_its_name_and_read_back_as_itself() {
        // (source, its name, the cnn.toml `pipeprof cache` is given)
        let table: [(ModelSource, &str, Option<&str>); 5] = [
            (ModelSource::BuiltIn, "built-in examples/cnn.toml", Some("examples/cnn.toml")),
            (ModelSource::File("models/my model.toml".into()), "models/my model.toml", Some("models/my model.toml")),
            (ModelSource::Program("train.py".into()), "train.py", None),
            (ModelSource::Program("examples/train_cnn.rs".into()), "examples/train_cnn.rs", None),
            (ModelSource::default(), "", None),
        ];
        for (source, name, toml) in table {
            assert_eq!(source.name(), name);
            assert_eq!(source.to_string(), name);
            assert_eq!(source.cnn_toml(), toml.map(Path::new), "{source:?}");
            let json = serde_json::to_string(&source).unwrap_or_default();
            assert_eq!(json, serde_json::to_string(name).unwrap_or_default(), "the summary's text is the name");
            let back: ModelSource = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(back, source);
            assert_eq!(ModelSource::from(name), source);
        }
        assert!(ModelSource::default().is_empty() && !ModelSource::BuiltIn.is_empty());
    }

    #[test]
    fn a_sanitised_name_keeps_its_source() {
        let clean = |n: &str| n.replace('\n', "?");
        assert_eq!(ModelSource::BuiltIn.map_name(clean), ModelSource::BuiltIn);
        assert_eq!(ModelSource::File("a\nb.toml".into()).map_name(clean), ModelSource::File("a?b.toml".into()));
        assert_eq!(ModelSource::Program("x\ny".into()).map_name(clean), ModelSource::Program("x?y".into()));
    }
}
