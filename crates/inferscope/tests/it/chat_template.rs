//! `inferscope chat-template`: the prompt of a model directory's template
//! (`chat_template.jinja` before `tokenizer_config.json`), `--chat-template`
//! over it, tools and extra arguments from the messages file, and errors
//! that name the problem.

use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .arg("chat-template")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn inferscope");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

fn stdout(out: &Output) -> &str {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::str::from_utf8(&out.stdout).expect("utf-8")
}

fn model_dir(dir: &Path) -> String {
    std::fs::create_dir_all(dir).expect("dir");
    let config = serde_json::json!({"bos_token": "<s>", "eos_token": "</s>",
        "chat_template": "config: {{ messages[0].content }}"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("config");
    dir.to_string_lossy().into_owned()
}

#[test]
fn renders_a_model_directorys_template_as_the_server_would() {
    let dir = std::env::temp_dir().join(format!("inferscope-chat-template-{}", std::process::id()));
    let model = model_dir(&dir);
    let chat = r#"[{"role": "user", "content": "hi"}]"#;
    let out = run(&["--model", &model, "--messages", "-"], chat);
    assert_eq!(stdout(&out), "config: hi");

    // transformers v5's file wins over the config's template; the config's
    // special tokens stay; trim_blocks eats the newline after a block tag.
    let file = "{{ bos_token }}{% for m in messages %}\n[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}\n{% if add_generation_prompt %}[assistant]{% endif %}";
    std::fs::write(dir.join("chat_template.jinja"), file).expect("jinja");
    let out = run(&["--model", &model, "--messages", "-"], chat);
    assert_eq!(stdout(&out), "<s>[user] hi</s>[assistant]");
    let out = run(
        &[
            "--model",
            &model,
            "--messages",
            "-",
            "--no-generation-prompt",
        ],
        chat,
    );
    assert_eq!(stdout(&out), "<s>[user] hi</s>");

    // --chat-template over the model's, with its special tokens; tools and
    // extra arguments come from the messages object, key order kept.
    let with_tools = r#"{"messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "description": "é"}], "chat_template_kwargs": {"enable_thinking": false}}"#;
    let out = run(
        &[
            "--model",
            &model,
            "--chat-template",
            "{{ bos_token }}{{ tools | tojson }}|{{ enable_thinking }}",
            "--messages",
            "-",
        ],
        with_tools,
    );
    assert_eq!(
        stdout(&out),
        r#"<s>[{"name": "f", "description": "é"}]|False"#
    );

    // Errors name the problem, with a failing exit status.
    for (args, stdin, want) in [
        (vec!["--model", &model, "--messages", "-"], "[", "not JSON"),
        (
            vec!["--chat-template", "missing.jinja", "--messages", "-"],
            chat,
            "looks like a file path",
        ),
        (
            vec!["--chat-template", "{% if %}", "--messages", "-"],
            chat,
            "syntax error",
        ),
        (
            vec![
                "--chat-template",
                "{{ raise_exception('no user role here') }}",
                "--messages",
                "-",
            ],
            chat,
            "no user role here",
        ),
    ] {
        let out = run(&args, stdin);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
