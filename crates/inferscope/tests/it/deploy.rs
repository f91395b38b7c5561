//! The deployment files agree with the code: the Dockerfile builds with the
//! README's release command, and every metric name and inferscope flag that
//! `deploy/kubernetes/` and `docs/scale-out.md` use exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use inferscope_schema::schema::{MetricType, all_metrics};

/// Flags of the endpoint picker's container (GIE's EPP / llm-d's inference
/// scheduler), not inferscope's: listed so that a typo in ours still fails.
const EPP_FLAGS: &[&str] = &[
    "--pool-name",
    "--pool-namespace",
    "--config-file",
    "--total-queued-requests-metric",
    "--total-running-requests-metric",
    "--kv-cache-usage-percentage-metric",
];

/// Flags of `cargo bench` in the measurement commands `docs/scale-out.md`
/// quotes.
const CARGO_FLAGS: &[&str] = &["--bench"];

/// `vllm:` names another branch adds (vLLM 2026 parity); empty while these
/// files reference none of them. The lead checks them after merging.
const EXPECTED_FROM_OTHER_BRANCHES: &[&str] = &[];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The files whose names and flags are checked.
fn checked_files() -> Vec<(String, String)> {
    let mut files = vec![("docs/scale-out.md".to_owned(), read("docs/scale-out.md"))];
    let dir = repo().join("deploy/kubernetes");
    let mut yamls: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    yamls.sort();
    assert!(yamls.len() >= 2, "inferscope.yaml and inferscope-gie.yaml");
    for p in yamls {
        let rel = format!(
            "deploy/kubernetes/{}",
            p.file_name().unwrap().to_string_lossy()
        );
        files.push((rel.clone(), read(&rel)));
    }
    files
}

/// Tokens of `text` that start with `prefix` and go on over `[a-z0-9_-]`.
fn tokens(text: &str, prefix: &str, extra: char) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        let tail = &rest[i + prefix.len()..];
        let len = tail
            .find(|c: char| {
                !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == extra)
            })
            .unwrap_or(tail.len());
        // `--x` inside a word (e.g. `a--b`) and `---` (a table rule) are
        // not flags: a name starts with a letter.
        if tail.starts_with(|c: char| c.is_ascii_lowercase())
            && before.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-')
        {
            out.insert(format!("{prefix}{}", &tail[..len]));
        }
        rest = &tail[len..];
    }
    out
}

fn vllm_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for def in all_metrics() {
        let exposed = def.exposed_name("vllm");
        let base = format!("vllm:{}", def.vllm_base());
        for n in [exposed, base] {
            if def.metric_type == MetricType::Histogram {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{n}{s}"));
                }
            }
            names.insert(n);
        }
    }
    names.extend(EXPECTED_FROM_OTHER_BRANCHES.iter().map(|s| s.to_string()));
    names
}

#[test]
fn every_metric_name_used_exists() {
    let known = vllm_names();
    let mut used = 0;
    for (file, text) in checked_files() {
        for name in tokens(&text, "vllm:", '_') {
            used += 1;
            assert!(
                known.contains(&name),
                "{file}: `{name}` is not a metric inferscope serves"
            );
        }
    }
    assert!(used >= 4, "the router's names are referenced");
}

#[test]
fn every_flag_used_exists() {
    let help = Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .args(["serve", "--help"])
        .output()
        .expect("run inferscope serve --help");
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    let serve_flags = tokens(&help, "--", '-');
    assert!(serve_flags.contains("--data-parallel-rank"));
    assert!(serve_flags.contains("--kv-events-config"));
    for (file, text) in checked_files() {
        // YAML comments may mention anything; prose and commands may not.
        let lines: Vec<&str> = if file.ends_with(".md") {
            text.lines().collect()
        } else {
            text.lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect()
        };
        for flag in tokens(&lines.join("\n"), "--", '-') {
            assert!(
                serve_flags.contains(&flag)
                    || EPP_FLAGS.contains(&flag.as_str())
                    || (file.ends_with(".md") && CARGO_FLAGS.contains(&flag.as_str())),
                "{file}: `{flag}` is not a flag of `inferscope serve`"
            );
        }
    }
}

#[test]
fn dockerfile_builds_with_the_readme_release_command() {
    let readme = read("README.md");
    let commands: BTreeSet<&str> = readme
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("cargo build --release"))
        .collect();
    assert_eq!(
        commands.len(),
        1,
        "one release build command in the README: {commands:?}"
    );
    let readme_cmd = *commands.iter().next().unwrap();

    let dockerfile = read("deploy/Dockerfile");
    let mut stage = None;
    let mut build_runs = Vec::new();
    let mut user = None;
    let mut last_from = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if let Some(from) = line.strip_prefix("FROM ") {
            stage = from.split_whitespace().last().map(str::to_owned);
            last_from = from.to_owned();
        } else if let Some(run) = line.strip_prefix("RUN ")
            && stage.as_deref() == Some("build")
        {
            build_runs.push(run.to_owned());
        } else if let Some(u) = line.strip_prefix("USER ") {
            user = Some(u.to_owned());
        }
    }
    assert_eq!(
        build_runs,
        vec![readme_cmd.to_owned()],
        "the build stage runs the README's command"
    );
    assert!(last_from.contains("slim"), "slim runtime base: {last_from}");
    let user = user.expect("a USER line");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "non-root user: {user}"
    );
    assert!(dockerfile.contains(r#"ENTRYPOINT ["inferscope", "serve""#));
    assert!(dockerfile.contains("HEALTHCHECK") && dockerfile.contains("/health"));
}

#[test]
fn the_token_scanner_finds_names_and_flags() {
    let t = tokens(
        "a vllm:num_requests_waiting{x} --foo-bar=1 x--y -- `--kv`",
        "--",
        '-',
    );
    assert_eq!(t.into_iter().collect::<Vec<_>>(), vec!["--foo-bar", "--kv"]);
    let n = tokens("(vllm:kv_cache_usage_perc) vllm:", "vllm:", '_');
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        vec!["vllm:kv_cache_usage_perc"]
    );
}
