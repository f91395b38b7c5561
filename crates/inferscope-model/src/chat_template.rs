//! Chat templates: a checkpoint's Jinja template rendered as transformers'
//! `apply_chat_template` renders it, and where the template comes from.
//!
//! transformers compiles templates in a Jinja2 `ImmutableSandboxedEnvironment`
//! with `trim_blocks`, `lstrip_blocks` and the loop-controls extension
//! (`break`/`continue`), its own `tojson` filter (`json.dumps` with
//! `ensure_ascii=False`), and the globals `raise_exception` and
//! `strftime_now`; it renders with `messages`, `tools`, `documents`,
//! `add_generation_prompt`, the tokenizer's special-token strings and any
//! extra keyword arguments. The environment here is set up the same way in
//! minijinja, with Python's `str()` for printed values and Python's string
//! methods (see [`python`]).

mod python;
pub mod strftime;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use minijinja::Value;
pub use minijinja::value::ValueKind;

use crate::error::ModelError;

/// The name the template is compiled under (no extension: no HTML escaping).
const TEMPLATE_NAME: &str = "chat_template";

/// The file of the transformers v5 layout, beside `tokenizer_config.json`;
/// it takes precedence over the config's `chat_template`.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Names the template receives from the renderer itself; extra keyword
/// arguments may not replace them (Python would raise a `TypeError`).
const RESERVED_ARGS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// One message of a chat conversation, as the server has it today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

/// What a chat template renders: the arguments transformers'
/// `apply_chat_template` passes (`chat_template_kwargs` of vLLM's API go
/// into `kwargs`).
#[derive(Debug, Clone, Default)]
pub struct ChatInput {
    /// The conversation: maps with `role`, `content` (a string or a list
    /// of parts such as `{"type": "text", "text": ...}`), and whatever
    /// else a message carries (`tool_calls`, `tool_call_id`, `name`, ...).
    pub messages: Vec<Value>,
    /// End with the opening of the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool schemas; templates see `tools` as none without them.
    pub tools: Option<Vec<Value>>,
    /// Extra keyword arguments (e.g. `enable_thinking`).
    pub kwargs: BTreeMap<String, Value>,
}

impl ChatInput {
    /// Plain `{role, content}` messages, nothing else.
    pub fn from_messages(messages: &[ChatMessage], add_generation_prompt: bool) -> Self {
        Self {
            messages: messages
                .iter()
                .map(|m| {
                    Value::from_iter([
                        ("role", Value::from(m.role.as_str())),
                        ("content", Value::from(m.content.as_str())),
                    ])
                })
                .collect(),
            add_generation_prompt,
            ..Self::default()
        }
    }

    /// The messages as `{role, content}` text, for the plain fallback
    /// template: text parts joined, other contents printed as Python would.
    pub fn plain_messages(&self) -> Vec<ChatMessage> {
        let field = |m: &Value, key: &str| m.get_attr(key).unwrap_or_default();
        self.messages
            .iter()
            .map(|m| {
                let content = field(m, "content");
                let content = match content.kind() {
                    ValueKind::Seq => content
                        .try_iter()
                        .into_iter()
                        .flatten()
                        .map(|part| python::str_of(&field(&part, "text")))
                        .collect(),
                    ValueKind::None => String::new(),
                    _ => python::str_of(&content),
                };
                ChatMessage {
                    role: python::str_of(&field(m, "role")),
                    content,
                }
            })
            .collect()
    }
}

/// A chat template compiled once, with the special-token strings it may
/// print (`bos_token`, `eos_token`).
#[derive(Clone)]
pub struct ChatTemplate {
    source: Arc<str>,
    /// The compiled template, or why it does not compile (reported by
    /// [`ChatTemplate::render`], so a model whose template we cannot run
    /// still serves completions).
    compiled: Arc<Result<minijinja::Environment<'static>, String>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("compiles", &self.compiled.is_ok())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// A template with the special-token strings it may refer to; a
    /// template that does not compile fails each [`ChatTemplate::render`].
    pub fn new(source: String, bos_token: String, eos_token: String) -> Self {
        Self::with_tokens(source, Some(bos_token), Some(eos_token))
    }

    /// Like [`ChatTemplate::new`], but a template that does not compile is
    /// an error now (for templates a user gives).
    pub fn parse(source: String, bos_token: String, eos_token: String) -> Result<Self, ModelError> {
        let t = Self::new(source, bos_token, eos_token);
        t.check()?;
        Ok(t)
    }

    /// Why the template does not compile, if it does not.
    pub fn check(&self) -> Result<(), ModelError> {
        self.env().map(|_| ())
    }

    /// The compiled template.
    fn env(&self) -> Result<&minijinja::Environment<'static>, ModelError> {
        self.compiled
            .as_ref()
            .as_ref()
            .map_err(|e| ModelError::Tokenizer(e.clone()))
    }

    /// A template whose special tokens may be missing: a missing one is
    /// undefined in the template, as transformers leaves it.
    fn with_tokens(source: String, bos_token: Option<String>, eos_token: Option<String>) -> Self {
        let compiled = environment(&source).map_err(|e| format!("chat template: {e:#}"));
        Self {
            source: source.into(),
            compiled: Arc::new(compiled),
            bos_token,
            eos_token,
        }
    }

    /// Reads `chat_template`, `bos_token` and `eos_token` from the text of a
    /// `tokenizer_config.json`; `None` when it has no template.
    pub fn from_tokenizer_config(text: &str) -> Option<Self> {
        Self::from_hf_files(None, Some(text))
    }

    /// The template of a Hugging Face directory's files: `chat_template.jinja`
    /// when there is one, else the `chat_template` of `tokenizer_config.json`
    /// (a string, or a list of named templates of which "default" is taken);
    /// the special tokens come from `tokenizer_config.json`. `None` when
    /// neither has a template.
    pub fn from_hf_files(
        chat_template_jinja: Option<&str>,
        tokenizer_config_json: Option<&str>,
    ) -> Option<Self> {
        let config: Option<serde_json::Value> =
            tokenizer_config_json.and_then(|text| serde_json::from_str(text).ok());
        let source = match chat_template_jinja {
            Some(text) => text.to_string(),
            None => match config.as_ref()?.get("chat_template")? {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(list) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))?
                    .get("template")?
                    .as_str()?
                    .to_string(),
                _ => return None,
            },
        };
        let token = |key: &str| match config.as_ref()?.get(key)? {
            serde_json::Value::String(s) => Some(s.clone()),
            obj => obj.get("content")?.as_str().map(str::to_string),
        };
        Some(Self::with_tokens(
            source,
            token("bos_token"),
            token("eos_token"),
        ))
    }

    /// The template of a Hugging Face directory (see
    /// [`ChatTemplate::from_hf_files`]); `None` when it has none.
    pub fn from_hf_dir(dir: &Path) -> Option<Self> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        Self::from_hf_files(
            read(CHAT_TEMPLATE_FILE).as_deref(),
            read("tokenizer_config.json").as_deref(),
        )
    }

    /// The `tokenizer.chat_template` of a GGUF file's metadata (the tensors
    /// are not read), with the strings of its BOS and EOS ids; `None` when
    /// it has none.
    pub fn from_gguf(path: &Path) -> Result<Option<Self>, ModelError> {
        use candle_core::quantized::gguf_file::Value as Meta;
        let content = crate::gguf_file::GgufFile::read(path)?;
        let meta = &content.metadata;
        let Some(Meta::String(source)) = meta.get("tokenizer.chat_template") else {
            return Ok(None);
        };
        let token = |key: &str| {
            let id = crate::gguf_meta::as_u64(meta.get(key)?)?;
            match meta.get("tokenizer.ggml.tokens")? {
                Meta::Array(tokens) => match tokens.get(usize::try_from(id).ok()?)? {
                    Meta::String(s) => Some(s.clone()),
                    _ => None,
                },
                _ => None,
            }
        };
        Ok(Some(Self::with_tokens(
            source.clone(),
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        )))
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The same special-token strings with another template text.
    pub fn with_source(&self, source: String) -> Result<Self, ModelError> {
        let t = Self::with_tokens(source, self.bos_token.clone(), self.eos_token.clone());
        t.check()?;
        Ok(t)
    }

    /// The same template with other special-token strings (`None` keeps
    /// the current one).
    pub fn with_special_tokens(
        &self,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            bos_token: bos_token.or_else(|| self.bos_token.clone()),
            eos_token: eos_token.or_else(|| self.eos_token.clone()),
            ..self.clone()
        })
    }

    /// Renders plain `{role, content}` messages.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_input(&ChatInput::from_messages(messages, add_generation_prompt))
    }

    /// Renders a conversation with everything transformers passes.
    pub fn render_input(&self, input: &ChatInput) -> Result<String, ModelError> {
        let env = self.env()?;
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        if let Some(t) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::from(t.as_str()));
        }
        if let Some(t) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::from(t.as_str()));
        }
        for (key, value) in &input.kwargs {
            if RESERVED_ARGS.contains(&key.as_str()) {
                return Err(ModelError::Tokenizer(format!(
                    "chat template argument `{key}` cannot be given as an extra argument"
                )));
            }
            ctx.insert(key.clone(), value.clone());
        }
        ctx.insert("messages".into(), Value::from(input.messages.clone()));
        ctx.insert(
            "tools".into(),
            input.tools.clone().map_or(Value::from(()), Value::from),
        );
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(input.add_generation_prompt),
        );
        env.get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(Value::from(ctx)))
            .map_err(|e| ModelError::Tokenizer(format!("chat template: {}", describe(&e))))
    }
}

/// A render error in one line: the message, and where in the template.
fn describe(e: &minijinja::Error) -> String {
    let mut msg = match e.detail() {
        Some(detail) if e.kind() == minijinja::ErrorKind::InvalidOperation => detail.to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line()
        && e.kind() == minijinja::ErrorKind::InvalidOperation
    {
        msg.push_str(&format!(" (template line {line})"));
    }
    msg
}

/// The Jinja environment transformers sets up, holding `source`.
fn environment(source: &str) -> Result<minijinja::Environment<'static>, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Jinja2's default: one trailing newline of the template is dropped.
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(python::unknown_method);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python::str_of(value))
            .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::WriteFailure, e.to_string()))
    });
    env.add_test("iterable", python::is_iterable);
    env.add_test("sequence", python::is_sequence);
    env.add_filter("tojson", python::tojson);
    env.add_filter("string", |v: Value| python::str_of(&v));
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_function("strftime_now", |format: String| {
        strftime::Utc::now().format(&format)
    });
    env.add_template_owned(TEMPLATE_NAME, source.to_string())?;
    Ok(env)
}

/// vLLM's `--chat-template` argument: the text of the file it names, or,
/// when no such file opens and it holds Jinja characters (`{`, `}`, a
/// newline), the template itself with `\n`-style escapes decoded.
pub fn load_template_arg(arg: &str) -> Result<String, ModelError> {
    match std::fs::read_to_string(arg) {
        Ok(text) => Ok(text),
        Err(e) if !arg.contains(['{', '}', '\n']) => Err(ModelError::Tokenizer(format!(
            "--chat-template {arg:?} looks like a file path, but it cannot be read: {e}"
        ))),
        Err(_) => Ok(decode_escapes(arg)),
    }
}

/// `\n`, `\t`, `\r`, `\\`, `\'` and `\"` decoded (what a template written
/// on a command line needs); other backslashes are kept.
fn decode_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek().copied() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(c @ ('\\' | '\'' | '"')) => out.push(c),
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    fn render(source: &str, input: &ChatInput) -> Result<String, ModelError> {
        ChatTemplate::new(source.into(), "<s>".into(), "</s>".into()).render_input(input)
    }

    #[test]
    fn chat_template_renders_with_python_methods_and_errors() {
        let config = r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}[{{ m['role'] }}] {{ m['content'].strip() }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"}"#;
        let t = ChatTemplate::from_tokenizer_config(config).unwrap();
        let out = t.render(&[msg("user", "  hi  ")], true).unwrap();
        assert_eq!(out, "<s>[user] hi</s>[assistant]");
        let err = t.render(&[msg("system", "x")], true).unwrap_err();
        assert!(err.to_string().contains("no system"), "{err}");
        assert!(ChatTemplate::from_tokenizer_config(r#"{"eos_token": "x"}"#).is_none());
    }

    #[test]
    fn blocks_are_trimmed_and_loops_can_break() {
        // trim_blocks eats the newline after a block tag, lstrip_blocks the
        // indentation before one; without them this is "\n  a\n  \n".
        let src = "{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n  {{ m.content }}\n{% endfor %}\n";
        let input = ChatInput::from_messages(&[msg("user", "a"), msg("user", "b")], false);
        assert_eq!(render(src, &input).unwrap(), "  a\n");
        let cont = "{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}";
        let input = ChatInput::from_messages(&[msg("user", "a"), msg("assistant", "b")], false);
        assert_eq!(render(cont, &input).unwrap(), "b");
    }

    #[test]
    fn tojson_is_pythons_json_dumps_without_html_escapes() {
        let input = ChatInput {
            tools: Some(vec![Value::from_serialize(serde_json::json!(
                {"name": "f", "d": "<é> & 'q'", "n": [1, 2.0, null, true]}
            ))]),
            ..ChatInput::default()
        };
        let src = "{{ tools[0] | tojson }}|{{ tools[0].n | tojson(indent=2) }}|{{ tools[0] | tojson(separators=(',', ':'), sort_keys=true) }}|{{ tools[0].d | tojson(ensure_ascii=true) }}";
        // Keys in the order sent (serde_json's preserve_order), as Python's
        // dict keeps them; sort_keys sorts.
        assert_eq!(
            render(src, &input).unwrap(),
            "{\"name\": \"f\", \"d\": \"<é> & 'q'\", \"n\": [1, 2.0, null, true]}|[\n  1,\n  2.0,\n  null,\n  true\n]|{\"d\":\"<é> & 'q'\",\"n\":[1,2.0,null,true],\"name\":\"f\"}|\"<\\u00e9> & 'q'\""
        );
    }

    #[test]
    fn printed_values_are_pythons_str() {
        let input = ChatInput::from_messages(&[msg("user", "x")], true);
        let out = render(
            "{{ none }}|{{ add_generation_prompt }}|{{ messages[0] }}|{{ 1.0 }}|{{ tools }}|{{ [1, 'a'] | string }}|{{ undefined_name }}",
            &input,
        )
        .unwrap();
        assert_eq!(
            out,
            "None|True|{'role': 'user', 'content': 'x'}|1.0|None|[1, 'a']|"
        );
    }

    #[test]
    fn kwargs_reach_the_template_and_cannot_replace_messages() {
        let mut input = ChatInput::from_messages(&[msg("user", "x")], false);
        input
            .kwargs
            .insert("enable_thinking".into(), Value::from(false));
        let src = "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}{{ bos_token }}";
        assert_eq!(render(src, &input).unwrap(), "/no_think<s>");
        input.kwargs.insert("messages".into(), Value::from(1));
        let err = render(src, &input).unwrap_err().to_string();
        assert!(err.contains("`messages`"), "{err}");
    }

    #[test]
    fn special_tokens_missing_from_the_config_are_undefined() {
        let config =
            r#"{"chat_template": "{{ bos_token is defined }}/{{ eos_token }}", "eos_token": null}"#;
        let t = ChatTemplate::from_tokenizer_config(config).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "False/");
    }

    #[test]
    fn chat_template_jinja_takes_precedence_over_the_config() {
        let config = r#"{"chat_template": "config", "bos_token": "<s>"}"#;
        let t = ChatTemplate::from_hf_files(Some("file {{ bos_token }}"), Some(config)).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "file <s>");
        let t = ChatTemplate::from_hf_files(Some("file only"), None).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "file only");
        assert!(ChatTemplate::from_hf_files(None, Some("{}")).is_none());
    }

    #[test]
    fn a_template_that_does_not_compile_is_an_error_not_a_panic() {
        let bad = "{% for m in messages %}{{ m.content }}";
        let err = ChatTemplate::parse(bad.into(), String::new(), String::new()).unwrap_err();
        assert!(err.to_string().contains("chat template"), "{err}");
        let t = ChatTemplate::new(bad.into(), String::new(), String::new());
        assert!(t.render(&[msg("user", "x")], false).is_err());
    }

    #[test]
    fn gguf_metadata_gives_the_template_and_its_token_strings() {
        use candle_core::quantized::gguf_file::{Value as Meta, write};
        let path = std::env::temp_dir().join(format!("inferscope-ct-{}.gguf", std::process::id()));
        let tokens = Meta::Array(
            ["<unk>", "<s>", "</s>"]
                .map(|t| Meta::String(t.into()))
                .to_vec(),
        );
        let source = Meta::String("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into());
        let (bos, eos) = (Meta::U32(1), Meta::U32(2));
        let mut meta = vec![
            ("tokenizer.ggml.tokens", &tokens),
            ("tokenizer.ggml.bos_token_id", &bos),
            ("tokenizer.ggml.eos_token_id", &eos),
        ];
        let mut file = std::fs::File::create(&path).unwrap();
        write(&mut file, &meta, &[]).unwrap();
        assert!(
            ChatTemplate::from_gguf(&path).unwrap().is_none(),
            "no template"
        );
        meta.push(("tokenizer.chat_template", &source));
        let mut file = std::fs::File::create(&path).unwrap();
        write(&mut file, &meta, &[]).unwrap();
        let t = ChatTemplate::from_gguf(&path).unwrap().unwrap();
        assert_eq!(t.render(&[msg("user", "hi")], false).unwrap(), "<s>hi</s>");
        std::fs::write(&path, b"not gguf").unwrap();
        let err = ChatTemplate::from_gguf(&path).unwrap_err().to_string();
        assert!(err.contains("not a valid GGUF"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn template_argument_is_a_path_or_the_text() {
        let dir = std::env::temp_dir().join(format!("inferscope-ct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.jinja");
        std::fs::write(&file, "from file\n").unwrap();
        assert_eq!(
            load_template_arg(file.to_str().unwrap()).unwrap(),
            "from file\n"
        );
        assert_eq!(
            load_template_arg(r"{{ messages[0].content }}\n\\n").unwrap(),
            "{{ messages[0].content }}\n\\n"
        );
        let err = load_template_arg(dir.join("missing.jinja").to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("looks like a file path"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
