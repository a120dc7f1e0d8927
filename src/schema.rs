//! Option objects (a generation's, a load's) read from JSON the same way on every surface: the
//! Rust API and JSON bodies name options in snake_case, JavaScript in camelCase, the CLI in
//! kebab-case flags. Each option set lists its snake_case names once; [`Fields`] checks an object
//! against the list (unknown names are refused), reads typed values, and words every error with
//! the option's name as the caller spelled it.
use serde_json::{Map, Value};

/// How a surface spells option names: Rust and JSON `max_tokens`, JavaScript `maxTokens`,
/// command-line flags `--max-tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    Snake,
    Camel,
    Kebab,
}

impl Naming {
    /// `snake` (a snake_case option name) as this surface spells it.
    pub fn spell(self, snake: &str) -> String {
        match self {
            Naming::Snake => snake.to_string(),
            Naming::Kebab => format!("--{}", snake.replace('_', "-")),
            Naming::Camel => {
                let mut out = String::with_capacity(snake.len());
                let mut upper = false;
                for c in snake.chars() {
                    if c == '_' {
                        upper = true;
                    } else if upper {
                        out.extend(c.to_uppercase());
                        upper = false;
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }

    /// A message that names options of `fields` in snake_case, in this surface's spelling
    /// (whole words only).
    pub fn respell(self, msg: &str, fields: &[&str]) -> String {
        let mut out = String::with_capacity(msg.len());
        let mut word = String::new();
        let flush = |word: &mut String, out: &mut String| {
            match fields.iter().find(|f| **f == word.as_str()) {
                Some(f) => out.push_str(&self.spell(f)),
                None => out.push_str(word),
            }
            word.clear();
        };
        for c in msg.chars() {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
            } else {
                flush(&mut word, &mut out);
                out.push(c);
            }
        }
        flush(&mut word, &mut out);
        out
    }
}

/// One option object being read: its fields by snake_case name, `null` counting as absent.
pub struct Fields<'a> {
    obj: Option<&'a Map<String, Value>>,
    naming: Naming,
    /// Prepended to every name in messages (`promptCache.` for a nested object).
    prefix: String,
}

impl<'a> Fields<'a> {
    /// `v` (an object, or null for "all defaults") checked against `known`.
    pub fn new(v: &'a Value, naming: Naming, known: &[&str]) -> Result<Self, String> {
        Self::with_prefix(v, naming, known, String::new())
    }

    fn with_prefix(v: &'a Value, naming: Naming, known: &[&str], prefix: String) -> Result<Self, String> {
        let obj = match v {
            Value::Null => None,
            Value::Object(o) => Some(o),
            _ => return Err(format!("{} must be an object", if prefix.is_empty() { "options".to_string() } else { prefix.trim_end_matches('.').to_string() })),
        };
        for key in obj.into_iter().flat_map(|o| o.keys()) {
            if !known.iter().any(|f| naming.spell(f) == *key) {
                let names: Vec<String> = known.iter().map(|f| naming.spell(f)).collect();
                return Err(format!("unknown option {prefix}{key:?} (options: {})", names.join(", ")));
            }
        }
        Ok(Fields { obj, naming, prefix })
    }

    /// The nested object `field` (null or absent: all its defaults), checked against `known`.
    pub fn nested(&self, field: &str, known: &[&str]) -> Result<Fields<'a>, String> {
        const NULL: Value = Value::Null;
        let v: &'a Value = self.get(field).unwrap_or(&NULL);
        Self::with_prefix(v, self.naming, known, format!("{}.", self.name(field)))
    }

    /// `field` as the caller spells it (with the nesting prefix).
    pub fn name(&self, field: &str) -> String {
        format!("{}{}", self.prefix, self.naming.spell(field))
    }

    /// `field`'s value as given (an option whose value is itself free-form JSON).
    pub fn raw(&self, field: &str) -> Option<&'a Value> {
        self.get(field)
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj?.get(&self.naming.spell(field)).filter(|v| !v.is_null())
    }

    pub fn count(&self, field: &str) -> Result<Option<usize>, String> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_u64()
            .filter(|&n| n <= 1 << 53)
            .map(|n| n as usize)
            .or_else(|| v.as_f64().filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x <= 9.0e15).map(|x| x as usize))
            .map(Some)
            .ok_or_else(|| format!("{} must be a non-negative integer, got {v}", self.name(field)))
    }

    pub fn number(&self, field: &str) -> Result<Option<f32>, String> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| format!("{} must be a number, got {v}", self.name(field)))
    }

    pub fn boolean(&self, field: &str) -> Result<Option<bool>, String> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| format!("{} must be true or false, got {v}", self.name(field)))
    }

    pub fn string(&self, field: &str) -> Result<Option<&'a str>, String> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_str().map(Some).ok_or_else(|| format!("{} must be a string, got {v}", self.name(field)))
    }

    pub fn strings(&self, field: &str) -> Result<Option<Vec<String>>, String> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_array()
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .map(Some)
            .ok_or_else(|| format!("{} must be an array of strings, got {v}", self.name(field)))
    }
}
