//! What a chat template's constant expressions take when compiled. minijinja folds constant
//! expressions while it compiles (`'x' * 100000000` becomes a 100 MB string, and `~` or `+` of
//! such strings a larger one), so a template of a few kilobytes could exhaust memory when the
//! model loads, before any render and its budget (template_budget.rs). This walks the parsed
//! template (minijinja's `unstable_machinery`) and bounds, without evaluating anything, the bytes
//! folding would allocate; a template past [`MAX_CONST_BYTES`] is refused.
use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt};
use minijinja::machinery::{self, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;

/// Far above any real template's constants (a few kilobytes).
pub const MAX_CONST_BYTES: u64 = 16 << 20;

/// minijinja's own limit on `string * n`: a larger repetition is not folded (it fails at run time).
const MAX_REPEAT: u64 = 100_000_000;

/// How the environment of template.rs treats whitespace (`trim_blocks`, `lstrip_blocks`), for
/// the checks that parse or tokenize a template before it compiles.
pub(super) const WHITESPACE: WhitespaceConfig = WhitespaceConfig { keep_trailing_newline: false, lstrip_blocks: true, trim_blocks: true };

/// Refuses `source` when folding its constants could allocate more than [`MAX_CONST_BYTES`].
/// A template that does not parse passes: compiling it reports the syntax error.
pub fn check(source: &str) -> Result<(), String> {
    let Ok(ast) = machinery::parse(source, "<template>", SyntaxConfig::default(), WHITESPACE) else { return Ok(()) };
    let mut total = 0u64;
    stmt(&ast, &mut total);
    if total > MAX_CONST_BYTES {
        return Err(format!(
            "its constant expressions would take {total} bytes when compiled (at most {MAX_CONST_BYTES})"
        ));
    }
    Ok(())
}

/// A folded constant, as far as sizes go.
#[derive(Clone, Copy)]
enum Folded {
    /// A number (its magnitude: a repetition count).
    Number(f64),
    /// A string, list or map of about this many bytes (lists: 16 a slot).
    Sized(u64),
}

impl Folded {
    fn bytes(self) -> u64 {
        match self {
            Folded::Number(_) => 0,
            Folded::Sized(n) => n,
        }
    }
    /// What it prints as (`~` concatenates printed forms).
    fn printed(self) -> u64 {
        match self {
            Folded::Number(_) => 40,
            Folded::Sized(n) => n.saturating_mul(2),
        }
    }
}

/// Adds to `total` what compiling `e` folds, and returns the folded value when `e` is constant.
fn expr(e: &Expr<'_>, total: &mut u64) -> Option<Folded> {
    let folded = match e {
        Expr::Const(c) => Some(match c.value.kind() {
            ValueKind::Number => Folded::Number(f64::try_from(c.value.clone()).unwrap_or(0.0).abs()),
            ValueKind::String => Folded::Sized(c.value.as_str().map_or(0, |s| s.len() as u64)),
            _ => Folded::Sized(16),
        }),
        Expr::List(l) => {
            let items: Vec<_> = l.items.iter().map(|i| expr(i, total)).collect();
            // folded only when every item is a literal (ast.rs's List::as_const)
            l.items.iter().all(|i| matches!(i, Expr::Const(_))).then(|| {
                Folded::Sized(items.iter().map(|i| i.map_or(0, Folded::bytes).saturating_add(16)).fold(0, u64::saturating_add))
            })
        }
        Expr::Map(m) => {
            for k in m.keys.iter().chain(&m.values) {
                expr(k, total);
            }
            let literal = m.keys.iter().chain(&m.values).all(|i| matches!(i, Expr::Const(_)));
            literal.then(|| Folded::Sized((m.keys.len() as u64).saturating_mul(64)))
        }
        Expr::UnaryOp(u) => expr(&u.expr, total).map(|v| match v {
            Folded::Number(n) => Folded::Number(n),
            Folded::Sized(_) => Folded::Number(1.0),
        }),
        Expr::BinOp(b) => {
            let (l, r) = (expr(&b.left, total), expr(&b.right, total));
            let (l, r) = (l?, r?);
            Some(match (b.op, l, r) {
                (BinOpKind::Mul, Folded::Sized(s), Folded::Number(n)) | (BinOpKind::Mul, Folded::Number(n), Folded::Sized(s)) => {
                    let bytes = (s as f64 * n).min(u64::MAX as f64) as u64;
                    if bytes > MAX_REPEAT.max(s) {
                        return None; // minijinja refuses to fold it
                    }
                    Folded::Sized(bytes)
                }
                (BinOpKind::Mul, Folded::Number(a), Folded::Number(b)) => Folded::Number(a * b),
                (BinOpKind::Pow, Folded::Number(a), Folded::Number(b)) => Folded::Number(a.powf(b)),
                (BinOpKind::Add | BinOpKind::Sub, Folded::Number(a), Folded::Number(b)) => Folded::Number(a + b),
                (BinOpKind::Add, l, r) => Folded::Sized(l.bytes().saturating_add(r.bytes())),
                (BinOpKind::Concat, l, r) => Folded::Sized(l.printed().saturating_add(r.printed())),
                (BinOpKind::Div | BinOpKind::FloorDiv | BinOpKind::Rem, Folded::Number(a), _) => Folded::Number(a),
                _ => Folded::Number(1.0),
            })
        }
        Expr::Compare(c) => {
            let first = expr(&c.expr, total);
            let rest: Vec<_> = c.ops.iter().map(|o| expr(&o.expr, total)).collect();
            (first.is_some() && rest.iter().all(Option::is_some)).then_some(Folded::Number(1.0))
        }
        Expr::Var(_) => None,
        Expr::Slice(s) => {
            expr(&s.expr, total);
            for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                expr(part, total);
            }
            None
        }
        Expr::IfExpr(i) => {
            expr(&i.test_expr, total);
            expr(&i.true_expr, total);
            if let Some(f) = &i.false_expr {
                expr(f, total);
            }
            None
        }
        Expr::Filter(f) => {
            if let Some(x) = &f.expr {
                expr(x, total);
            }
            args(&f.args, total);
            None
        }
        Expr::Test(t) => {
            expr(&t.expr, total);
            args(&t.args, total);
            None
        }
        Expr::GetAttr(g) => {
            expr(&g.expr, total);
            None
        }
        Expr::GetItem(g) => {
            expr(&g.expr, total);
            expr(&g.subscript_expr, total);
            None
        }
        Expr::Call(c) => {
            expr(&c.expr, total);
            args(&c.args, total);
            None
        }
    };
    if let Some(Folded::Sized(n)) = folded {
        *total = total.saturating_add(n);
    }
    folded
}

fn args(args: &[CallArg<'_>], total: &mut u64) {
    for a in args {
        match a {
            CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => {
                expr(e, total);
            }
        }
    }
}

fn stmts(list: &[Stmt<'_>], total: &mut u64) {
    for s in list {
        stmt(s, total);
    }
}

fn stmt(s: &Stmt<'_>, total: &mut u64) {
    match s {
        Stmt::Template(t) => stmts(&t.children, total),
        Stmt::EmitExpr(e) => drop(expr(&e.expr, total)),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
        Stmt::ForLoop(f) => {
            for e in [Some(&f.target), Some(&f.iter), f.filter_expr.as_ref()].into_iter().flatten() {
                expr(e, total);
            }
            stmts(&f.body, total);
            stmts(&f.else_body, total);
        }
        Stmt::IfCond(i) => {
            expr(&i.expr, total);
            stmts(&i.true_body, total);
            stmts(&i.false_body, total);
        }
        Stmt::WithBlock(w) => {
            for (a, b) in &w.assignments {
                expr(a, total);
                expr(b, total);
            }
            stmts(&w.body, total);
        }
        Stmt::Set(x) => {
            expr(&x.target, total);
            expr(&x.expr, total);
        }
        Stmt::SetBlock(x) => {
            expr(&x.target, total);
            if let Some(f) = &x.filter {
                expr(f, total);
            }
            stmts(&x.body, total);
        }
        Stmt::AutoEscape(a) => {
            expr(&a.enabled, total);
            stmts(&a.body, total);
        }
        Stmt::FilterBlock(f) => {
            expr(&f.filter, total);
            stmts(&f.body, total);
        }
        Stmt::Block(b) => stmts(&b.body, total),
        Stmt::Import(i) => {
            expr(&i.expr, total);
            expr(&i.name, total);
        }
        Stmt::FromImport(i) => {
            expr(&i.expr, total);
            for (a, b) in &i.names {
                expr(a, total);
                if let Some(b) = b {
                    expr(b, total);
                }
            }
        }
        Stmt::Extends(x) => drop(expr(&x.name, total)),
        Stmt::Include(x) => drop(expr(&x.name, total)),
        Stmt::Macro(m) => {
            for e in m.args.iter().chain(&m.defaults) {
                expr(e, total);
            }
            stmts(&m.body, total);
        }
        Stmt::CallBlock(c) => {
            expr(&c.call.expr, total);
            args(&c.call.args, total);
            for e in c.macro_decl.args.iter().chain(&c.macro_decl.defaults) {
                expr(e, total);
            }
            stmts(&c.macro_decl.body, total);
        }
        Stmt::Do(d) => {
            expr(&d.call.expr, total);
            args(&d.call.args, total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_repetitions_are_bounded() {
        // 100 MB each, folded while compiling: a few kilobytes of template, gigabytes of memory.
        let many = "{{ 'x' * 100000000 }}".repeat(100);
        let err = check(&many).unwrap_err();
        assert!(err.contains("constant expressions would take"), "{err}");
        for src in [
            "{{ ('x' * 10000000) ~ ('x' * 10000000) }}",
            "{{ 'x' * 10 ** 8 }}",
            "{% set a = ('ab' * 5000000) + ('ab' * 5000000) %}",
            "{% for i in range(3) %}{{ ['x' * 20000000] }}{% endfor %}",
            "{% macro f(x='y' * 20000000) %}{% endmacro %}",
        ] {
            assert!(check(src).is_err(), "{src}");
        }
    }

    #[test]
    fn ordinary_templates_pass() {
        for src in [
            "{{ '-' * 20 }}{{ 1 + 2 }}{{ 'a' ~ 'b' }}{% for m in messages %}{{ m.content * 3 }}{% endfor %}",
            // not folded: minijinja refuses repetitions past 100 MB and fails at run time instead
            "{{ 'x' * 1000000000 }}",
            // a variable operand: not folded
            "{{ 'x' * n }}",
            "{% if %}",
        ] {
            assert!(check(src).is_ok(), "{src}");
        }
    }
}
