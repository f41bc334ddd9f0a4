#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `--json`'s document and its JSON Schema: the committed schema is the one the types make, a
//! released version's schema never changes under the same version, and what `profile --json`
//! and `report --json` print holds against it with a real validator (the Python tests hold
//! `run --json` and every summary they write against it too).

mod common;
use common::*;
use pipeprof::report::json::{schema, VerdictJson, SCHEMA};
use std::path::Path;

/// Each released version of the documents and the CRC-32 of its schema's shape ([`shape`]):
/// a version's shape never changes once released; its descriptions may.
const RELEASED: &[(&str, u32)] = &[
    ("pipeprof.verdict/1", 0xc9aa_3121),
    ("summary/1", 0x6ed4_a208),
    // The node of a job on several machines: `straggler.node`; `settings.node`, `ranks[].node`.
    ("pipeprof.verdict/2", 0xeaaa_0143),
    ("summary/2", 0x0a17_1c8f),
];

/// The two documents: (file, its version's name, the schema the types make, where they are).
fn documents() -> [(&'static str, String, String, &'static str); 2] {
    let summary = format!("summary/{}", pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION);
    [
        ("verdict.schema.json", SCHEMA.to_string(), schema(), "SCHEMA in src/report/json.rs"),
        (
            "summary.schema.json",
            summary,
            pipeprof::session::summary_schema(),
            "SUMMARY_SCHEMA_VERSION in core/src/aggregate/summary.rs",
        ),
    ]
}

fn schema_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema").join(name)
}

#[test]
fn the_committed_schemas_are_the_ones_the_types_make() {
    for (file, version, made, _) in documents() {
        if std::env::var_os("PIPEPROF_WRITE_SCHEMA").is_some() {
            std::fs::write(schema_file(file), &made).unwrap();
        }
        let committed = std::fs::read_to_string(schema_file(file)).unwrap_or_default();
        assert!(
            committed == made,
            "docs/schema/{file} is not what the types make: a field changed. Raise the version ({version}) when a \
             field changes meaning or goes, then write the file with PIPEPROF_WRITE_SCHEMA=1 cargo test --release --test schema"
        );
    }
}

/// A schema without its words (every `description` and `title` left out), as compact JSON:
/// what a change of version is about.
fn shape(schema: &serde_json::Value) -> String {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("description");
                m.remove("title");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = schema.clone();
    strip(&mut v);
    v.to_string()
}

#[test]
fn a_schemas_shape_is_its_fields_not_its_words() {
    let a = serde_json::json!({"description": "x", "properties": {"n": {"type": "integer", "description": "y"}}});
    let b = serde_json::json!({"description": "z", "properties": {"n": {"type": "integer"}}});
    let c = serde_json::json!({"properties": {"n": {"type": "number"}}});
    assert_eq!(shape(&a), shape(&b));
    assert_ne!(shape(&a), shape(&c));
}

#[test]
fn a_released_version_keeps_its_schema() {
    for (file, version, _, raise) in documents() {
        let committed: serde_json::Value = serde_json::from_slice(&std::fs::read(schema_file(file)).unwrap()).unwrap();
        let crc = crc32fast::hash(shape(&committed).as_bytes());
        let Some((_, released)) = RELEASED.iter().find(|(v, _)| *v == version) else {
            panic!("{version} is not in RELEASED: add (\"{version}\", {crc:#010x}) once its schema is final")
        };
        assert_eq!(
            crc, *released,
            "the fields of docs/schema/{file} of {version}, already released, changed (shape CRC-32 now {crc:#010x}): \
             raise {raise} and add the new version to RELEASED"
        );
    }
}

#[test]
fn a_run_with_no_step_is_insufficient_data_and_holds() {
    let d = pipeprof_core::diagnose::Diagnosed::new(pipeprof_core::aggregate::Summary::default());
    let doc = serde_json::to_value(VerdictJson::of(&d, &[])).unwrap();
    assert_eq!(verdict_schema_errors(&doc), Vec::<String>::new());
    assert_eq!(doc["status"], "insufficient_data");
    assert_eq!(doc["limiter"], serde_json::Value::Null);
}

#[test]
fn the_validator_refuses_a_document_that_breaks_the_schema() {
    let d = pipeprof_core::diagnose::Diagnosed::new(pipeprof_core::aggregate::Summary::default());
    let mut doc = serde_json::to_value(VerdictJson::of(&d, &[])).unwrap();
    doc["status"] = "fine".into();
    doc.as_object_mut().unwrap().remove("numbers");
    let errors = verdict_schema_errors(&doc);
    assert_eq!(errors.len(), 2, "{errors:?}");
}

/// `profile --json` on a small folder: stdout is one JSON document and nothing else, it
/// holds against the schema, says what the summary file's verdict says, and `report --json`
/// on that summary gives the same verdict.
#[test]
fn profile_and_report_print_one_document_that_holds() {
    let d = tempfile::tempdir().unwrap();
    let model = write_tiny_model(d.path());
    demo(&d.path().join("imgs"), 2, 24, 5);
    let summary = d.path().join("s.json");
    let (data, s) = (d.path().join("imgs"), summary.to_str().unwrap());
    let out = pipeprof(&["profile", "--model", &model, "--data", data.to_str().unwrap(), "--summary", s, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(verdict_schema_errors(&doc), Vec::<String>::new(), "{doc:#}");
    assert!(text(&out.stderr).contains("verdict: "), "the report goes to stderr: {}", text(&out.stderr));
    let saved = read_summary(&summary);
    assert_eq!(summary_schema_errors(&saved), Vec::<String>::new(), "the summary file holds against its schema");
    assert_eq!(doc["schema"], SCHEMA);
    assert_eq!(doc["headline"], saved["verdict"]["headline"]);
    assert_eq!(doc["numbers"]["steps"], saved["steps"]);
    assert_eq!(doc["evidence"].as_array().map(Vec::len), saved["verdict"]["evidence"].as_array().map(Vec::len));
    let measures = saved["verdict"]["measures"].as_array().unwrap();
    for (item, m) in doc["evidence"].as_array().unwrap().iter().zip(measures) {
        assert_eq!(item["what"], m["what"]);
        assert_eq!(item["value"], m["value"]);
    }
    let again = pipeprof(&["report", s, "--json"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let redone: serde_json::Value = serde_json::from_slice(&again.stdout).expect("one JSON document");
    assert_eq!(verdict_schema_errors(&redone), Vec::<String>::new());
    for key in ["limiter", "severity", "headline", "evidence", "advice", "numbers"] {
        assert_eq!(redone[key], doc[key], "{key}");
    }
}

#[test]
fn report_json_refuses_two_runs_and_html_on_stdout() {
    let d = tempfile::tempdir().unwrap();
    let model = write_tiny_model(d.path());
    demo(&d.path().join("imgs"), 2, 8, 5);
    let a = d.path().join("a.json");
    let data = d.path().join("imgs");
    let run =
        pipeprof(&["profile", "--model", &model, "--data", data.to_str().unwrap(), "--summary", a.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let a = a.to_str().unwrap();
    let two = pipeprof(&["report", a, a, "--json"]);
    assert!(!two.status.success() && two.stdout.is_empty());
    assert!(text(&two.stderr).contains("pipeprof compare --json"), "{}", text(&two.stderr));
    let html = pipeprof(&["report", a, "--json", "--html", "-"]);
    assert_eq!(html.status.code(), Some(2));
    assert!(text(&html.stderr).contains("stdout takes one"), "{}", text(&html.stderr));
}
