//! The sampling defaults a checkpoint's authors recommend: `generation_config.json`
//! beside a Hugging Face checkpoint (the fields vLLM reads from it), or the
//! `general.sampling.*` keys of a GGUF file (the ones llama.cpp reads). The
//! server applies them to requests that omit the field, as vLLM does with
//! `--generation-config auto`.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use candle_core::quantized::gguf_file::Value as GgufValue;
use serde_json::Value;

use crate::error::ModelError;
use crate::gguf_file::GgufFile;
use crate::gguf_meta::Meta;

/// Sampling defaults; `None` leaves the server's own default (temperature 1,
/// top_p 1, no top_k, no min_p, no repetition penalty, no cap on max_tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerationDefaults {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k` (0 or -1: off).
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f64>,
    /// `max_new_tokens`: caps every request's `max_tokens`, as vLLM does.
    pub max_tokens: Option<u64>,
}

/// The GGUF keys llama.cpp reads as the model's sampling defaults, and the
/// field each sets.
const GGUF_KEYS: [(&str, &str); 5] = [
    ("general.sampling.temp", "temperature"),
    ("general.sampling.top_p", "top_p"),
    ("general.sampling.top_k", "top_k"),
    ("general.sampling.min_p", "min_p"),
    ("general.sampling.penalty_repeat", "repetition_penalty"),
];

impl GenerationDefaults {
    /// No defaults (`--generation-config vllm`).
    pub const NONE: Self = Self {
        temperature: None,
        top_p: None,
        top_k: None,
        min_p: None,
        repetition_penalty: None,
        max_tokens: None,
    };

    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::NONE
    }

    /// The fields vLLM reads from a `generation_config.json` (`temperature`,
    /// `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_new_tokens`);
    /// the others (`do_sample`, `eos_token_id`, …) are not sampling defaults
    /// here, as in vLLM.
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("generation_config.json: {e}")))?;
        let mut d = Self::NONE;
        d.set_fields(&v, "generation_config.json")
            .map_err(ModelError::Config)?;
        Ok(d)
    }

    /// `generation_config.json` in `dir`, or nothing when the file is absent.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("generation_config.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::from_hf_json(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::NONE),
            Err(source) => Err(ModelError::Io { path, source }),
        }
    }

    /// The `general.sampling.*` keys of a GGUF file's metadata.
    pub fn from_gguf_metadata(metadata: &HashMap<String, GgufValue>) -> Self {
        let meta = Meta(metadata);
        let mut d = Self::NONE;
        for (key, field) in GGUF_KEYS {
            if let Some(x) = meta.opt_f64(key) {
                d.set(field, x);
            }
        }
        d
    }

    /// The defaults of a model spec: a Hugging Face directory's
    /// `generation_config.json`, a GGUF file's metadata, nothing for the
    /// built-in models.
    pub fn for_model(spec: &str) -> Result<Self, ModelError> {
        let path = Path::new(spec);
        if path.is_dir() {
            Self::from_dir(path)
        } else if path.is_file() && crate::loader::is_gguf_file(path)? {
            Ok(Self::from_gguf_metadata(&GgufFile::read(path)?.metadata))
        } else {
            Ok(Self::NONE)
        }
    }

    /// These defaults with the fields of a JSON object laid over them
    /// (vLLM's `--override-generation-config`, which takes the same names as
    /// `generation_config.json`).
    pub fn with_overrides(mut self, overrides: &Value) -> Result<Self, String> {
        if !overrides.is_object() {
            return Err(format!("expected a JSON object, got {overrides}"));
        }
        self.set_fields(overrides, "the override")?;
        Ok(self)
    }

    fn set_fields(&mut self, v: &Value, source: &str) -> Result<(), String> {
        for field in [
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "max_new_tokens",
        ] {
            match v.get(field) {
                None | Some(Value::Null) => {}
                Some(x) => {
                    let n = x
                        .as_f64()
                        .ok_or_else(|| format!("{source}: `{field}` must be a number, got {x}"))?;
                    self.set(field, n);
                }
            }
        }
        Ok(())
    }

    fn set(&mut self, field: &str, x: f64) {
        match field {
            "temperature" => self.temperature = Some(x),
            "top_p" => self.top_p = Some(x),
            "top_k" => self.top_k = Some(x as i64),
            "min_p" => self.min_p = Some(x),
            "repetition_penalty" => self.repetition_penalty = Some(x),
            "max_new_tokens" => self.max_tokens = Some(x.max(0.0) as u64),
            _ => unreachable!("not a sampling default: {field}"),
        }
    }
}

impl fmt::Display for GenerationDefaults {
    /// `temperature=0.6, top_p=0.95`: the fields that are set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut put = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{name}={v}"));
            }
        };
        put("temperature", self.temperature.map(|x| x.to_string()));
        put("top_p", self.top_p.map(|x| x.to_string()));
        put("top_k", self.top_k.map(|x| x.to_string()));
        put("min_p", self.min_p.map(|x| x.to_string()));
        put(
            "repetition_penalty",
            self.repetition_penalty.map(|x| x.to_string()),
        );
        put("max_tokens", self.max_tokens.map(|x| x.to_string()));
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_vllm_reads_and_nothing_else() {
        let d = GenerationDefaults::from_hf_json(
            r#"{"bos_token_id": 1, "do_sample": true, "eos_token_id": [2, 3],
                "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                "repetition_penalty": 1.05, "max_new_tokens": 512,
                "transformers_version": "4.51.0"}"#,
        )
        .unwrap();
        assert_eq!(
            d,
            GenerationDefaults {
                temperature: Some(0.6),
                top_p: Some(0.95),
                top_k: Some(20),
                min_p: Some(0.0),
                repetition_penalty: Some(1.05),
                max_tokens: Some(512),
            }
        );
        assert_eq!(
            d.to_string(),
            "temperature=0.6, top_p=0.95, top_k=20, min_p=0, repetition_penalty=1.05, max_tokens=512"
        );
        let none = GenerationDefaults::from_hf_json(r#"{"eos_token_id": 2}"#).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_bad_value_names_the_field() {
        let e = GenerationDefaults::from_hf_json(r#"{"temperature": "hot"}"#).unwrap_err();
        assert!(e.to_string().contains("`temperature`"), "{e}");
        let e = GenerationDefaults::NONE
            .with_overrides(&serde_json::json!([1]))
            .unwrap_err();
        assert!(e.contains("JSON object"), "{e}");
    }

    #[test]
    fn overrides_lay_over_the_checkpoint() {
        let d = GenerationDefaults::from_hf_json(r#"{"temperature": 0.6, "top_k": 20}"#)
            .unwrap()
            .with_overrides(&serde_json::json!({"temperature": 0.2, "max_new_tokens": 64}))
            .unwrap();
        assert_eq!(d.temperature, Some(0.2));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.max_tokens, Some(64));
    }

    #[test]
    fn reads_llama_cpp_sampling_keys_from_gguf_metadata() {
        let mut m = HashMap::new();
        m.insert("general.sampling.temp".into(), GgufValue::F32(0.7));
        m.insert("general.sampling.top_k".into(), GgufValue::I32(40));
        m.insert(
            "general.sampling.penalty_repeat".into(),
            GgufValue::F32(1.25),
        );
        m.insert("general.name".into(), GgufValue::String("x".into()));
        let d = GenerationDefaults::from_gguf_metadata(&m);
        assert_eq!(d.temperature, Some(f64::from(0.7f32)));
        assert_eq!(d.top_k, Some(40));
        assert_eq!(d.repetition_penalty, Some(1.25));
        assert_eq!(d.top_p, None);
        assert_eq!(d.max_tokens, None);
    }
}
