//! The scenario tables and the certification reports cannot drift from the registry: each is
//! generated from it or checked against it here. `PALISADE_BLESS=1` rewrites the generated
//! tables (after a change to the registry) instead of failing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::path::{Path, PathBuf};

use palisade_conformance::registry::{SCENARIOS, Shape, markdown_table};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn bless() -> bool {
    std::env::var("PALISADE_BLESS").is_ok_and(|v| v == "1")
}

/// The text between `<!-- scenarios:begin -->` and `<!-- scenarios:end -->`.
fn between_markers(text: &str) -> Option<(usize, usize)> {
    let begin = text.find("<!-- scenarios:begin -->")? + "<!-- scenarios:begin -->\n".len();
    let end = text.find("<!-- scenarios:end -->")?;
    Some((begin, end))
}

#[test]
fn scenario_names_are_unique() {
    for (i, s) in SCENARIOS.iter().enumerate() {
        assert!(!SCENARIOS[..i].iter().any(|o| o.name == s.name), "`{}` is registered twice", s.name);
    }
}

#[test]
fn the_crate_docs_table_is_the_registry() {
    let path = repo().join("conformance/SCENARIOS.md");
    let want = markdown_table();
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        if bless() {
            std::fs::write(&path, &want).unwrap();
        } else {
            panic!("{} differs from the registry: run this test with PALISADE_BLESS=1 and commit", path.display());
        }
    }
}

#[test]
fn the_readme_table_is_the_registry() {
    let path = repo().join("README.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = between_markers(&text).expect("README.md has the scenario table markers");
    let want = markdown_table();
    if text[begin..end] != want {
        if bless() {
            std::fs::write(&path, format!("{}{want}{}", &text[..begin], &text[end..])).unwrap();
        } else {
            panic!(
                "README.md's scenario table differs from the registry: run this test with PALISADE_BLESS=1 and commit"
            );
        }
    }
}

/// Every committed certification report lists exactly the registry's scenarios of what it
/// certified, each with a verdict, and no scenario the registry does not have.
#[test]
fn every_certification_report_matches_the_registry() {
    let dir = repo().join("docs/conformance");
    let mut reports = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        reports += 1;
        let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let mut covered: Vec<&str> = Vec::new();
        for cert in report["certifications"].as_array().unwrap() {
            let kind = cert["kind"].as_str().unwrap();
            let applies = |shape: Shape| match kind {
                "lock service" => shape.certifies_lock_services(),
                "fenced store" => shape.certifies_stores(),
                "pairing" => shape.certifies_pairings(),
                other => panic!("{name}: unknown certification kind {other}"),
            };
            let listed: Vec<&str> =
                cert["scenarios"].as_array().unwrap().iter().map(|s| s["scenario"].as_str().unwrap()).collect();
            let want: Vec<&str> = SCENARIOS.iter().filter(|s| applies(s.shape)).map(|s| s.name).collect();
            for w in &want {
                assert!(listed.contains(w), "{name}: `{}` does not list `{w}`: regenerate the report", cert["name"]);
            }
            for l in &listed {
                assert!(
                    want.contains(l),
                    "{name}: `{}` lists `{l}`, which the registry does not have for it",
                    cert["name"]
                );
            }
            for s in cert["scenarios"].as_array().unwrap() {
                let status = s["status"].as_str().unwrap();
                assert!(
                    ["checked", "refusal checked", "not applicable", "failed"].contains(&status),
                    "{name}: unknown status {status}"
                );
            }
            covered.extend(listed);
        }
        assert!(!covered.is_empty(), "{name}: an empty certification report");
        assert!(dir.join(format!("{name}.md")).exists(), "{name}.json has no {name}.md beside it");
    }
    assert!(reports > 0, "no certification report under {}", dir.display());
}
