//! `docs/architecture.md` names files and modules; this fails when one of
//! them is moved or renamed without the document following.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `` `crate/…/file.rs` `` path (under `crates/inferscope-`, or the
/// server's `openai/…`) and every bare `` `name.rs` `` of the server's layer
/// table.
fn named_files(doc: &str) -> (Vec<String>, Vec<String>) {
    let mut paths = Vec::new();
    let mut bare = Vec::new();
    for quoted in doc.split('`').skip(1).step_by(2) {
        let Some(stem) = quoted.strip_suffix(".rs") else {
            continue;
        };
        if quoted.contains('/') {
            paths.push(quoted.to_owned());
        } else if !stem.is_empty() && stem.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            bare.push(quoted.to_owned());
        }
    }
    (paths, bare)
}

#[test]
fn every_file_the_architecture_doc_names_exists() {
    let root = root();
    let doc =
        std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let (paths, bare) = named_files(&doc);
    assert!(
        paths.len() >= 20,
        "the request trace names its files: {paths:?}"
    );
    assert!(
        bare.len() >= 10,
        "the layer table names its modules: {bare:?}"
    );
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            let server = root.join("crates/inferscope-server/src").join(p.as_str());
            !root.join(format!("crates/inferscope-{p}")).is_file() && !server.is_file()
        })
        .chain(
            bare.iter()
                .filter(|b| !root.join("crates/inferscope-server/src").join(b).is_file()),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files that do not exist: {missing:?}"
    );
}
