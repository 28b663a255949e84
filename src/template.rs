//! Key templates: `"account:{account_id}"` rendered from a payload's
//! top-level fields. Concurrency and uniqueness keys both use them, and every
//! enqueuer must render them identically, so there is exactly one renderer.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A parsed key template. `{field}` is replaced by the payload's top-level
/// `field`; `{{` and `}}` stand for literal braces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(String),
}

/// Why a template could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` with no matching `}`.
    #[error("unclosed '{{' at byte {0}")]
    Unclosed(usize),
    /// A `}` with no `{` before it (write `}}` for a literal brace).
    #[error("unmatched '}}' at byte {0}")]
    Unmatched(usize),
    /// `{}` names no field.
    #[error("empty placeholder at byte {0}")]
    Empty(usize),
    /// A field name outside `[A-Za-z0-9_-]`.
    #[error("placeholder {0:?} is not a field name (letters, digits, '_' and '-')")]
    BadField(String),
    /// The template is empty.
    #[error("template is empty")]
    Blank,
}

/// The longest a rendered key may be, in bytes. Keys are indexed (the
/// semaphores, blocked jobs and holders are found by key), and an index entry
/// has a size limit: a key past it would be stored at enqueue and then fail
/// every statement that indexes it, so it is refused at every enqueue path.
pub const MAX_KEY_BYTES: usize = 1024;

/// Why a template could not be rendered from a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The payload is not a JSON object, so it has no fields.
    #[error("payload is not a JSON object, so key {template:?} cannot be rendered")]
    NotAnObject {
        /// The template's source text.
        template: String,
    },
    /// A placeholder's field is absent or null.
    #[error("payload has no field {field:?} for key {template:?}")]
    Missing {
        /// The absent field.
        field: String,
        /// The template's source text.
        template: String,
    },
    /// The rendered key is longer than [`MAX_KEY_BYTES`].
    #[error("key {template:?} renders to {bytes} bytes, more than the most a key may have, {max} bytes", max = MAX_KEY_BYTES)]
    TooLong {
        /// How long the rendered key is.
        bytes: usize,
        /// The template's source text.
        template: String,
    },
    /// A placeholder's field is an object or array, which has no stable text form.
    #[error("field {field:?} for key {template:?} must be a string, number or boolean")]
    NotScalar {
        /// The offending field.
        field: String,
        /// The template's source text.
        template: String,
    },
}

impl KeyTemplate {
    /// Parses a template.
    ///
    /// # Errors
    /// Unbalanced braces, an empty placeholder, or a field name with other
    /// characters than letters, digits, `_` and `-`.
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        if source.is_empty() {
            return Err(TemplateError::Blank);
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = source.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::Unmatched(at)),
                '{' => {
                    let mut field = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((_, c)) => field.push(c),
                            None => return Err(TemplateError::Unclosed(at)),
                        }
                    }
                    if field.is_empty() {
                        return Err(TemplateError::Empty(at));
                    }
                    if !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                        return Err(TemplateError::BadField(field));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(field));
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(KeyTemplate { source: source.to_string(), parts })
    }

    /// A template that renders to `text` whatever the payload: the key of a
    /// job type whose limit applies to the type as a whole.
    pub fn constant(text: &str) -> Self {
        KeyTemplate { source: text.replace('{', "{{").replace('}', "}}"), parts: vec![Part::Literal(text.to_string())] }
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The fields the template reads, in order.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field(f) => Some(f.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// Renders the key for a payload. Strings render as themselves, numbers
    /// and booleans as their JSON text.
    ///
    /// # Errors
    /// The payload is not an object (when a field is needed), or a field is
    /// missing, null, an object or an array.
    pub fn render(&self, payload: &serde_json::Value) -> Result<String, RenderError> {
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => key.push_str(text),
                Part::Field(field) => key.push_str(&self.field_text(payload, field)?),
            }
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(RenderError::TooLong { bytes: key.len(), template: self.source.clone() });
        }
        Ok(key)
    }

    fn field_text(&self, payload: &serde_json::Value, field: &str) -> Result<String, RenderError> {
        let object = payload.as_object().ok_or_else(|| RenderError::NotAnObject { template: self.source.clone() })?;
        match object.get(field) {
            None | Some(serde_json::Value::Null) => {
                Err(RenderError::Missing { field: field.to_string(), template: self.source.clone() })
            }
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => Ok(v.to_string()),
            Some(_) => Err(RenderError::NotScalar { field: field.to_string(), template: self.source.clone() }),
        }
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl TryFrom<String> for KeyTemplate {
    type Error = TemplateError;
    fn try_from(source: String) -> Result<Self, Self::Error> {
        KeyTemplate::parse(&source)
    }
}

impl From<KeyTemplate> for String {
    fn from(template: KeyTemplate) -> String {
        template.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_fields_and_literals() {
        let t = KeyTemplate::parse("account:{account_id}/{region}").unwrap();
        let key = t.render(&json!({"account_id": 42, "region": "eu", "other": [1]})).unwrap();
        assert_eq!(key, "account:42/eu");
        assert_eq!(t.fields().collect::<Vec<_>>(), ["account_id", "region"]);
    }

    #[test]
    fn doubled_braces_are_literal() {
        let t = KeyTemplate::parse("{{x}}-{x}").unwrap();
        assert_eq!(t.render(&json!({"x": true})).unwrap(), "{x}-true");
    }

    #[test]
    fn constant_survives_a_round_trip_through_its_source() {
        let t = KeyTemplate::constant("odd{name}");
        assert_eq!(t.render(&json!(null)).unwrap(), "odd{name}");
        let reparsed = KeyTemplate::parse(t.as_str()).unwrap();
        assert_eq!(reparsed.render(&json!(null)).unwrap(), "odd{name}");
    }

    #[test]
    fn rejects_malformed_templates() {
        assert_eq!(KeyTemplate::parse("a{b"), Err(TemplateError::Unclosed(1)));
        assert_eq!(KeyTemplate::parse("a}b"), Err(TemplateError::Unmatched(1)));
        assert_eq!(KeyTemplate::parse("{}"), Err(TemplateError::Empty(0)));
        assert_eq!(KeyTemplate::parse("{a b}"), Err(TemplateError::BadField("a b".into())));
        assert_eq!(KeyTemplate::parse(""), Err(TemplateError::Blank));
    }

    #[test]
    fn a_key_longer_than_the_maximum_is_refused() {
        let t = KeyTemplate::parse("k:{id}").unwrap();
        let fits = "x".repeat(MAX_KEY_BYTES - 2);
        assert_eq!(t.render(&json!({ "id": fits })).unwrap().len(), MAX_KEY_BYTES);
        let long = "x".repeat(MAX_KEY_BYTES - 1);
        assert!(
            matches!(t.render(&json!({ "id": long })), Err(RenderError::TooLong { bytes, .. }) if bytes == MAX_KEY_BYTES + 1)
        );
    }

    #[test]
    fn render_errors_name_the_field() {
        let t = KeyTemplate::parse("{id}").unwrap();
        assert!(matches!(t.render(&json!({})), Err(RenderError::Missing { field, .. }) if field == "id"));
        assert!(matches!(t.render(&json!({"id": null})), Err(RenderError::Missing { .. })));
        assert!(matches!(t.render(&json!({"id": {"a": 1}})), Err(RenderError::NotScalar { .. })));
        assert!(matches!(t.render(&json!("text")), Err(RenderError::NotAnObject { .. })));
    }

    #[test]
    fn serializes_as_its_source() {
        let t = KeyTemplate::parse("k:{id}").unwrap();
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, "\"k:{id}\"");
        let back: KeyTemplate = serde_json::from_str(&text).unwrap();
        assert_eq!(back, t);
        assert!(serde_json::from_str::<KeyTemplate>("\"{\"").is_err());
    }
}
