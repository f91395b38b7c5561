//! Request validation: every check that turns bad input into a 4xx with a
//! message naming the field, before anything reaches the engine.

use inferscope_engine::SamplingParams;
use inferscope_model::Tokenizer;

use crate::error::ApiError;
use crate::protocol::{PromptInput, SamplingFields};

/// Limits the server validates against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest prompt plus output.
    pub max_model_len: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Largest `n`.
    pub max_n: usize,
}

/// A request ready for the engine.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Tokenized prompts (one per prompt in a batch).
    pub prompts: Vec<Vec<u32>>,
    /// Parameters of each choice (the seed is varied per choice).
    pub params: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream over SSE.
    pub stream: bool,
    /// Send the usage chunk.
    pub include_usage: bool,
}

/// Tokenizes a completion prompt.
pub fn completion_prompts(
    prompt: Option<PromptInput>,
    tokenizer: &dyn Tokenizer,
    limits: &Limits,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let missing = || ApiError::invalid("`prompt` is required", Some("prompt"));
    let encode = |text: &str| {
        tokenizer.encode(text, true).map_err(|e| {
            ApiError::invalid(format!("cannot tokenize the prompt: {e}"), Some("prompt"))
        })
    };
    let ids = |v: Vec<i64>| -> Result<Vec<u32>, ApiError> {
        v.into_iter()
            .map(|t| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < limits.vocab_size)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!(
                                "token id {t} in `prompt` is out of range (vocabulary size {})",
                                limits.vocab_size
                            ),
                            Some("prompt"),
                        )
                    })
            })
            .collect()
    };
    let prompts = match prompt.ok_or_else(missing)? {
        PromptInput::Text(s) => vec![encode(&s)?],
        PromptInput::Texts(v) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
        PromptInput::Tokens(v) => vec![ids(v)?],
        PromptInput::TokenLists(v) => v.into_iter().map(ids).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(
            "`prompt` must not be an empty list",
            Some("prompt"),
        ));
    }
    Ok(prompts)
}

/// Checks the sampling fields and the lengths; builds the engine parameters.
/// `max_tokens` is the request's value; `default_max_tokens(prompt_len)`
/// applies when it is absent.
pub fn plan(
    prompts: Vec<Vec<u32>>,
    max_tokens: Option<i64>,
    default_max_tokens: impl Fn(usize) -> usize,
    f: SamplingFields,
    limits: &Limits,
    max_param: &'static str,
) -> Result<Plan, ApiError> {
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid(
            "the prompt is empty: send at least one token",
            Some("prompt"),
        ));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let max_tokens = match max_tokens {
        Some(v) if v < 1 => {
            return Err(ApiError::invalid(
                format!("`{max_param}` must be at least 1, got {v}"),
                Some(max_param),
            ));
        }
        Some(v) => usize::try_from(v).unwrap_or(usize::MAX),
        None => default_max_tokens(longest).max(1),
    };
    if longest >= limits.max_model_len || longest.saturating_add(max_tokens) > limits.max_model_len
    {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} in the completion). Please reduce the length of the prompt or of `{max_param}`.",
                limits.max_model_len,
                longest.saturating_add(max_tokens),
                longest,
                max_tokens
            ),
            Some(max_param),
        ));
    }
    let temperature = f.temperature.unwrap_or(1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid(
            format!("`temperature` must be a non-negative number, got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = f.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            format!("`top_p` must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let top_k = match f.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return Err(ApiError::invalid(
                format!("`top_k` must be -1 (off) or positive, got {k}"),
                Some("top_k"),
            ));
        }
    };
    let n = f.n.unwrap_or(1);
    if n < 1 || n as u64 > limits.max_n as u64 {
        return Err(ApiError::invalid(
            format!("`n` must be between 1 and {}, got {n}", limits.max_n),
            Some("n"),
        ));
    }
    let min_tokens = f.min_tokens.unwrap_or(0);
    if min_tokens < 0 || min_tokens as u64 > max_tokens as u64 {
        return Err(ApiError::invalid(
            format!(
                "`min_tokens` must be between 0 and `{max_param}` ({max_tokens}), got {min_tokens}"
            ),
            Some("min_tokens"),
        ));
    }
    match &f.logprobs {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "`logprobs` is not supported by this server",
                Some("logprobs"),
            ));
        }
    }
    let stop_token_ids = f
        .stop_token_ids
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            u32::try_from(t)
                .ok()
                .filter(|&t| (t as usize) < limits.vocab_size)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!(
                            "stop token id {t} is out of range (vocabulary size {})",
                            limits.vocab_size
                        ),
                        Some("stop_token_ids"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let stream = f.stream.unwrap_or(false);
    let include_usage = f
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok(Plan {
        prompts,
        params: SamplingParams {
            max_tokens,
            min_tokens: min_tokens as usize,
            ignore_eos: f.ignore_eos.unwrap_or(false),
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: f.seed.map(|s| s as u64),
            stop_token_ids,
            n: n as usize,
        },
        stop: f.stop.map(|s| s.into_vec()).unwrap_or_default(),
        stream,
        include_usage,
    })
}

#[cfg(test)]
mod tests {
    use inferscope_model::ByteTokenizer;

    use super::*;

    const LIMITS: Limits = Limits {
        max_model_len: 100,
        vocab_size: 258,
        max_n: 16,
    };

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).expect("fields")
    }

    #[test]
    fn lengths_are_checked_and_named() {
        let err = plan(
            vec![vec![1; 90]],
            Some(20),
            |_| 16,
            fields("{}"),
            &LIMITS,
            "max_tokens",
        )
        .expect_err("too long");
        assert_eq!(err.status.as_u16(), 400);
        assert!(
            err.message.contains("100") && err.message.contains("90") && err.message.contains("20")
        );
        let err = plan(
            vec![vec![1; 5]],
            Some(0),
            |_| 16,
            fields("{}"),
            &LIMITS,
            "max_tokens",
        )
        .expect_err("zero");
        assert!(err.message.contains("max_tokens"));
        let err = plan(
            vec![vec![1; 5]],
            Some(-3),
            |_| 16,
            fields("{}"),
            &LIMITS,
            "max_tokens",
        )
        .expect_err("negative");
        assert!(err.message.contains("-3"));
        let err = plan(
            vec![vec![]],
            Some(3),
            |_| 16,
            fields("{}"),
            &LIMITS,
            "max_tokens",
        )
        .expect_err("empty");
        assert!(err.message.contains("empty"));
        let ok = plan(
            vec![vec![1; 5]],
            None,
            |p| 100 - p,
            fields("{}"),
            &LIMITS,
            "max_tokens",
        )
        .expect("default");
        assert_eq!(ok.params.max_tokens, 95);
    }

    #[test]
    fn sampling_fields_are_checked() {
        for (json, field) in [
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_k": -5}"#, "top_k"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"n": 1000}"#, "n"),
            (r#"{"min_tokens": 50}"#, "min_tokens"),
            (r#"{"logprobs": 5}"#, "logprobs"),
            (r#"{"stop_token_ids": [999]}"#, "stop_token_ids"),
        ] {
            let err = plan(
                vec![vec![1; 5]],
                Some(10),
                |_| 16,
                fields(json),
                &LIMITS,
                "max_tokens",
            )
            .expect_err(json);
            assert_eq!(err.param, Some(field), "{json}");
        }
        let ok = plan(
            vec![vec![1; 5]],
            Some(10),
            |_| 16,
            fields(r#"{"stop": "x", "n": 2, "ignore_eos": true, "seed": 7, "stream": true, "stream_options": {"include_usage": true}}"#),
            &LIMITS,
            "max_tokens",
        )
        .expect("valid");
        assert_eq!(ok.stop, vec!["x".to_owned()]);
        assert!(ok.stream && ok.include_usage && ok.params.ignore_eos);
        assert_eq!((ok.params.n, ok.params.seed), (2, Some(7)));
    }

    #[test]
    fn prompts_of_every_shape() {
        let tok = ByteTokenizer;
        let p = |json: &str| serde_json::from_str::<PromptInput>(json).expect("prompt");
        assert_eq!(
            completion_prompts(Some(p(r#""ab""#)), &tok, &LIMITS)
                .expect("text")
                .len(),
            1
        );
        assert_eq!(
            completion_prompts(Some(p(r#"["a","b"]"#)), &tok, &LIMITS)
                .expect("texts")
                .len(),
            2
        );
        assert_eq!(
            completion_prompts(Some(p("[1,2,3]")), &tok, &LIMITS).expect("ids"),
            vec![vec![1, 2, 3]]
        );
        assert_eq!(
            completion_prompts(Some(p("[[1],[2]]")), &tok, &LIMITS)
                .expect("lists")
                .len(),
            2
        );
        assert!(completion_prompts(Some(p("[1,-2]")), &tok, &LIMITS).is_err());
        assert!(completion_prompts(Some(p("[1,5000]")), &tok, &LIMITS).is_err());
        assert!(completion_prompts(None, &tok, &LIMITS).is_err());
    }
}
