//! `inferscope chat-template`: renders a conversation with a model's chat
//! template (or a given one) exactly as the server does, to see the prompt a
//! model gets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use inferscope_model::chat_template::{
    ChatInput, ChatTemplate, Value, ValueKind, load_template_arg,
};
use inferscope_model::tokenizer::default_chat_template;

/// Arguments of `inferscope chat-template`.
#[derive(Args, Debug)]
pub struct ChatTemplateArgs {
    /// A Hugging Face model directory (its `chat_template.jinja`, else the template of its
    /// `tokenizer_config.json`) or a `.gguf` file (`tokenizer.chat_template`).
    #[arg(long, required_unless_present = "chat_template")]
    model: Option<PathBuf>,

    /// The template instead of the model's: a file, or the Jinja text itself (as `serve`).
    #[arg(long)]
    chat_template: Option<String>,

    /// The conversation: a JSON file (`-` for stdin) holding a list of messages as the
    /// chat API takes them, or an object with `messages` and optionally `tools` and
    /// `chat_template_kwargs`.
    #[arg(long)]
    messages: PathBuf,

    /// Render without the opening of the assistant's turn (`add_generation_prompt` false).
    #[arg(long)]
    no_generation_prompt: bool,

    /// `bos_token` as the template sees it (default: the model's).
    #[arg(long)]
    bos_token: Option<String>,

    /// `eos_token` as the template sees it (default: the model's).
    #[arg(long)]
    eos_token: Option<String>,
}

/// Renders and prints the prompt, without a newline after it.
pub fn run(args: ChatTemplateArgs) -> anyhow::Result<()> {
    let input = read_input(&args.messages, !args.no_generation_prompt)?;
    let model_template = match &args.model {
        Some(path) => model_template(path)?,
        None => None,
    };
    let template = match (&args.chat_template, model_template) {
        (Some(arg), model) => {
            let source = load_template_arg(arg)?;
            match model {
                Some(m) => m.with_source(source)?,
                None => ChatTemplate::parse(source, String::new(), String::new())?,
            }
        }
        (None, Some(m)) => m,
        (None, None) => {
            eprintln!("the model has no chat template: the server renders with its plain one");
            let text = default_chat_template(&input.plain_messages(), input.add_generation_prompt);
            print!("{text}");
            return Ok(());
        }
    };
    let template = match (&args.bos_token, &args.eos_token) {
        (None, None) => template,
        (bos, eos) => template.with_special_tokens(bos.clone(), eos.clone())?,
    };
    let text = template.render_input(&input)?;
    print!("{text}");
    Ok(())
}

/// The template of a model directory or GGUF file.
fn model_template(path: &Path) -> anyhow::Result<Option<ChatTemplate>> {
    if path.is_dir() {
        return Ok(ChatTemplate::from_hf_dir(path));
    }
    if path.is_file() {
        return Ok(ChatTemplate::from_gguf(path)?);
    }
    bail!("--model {}: no such directory or file", path.display())
}

/// The conversation of `--messages`.
fn read_input(path: &Path, add_generation_prompt: bool) -> anyhow::Result<ChatInput> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the messages from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("--messages {}", path.display()))?
    };
    // Parsed straight into template values, so objects keep their key order.
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("--messages {}: not JSON", path.display()))?;
    let list = |v: Value, what: &str| -> anyhow::Result<Vec<Value>> {
        match v.kind() {
            ValueKind::Seq => Ok(v.try_iter()?.collect()),
            _ => bail!("--messages: `{what}` must be a list"),
        }
    };
    let mut input = ChatInput {
        add_generation_prompt,
        ..ChatInput::default()
    };
    match value.kind() {
        ValueKind::Seq => input.messages = list(value, "messages")?,
        ValueKind::Map => {
            input.messages = list(value.get_attr("messages")?, "messages")?;
            let tools = value.get_attr("tools")?;
            if !tools.is_undefined() && !tools.is_none() {
                input.tools = Some(list(tools, "tools")?);
            }
            let kwargs = value.get_attr("chat_template_kwargs")?;
            if !kwargs.is_undefined() {
                let mut map = BTreeMap::new();
                for key in kwargs.try_iter()? {
                    let name = key
                        .as_str()
                        .context("--messages: `chat_template_kwargs` keys must be strings")?
                        .to_string();
                    map.insert(name, kwargs.get_item(&key)?);
                }
                input.kwargs = map;
            }
        }
        _ => bail!("--messages: a list of messages, or an object with `messages`"),
    }
    Ok(input)
}
