//! How Python Jinja2 prints values: `str(x)`, which for lists and dicts is Python's `repr`
//! (`{'type': 'object', 'required': ['city']}`). Some templates print tool schemas with a bare
//! `{{ tools }}` or `| string`, and the model saw exactly that text in training.
use minijinja::value::{Value, ValueKind};
use minijinja::Error;

use super::pyjson::py_float_repr;

/// `str(value)`: strings as they are, containers as their Python repr.
pub fn py_str(value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::Seq | ValueKind::Map => {
            let mut out = String::new();
            repr(value, &mut out)?;
            Ok(out)
        }
        _ => Ok(value.to_string()),
    }
}

fn repr(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&py_float_repr(f64::try_from(value.clone())?)),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&key, out)?;
                out.push_str(": ");
                repr(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_print_like_python() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"type": "object", "n": [1, 2.0, true, null], "s": "it's", "q": "a\"b'c\n"}"#,
        )
        .unwrap();
        let got = py_str(&Value::from_serialize(&v)).unwrap();
        assert_eq!(got, r#"{'type': 'object', 'n': [1, 2.0, True, None], 's': "it's", 'q': 'a"b\'c\n'}"#);
        assert_eq!(py_str(&Value::from("plain")).unwrap(), "plain");
    }
}
