//! `docs/architecture.md` names files and modules; this fails when one of
//! them is moved or renamed without the document following.

use std::collections::{BTreeMap, BTreeSet};
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

/// A module of one crate: its path from the crate root (`["openai",
/// "infer"]`), and its file.
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// Every module file under `src` (`src/bin/` holds binaries, not modules).
fn modules(src: &Path) -> Vec<Module> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("readable source dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut mods: Vec<Module> = files
        .into_iter()
        .filter(|f| !f.starts_with(src.join("bin")))
        .map(|file| {
            let rel = file
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut path: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if matches!(path.last().map(String::as_str), Some("mod"))
                || (path.len() == 1 && matches!(path[0].as_str(), "lib" | "main"))
            {
                path.pop();
            }
            Module { path, file }
        })
        .collect();
    mods.sort_by(|a, b| a.path.cmp(&b.path));
    mods
}

/// A file's code without comments and without its trailing
/// `#[cfg(test)] mod tests` (test-only imports are not the module's).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal (a URL) keeps its line whole;
            // what follows it names no module either way.
            Some(i) if l[..i].matches('"').count() % 2 == 0 => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifier at the start of `s`, and the rest.
fn ident(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// The paths a `use` tree or an expression path names, from `s` (just after
/// `crate::`, `super::` or a group's `{`), each prefixed with `prefix`.
fn paths_from(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    let mut rest = s.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            // Items at depth 0, split at commas.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        paths_from(&group[start..i], path.clone(), out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        paths_from(&group[start..i], path.clone(), out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let (id, after) = ident(rest);
        if id.is_empty() {
            break;
        }
        path.push(id.to_owned());
        match after.strip_prefix("::") {
            Some(more) => rest = more.trim_start(),
            None => break,
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// The modules of `mods` that module `me` names in `code`, outside its own
/// line of descent (a submodule using its parent's items is the parent's
/// own part).
fn imports(code: &str, me: &[String], mods: &[Module]) -> BTreeSet<Vec<String>> {
    let mut named = Vec::new();
    let bytes = code.as_bytes();
    for (i, _) in code.match_indices("crate::") {
        // Not the tail of another path (`inferscope_crate::`).
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
            continue;
        }
        paths_from(&code[i + 7..], Vec::new(), &mut named);
    }
    for (i, _) in code.match_indices("super::") {
        if i > 0
            && (bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':')
        {
            continue;
        }
        // `super::super::x` climbs twice; a file module's `super` is its parent.
        let mut base = me.to_vec();
        let mut rest = &code[i..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        paths_from(rest, base, &mut named);
    }
    let lineage = |p: &[String]| p.starts_with(me) || me.starts_with(p);
    named
        .into_iter()
        .filter_map(|p| {
            // The longest prefix of the path that is a module file.
            (1..=p.len())
                .rev()
                .find_map(|n| mods.iter().find(|m| m.path == p[..n]))
                .map(|m| m.path.clone())
        })
        .filter(|p| !lineage(p))
        .collect()
}

/// Each crate's module graph: module path → the modules it imports.
fn module_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules(src);
    mods.iter()
        .map(|m| {
            let text = std::fs::read_to_string(&m.file).expect("readable module");
            (m.path.clone(), imports(&code_of(&text), &m.path, &mods))
        })
        .collect()
}

fn crate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let mut circles = Vec::new();
    let mut edges = 0;
    for dir in crate_dirs() {
        let graph = module_graph(&dir.join("src"));
        for (a, deps) in &graph {
            edges += deps.len();
            for b in deps {
                if a < b && graph.get(b).is_some_and(|d| d.contains(a)) {
                    circles.push(format!(
                        "{}: {} <-> {}",
                        dir.file_name().unwrap_or_default().to_string_lossy(),
                        a.join("::"),
                        b.join("::")
                    ));
                }
            }
        }
    }
    // The reader must see the imports at all for its silence to mean anything.
    assert!(edges > 200, "only {edges} imports found in crates/*/src");
    assert!(
        circles.is_empty(),
        "modules importing each other: {circles:#?}"
    );
}

#[test]
fn the_import_reader_sees_use_trees_and_super() {
    let mods: Vec<Module> = [
        vec![],
        vec!["a"],
        vec!["b"],
        vec!["b", "c"],
        vec!["d"],
        vec!["e"],
    ]
    .into_iter()
    .map(|p| Module {
        path: p.into_iter().map(String::from).collect(),
        file: PathBuf::new(),
    })
    .collect();
    let me = vec!["b".to_owned(), "c".to_owned()];
    let code = "use crate::{a::X, d::{self, Y}};\nuse super::Z;\nfn f() { super::super::e::g(); inferscope_crate::a(); }\n// crate::x::y\n";
    let got: Vec<String> = imports(&code_of(code), &me, &mods)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(got, ["a", "d", "e"]);
}

/// The server layer table's rows: the modules of each row's first cell
/// (`openai/infer.rs` → `openai::infer`, `otel/` → `otel`) and the
/// names of its imports cell.
fn layer_table(doc: &str) -> Vec<(Vec<Vec<String>>, BTreeSet<String>)> {
    let start = doc
        .find("## The server's layers")
        .expect("the layer section");
    let section = &doc[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let mods = cells[0]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|m| {
                    m.trim_end_matches(".rs")
                        .trim_end_matches('/')
                        .split('/')
                        .map(String::from)
                        .collect()
                })
                .collect();
            let names = cells[cells.len() - 1]
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty() && *n != "—")
                .map(String::from)
                .collect();
            (mods, names)
        })
        .collect()
}

/// How the layer table names module `target` as an import of a module in
/// `home` (`[]` for a top-level module, `["openai"]` inside openai/):
/// a sibling by its own name, anything else by its top-level name.
fn table_name(target: &[String], home: &[String]) -> String {
    match target.strip_prefix(home) {
        Some([first, ..]) if !home.is_empty() => first.clone(),
        _ => target[0].clone(),
    }
}

#[test]
fn the_server_layer_table_names_each_modules_imports() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("doc");
    let graph = module_graph(&root().join("crates/inferscope-server/src"));
    let rows = layer_table(&doc);
    assert!(
        rows.len() >= 12,
        "the layer table has its rows: {}",
        rows.len()
    );
    let mut covered = BTreeSet::new();
    for (i, (mods, names)) in rows.iter().enumerate() {
        let mut actual = BTreeSet::new();
        for m in mods {
            let home: Vec<String> = m[..m.len().saturating_sub(1)].to_vec();
            let mut found = false;
            for (path, deps) in graph.range(m.clone()..) {
                if !path.starts_with(m) {
                    break;
                }
                found = true;
                covered.insert(path.clone());
                for d in deps.iter().filter(|d| !d.starts_with(m)) {
                    actual.insert(table_name(d, &home));
                }
            }
            assert!(
                found,
                "the layer table names {}, which is no module",
                m.join("/")
            );
        }
        let row = mods
            .iter()
            .map(|m| m.join("/"))
            .collect::<Vec<_>>()
            .join(", ");
        assert_eq!(
            names, &actual,
            "docs/architecture.md, layer table, row {row}: the imports column says {names:?}, the `use` lines say {actual:?}"
        );
        // Each import is a row further down.
        for n in names {
            let below = rows[i + 1..].iter().any(|(ms, _)| {
                ms.iter()
                    .any(|m| m.last() == Some(n) || m.first() == Some(n))
            });
            assert!(below, "row {row} imports {n}, which is not below it");
        }
    }
    let uncovered: Vec<String> = graph
        .keys()
        .filter(|p| !p.is_empty() && !covered.contains(*p) && p.as_slice() != ["openai"])
        .map(|p| p.join("::"))
        .collect();
    assert!(
        uncovered.is_empty(),
        "server modules missing from the layer table: {uncovered:?}"
    );
}

/// `crates/inferscope-X` → `X`; the binary crate is `inferscope`.
fn short(name: &str) -> String {
    name.strip_prefix("inferscope-").unwrap_or(name).to_owned()
}

/// Each workspace crate's inferscope dependencies (normal ones), by short name.
fn cargo_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|n| n.starts_with("inferscope"))
                .map(short)
                .collect();
            (short(p["name"].as_str().expect("name")), deps)
        })
        .collect()
}

#[test]
fn the_crate_diagram_and_table_are_cargos_graph() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("doc");
    let cargo = cargo_graph();
    let start = doc
        .find("## Crates and their one-way dependencies")
        .expect("section");
    let block = &doc[start..];
    let block = &block[block.find("```\n").expect("diagram") + 4..];
    let block = &block[..block.find("```").expect("diagram end")];
    let mut drawn: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in block.lines().filter(|l| l.contains("<-")) {
        let (deps, user) = line.split_once("<-").expect("an arrow");
        let user = user.split_whitespace().next().expect("a crate").to_owned();
        let user = if user == "inferscope" {
            user
        } else {
            user.replace('_', "-")
        };
        drawn
            .entry(user)
            .or_default()
            .extend(deps.split(',').map(|d| d.trim().to_owned()));
    }
    let with_deps: BTreeMap<String, BTreeSet<String>> = cargo
        .iter()
        .filter(|(_, d)| !d.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(drawn, with_deps, "the diagram against cargo metadata");
    // The table's last column: "none (…)" or the short names.
    for line in doc[start..]
        .lines()
        .filter(|l| l.starts_with("| `inferscope"))
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let name = short(cells[0].trim_matches('`'));
        let listed: BTreeSet<String> = if cells[2].starts_with("none") {
            BTreeSet::new()
        } else {
            cells[2].split(',').map(|d| d.trim().to_owned()).collect()
        };
        assert_eq!(
            Some(&listed),
            cargo.get(&name),
            "the table's row for {name}"
        );
    }
}
