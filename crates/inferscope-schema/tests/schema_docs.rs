//! `docs/metrics.md` is generated from the schema; this fails when the two drift.

use std::path::PathBuf;

use inferscope_schema::schema::{DEFAULT_NAMESPACE, render_markdown};

fn docs_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md")
}

#[test]
fn docs_match_schema() {
    let expected = render_markdown(DEFAULT_NAMESPACE);
    let path = docs_path();
    if std::env::var_os("INFERSCOPE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == expected,
        "{} is out of date with the metric schema (src/schema.rs).\n\
         Regenerate it with: INFERSCOPE_BLESS=1 cargo test -p inferscope-schema --test schema_docs",
        path.display()
    );
}
