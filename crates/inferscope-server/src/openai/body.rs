//! A request body's top-level fields, parsed once. Each reader (the API's
//! own fields, the sampling fields, the refusal table, the structured-output
//! fields) takes the fields it knows from the list, each value parsed from
//! its own text, instead of parsing the whole body again: a small body's
//! three parses were a tenth of a request's work on the server
//! (`docs/results/request-path.md`).

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::Deserializer as _;
use serde::de::value::StrDeserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::ApiError;

/// The top-level fields of a JSON object body, in order, each value as its
/// JSON text (borrowed from the body).
pub struct Fields<'a> {
    body: &'a [u8],
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> Fields<'a> {
    /// Parses `body`, which must be one JSON object; a 400 otherwise.
    pub fn parse(body: &'a [u8]) -> Result<Self, ApiError> {
        // Checked as UTF-8 once, here: read from bytes, serde_json would
        // check each string and each value's text again. A body that is
        // not UTF-8 is read from its bytes, for serde_json's own error.
        let fields = match std::str::from_utf8(body) {
            Ok(text) => object(serde_json::Deserializer::from_str(text)),
            Err(_) => object(serde_json::Deserializer::from_slice(body)),
        };
        let fields = fields.map_err(|e| invalid_body(&e.to_string()))?;
        Ok(Self { body, fields })
    }

    /// The fields as `T` reads them (a struct whose unknown fields are
    /// ignored); a 400 placed in the body when a value is not what `T`
    /// takes (see `error`).
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let failed = Cell::new(None);
        let access = FieldsAccess {
            fields: self.fields.iter(),
            value: None,
            failed: &failed,
        };
        T::deserialize(FieldsDeserializer(access)).map_err(|e| self.error(&e, failed.get()))
    }

    /// The fields in order: name and value's JSON text.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
        self.fields.iter().map(|(k, v)| (k.as_ref(), *v))
    }

    /// The 400 for `e`, placed in the body: `failed` is the value whose
    /// read failed, when one did. An error from a value's own parse has its
    /// position within that value, moved to where the value is in the body
    /// (what a parse of the whole body reports); one raised after the value
    /// was read (an untagged enum's, say) is placed at the value's last
    /// character (a whole body's parse may report the character after).
    fn error(&self, e: &serde_json::Error, failed: Option<&RawValue>) -> ApiError {
        let text = e.to_string();
        let Some(value) = failed else {
            return invalid_body(&text);
        };
        let message = match e.line() {
            0 => text.as_str(),
            _ => text
                .rfind(" at line ")
                .map_or(text.as_str(), |i| &text[..i]),
        };
        let start = value.get().as_ptr() as usize - self.body.as_ptr() as usize;
        let (at, line_in_value, column_in_value) = match e.line() {
            0 => (start + value.get().len(), 1, 0),
            line => (start, line, e.column()),
        };
        let before = &self.body[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + line_in_value;
        let column = if line_in_value == 1 {
            let line_start = before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            at - line_start + column_in_value
        } else {
            column_in_value
        };
        invalid_body(&format!("{message} at line {line} column {column}"))
    }
}

/// The fields as a map to deserialize from.
struct FieldsDeserializer<'f, 'a>(FieldsAccess<'f, 'a>);

impl<'de, 'f, 'a: 'de> serde::Deserializer<'de> for FieldsDeserializer<'f, 'a> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_map(self.0)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// Walks the fields; notes the value whose read failed, for its error.
struct FieldsAccess<'f, 'a> {
    fields: std::slice::Iter<'f, (Cow<'a, str>, &'a RawValue)>,
    value: Option<&'a RawValue>,
    failed: &'f Cell<Option<&'a RawValue>>,
}

impl<'de, 'a: 'de> MapAccess<'de> for FieldsAccess<'_, 'a> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.fields.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        seed.deserialize(StrDeserializer::<serde_json::Error>::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        // Serde's derived readers always ask for a key first; a reader that
        // did not gets an error, not a panic.
        let Some(value) = self.value.take() else {
            return Err(serde::de::Error::custom("a value was read before its key"));
        };
        let read = seed.deserialize(value);
        if read.is_err() {
            self.failed.set(Some(value));
        }
        read
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

/// The fields of the one JSON object `de` reads.
fn object<'a, R: serde_json::de::Read<'a>>(
    mut de: serde_json::Deserializer<R>,
) -> Result<Vec<(Cow<'a, str>, &'a RawValue)>, serde_json::Error> {
    let fields = de.deserialize_map(ObjectVisitor)?;
    de.end()?;
    Ok(fields)
}

/// A body that is not what the API takes, as a 400.
fn invalid_body(message: &str) -> ApiError {
    ApiError::invalid(format!("invalid JSON body: {message}"), None)
}

/// Reads a top-level object into its fields.
struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(key) = map.next_key_seed(Key)? {
            fields.push((key, map.next_value::<&RawValue>()?));
        }
        Ok(fields)
    }
}

/// A field name, borrowed from the body unless it has escapes (serde's own
/// `Cow<str>` is always copied).
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(key))
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::protocol::{CompletionRequest, PromptInput, SamplingFields};

    /// A value the reader does not take is refused with the message, and
    /// the position in the body, that parsing the whole body gives.
    #[test]
    fn a_wrong_value_is_placed_as_a_whole_body_parse_places_it() {
        for body in [
            r#"{"temperature": "hot"}"#,
            r#"{"model": "m", "top_p": [1, 2], "prompt": "x"}"#,
            "{\n  \"model\": \"m\",\n  \"seed\": 1.5\n}",
            "{\"n\": 1,\n\"top_k\": [\n1,\n\"x\"]}",
            r#"{"max_tokens": -1.0e400}"#,
        ] {
            let whole = serde_json::from_slice::<SamplingFields>(body.as_bytes())
                .and_then(|_| serde_json::from_slice::<CompletionRequest>(body.as_bytes()))
                .expect_err(body)
                .to_string();
            let fields = Fields::parse(body.as_bytes()).expect("an object");
            let read = fields
                .read::<SamplingFields>()
                .and_then(|_| fields.read::<CompletionRequest>())
                .expect_err(body);
            assert_eq!(read.status.as_u16(), 400);
            assert_eq!(
                read.message,
                format!("invalid JSON body: {whole}"),
                "{body}"
            );
        }
        // An untagged enum refuses the value after reading it: placed at
        // its last character.
        for (body, at) in [
            ("{\"stop\": [\"a\",\n  7]}", "line 2 column 4"),
            (
                "{\"n\": 1,\n\"stop\": {\n\"x\": 1}, \"seed\": 2}",
                "line 3 column 7",
            ),
            (r#"{"stop": 5}"#, "line 1 column 10"),
        ] {
            let fields = Fields::parse(body.as_bytes()).expect("an object");
            let read = fields.read::<SamplingFields>().expect_err(body);
            assert_eq!(
                read.message,
                format!(
                    "invalid JSON body: data did not match any variant of untagged enum StopInput at {at}"
                ),
                "{body}"
            );
        }
    }

    /// Each reader takes its own fields and skips the others; escaped names
    /// are read unescaped.
    #[test]
    fn readers_take_their_fields_escaped_or_not() {
        let body =
            br#"{"model": "m", "\u0074emperature": 0.5, "prompt": ["a", "b"], "x": {"y": [1]}}"#;
        let fields = Fields::parse(body).expect("an object");
        let req: CompletionRequest = fields.read().expect("completion fields");
        assert_eq!(req.model.as_deref(), Some("m"));
        assert!(matches!(req.prompt, Some(PromptInput::Texts(t)) if t == ["a", "b"]));
        let sampling: SamplingFields = fields.read().expect("sampling fields");
        assert_eq!(sampling.temperature, Some(0.5));
        assert_eq!(
            fields.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            ["model", "temperature", "prompt", "x"]
        );
    }

    /// Not one JSON object (an array, trailing bytes, broken JSON), or a
    /// field twice: a 400.
    #[test]
    fn only_one_object_is_a_body() {
        for body in ["[]", r#"["m", "p"]"#, "{} {}", r#"{"model": "m""#, ""] {
            let err = Fields::parse(body.as_bytes()).err().expect(body);
            assert_eq!(err.status.as_u16(), 400, "{body}");
            assert!(
                err.message.starts_with("invalid JSON body: "),
                "{}",
                err.message
            );
        }
        let twice = Fields::parse(br#"{"seed": 1, "seed": 2}"#).expect("an object");
        let err = twice.read::<SamplingFields>().expect_err("a duplicate");
        assert!(
            err.message.contains("duplicate field `seed`"),
            "{}",
            err.message
        );
    }
}
