//! `json.dumps` as Python writes it, for the `tojson` filter of chat templates. transformers
//! replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, and tool schemas rendered into prompts must match it byte for byte: the
//! model was trained on that exact text (", " and ": " separators, no HTML escaping, Python's
//! float repr).
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The knobs of `json.dumps` that templates use.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline + `s` repeated per level (an int n means n spaces).
    pub indent: Option<String>,
    /// `(item, key)` separators; `None` means Python's default for the indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
    /// Stop with an error once the text passes this many bytes (an indent repeats per level and
    /// line, so deep values with a wide indent print far more than they weigh).
    pub max_len: Option<u64>,
}

pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.clone(), k.clone()),
        // Python drops the space after "," when indenting (it would trail every line).
        None if opts.indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut w = Writer { opts, item_sep, key_sep, out: String::new() };
    w.value(value, 0)?;
    Ok(w.out)
}

struct Writer<'a> {
    opts: &'a DumpOptions,
    item_sep: String,
    key_sep: String,
    out: String,
}

impl Writer<'_> {
    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            // Python would raise on Jinja's Undefined; null is the forgiving reading.
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v)?,
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Bytes => self.string(&String::from_utf8_lossy(v.as_bytes().unwrap_or_default())),
            ValueKind::Map => self.map(v, depth)?,
            ValueKind::Seq | ValueKind::Iterable => self.seq(v, depth)?,
            _ => self.string(&v.to_string()),
        }
        Ok(())
    }

    fn number(&mut self, v: &Value) -> Result<(), Error> {
        if v.is_integer() {
            self.out.push_str(&v.to_string());
        } else {
            let f = f64::try_from(v.clone())?;
            self.out.push_str(&py_float_repr(f));
        }
        Ok(())
    }

    fn newline(&mut self, depth: usize) -> Result<(), Error> {
        if let Some(unit) = &self.opts.indent {
            let len = (self.out.len() as u64).saturating_add((unit.len() as u64).saturating_mul(depth as u64) + 1);
            if let Some(max) = self.opts.max_len.filter(|max| len > *max) {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: the text would pass {max} bytes")));
            }
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(unit);
            }
        }
        Ok(())
    }

    fn seq(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        let items: Vec<Value> = v.try_iter()?.collect();
        if items.is_empty() {
            self.out.push_str("[]");
            return Ok(());
        }
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
            }
            self.newline(depth + 1)?;
            self.value(item, depth + 1)?;
        }
        self.newline(depth)?;
        self.out.push(']');
        Ok(())
    }

    fn map(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        let mut entries = Vec::new();
        for key in v.try_iter()? {
            let item = v.get_item(&key)?;
            entries.push((key_string(&key)?, item));
        }
        if self.opts.sort_keys {
            entries.sort_by(|a, b| a.0.cmp(&b.0));
        }
        if entries.is_empty() {
            self.out.push_str("{}");
            return Ok(());
        }
        self.out.push('{');
        for (i, (key, item)) in entries.iter().enumerate() {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
            }
            self.newline(depth + 1)?;
            self.string(key);
            let sep = self.key_sep.clone();
            self.out.push_str(&sep);
            self.value(item, depth + 1)?;
        }
        self.newline(depth)?;
        self.out.push('}');
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => push_u16_escape(&mut self.out, c as u16),
                c if self.opts.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        push_u16_escape(&mut self.out, *unit);
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

fn push_u16_escape(out: &mut String, unit: u16) {
    out.push_str(&format!("\\u{unit:04x}"));
}

/// Python coerces non-string keys: True -> "true", None -> "null", 1 -> "1", 1.5 -> "1.5".
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None | ValueKind::Undefined => "null".into(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => py_float_repr(f64::try_from(key.clone())?),
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {}", key.kind()),
            ))
        }
    })
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16
/// (always with a fractional part), otherwise `d.ddde+XX` with at least two exponent digits.
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "1.2345e-7".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1.2345e100, "1.2345e+100"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    fn dump(json: &str, opts: DumpOptions) -> String {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        dumps(&Value::from_serialize(&v), &opts).unwrap()
    }

    #[test]
    fn default_separators_and_escapes() {
        let s = dump(r#"{"b": [1, 2.0, true, null], "a": "x<y>&'\"\n\u0001é😀", "e": {}}"#, DumpOptions::default());
        assert_eq!(s, "{\"b\": [1, 2.0, true, null], \"a\": \"x<y>&'\\\"\\n\\u0001é😀\", \"e\": {}}");
    }

    #[test]
    fn indent_and_ascii() {
        let opts = DumpOptions { indent: Some("  ".into()), ensure_ascii: true, ..Default::default() };
        let s = dump(r#"{"k": ["é😀", []]}"#, opts);
        assert_eq!(s, "{\n  \"k\": [\n    \"\\u00e9\\ud83d\\ude00\",\n    []\n  ]\n}");
    }

    #[test]
    fn sort_and_separators() {
        let opts = DumpOptions {
            sort_keys: true,
            separators: Some((",".into(), ":".into())),
            ..Default::default()
        };
        assert_eq!(dump(r#"{"b":1,"a":{"d":2,"c":3}}"#, opts), r#"{"a":{"c":3,"d":2},"b":1}"#);
    }
}
