//! Chat templates: a checkpoint's Jinja template rendered as transformers
//! renders it.

use crate::error::ModelError;
use crate::tokenizer::ChatMessage;

/// A checkpoint's Jinja chat template (`tokenizer_config.json`), rendered
/// with minijinja and Python-compatible string methods.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// A template with the special-token strings it may refer to.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Self {
        Self {
            source,
            bos_token,
            eos_token,
        }
    }

    /// Reads `chat_template`, `bos_token` and `eos_token` from the text of a
    /// `tokenizer_config.json`; `None` when it has no template.
    pub fn from_tokenizer_config(text: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let source = match v.get("chat_template")? {
            serde_json::Value::String(s) => s.clone(),
            // A list of named templates: take "default".
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))?
                .get("template")?
                .as_str()?
                .to_string(),
            _ => return None,
        };
        let token = |key: &str| match v.get(key) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(obj) => obj
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or_default()
                .to_string(),
            None => String::new(),
        };
        Some(Self::new(source, token("bos_token"), token("eos_token")))
    }

    /// Renders the conversation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        let messages: Vec<std::collections::BTreeMap<&str, &str>> = messages
            .iter()
            .map(|m| [("role", m.role.as_str()), ("content", m.content.as_str())].into())
            .collect();
        env.render_str(
            &self.source,
            minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            },
        )
        .map_err(|e| ModelError::Tokenizer(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_template_renders_with_python_methods_and_errors() {
        let config = r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}[{{ m['role'] }}] {{ m['content'].strip() }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"}"#;
        let t = ChatTemplate::from_tokenizer_config(config).unwrap();
        let msg = |role: &str, content: &str| ChatMessage {
            role: role.into(),
            content: content.into(),
        };
        let out = t.render(&[msg("user", "  hi  ")], true).unwrap();
        assert_eq!(out, "<s>[user] hi</s>[assistant]");
        let err = t.render(&[msg("system", "x")], true).unwrap_err();
        assert!(err.to_string().contains("no system"), "{err}");
        assert!(ChatTemplate::from_tokenizer_config(r#"{"eos_token": "x"}"#).is_none());
    }
}
