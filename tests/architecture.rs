#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What Cargo does not check of the house (ARCHITECTURE.md). Cargo enforces the crates'
//! direction (`pipeprof-core` cannot name the trainer or the binary, the trainer not the
//! binary) and refuses a circle between crates; inside a crate it checks nothing. So, read
//! with `syn` (test code left out):
//! - inside each of the three layered crates every module has a layer and uses only its own
//!   layer's module or lower layers (the data flows one way);
//! - no two modules of a crate use each other, directly or through others;
//! - no function is longer than [`MAX_FN_LINES`], and none over [`FN_LINES`] without its
//!   reason in [`LONG_FUNCTIONS`];
//! - the core crate builds without candle or the crates above it (`cargo tree`).

use proc_macro2::{TokenStream, TokenTree};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use syn::visit::Visit;

/// A crate's layers, bottom first, by module path: a module's layer is that of the longest
/// entry that is its path or holds it (`commands::profile::options` is in `commands::profile`).
/// Modules of one entry may use each other; of another entry, only a lower layer's.
type Layers = &'static [&'static [&'static str]];

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

/// The workspace's crates: (name, src, layers; `None` for a crate with no layer table).
fn crates() -> Vec<(&'static str, PathBuf, Option<Layers>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![
        ("pipeprof-core", root.join("core/src"), Some(CORE)),
        ("pipeprof-trainer", root.join("trainer/src"), Some(TRAINER)),
        ("pipeprof", root.join("src"), Some(BINARY)),
        ("pipeprof-probes", root.join("probes/src"), None),
        ("pipeprof-fake-nvml", root.join("probes/fake_nvml/src"), None),
        ("pipeprof-python", root.join("python/src"), None),
    ]
}

/// The longest function allowed at all.
const MAX_FN_LINES: usize = 80;
/// The longest function allowed without a reason.
const FN_LINES: usize = 60;
/// Functions over [`FN_LINES`] (file, function) and why they stay whole.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    (
        "trainer/src/train/mod.rs",
        "train",
        "the epoch loop: each step's spans, stops and progress in the order they run",
    ),
    (
        "trainer/src/train/mod.rs",
        "compute_step",
        "one step's forward, backward and update, each a span: split, the spans' nesting would spread over functions",
    ),
    (
        "trainer/src/cache/build.rs",
        "build",
        "one pass over the images with its error paths, in the order they are written",
    ),
    ("trainer/src/cache/build.rs", "write_pixels", "one pass writing each image's pixels with its error paths"),
];

/// The entry of `layers` that holds module `path` (`a::b::c`), and its layer.
fn entry_of(layers: Layers, path: &str) -> Option<(&'static str, usize)> {
    let holds = |e: &str| path == e || path.strip_prefix(e).is_some_and(|r| r.starts_with("::"));
    layers
        .iter()
        .enumerate()
        .flat_map(|(k, l)| l.iter().map(move |e| (*e, k)))
        .filter(|(e, _)| holds(e))
        .max_by_key(|(e, _)| e.len())
}

/// What one file says, test code left out: the paths it names (use trees expanded, inline
/// paths, paths inside macro calls), its public re-exports (bound name → path), the test-only
/// module files it declares, and each function with its lines (from `fn` to its `}`).
#[derive(Default, Debug)]
struct FileFacts {
    paths: Vec<Vec<String>>,
    reexports: Vec<(String, Vec<String>)>,
    test_mods: Vec<String>,
    fns: Vec<(String, usize)>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<TokenStream>().is_ok_and(|t| t.to_string().split_whitespace().any(|w| w == "test"))
    })
}

/// The paths a use tree names, each with the name it binds: `a::{b, c::D as E}` →
/// (`a::b`, `b`), (`a::c::D`, `E`).
fn expand_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            expand_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.clone(), prefix.last().cloned().unwrap_or_default()))
        }
        syn::UseTree::Name(n) => out.push(([prefix.as_slice(), &[n.ident.to_string()]].concat(), n.ident.to_string())),
        syn::UseTree::Rename(r) => {
            out.push(([prefix.as_slice(), &[r.ident.to_string()]].concat(), r.rename.to_string()))
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), "*".into())),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| expand_use(t, prefix, out)),
    }
}

/// Every `a::b::c` run of names in a macro's tokens (`format!("{}", crate::units::ms(x))`).
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let mut run: Vec<String> = Vec::new();
    let mut colons = 0;
    for t in tokens {
        match t {
            TokenTree::Ident(i) if run.is_empty() || colons == 2 => {
                run.push(i.to_string());
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => colons += 1,
            other => {
                if run.len() > 1 {
                    out.push(std::mem::take(&mut run));
                }
                run.clear();
                colons = 0;
                match other {
                    TokenTree::Group(g) => token_paths(g.stream(), out),
                    TokenTree::Ident(i) => run.push(i.to_string()),
                    _ => {}
                }
            }
        }
    }
    if run.len() > 1 {
        out.push(run);
    }
}

impl<'a> Visit<'a> for FileFacts {
    fn visit_item(&mut self, item: &'a syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test(attrs) {
            if let syn::Item::Mod(m) = item {
                self.test_mods.push(m.ident.to_string());
            }
            return;
        }
        if let syn::Item::Use(u) = item {
            let mut uses = Vec::new();
            expand_use(&u.tree, &mut Vec::new(), &mut uses);
            for (path, name) in uses {
                if !matches!(u.vis, syn::Visibility::Inherited) && name != "*" {
                    self.reexports.push((name, path.clone()));
                }
                self.paths.push(path);
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.function(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        self.function(&f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(b) = &f.default {
            self.function(&f.sig, b);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }

    fn visit_path(&mut self, p: &'a syn::Path) {
        self.paths.push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'a syn::Macro) {
        token_paths(m.tokens.clone(), &mut self.paths);
        syn::visit::visit_macro(self, m);
    }
}

impl FileFacts {
    fn function(&mut self, sig: &syn::Signature, body: &syn::Block) {
        let lines = body.brace_token.span.close().end().line - sig.fn_token.span.start().line + 1;
        self.fns.push((sig.ident.to_string(), lines));
    }

    fn of(code: &str) -> FileFacts {
        let file = syn::parse_file(code).expect("the source parses");
        let mut facts = FileFacts::default();
        facts.visit_file(&file);
        facts
    }
}

/// What `main.rs` is called beside `lib.rs` (the root, ``): a crate root of its own, in no layer.
const MAIN: &str = "<main>";

/// A file's module path below its crate's `src` (`commands/profile/mod.rs` is
/// `commands::profile`; `lib.rs` is the root, ``, and `main.rs` [`MAIN`]).
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if parts.last().is_some_and(|f| f == "mod") {
        parts.pop();
    }
    if parts == ["main"] {
        return MAIN.to_string();
    }
    if parts == ["lib"] {
        parts.clear();
    }
    parts.join("::")
}

fn join(module: &str, child: &str) -> String {
    if module.is_empty() {
        child.to_string()
    } else {
        format!("{module}::{child}")
    }
}

fn parent(module: &str) -> String {
    module.rsplit_once("::").map_or(String::new(), |(p, _)| p.to_string())
}

/// One crate's modules: each file's module path with its facts, test-only module files (and
/// what is below them) left out.
fn crate_modules(src: &Path) -> BTreeMap<String, (PathBuf, FileFacts)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("src is readable").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut all: BTreeMap<String, (PathBuf, FileFacts)> = files
        .into_iter()
        .map(|f| {
            let code = std::fs::read_to_string(&f).expect("readable");
            (module_of(f.strip_prefix(src).expect("under src")), (f, FileFacts::of(&code)))
        })
        .collect();
    let tests: Vec<String> =
        all.iter().flat_map(|(m, (_, facts))| facts.test_mods.iter().map(move |t| join(m, t))).collect();
    all.retain(|m, _| !tests.iter().any(|t| m == t || m.starts_with(&format!("{t}::"))));
    all
}

type Reexports = BTreeMap<(String, String), Vec<String>>;

/// The module `path` (written in `from`) lands in: the deepest module it names, a re-exported
/// item followed to the module that defines it. `None` for another crate's path.
fn resolve(modules: &[String], reexports: &Reexports, from: &str, path: &[String], depth: usize) -> Option<String> {
    let known = |m: &str| modules.iter().any(|k| k == m);
    let (mut cur, rest) = match path.first().map(String::as_str) {
        Some("crate") => (String::new(), &path[1..]),
        Some("self") => (from.to_string(), &path[1..]),
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            ((0..ups).fold(from.to_string(), |m, _| parent(&m)), &path[ups..])
        }
        Some(first) if known(&join(from, first)) => (from.to_string(), path),
        _ => return None,
    };
    for seg in rest {
        let next = join(&cur, seg);
        if known(&next) && next != cur {
            cur = next;
            continue;
        }
        let target = reexports.get(&(cur.clone(), seg.clone())).filter(|_| depth < 8);
        return target.and_then(|t| resolve(modules, reexports, &cur, t, depth + 1)).or(Some(cur));
    }
    Some(cur)
}

/// Each module's uses of other modules, with one path that makes each: of its ancestors too
/// (but the root) with `ancestors`, for the layers; without, for circles (a module may always
/// use its parent, which declared it).
fn graph_of(
    modules: &BTreeMap<String, (PathBuf, FileFacts)>,
    ancestors: bool,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let names: Vec<String> = modules.keys().cloned().collect();
    let reexports: Reexports = modules
        .iter()
        .flat_map(|(m, (_, f))| f.reexports.iter().map(move |(name, p)| ((m.clone(), name.clone()), p.clone())))
        .collect();
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (m, (_, facts)) in modules {
        for p in &facts.paths {
            let Some(t) = resolve(&names, &reexports, m, p, 0) else { continue };
            let ancestor = t.is_empty() || (m.starts_with(&format!("{t}::")) && !ancestors);
            if t != *m && !ancestor {
                graph.entry(m.clone()).or_default().entry(t).or_insert_with(|| p.join("::"));
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

/// A layered crate's uses that look up: each module's (file, what it uses).
fn uses_looking_up(modules: &BTreeMap<String, (PathBuf, FileFacts)>, layers: Layers) -> Vec<(String, String)> {
    let mut wrong = Vec::new();
    let mut graph = graph_of(modules, true);
    for (m, (file, _)) in modules.iter().filter(|(m, _)| !m.is_empty() && *m != MAIN) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let file = file.strip_prefix(root).unwrap_or(file).display().to_string();
        let Some((own, layer)) = entry_of(layers, m) else {
            wrong.push((file, format!("module {m} has no layer")));
            continue;
        };
        for (t, how) in graph.remove(m).unwrap_or_default() {
            match entry_of(layers, &t) {
                Some((e, _)) if e == own => {}
                Some((_, l)) if l < layer => {}
                _ => wrong.push((file.clone(), format!("{m} uses {t} ({how})"))),
            }
        }
    }
    wrong
}

#[test]
fn every_module_has_a_layer_and_uses_only_lower_layers_and_no_module_uses_one_that_uses_it() {
    let mut wrong = Vec::new();
    let mut found = Vec::new();
    for (name, src, layers) in crates() {
        assert!(src.is_dir(), "{} is not a folder: the crate list is out of date", src.display());
        let modules = crate_modules(&src);
        if let Some(layers) = layers {
            wrong.extend(uses_looking_up(&modules, layers));
        }
        // One graph per crate: a circle between crates cannot build.
        let graph = graph_of(&modules, false);
        for group in circles(&graph) {
            let how: Vec<String> = group
                .iter()
                .flat_map(|m| {
                    let uses = graph.get(m).into_iter().flatten().filter(|(t, _)| group.contains(t));
                    uses.map(move |(t, p)| format!("{name}::{m} → {t} ({p})"))
                })
                .collect();
            found.push(how.join("; "));
        }
    }
    assert!(wrong.is_empty(), "uses that look up (see ARCHITECTURE.md): {wrong:#?}");
    assert!(found.is_empty(), "import circles (a module using one that uses it): {found:#?}");
}

#[test]
fn no_function_over_60_lines_without_its_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut long, mut listed) = (Vec::new(), Vec::new());
    for (_, src, _) in crates() {
        for (file, facts) in crate_modules(&src).into_values() {
            let rel = file.strip_prefix(root).expect("under the repository").display().to_string();
            for (f, n) in facts.fns.into_iter().filter(|(_, n)| *n > FN_LINES) {
                let reason = LONG_FUNCTIONS.iter().any(|(lf, lfn, _)| *lf == rel && *lfn == f);
                if reason {
                    listed.push((rel.clone(), f.clone()));
                }
                if n > MAX_FN_LINES || !reason {
                    long.push(format!("{rel}: fn {f}: {n} lines"));
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over {FN_LINES} lines: split them into named parts:\n{}", long.join("\n"));
    let gone: Vec<_> =
        LONG_FUNCTIONS.iter().filter(|(f, n, _)| !listed.iter().any(|(lf, ln)| lf == f && ln == n)).collect();
    assert!(gone.is_empty(), "listed as long but no longer over {FN_LINES} lines: take them off: {gone:?}");
}

#[test]
fn the_reader_follows_uses_groups_reexports_and_macros_and_skips_tests() {
    let files = [
        ("", "pub mod a; pub mod b; mod c; #[cfg(test)]\nmod tests;"),
        ("a", "pub use inner::Thing;\npub mod inner;\nuse crate::b::{self, f as g};"),
        ("a::inner", "use super::super::c::C;\npub struct Thing;"),
        ("b", "// use crate::c::C;\nconst S: &str = \"crate::c::C\";\npub fn f() -> crate::a::Thing { super::a::inner::Thing }"),
        ("c", "#[cfg(test)]\nmod tests { use crate::a::Thing; }\npub struct C;\nfn h() { assert!(crate::b::f() == 1); }"),
        ("tests", "use crate::c::C;"),
        ("b::low", "pub fn g() { super::f(); }"),
    ];
    let mut modules: BTreeMap<String, (PathBuf, FileFacts)> =
        files.into_iter().map(|(m, code)| (m.to_string(), (PathBuf::from(m), FileFacts::of(code)))).collect();
    assert_eq!(modules[""].1.test_mods, ["tests"]);
    modules.remove("tests");
    let graph = graph_of(&modules, false);
    let edges: Vec<(String, String)> =
        graph.iter().flat_map(|(m, ts)| ts.keys().map(move |t| (m.clone(), t.clone()))).collect();
    let want = [("a", "a::inner"), ("a", "b"), ("a::inner", "c"), ("b", "a::inner"), ("c", "b")];
    assert_eq!(edges, want.map(|(m, t)| (m.to_string(), t.to_string())));
    assert_eq!(circles(&graph), [["a::inner", "b", "c"]]);
    // Layers: `c` below `b` may not use it; `a` and `b`, two entries of one layer, may not use
    // each other; `a::inner` is `a`'s entry, and uses `c` below; `b::low`, an entry below its
    // parent's, may not use its parent's items either.
    let layers: Layers = &[&["c"], &["b::low"], &["a", "b"]];
    let wrong = uses_looking_up(&modules, layers);
    let want = [
        ("a", "a uses b (crate::b)"),
        ("b", "b uses a::inner (crate::a::Thing)"),
        ("b::low", "b::low uses b (super::f)"),
        ("c", "c uses b (crate::b::f)"),
    ];
    assert_eq!(wrong, want.map(|(f, w)| (f.to_string(), w.to_string())));
    assert_eq!(entry_of(BINARY, "commands::profile::check::run"), Some(("commands::profile::check", 7)));
    assert_eq!(entry_of(BINARY, "commands::profile::options"), Some(("commands::profile", 3)));
    assert_eq!(entry_of(BINARY, "commandsx"), None);
    assert_eq!(module_of(Path::new("commands/profile/mod.rs")), "commands::profile");
    assert_eq!(module_of(Path::new("lib.rs")), "");
    assert_eq!(module_of(Path::new("main.rs")), MAIN);
}

#[test]
fn the_reader_counts_a_functions_lines_from_fn_to_its_brace_and_skips_tests() {
    let body = |n: usize| "    step();\n".repeat(n);
    let source = format!(
        "fn short() {{\n{}}}\n\
         /// A doc comment.\npub(crate) fn long<T: Fn(u32) -> u32>(f: T) -> [u8; 4]\nwhere T: Copy\n{{\n{}    let s = \"}}\n\n\";\n    /* }}\n */\n}}\n\
         type P = fn(u32) -> u32;\ntrait D {{ fn declared(); }}\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n\
         impl X {{\n    fn method(&self) {{\n{}    }}\n}}\n",
        body(3),
        body(6),
        body(20),
        body(9)
    );
    // `short`: its line, three steps, `}`; `long`: its two signature lines, `{`, six steps, a
    // string of three lines, a comment of two, `}`; `method`: its line, nine steps, `}`.
    let want = [("short", 5), ("long", 2 + 1 + 6 + 3 + 2 + 1), ("method", 11)];
    assert_eq!(FileFacts::of(&source).fns, want.map(|(f, n)| (f.to_string(), n)));
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
