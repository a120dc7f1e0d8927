//! A byte budget for the values a chat template builds. Fuel bounds how many instructions a
//! render runs, but not how large its values grow: `{% set ns.s = ns.s ~ ns.s %}` in a loop, or a
//! macro that returns its argument twice, doubles a string per step and exhausts memory within
//! a few hundred instructions, and Rust cannot recover from a failed allocation. minijinja has no
//! hook for that, so before a render its compiled program is rewritten (minijinja's
//! `unstable_machinery`, hence the exact version pin in Cargo.toml):
//!
//! - after every instruction that makes a new value (`~`, `+`, `*`, `%`, filters, calls, list
//!   and map literals, captured blocks, constant lists: minijinja folds `[x] * 10**12` into a
//!   lazy one) comes a call to [`CHARGE`], which adds the value's weight
//!   ([`weight`]: its bytes, counting what containers hold, shared or not) to the render's total;
//! - raw template text is emitted through the formatter, which charges what it writes (so a
//!   loop inside `{% set x %}…{% endset %}` or a macro body is counted while it grows).
//!
//! The total of bytes made bounds what the template can hold at once; past the budget the render
//! stops with an error. The few operations that can multiply sizes in one step (`replace`,
//! `join`, `indent`, `format`, `batch`, `slice`, `tojson(indent)`) check the result's size
//! against what is left before they run (template.rs), so no single step allocates past it.
//! Values also nest at most [`MAX_DEPTH`] deep: printing, comparing or dropping a deeper one
//! recurses once per level and could overflow the thread's stack.
use std::cell::Cell;

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Rest, Value, ValueIter, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// The function the rewritten program calls to charge a value (a name templates cannot bind:
/// [`bounded`] refuses templates that use the prefix).
pub const CHARGE: &str = "__mlex_charge";
const RESERVED_PREFIX: &str = "__mlex";

/// What one slot of a list or map counts, besides what it holds.
const SLOT: u64 = 16;

/// The deepest nesting of lists and maps a render may build.
pub const MAX_DEPTH: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Budget {
    used: u64,
    limit: u64,
    exceeded: bool,
}

thread_local! {
    static BUDGET: Cell<Option<Budget>> = const { Cell::new(None) };
}

/// The budget of the render running on this thread, for as long as the scope lives (renders
/// are synchronous: one thread, start to end).
pub struct BudgetScope {
    prev: Option<Budget>,
}

impl BudgetScope {
    pub fn enter(limit: u64) -> Self {
        let prev = BUDGET.with(|b| b.replace(Some(Budget { used: 0, limit, exceeded: false })));
        BudgetScope { prev }
    }

    /// Whether the render stopped because it ran over its budget.
    pub fn exceeded(&self) -> bool {
        BUDGET.with(|b| b.get().is_some_and(|b| b.exceeded))
    }
}

impl Drop for BudgetScope {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(self.prev));
    }
}

/// Bytes left to the render on this thread (unbounded outside a render).
pub fn remaining() -> u64 {
    BUDGET.with(|b| b.get().map_or(u64::MAX, |b| b.limit.saturating_sub(b.used)))
}

/// Counts `bytes` against the render's budget; past it, an error (and the scope remembers why).
pub fn charge(bytes: u64) -> Result<(), Error> {
    BUDGET.with(|cell| {
        let Some(mut b) = cell.get() else { return Ok(()) };
        b.used = b.used.saturating_add(bytes);
        let over = b.used > b.limit;
        b.exceeded |= over;
        cell.set(Some(b));
        if over {
            Err(over_budget(b.limit))
        } else {
            Ok(())
        }
    })
}

/// Refuses, before it runs, an operation that would make `bytes` bytes.
pub fn check(bytes: u64, what: &str) -> Result<(), Error> {
    if bytes > remaining() {
        BUDGET.with(|cell| {
            if let Some(mut b) = cell.get() {
                b.exceeded = true;
                cell.set(Some(b));
            }
        });
        let limit = BUDGET.with(|b| b.get().map_or(0, |b| b.limit));
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what} would make {bytes} bytes, past the template's budget of {limit}"),
        ));
    }
    Ok(())
}

fn over_budget(limit: u64) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("the template built more than {limit} bytes of values (it grows strings or lists without bound?)"),
    )
}

/// The [`CHARGE`] function: charges `value`'s weight and hands it back unchanged.
pub fn charge_value(value: Value) -> Result<Value, Error> {
    let left = remaining();
    let w = weight(&value, left)?;
    charge(w)?;
    Ok(value)
}

/// What a value weighs: a string's bytes, and for lists and maps [`SLOT`] per item plus what
/// each item weighs (an item held twice counts twice: printing or joining copies it twice).
/// Stops counting once past `cap` (a lazy sequence may be astronomically long); values nested
/// deeper than [`MAX_DEPTH`] are an error.
pub fn weight(value: &Value, cap: u64) -> Result<u64, Error> {
    enum Open {
        Seq(ValueIter),
        Map(Value, ValueIter),
    }
    fn open(v: &Value) -> Option<Open> {
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable => v.try_iter().ok().map(Open::Seq),
            ValueKind::Map => v.try_iter().ok().map(|it| Open::Map(v.clone(), it)),
            _ => None,
        }
    }
    fn flat(v: &Value) -> u64 {
        match v.kind() {
            ValueKind::String => v.as_str().map_or(0, |s| s.len() as u64),
            ValueKind::Bytes => v.as_bytes().map_or(0, |b| b.len() as u64),
            _ => 0,
        }
    }
    let mut total = flat(value);
    // A sized lazy sequence (`[x] * n`, `a + b`) too long for the cap: no need to walk it.
    if matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable | ValueKind::Map)
        && value.len().is_some_and(|n| (n as u64).saturating_mul(SLOT) > cap)
    {
        return Ok((value.len().unwrap_or(0) as u64).saturating_mul(SLOT));
    }
    let mut stack: Vec<Open> = open(value).into_iter().collect();
    while let Some(top) = stack.last_mut() {
        if total > cap {
            break;
        }
        let next = match top {
            Open::Seq(it) => it.next().map(|item| (None, item)),
            Open::Map(map, it) => it.next().map(|key| {
                let item = map.get_item(&key).unwrap_or_default();
                (Some(key), item)
            }),
        };
        let Some((key, item)) = next else {
            stack.pop();
            continue;
        };
        total = total.saturating_add(SLOT + key.as_ref().map_or(0, flat) + flat(&item));
        if let Some(inner) = open(&item) {
            if stack.len() >= MAX_DEPTH {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("the template nests lists or maps more than {MAX_DEPTH} deep"),
                ));
            }
            stack.push(inner);
        }
    }
    Ok(total)
}

/// `program` with the budget's charges in: see the file's header. Templates that name
/// something with the reserved prefix are refused (they could rebind [`CHARGE`]).
pub fn bounded<'s>(program: &Instructions<'s>) -> Result<Instructions<'s>, String> {
    let n = program.len();
    let instr = |i: usize| program.get(i as u32).expect("index below len");
    // Where each old instruction starts in the new program (n: the end).
    let mut start = Vec::with_capacity(n + 1);
    let mut at = 0u32;
    for i in 0..n {
        start.push(at);
        let ins = instr(i);
        if let Some(name) = named(ins) {
            if name.starts_with(RESERVED_PREFIX) {
                return Err(format!("the name {name:?} is reserved (names starting with {RESERVED_PREFIX:?})"));
            }
        }
        at += if matches!(ins, Instruction::EmitRaw(_)) || charged(ins) { 2 } else { 1 };
    }
    start.push(at);
    let to = |t: &u32| start[*t as usize];

    let mut out = Instructions::new(program.name(), program.source());
    for i in 0..n {
        let add = |out: &mut Instructions<'s>, ins: Instruction<'s>| {
            match (program.get_span(i as u32), program.get_line(i as u32)) {
                (Some(span), _) => out.add_with_span(ins, span),
                (None, Some(line)) => out.add_with_line(ins, line.min(u16::MAX as usize) as u16),
                (None, None) => out.add(ins),
            };
        };
        let ins = instr(i);
        let moved = match ins {
            Instruction::Jump(t) => Instruction::Jump(to(t)),
            Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(to(t)),
            Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(to(t)),
            Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(to(t)),
            Instruction::Iterate(t) => Instruction::Iterate(to(t)),
            Instruction::BuildMacro(name, t, flags) => Instruction::BuildMacro(name, to(t), *flags),
            Instruction::EmitRaw(s) => {
                add(&mut out, Instruction::LoadConst(Value::from_safe_string(s.to_string())));
                Instruction::Emit
            }
            other => other.clone(),
        };
        add(&mut out, moved);
        if charged(ins) {
            add(&mut out, Instruction::CallFunction(CHARGE, Some(1)));
        }
    }
    debug_assert_eq!(out.len() as u32, start[n]);
    Ok(out)
}

/// Instructions whose result can be larger than what they were given in a way the budget must
/// see: everything that builds a string, list or map at run time.
fn charged(ins: &Instruction<'_>) -> bool {
    matches!(
        ins,
        Instruction::StringConcat
            | Instruction::Add
            | Instruction::Mul
            | Instruction::Rem
            | Instruction::BuildList(_)
            | Instruction::BuildMap(_)
            | Instruction::ApplyFilter(..)
            | Instruction::CallMethod(..)
            | Instruction::CallObject(_)
            | Instruction::EndCapture
    ) || matches!(ins, Instruction::CallFunction(name, _) if *name != CHARGE)
        // a folded constant sequence can be a lazy repetition (`[x] * 10**12`)
        || matches!(ins, Instruction::LoadConst(v) if matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable | ValueKind::Map))
}

/// The name an instruction binds or looks up, if any.
fn named<'s>(ins: &Instruction<'s>) -> Option<&'s str> {
    match ins {
        Instruction::StoreLocal(n)
        | Instruction::Lookup(n)
        | Instruction::CallFunction(n, _)
        | Instruction::BuildMacro(n, _, _)
        | Instruction::Enclose(n) => Some(n),
        _ => None,
    }
}

/// Registers [`CHARGE`], the pre-checked filters and the pre-checked Python string methods
/// (minijinja-contrib's `pycompat`, which this installs as the unknown-method callback).
pub fn install(env: &mut Environment<'_>) {
    env.add_function(CHARGE, charge_value);
    for (name, check) in [
        ("replace", check_replace as Precheck),
        ("join", check_join),
        ("indent", check_indent),
        ("format", check_format),
        ("batch", check_count),
        ("slice", check_count),
    ] {
        let builtin = builtin_filter(name);
        env.add_filter(name, move |state: &State, args: Rest<Value>| {
            check(name, &args)?;
            builtin.call(state, &args)
        });
    }
    env.set_unknown_method_callback(|state, value, method, args| {
        if value.kind() == ValueKind::String {
            let mut all = Vec::with_capacity(args.len() + 1);
            all.push(value.clone());
            all.extend_from_slice(args);
            match method {
                "replace" => check_replace("str.replace", &all)?,
                "format" => check_format("str.format", &all)?,
                // `sep.join(items)`: the filter's arguments the other way round.
                "join" if !args.is_empty() => check_join("str.join", &[args[0].clone(), value.clone()])?,
                _ => {}
            }
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
}

/// Checks a call's arguments (the filtered value first) before it runs.
type Precheck = fn(&str, &[Value]) -> Result<(), Error>;

fn builtin_filter(name: &str) -> Value {
    match name {
        "replace" => Value::from_function(minijinja::filters::replace),
        "join" => Value::from_function(minijinja::filters::join),
        "indent" => Value::from_function(minijinja::filters::indent),
        "format" => Value::from_function(minijinja::filters::format),
        "batch" => Value::from_function(minijinja::filters::batch),
        "slice" => Value::from_function(minijinja::filters::slice),
        _ => unreachable!("no pre-checked filter {name}"),
    }
}

fn str_len(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_str).map_or(0, |s| s.len() as u64)
}

/// What `{v}` prints, in bytes, counted up to `cap` without keeping it.
fn display_len(v: &Value, cap: u64) -> u64 {
    struct Count(u64, u64);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len() as u64;
            if self.0 > self.1 {
                Err(std::fmt::Error)
            } else {
                Ok(())
            }
        }
    }
    let mut c = Count(0, cap);
    let _ = std::fmt::write(&mut c, format_args!("{v}"));
    c.0
}

/// `s|replace(old, new)`: every match of `old` (between every character when empty) becomes `new`.
fn check_replace(what: &str, args: &[Value]) -> Result<(), Error> {
    let (Some(s), Some(old), Some(new)) =
        (args.first().and_then(Value::as_str), args.get(1).and_then(Value::as_str), args.get(2).and_then(Value::as_str))
    else {
        return Ok(());
    };
    let limit = args.get(3).and_then(Value::as_i64).filter(|n| *n >= 0).map_or(u64::MAX, |n| n as u64);
    let matches = if old.is_empty() { s.chars().count() as u64 + 1 } else { s.matches(old).count() as u64 };
    let grow = (new.len() as u64).saturating_sub(old.len() as u64);
    check((s.len() as u64).saturating_add(matches.min(limit).saturating_mul(grow)), what)
}

/// `items|join(sep)`: every item printed, `sep` between them (a string joins its characters).
fn check_join(what: &str, args: &[Value]) -> Result<(), Error> {
    let Some(items) = args.first() else { return Ok(()) };
    let sep = str_len(args.get(1));
    let cap = remaining();
    if let Some(s) = items.as_str() {
        let n = s.chars().count() as u64;
        return check((s.len() as u64).saturating_add(n.saturating_sub(1).saturating_mul(sep)), what);
    }
    if let Some(n) = items.len().filter(|_| !matches!(items.kind(), ValueKind::String)) {
        check((n as u64).saturating_sub(1).saturating_mul(sep), what)?;
    }
    let Ok(iter) = items.try_iter() else { return Ok(()) };
    let mut total = 0u64;
    for (i, item) in iter.enumerate() {
        if i > 0 {
            total = total.saturating_add(sep);
        }
        total = total.saturating_add(display_len(&item, cap));
        if total > cap {
            break;
        }
    }
    check(total, what)
}

/// `s|indent(width)`: `width` spaces (or the string given) before each line.
fn check_indent(what: &str, args: &[Value]) -> Result<(), Error> {
    let Some(s) = args.first().and_then(Value::as_str) else { return Ok(()) };
    let width = match args.get(1) {
        Some(w) if w.as_str().is_some() => str_len(Some(w)),
        Some(w) => w.as_i64().map_or(4, |n| n.max(0) as u64),
        None => 4,
    };
    let lines = s.bytes().filter(|b| *b == b'\n').count() as u64 + 1;
    check((s.len() as u64).saturating_add(lines.saturating_mul(width)), what)
}

/// `fmt|format(args)` and `fmt.format(args)`: each placeholder may print any argument (by name
/// or index, more than once) padded to any width written in the format.
fn check_format(what: &str, args: &[Value]) -> Result<(), Error> {
    let Some(fmt) = args.first().and_then(Value::as_str) else { return Ok(()) };
    let cap = remaining();
    let widest = args[1..]
        .iter()
        .flat_map(|a| match a.kind() {
            // keyword arguments arrive as one map
            ValueKind::Map => a.try_iter().map(|keys| keys.map(|k| a.get_item(&k).unwrap_or_default()).collect()).unwrap_or_default(),
            _ => vec![a.clone()],
        })
        .map(|a| display_len(&a, cap))
        .max()
        .unwrap_or(0);
    let placeholders = fmt.bytes().filter(|b| matches!(b, b'%' | b'{')).count() as u64;
    let widths: u64 = fmt
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|d| d.parse::<u64>().ok().or(if d.is_empty() { Some(0) } else { Some(u64::MAX) }))
        .fold(0u64, u64::saturating_add);
    check((fmt.len() as u64).saturating_add(placeholders.saturating_mul(widest)).saturating_add(widths), what)
}

/// `batch(n, fill)` / `slice(n, fill)`: up to `n` slots made for a short input.
fn check_count(what: &str, args: &[Value]) -> Result<(), Error> {
    match args.get(1).and_then(Value::as_i64) {
        Some(n) if n > 0 => check((n as u64).saturating_mul(SLOT), what),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::chat::ChatMessage;
    use crate::tokenizer::template::TemplateLimits;
    use crate::tokenizer::{ChatTemplate, SpecialTokens, TemplateOptions, TemplateSource};

    fn render_with(src: &str, limits: TemplateLimits) -> crate::error::Result<String> {
        let t = ChatTemplate::new(TemplateSource::Single(src.into())).with_limits(limits);
        t.render(&[ChatMessage::user("hi")], &TemplateOptions::default(), &SpecialTokens::default())
    }

    fn render(src: &str) -> crate::error::Result<String> {
        render_with(src, TemplateLimits::default())
    }

    /// Each of these would take gigabytes (most of them within a few hundred instructions).
    #[test]
    fn growing_values_stop_at_the_budget() {
        let kb = "k".repeat(1024);
        let cases = [
            // a string doubled in a namespace
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}".to_string(),
            // the same with +
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}".to_string(),
            // doubled through macro recursion (no namespace)
            "{% macro f(s, n) %}{% if n > 0 %}{{ f(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ f('ab', 60) }}".to_string(),
            // a macro printing its argument twice: the captured output doubles
            "{% macro d(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = d(ns.s) %}{% endfor %}".to_string(),
            // raw text printed in a loop inside a captured block (fuel alone allows ~6 GB)
            format!("{{% set x %}}{{% for i in range(100000) %}}{{% for j in range(100000) %}}{kb}{{% endfor %}}{{% endfor %}}{{% endset %}}{{{{ x|length }}}}"),
            // nested 1-tuples whose printed form escapes each level's quotes (fuzz/'s
            // chat_template found it: corpus/chat_template/regress-nested-repr-doubling)
            "{% set ns = namespace(s='ab') %}{% for i in range(50) %}{% set ns.s = ns.s ~ 1, %}{% endfor %}".to_string(),
            // a list doubled: its items are shared, but joining or printing copies each
            "{% set ns = namespace(l=['x' * 1000000]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|join }}".to_string(),
            // lazy repetitions (folded into constants) joined, listed
            "{{ (['x'] * 1000000000000)|join }}".to_string(),
            "{{ ([1] * 1000000000000)|list|length }}".to_string(),
            "{% set n = messages|length %}{{ ([''] * (n * 1000000000000))|join }}".to_string(),
            // one step that multiplies: replace, str.replace, join, str.join, format, indent, batch, slice
            "{{ ('x' * 10000000)|replace('x', 'y' * 100000) }}".to_string(),
            "{{ ('x' * 10000000).replace('', 'y' * 100000) }}".to_string(),
            "{% set l = ['a', 'b', 'c'] %}{% set z = 'z' * (messages|length * 100000000) %}{{ l|join(z) }}{{ l|join(z) }}{{ l|join(z) }}".to_string(),
            "{{ ('z' * (messages|length * 100000000)).join(['a', 'b', 'c', 'd']) }}".to_string(),
            "{{ '%999999999999s'|format('x') }}".to_string(),
            "{{ '{0}{0}{0}{0}'.format('x' * (messages|length * 100000000)) }}".to_string(),
            "{{ ('a\\n' * 1000000)|indent(1000000) }}".to_string(),
            "{{ [1]|batch(1000000000000, 'x')|list }}".to_string(),
            "{{ [1]|slice(1000000000000, 'x')|list }}".to_string(),
        ];
        for src in &cases {
            let err = render(src).expect_err(src).to_string();
            assert!(
                err.contains("bytes of values") || err.contains("past the template's budget"),
                "{src}: {err}"
            );
            assert!(err.contains("messages and tools of"), "{src}: {err}");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        // 100,000 levels: printing or dropping it would recurse once per level.
        let src = "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}";
        let err = render(src).unwrap_err().to_string();
        assert!(err.contains("more than 256 deep"), "{err}");
    }

    #[test]
    fn tojson_indent_stops_at_the_budget() {
        // 200 levels with a 1 KB indent print ~40 MB from a value of a few KB.
        let src = "{% set ns = namespace(l=[]) %}{% for i in range(200) %}{% set ns.l = [ns.l, 1] %}{% endfor %}{{ ns.l|tojson(indent=1024)|length }}";
        let small = TemplateLimits { value_bytes: 4 << 20, ..Default::default() };
        let err = render_with(src, small).unwrap_err().to_string();
        assert!(err.contains("tojson: the text would pass"), "{err}");
        // With the default budget it prints.
        let n: usize = render(src).unwrap().parse().unwrap();
        assert!(n > 20_000_000, "{n}");
    }

    #[test]
    fn reserved_names_are_refused() {
        for src in ["{% set __mlex_charge = 1 %}x", "{% macro __mlex_x() %}{% endmacro %}x", "{{ __mlex_charge('a') }}"] {
            let err = render(src).unwrap_err().to_string();
            assert!(err.contains("is reserved"), "{src}: {err}");
        }
    }

    /// The rewrite keeps what templates print: raw text with whitespace control, loops with
    /// break/continue/else, recursive loops, macros with defaults and caller, set and filter
    /// blocks, Python methods.
    #[test]
    fn rewritten_templates_print_the_same() {
        let src = r#"{%- set tree = [{'n': 'a', 'c': [{'n': 'b', 'c': []}]}, {'n': 'c', 'c': []}] -%}
<{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}>
{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }},{% endfor %}
{% for x in [] %}never{% else %}empty{% endfor %}
{% for node in tree recursive %}[{{ node.n }}{% if node.c %}{{ loop(node.c) }}{% endif %}]{% endfor %}
{% macro greet(who, punct='!') %}hello {{ who }}{{ punct }}{{ caller() if caller else '' }}{% endmacro %}
{{ greet('x') }} {% call greet('y', '?') %}(called){% endcall %}
{% set block %}  captured {{ 1 + 2 }}  {% endset %}[{{ block }}]
{% filter upper %}shout {{ 'it' }}{% endfilter %}
{{ '  pad  '.strip() }}|{{ 'a,b'.split(',')|join('+') }}|{{ 'x'|replace('x', 'yy') }}|{{ {'k': [1, 'v']} }}|{{ [1, 2]|tojson }}
{%- if true %}
  trimmed
{%- endif %}
end"#;
        let mut plain = minijinja::Environment::new();
        plain.set_trim_blocks(true);
        plain.set_lstrip_blocks(true);
        plain.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        let ctx = minijinja::context! { messages => vec![minijinja::context! { role => "user", content => "hi" }] };
        let expected = plain.render_str(src, ctx).unwrap();
        // (Python Jinja2 prints dicts as Python does, minijinja as JSON; tojson is Python's.)
        let expected = expected.replace(r#"{"k": [1, "v"]}"#, "{'k': [1, 'v']}").replace("[1,2]", "[1, 2]");
        assert_eq!(render(src).unwrap(), expected);
    }
}
