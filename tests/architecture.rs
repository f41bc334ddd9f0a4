#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The import graph follows the data flow (ARCHITECTURE.md): every module of `src/` has a
//! layer, and may use only modules of lower layers. This test reads the sources and fails,
//! naming the file and the import, when a module looks up.

use std::collections::BTreeMap;
use std::path::Path;

/// Layers, bottom first. Modules in one layer may not use each other.
const LAYERS: &[&[&str]] = &[
    &["units", "signal", "limits", "model_source", "flags"],
    &["config", "aggregate"],
    &["data", "diagnose", "progress"],
    &["train", "cache"],
    &["report", "tui", "export", "metrics"],
    &["html"],
    &["session"],
    &["profile", "attach", "run", "offline", "cli"],
    &["check_advice"],
    &["check_run"],
    &["commands"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// `crate::a`, and every `b` in `crate::{a, b::c}`, used in `text`.
fn crate_imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push(name);
            }
        } else {
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_has_a_layer_and_imports_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a file").as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(own) = layer_of(&module) else {
            wrong.entry(rel.display().to_string()).or_default().push(format!("module {module} has no layer"));
            continue;
        };
        let text = std::fs::read_to_string(f).expect("readable");
        for used in crate_imports(&text) {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                _ => wrong.entry(rel.display().to_string()).or_default().push(format!("uses crate::{used}")),
            }
        }
    }
    assert!(wrong.is_empty(), "imports that look up (see ARCHITECTURE.md): {wrong:#?}");
}

#[test]
fn the_import_reader_sees_groups_and_paths() {
    let t = "use crate::{aggregate::Summary, diagnose};\nlet x = crate::units::ms(1.0);";
    assert_eq!(crate_imports(t), ["aggregate", "diagnose", "units"]);
}
