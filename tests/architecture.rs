#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The import graph follows the data flow (ARCHITECTURE.md): inside each of the three crates
//! (`core/src`, `trainer/src`, `src`) every module has a layer and may use only modules of
//! lower layers. This test reads the sources and fails, naming the file and the import, when a
//! module looks up. Between the crates Cargo enforces the direction (`pipeprof-core` cannot
//! name the trainer or the binary, the trainer not the binary), so a path into another crate
//! is not this test's; what Cargo does not check, a crate's dependencies (no candle in
//! `pipeprof-core`), is read below through `cargo tree`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A crate's layers, bottom first, by module path: a file's layer is that of the longest path
/// in it that is its module or holds it (`commands::profile::options` is in
/// `commands::profile`), and an import's the same. Modules in one layer may not use each other.
type Layers = &'static [&'static [&'static str]];

/// The workspace's layered crates, bottom first: (name, src, layers). A module's name is its
/// path inside its crate; `lib.rs` and `main.rs` are no module.
fn layered_crates() -> [(&'static str, PathBuf, Layers); 3] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        ("pipeprof-core", root.join("core/src"), CORE),
        ("pipeprof-trainer", root.join("trainer/src"), TRAINER),
        ("pipeprof", root.join("src"), BINARY),
    ]
}

const CORE: Layers =
    &[&["units", "signal", "limits", "model_source", "flags"], &["config", "aggregate"], &["diagnose"]];

const TRAINER: Layers = &[&["data", "progress"], &["train", "cache"]];

const BINARY: Layers = &[
    &["report", "tui", "export", "metrics"],
    &["html"],
    &["session"],
    &["commands::profile", "commands::attach", "commands::run", "commands::report"],
    &["commands::compare"],
    &["commands::rerun"],
    &["commands::scratch"],
    &["commands::profile::check"],
    &["commands::run::check"],
    &["cli"],
    &["commands"],
];

/// The entry of `layers` that holds module `path` (`a::b::c`), and its layer: the longest
/// entry that is `path` or a parent of it.
fn entry_of(layers: Layers, path: &str) -> Option<(&'static str, usize)> {
    let holds = |e: &str| path == e || path.strip_prefix(e).is_some_and(|r| r.starts_with("::"));
    layers
        .iter()
        .enumerate()
        .flat_map(|(k, l)| l.iter().map(move |e| (*e, k)))
        .filter(|(e, _)| holds(e))
        .max_by_key(|(e, _)| e.len())
}

/// Every path written after `crate::` in `text` (each item of a `crate::{a, b::c}` group, its
/// head only where it nests another group).
fn crate_imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    imports_after(text, "crate::", &mut out);
    out.retain(|m| !m.is_empty());
    out
}

/// A path of names joined by `::` at the start of `s`.
fn path_at(s: &str) -> String {
    let mut path = String::new();
    let mut rest = s;
    loop {
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        if !path.is_empty() {
            path.push_str("::");
        }
        path.push_str(&name);
        match rest.strip_prefix("::") {
            Some(r) if r.starts_with(|c: char| c.is_alphanumeric() || c == '_') => rest = r,
            _ => break,
        }
    }
    path
}

/// The module paths written right after each `prefix` in `text`, into `out`.
fn imports_after(text: &str, prefix: &str, out: &mut Vec<String>) {
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let starts_word = rest[..i].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        rest = &rest[i + prefix.len()..];
        if !starts_word {
            continue;
        }
        let head = path_at(rest);
        let after = &rest[head.len()..];
        let group = if head.is_empty() { rest.strip_prefix('{') } else { after.strip_prefix("::{") };
        let Some(group) = group else {
            out.push(head);
            continue;
        };
        let end = group.find('}').unwrap_or(group.len());
        for item in group[..end].split(',') {
            let item = path_at(item.trim());
            out.push(if head.is_empty() { item } else { format!("{head}::{item}") });
        }
    }
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

/// A file's module path below its crate's `src` (`commands/profile/mod.rs` is
/// `commands::profile`); `lib.rs` and `main.rs` are no module (None).
fn module_of(rel: &Path) -> Option<String> {
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if parts.last().is_some_and(|f| f == "mod") {
        parts.pop();
    }
    (parts != ["lib"] && parts != ["main"]).then(|| parts.join("::"))
}

#[test]
fn every_module_has_a_layer_and_imports_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, src, layers) in layered_crates() {
        let mut files = Vec::new();
        sources(&src, &mut files);
        assert!(!files.is_empty(), "{} has no sources", src.display());
        for f in &files {
            let shown = f.strip_prefix(root).expect("under the workspace").display().to_string();
            let Some(module) = module_of(f.strip_prefix(&src).expect("under src")) else { continue };
            let Some((own, layer)) = entry_of(layers, &module) else {
                wrong.entry(shown).or_default().push(format!("module {module} has no layer"));
                continue;
            };
            let text = std::fs::read_to_string(f).expect("readable");
            for used in crate_imports(&text) {
                match entry_of(layers, &used) {
                    Some((e, _)) if e == own => {}
                    Some((_, l)) if l < layer => {}
                    _ => wrong.entry(shown.clone()).or_default().push(format!("uses crate::{used}")),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports that look up (see ARCHITECTURE.md): {wrong:#?}");
}

#[test]
fn the_import_reader_sees_groups_and_paths() {
    let t = "use crate::{aggregate::Summary, diagnose};\nlet x = crate::units::ms(1.0);";
    assert_eq!(crate_imports(t), ["aggregate::Summary", "diagnose", "units::ms"]);
    let t = "use pipeprof_core::{config, limits::MAX_WORKERS};\nlet d = pipeprof_trainer::data::demo;";
    assert!(crate_imports(t).is_empty(), "another crate's paths are Cargo's to check");
    let t = "use crate::commands::rerun::{self, Outcome};";
    assert_eq!(crate_imports(t), ["commands::rerun::self", "commands::rerun::Outcome"]);
    assert!(crate_imports("my_pipeprof_core::x; supercrate::y").is_empty());
    assert_eq!(entry_of(BINARY, "commands::profile::check::run"), Some(("commands::profile::check", 7)));
    assert_eq!(entry_of(BINARY, "commands::profile::options"), Some(("commands::profile", 3)));
    assert_eq!(entry_of(BINARY, "commandsx"), None);
    assert_eq!(module_of(Path::new("commands/profile/mod.rs")).as_deref(), Some("commands::profile"));
    assert_eq!(module_of(Path::new("lib.rs")), None);
}

// ---------------------------------------------------------------------------------------------
// The crates' own dependencies: what a `pipeprof-core` user builds.

/// Every package `krate` builds with for this machine (normal and build dependencies, not its
/// tests'), by name: `cargo tree`'s own resolution, so features and the lock file count.
fn dependencies_of(krate: &str) -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal,build", "--prefix", "none", "--format", "{p}", "-p", krate])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo tree -p {krate}: {}", String::from_utf8_lossy(&out.stderr));
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Packages the pure profiler must never build with: the candle trainer's and the views'
/// heavy dependencies, and the crates above it.
const NOT_IN_CORE: &[&str] =
    &["candle-core", "candle-nn", "gemm", "image", "ratatui", "crossterm", "pipeprof-trainer", "pipeprof"];

#[test]
fn the_core_crate_builds_without_candle_and_without_the_crates_above_it() {
    let core = dependencies_of("pipeprof-core");
    assert!(core.iter().any(|n| n == "pipeprof-probes"), "the reader sees core's dependencies: {core:?}");
    let wrong: Vec<&String> = core.iter().filter(|n| NOT_IN_CORE.contains(&n.as_str())).collect();
    assert!(wrong.is_empty(), "pipeprof-core depends on {wrong:?} (keep candle, views and the upper crates out of it)");
    // The same reader does see them where they belong.
    let trainer = dependencies_of("pipeprof-trainer");
    for (name, want) in [("candle-core", true), ("pipeprof-core", true), ("ratatui", false), ("pipeprof", false)] {
        assert_eq!(trainer.iter().any(|n| n == name), want, "pipeprof-trainer and {name}: {trainer:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Import circles: no two modules of one crate (`core/src`, `trainer/src`, `src`, `probes/src`)
// may use each other, directly or through others. A module is a file (`aggregate/machine.rs` is
// `aggregate::machine`); a use is any path to another module (`use` statements, re-exports
// followed to where the item is defined, and inline `crate::`, `super::`, `child::` paths), test
// code and comments left out.
// A module may always use its ancestors (its parent declared it): those edges are not counted.

/// Circles that exist on main and are another engineer's to remove, with who removes them.
/// Empty this list as they go; the test fails on any circle not listed, and on a listed one that
/// is gone (so the list stays true).
const ALLOWED_CIRCLES: &[(&[&str], &str)] = &[];

/// Code with comments removed and string and character literals emptied (the lines they
/// spanned kept).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut newlines) = (0, 0);
    while i < c.len() {
        match (c[i], c.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        newlines += usize::from(c[i] == '\n');
                        i += 1;
                    }
                }
            }
            ('r', Some('#' | '"')) if i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_') => {
                // A raw string: r"…" or r#"…"#.
                let hashes = c[i + 1..].iter().take_while(|x| **x == '#').count();
                if c.get(i + 1 + hashes) != Some(&'"') {
                    out.push(c[i]);
                    i += 1;
                    continue;
                }
                i += 2 + hashes;
                while i < c.len()
                    && !(c[i] == '"' && c[i + 1..].iter().take(hashes).filter(|x| **x == '#').count() == hashes)
                {
                    newlines += usize::from(c[i] == '\n');
                    i += 1;
                }
                i += 1 + hashes;
                out.push_str("\"\"");
            }
            ('"', _) => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    newlines += usize::from(c[i] == '\n');
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            ('\'', Some('\\')) => {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            ('\'', Some(_)) if c.get(i + 2) == Some(&'\'') => i += 3,
            (ch, _) => {
                out.push(ch);
                i += 1;
            }
        }
        // The lines a removed comment or literal spanned, kept so that line counts stay true.
        out.extend(std::iter::repeat_n('\n', std::mem::take(&mut newlines)));
    }
    out
}

/// The end (exclusive) of the item starting at `from`: after its `;`, or its `{ … }` block.
fn item_end(code: &str, from: usize) -> usize {
    let b = code.as_bytes();
    let mut depth = 0usize;
    for (i, &ch) in b.iter().enumerate().skip(from) {
        match ch {
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// `code` without its `#[cfg(test)]` items, and the names of the test-only module files it
/// declares (`#[cfg(test)] mod tests;`).
fn without_tests(code: &str) -> (String, Vec<String>) {
    let (mut out, mut test_mods, mut rest) = (String::new(), Vec::new(), code);
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let end = item_end(after, 0);
        let item = after[..end].trim();
        if let Some(name) = item.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
            test_mods.push(name.trim().to_string());
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// One crate's files, each with its module (`aggregate::machine`; the root and `main.rs` are
/// ``) and its code, test-only module files and `#[cfg(test)]` items left out.
fn crate_files(src: &Path) -> Vec<(std::path::PathBuf, String, String)> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut all = Vec::new();
    let mut tests = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let file = parts.pop().expect("a file");
        let stem = file.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" && !(parts.is_empty() && stem == "main") {
            parts.push(stem.to_string());
        }
        let module = parts.join("::");
        let (code, test_mods) = without_tests(&code_only(&std::fs::read_to_string(&f).expect("readable")));
        tests.extend(test_mods.into_iter().map(|t| join(&module, &t)));
        all.push((f, module, code));
    }
    all.retain(|(_, m, _)| !tests.iter().any(|t| m == t || m.starts_with(&format!("{t}::"))));
    all
}

/// One crate's file modules (`aggregate::machine`; the root is ``): their code, test-only
/// modules left out.
fn crate_modules(src: &Path) -> BTreeMap<String, String> {
    let main = src.join("main.rs");
    crate_files(src).into_iter().filter(|(f, _, _)| *f != main).map(|(_, m, code)| (m, code)).collect()
}

fn join(module: &str, child: &str) -> String {
    if module.is_empty() {
        child.to_string()
    } else {
        format!("{module}::{child}")
    }
}

fn parent(module: &str) -> String {
    module.rsplit_once("::").map(|(p, _)| p.to_string()).unwrap_or_default()
}

/// The paths a use tree names, each with the name it binds: `a::{b, c::D as E}` →
/// (`a::b`, `b`), (`a::c::D`, `E`).
fn expand_use(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, ch) in tree.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&tree[start..]);
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        if let Some(open) = item.find('{') {
            let head: Vec<String> =
                item[..open].split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
            let inner = item[open + 1..].trim_end().trim_end_matches('}');
            expand_use(inner, &[prefix, &head[..]].concat(), out);
            continue;
        }
        let (path, alias) = match item.split_once(" as ") {
            Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
            None => (item, None),
        };
        let mut segs: Vec<String> = prefix.to_vec();
        segs.extend(path.split("::").map(|s| s.trim().to_string()).filter(|s| s != "self"));
        let name = alias.or_else(|| segs.last().cloned()).unwrap_or_default();
        out.push((segs, name));
    }
}

/// Every `use` statement of `code` (expanded, and whether it is `pub`), and `code` without them.
fn use_statements(code: &str) -> (Vec<(Vec<String>, String, bool)>, String) {
    let (mut uses, mut rest, mut text) = (Vec::new(), String::new(), code);
    while let Some(at) = text.find("use ") {
        let starts_word =
            at == 0 || !text.as_bytes()[at - 1].is_ascii_alphanumeric() && text.as_bytes()[at - 1] != b'_';
        if !starts_word {
            rest.push_str(&text[..at + 4]);
            text = &text[at + 4..];
            continue;
        }
        let before = text[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let end = item_end(text, at);
        let mut list = Vec::new();
        expand_use(text[at + 4..end].trim_end_matches(';'), &[], &mut list);
        uses.extend(list.into_iter().map(|(p, n)| (p, n, public)));
        rest.push_str(&text[..at]);
        text = &text[end..];
    }
    rest.push_str(text);
    (uses, rest)
}

/// The paths written inline in `code` that start at `crate`, `super`, `self` or one of the
/// module's own children (`threads::Threads::default()`).
fn inline_paths(code: &str, children: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        if !ident(b[i]) || (i > 0 && (ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && (ident(b[i]) || (b[i] == b':' && b.get(i + 1) == Some(&b':'))) {
            i += if b[i] == b':' { 2 } else { 1 };
        }
        let segs: Vec<String> = code[start..i].split("::").filter(|s| !s.is_empty()).map(String::from).collect();
        let head = segs.first().map(String::as_str).unwrap_or("");
        if segs.len() > 1 && (matches!(head, "crate" | "super" | "self") || children.iter().any(|c| c == head)) {
            out.push(segs);
        }
    }
    out
}

type Modules = BTreeMap<String, String>;
type Reexports = BTreeMap<(String, String), Vec<String>>;

/// The module `path` (written in `from`) lands in: the deepest module it names, a re-exported
/// item followed to the module that defines it. `None` for another crate's path.
fn resolve(modules: &Modules, reexports: &Reexports, from: &str, path: &[String], depth: usize) -> Option<String> {
    let (mut cur, rest) = match path.first().map(String::as_str) {
        Some("crate") => (String::new(), &path[1..]),
        Some("self") => (from.to_string(), &path[1..]),
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            ((0..ups).fold(from.to_string(), |m, _| parent(&m)), &path[ups..])
        }
        Some(first) if modules.contains_key(&join(from, first)) => (from.to_string(), path),
        _ => return None,
    };
    for seg in rest {
        let next = join(&cur, seg);
        if modules.contains_key(&next) && next != cur {
            cur = next;
            continue;
        }
        let target = reexports.get(&(cur.clone(), seg.clone())).filter(|_| depth < 8);
        return target.and_then(|t| resolve(modules, reexports, &cur, t, depth + 1)).or(Some(cur));
    }
    Some(cur)
}

/// Each module's uses of other modules (not of its ancestors), with one path that makes each.
fn graph_of(modules: &Modules) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut reexports = Reexports::new();
    let mut paths: BTreeMap<&str, Vec<Vec<String>>> = BTreeMap::new();
    for (m, code) in modules {
        let children: Vec<String> = modules
            .keys()
            .filter(|k| *k != m && parent(k) == *m)
            .map(|k| k.rsplit("::").next().unwrap_or(k).to_string())
            .collect();
        let (uses, rest) = use_statements(code);
        for (path, name, public) in uses {
            if public && name != "*" {
                reexports.insert((m.clone(), name), path.clone());
            }
            paths.entry(m).or_default().push(path);
        }
        paths.entry(m).or_default().extend(inline_paths(&rest, &children));
    }
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (m, ps) in paths {
        for p in ps {
            let Some(t) = resolve(modules, &reexports, m, &p, 0) else { continue };
            let ancestor = t.is_empty() || m.starts_with(&format!("{t}::"));
            if t != m && !ancestor {
                graph.entry(m.to_string()).or_default().entry(t).or_insert_with(|| p.join("::"));
            }
        }
    }
    graph
}

/// The strongly connected groups of more than one module (Tarjan), each sorted.
fn circles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, (usize, usize)>,
        stack: Vec<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, (t.next, t.next));
        t.next += 1;
        t.stack.push(v);
        for w in t.g.get(v).into_iter().flat_map(|e| e.keys()) {
            let low = match t.index.get(w.as_str()) {
                None => {
                    visit(t, w);
                    t.index[w.as_str()].1
                }
                Some(&(i, _)) if t.stack.contains(&w.as_str()) => i,
                Some(_) => continue,
            };
            let e = t.index.get_mut(v).expect("visited");
            e.1 = e.1.min(low);
        }
        if t.index[v].0 == t.index[v].1 {
            let at = t.stack.iter().rposition(|x| *x == v).expect("on the stack");
            let mut group: Vec<String> = t.stack.drain(at..).map(String::from).collect();
            if group.len() > 1 {
                group.sort();
                t.out.push(group);
            }
        }
    }
    let mut t = T { g: graph, index: BTreeMap::new(), stack: Vec::new(), next: 0, out: Vec::new() };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

#[test]
fn no_module_uses_a_module_that_uses_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found: Vec<(Vec<String>, String)> = Vec::new();
    // One graph per crate: a circle between crates cannot build (Cargo refuses a dependency
    // cycle), so every circle lies inside one. Each is named with its crate's.
    let crates = layered_crates().map(|(name, src, _)| (name, src));
    for (name, src) in crates.into_iter().chain([("pipeprof-probes", root.join("probes/src"))]) {
        let prefix = &format!("{name}::");
        let graph = graph_of(&crate_modules(&src));
        for group in circles(&graph) {
            // How the group's modules use each other, one path per use.
            let how: Vec<String> = group
                .iter()
                .flat_map(|m| {
                    let uses = graph.get(m).into_iter().flatten().filter(|(t, _)| group.contains(t));
                    uses.map(move |(t, p)| format!("{prefix}{m} → {prefix}{t} ({p})"))
                })
                .collect();
            found.push((group.iter().map(|m| format!("{prefix}{m}")).collect(), how.join("; ")));
        }
    }
    let allowed: Vec<Vec<String>> =
        ALLOWED_CIRCLES.iter().map(|(c, _)| c.iter().map(|m| m.to_string()).collect()).collect();
    for (group, how) in &found {
        eprintln!("import circle {}: {how}", group.join(" ⇄ "));
    }
    let new: Vec<&(Vec<String>, String)> = found.iter().filter(|(g, _)| !allowed.contains(g)).collect();
    let gone: Vec<&Vec<String>> = allowed.iter().filter(|a| !found.iter().any(|(g, _)| g == *a)).collect();
    assert!(new.is_empty(), "import circles (a module using one that uses it): {new:#?}");
    assert!(gone.is_empty(), "allowed circles that are gone: take them off ALLOWED_CIRCLES: {gone:?}");
}

#[test]
fn the_circle_reader_follows_uses_groups_and_reexports_and_skips_tests_and_comments() {
    let modules: Modules = [
        ("", "pub mod a; pub mod b; mod c; #[cfg(test)]\nmod tests;"),
        ("a", "pub use inner::Thing;\npub mod inner;\nuse crate::b::{self, f as g};"),
        ("a::inner", "use super::super::c::C;\npub struct Thing;"),
        ("b", "// use crate::c::C;\nconst S: &str = \"crate::c::C\";\npub fn f() -> crate::a::Thing { super::a::inner::Thing }"),
        ("c", "#[cfg(test)]\nmod tests { use crate::a::Thing; }\npub struct C;\nfn h() { crate::b::f(); }"),
    ]
    .into_iter()
    .map(|(m, code)| (m.to_string(), without_tests(&code_only(code)).0))
    .collect();
    let graph = graph_of(&modules);
    let edges: Vec<(String, String)> =
        graph.iter().flat_map(|(m, ts)| ts.keys().map(move |t| (m.clone(), t.clone()))).collect();
    let want = [("a", "a::inner"), ("a", "b"), ("a::inner", "c"), ("b", "a::inner"), ("c", "b")];
    assert_eq!(edges, want.map(|(m, t)| (m.to_string(), t.to_string())));
    assert_eq!(circles(&graph), [["a::inner", "b", "c"]]);
    assert_eq!(without_tests("x; #[cfg(test)]\nmod tests;\ny").1, ["tests"]);
    assert_eq!(code_only("let c = '\"'; // crate::x\nlet s = r#\"super::y\"#;"), "let c = ; \nlet s = \"\";");
}

// ---------------------------------------------------------------------------------------------
// Function length: no function of a crate's own code (tests left out) is longer than
// `MAX_FN_LINES` lines, from the line of its `fn` to the line of its closing brace.

/// Every crate's source root. Roots that do not exist (yet) are skipped; `src` must exist.
/// The sources of the crates outside the layer table, beside [`layered_crates`]'s.
const OTHER_SOURCES: &[&str] = &["probes/src", "probes/fake_nvml/src", "python/src"];

const MAX_FN_LINES: usize = 80;

/// The functions of `code` (as `code_only` and `without_tests` left it) longer than `limit`
/// lines: each name with its length.
fn long_functions(code: &str, limit: usize) -> Vec<(String, usize)> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|i| i + from) {
        from = at + 3;
        if at > 0 && ident(b[at - 1]) {
            continue;
        }
        let name: String = code[from..].trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue; // A function pointer type: `fn(u32) -> u32`.
        }
        // The body's `{`, or the `;` of a declaration, outside the signature's brackets.
        let mut depth = 0i32;
        let Some(open) = (from..b.len()).find(|&i| {
            match b[i] {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                _ => {}
            }
            depth == 0 && (b[i] == b'{' || b[i] == b';')
        }) else {
            break;
        };
        if b[open] == b';' {
            continue;
        }
        let lines = code[at..item_end(code, open)].matches('\n').count() + 1;
        if lines > limit {
            out.push((name, lines));
        }
    }
    out
}

#[test]
fn no_function_over_80_lines_outside_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    let every = layered_crates().into_iter().map(|(_, src, _)| src).chain(OTHER_SOURCES.iter().map(|s| root.join(s)));
    for src in every {
        assert!(src.is_dir(), "{} is not a folder: the crate list is out of date", src.display());
        for (file, _, code) in crate_files(&src) {
            let rel = file.strip_prefix(root).expect("under the repository").display().to_string();
            long.extend(
                long_functions(&code, MAX_FN_LINES).into_iter().map(|(f, n)| format!("{rel}: fn {f}: {n} lines")),
            );
        }
    }
    assert!(long.is_empty(), "functions over {MAX_FN_LINES} lines; split them into named parts:\n{}", long.join("\n"));
}

#[test]
fn the_length_reader_counts_lines_of_code_and_skips_tests() {
    let body = |n: usize| "    step();\n".repeat(n);
    let source = format!(
        "fn short() {{\n{}}}\n\
         /// A doc comment.\npub(crate) fn long<T: Fn(u32) -> u32>(f: T) -> [u8; 4]\nwhere T: Copy\n{{\n{}    let s = \"}}\n\n\";\n    /* }}\n */\n}}\n\
         type P = fn(u32) -> u32;\nfn declared();\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n\
         impl X {{\n    fn method(&self) {{\n{}    }}\n}}\n",
        body(3),
        body(6),
        body(20),
        body(9)
    );
    let code = without_tests(&code_only(&source)).0;
    // `long`: its two signature lines, `{`, six steps, a string of three lines, a comment of
    // two, `}`; `method`: its line, nine steps, `}`.
    let want = [("long", 2 + 1 + 6 + 3 + 2 + 1), ("method", 11)];
    assert_eq!(long_functions(&code, 5), want.map(|(f, n)| (f.to_string(), n)));
    assert_eq!(long_functions(&code, 11), [("long".to_string(), 15)]);
    assert!(
        long_functions(&code_only(&source), 11).iter().any(|(f, _)| f == "long_test"),
        "test code counts before without_tests"
    );
}
