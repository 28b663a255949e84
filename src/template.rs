//! Key templates: `"account:{account_id}"` rendered from a payload's
//! top-level fields. Concurrency and uniqueness keys both use them, and every
//! enqueuer must render them identically: every Rust enqueuer goes through
//! this renderer, and the SQL enqueue's `jobhost.render_key` gives the same
//! text for every value (the canonical forms below; `tests/all/keys.rs` holds
//! the two to it).

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
        /// How long the rendered key is; for a number too long to be
        /// written out, how long that number's text alone would be.
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

    /// Renders the key for a payload: strings as themselves, booleans as
    /// `true` and `false`, numbers in [`number_text`]'s canonical form. This
    /// is the text PostgreSQL's `payload ->> field` gives for the same
    /// document, so the SQL enqueue (`jobhost.render_key`) and every Rust
    /// enqueuer store the same key (docs/concurrency.md, "Keys").
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
            Some(serde_json::Value::Bool(b)) => Ok(b.to_string()),
            Some(serde_json::Value::Number(n)) => {
                number_text(n.as_str()).map_err(|bytes| RenderError::TooLong { bytes, template: self.source.clone() })
            }
            Some(_) => Err(RenderError::NotScalar { field: field.to_string(), template: self.source.clone() }),
        }
    }
}

/// The canonical text of a JSON number in a key: PostgreSQL `numeric`'s
/// output form, which is what `->>` gives for a `jsonb` number. The value is
/// kept exactly (no rounding through `f64`, integers past 64 bits whole);
/// there is no exponent; the digits after the point are those written, moved
/// by the exponent (`1.0` → `1.0`, `1e2` → `100`, `1.50e1` → `15.0`, `1e-3` →
/// `0.001`); and zero has no sign (`-0` → `0`, `-0.0` → `0.0`). So `100` and
/// `1e2` share a key, while `1` and `1.0` do not, on either backend.
///
/// `number` is a number's JSON text, as `serde_json` keeps it. Written here
/// rather than with `bigdecimal`: its plain text differs from `numeric`'s
/// (`0e5` becomes `000000`), and a key needs the length known before the
/// digits are written out; PostgreSQL's own output pins this one (the tests
/// below, and `tests/all/keys.rs` against a live server).
///
/// # Errors
/// The text would be longer than any key may be ([`MAX_KEY_BYTES`]); the
/// error is its length. `1e100000` is a hundred thousand digits: a huge
/// exponent is refused before it is written out.
pub fn number_text(number: &str) -> Result<String, usize> {
    let parts = NumberParts::of(number);
    let len = parts.text_len();
    if len > MAX_KEY_BYTES as i128 {
        return Err(usize::try_from(len).unwrap_or(usize::MAX));
    }
    Ok(parts.text())
}

/// A JSON number taken apart without converting it, so no digit is lost:
/// its sign, the digits written before and after its point, and where the
/// point falls once the exponent has moved it. Digit positions count from the
/// first digit written; a position outside the written digits is a zero.
struct NumberParts<'a> {
    negative: bool,
    integer: &'a str,
    fraction: &'a str,
    /// Where the point falls: before the digit at this position (negative
    /// or past the written digits when the exponent moved it that far).
    point: i128,
}

impl<'a> NumberParts<'a> {
    /// Splits a number's JSON text (`-?digits(.digits)?([eE][+-]?digits)?`).
    /// An exponent too large to parse is clamped to ±2⁶³: the text is far
    /// past any key's length either way.
    fn of(number: &'a str) -> Self {
        let (negative, unsigned) = match number.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, number),
        };
        let (mantissa, exponent) = unsigned.split_once(['e', 'E']).unwrap_or((unsigned, "0"));
        let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let exponent = exponent.strip_prefix('+').unwrap_or(exponent);
        let exponent = exponent.parse::<i128>().unwrap_or(if exponent.starts_with('-') {
            -(i64::MAX as i128)
        } else {
            i64::MAX as i128
        });
        NumberParts { negative, integer, fraction, point: integer.len() as i128 + exponent }
    }

    fn digit(&self, at: i128) -> u8 {
        let (integer, fraction) = (self.integer.as_bytes(), self.fraction.as_bytes());
        match usize::try_from(at) {
            Ok(at) if at < integer.len() => integer[at],
            Ok(at) if at - integer.len() < fraction.len() => fraction[at - integer.len()],
            _ => b'0',
        }
    }

    fn digits(&self) -> i128 {
        (self.integer.len() + self.fraction.len()) as i128
    }

    /// The first non-zero digit, if the value is not zero.
    fn first_significant(&self) -> Option<i128> {
        (0..self.digits()).find(|&at| self.digit(at) != b'0')
    }

    /// Digits after the point: those written, moved by the exponent.
    fn scale(&self) -> i128 {
        (self.digits() - self.point).max(0)
    }

    /// The positions of the digits before the point, without leading
    /// zeros: a lone `0` when the value is less than one.
    fn integer_digits(&self) -> std::ops::Range<i128> {
        match self.first_significant() {
            Some(first) if first < self.point => first..self.point,
            _ => self.point - 1..self.point,
        }
    }

    /// Zero has no sign, as in `numeric`.
    fn signed(&self) -> bool {
        self.negative && self.first_significant().is_some()
    }

    /// The length of [`NumberParts::text`], without writing it.
    fn text_len(&self) -> i128 {
        let fraction = match self.scale() {
            0 => 0,
            scale => 1 + scale,
        };
        let integer = self.integer_digits();
        i128::from(self.signed()) + (integer.end - integer.start) + fraction
    }

    fn text(&self) -> String {
        let mut text = String::new();
        if self.signed() {
            text.push('-');
        }
        text.extend(self.integer_digits().map(|at| char::from(self.digit(at))));
        if self.scale() > 0 {
            text.push('.');
            text.extend((self.point..self.point + self.scale()).map(|at| char::from(self.digit(at))));
        }
        text
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

    /// Each JSON number beside the text PostgreSQL 15 gives for it as
    /// `('{"x": NUMBER}'::jsonb) ->> 'x'`, which `jobhost.render_key` uses.
    const POSTGRES_NUMBER_TEXT: &[(&str, &str)] = &[
        ("100", "100"),
        ("1e2", "100"),
        ("1E+2", "100"),
        ("1.0", "1.0"),
        ("-0", "0"),
        ("-0.0", "0.0"),
        ("-0e5", "0"),
        ("0e-3", "0.000"),
        ("0.000", "0.000"),
        ("1.50e1", "15.0"),
        ("1e-3", "0.001"),
        ("1.5E-0", "1.5"),
        ("-1.5e3", "-1500"),
        ("-0.001e1", "-0.01"),
        ("12.3400e-2", "0.123400"),
        ("123456789e-5", "1234.56789"),
        ("1e-20", "0.00000000000000000001"),
        ("18446744073709551617", "18446744073709551617"),
        ("-18446744073709551617", "-18446744073709551617"),
        ("0.1234567890123456789012345678901234567890", "0.1234567890123456789012345678901234567890"),
    ];

    #[test]
    fn numbers_render_as_postgres_numeric_text() {
        for (json, postgres) in POSTGRES_NUMBER_TEXT {
            assert_eq!(number_text(json).as_deref(), Ok(*postgres), "{json}");
        }
    }

    #[test]
    fn numbers_keep_their_exact_value_in_a_key() {
        let t = KeyTemplate::parse("n:{n}").unwrap();
        for (json, postgres) in POSTGRES_NUMBER_TEXT {
            let payload: serde_json::Value = serde_json::from_str(&format!("{{\"n\": {json}}}")).unwrap();
            assert_eq!(t.render(&payload).unwrap(), format!("n:{postgres}"), "{json}");
        }
    }

    #[test]
    fn a_number_too_long_for_a_key_is_refused_without_writing_it_out() {
        assert_eq!(number_text("1e1023").map(|t| t.len()), Ok(1024));
        assert_eq!(number_text("1e1024"), Err(1025));
        assert_eq!(number_text("-1e-1022"), Err(1025), "sign, '0.', 1022 digits");
        assert!(number_text("1e999999999999999999999999999999999999999999").is_err_and(|len| len > 1 << 60));
        assert!(number_text("1e-999999999999999999999999999999999999999999").is_err_and(|len| len > 1 << 60));
        let t = KeyTemplate::parse("{n}").unwrap();
        let huge: serde_json::Value = serde_json::from_str(r#"{"n": 1e100000}"#).unwrap();
        assert!(matches!(t.render(&huge), Err(RenderError::TooLong { bytes: 100_001, .. })));
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
