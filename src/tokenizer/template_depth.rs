//! How deep a chat template's expressions nest, bounded before anything parses them.
//! minijinja's parser refuses nesting past 150 levels where it recurses (parentheses,
//! statements), but it builds an operator chain (`a + b + c ...`, `x.a.b ...`, `x|f|g ...`) in a
//! loop, one AST level per operator, and its compiler, our constant walk (template_consts.rs) and
//! the AST's drop then recurse once per level. A few kilobytes of `{{ 1 + 1 + ... }}` in a
//! checkpoint's tokenizer_config.json overflowed the stack of the thread loading it (found by the
//! chat_template fuzz target): a crash no caller can catch. So a tag holding more than
//! [`MAX_TAG_OPERATORS`] operators is refused from its tokens alone, before it is parsed.
use super::template_consts::WHITESPACE;
use minijinja::machinery::{tokenize, Token};
use minijinja::syntax::SyntaxConfig;

/// Far above any real template's tags (the 71 of the test assets hold at most 26 operators in
/// a tag), and a few hundred kilobytes of stack at most for the recursions above.
pub const MAX_TAG_OPERATORS: usize = 500;

/// Refuses `source` when one of its tags holds more than [`MAX_TAG_OPERATORS`] operators. A
/// template that does not tokenize passes: compiling it reports the syntax error.
pub fn check(source: &str) -> Result<(), String> {
    let (count, line) = max_tag_operators(source);
    if count > MAX_TAG_OPERATORS {
        return Err(format!(
            "a tag on line {line} chains {count} operators (at most {MAX_TAG_OPERATORS}): it would nest too deep to compile"
        ));
    }
    Ok(())
}

/// The most operators one tag of `source` holds, and the line where that tag starts.
fn max_tag_operators(source: &str) -> (usize, usize) {
    let (mut most, mut line) = (0, 0);
    let (mut count, mut start) = (0, 0);
    for token in tokenize(source, false, SyntaxConfig::default(), WHITESPACE) {
        let Ok((token, span)) = token else { break };
        match token {
            Token::VariableStart | Token::BlockStart => (count, start) = (0, span.start_line as usize),
            Token::VariableEnd | Token::BlockEnd => {}
            t if nests(&t) => {
                count += 1;
                if count > most {
                    (most, line) = (count, start);
                }
            }
            _ => {}
        }
    }
    (most, line)
}

/// Whether `t` can add a level to the expression it is in (commas, colons and literals add none).
fn nests(t: &Token<'_>) -> bool {
    match t {
        Token::Plus | Token::Minus | Token::Mul | Token::Div | Token::FloorDiv | Token::Pow | Token::Mod => true,
        Token::Dot | Token::Tilde | Token::Pipe | Token::BracketOpen | Token::ParenOpen | Token::BraceOpen => true,
        Token::Eq | Token::Ne | Token::Gt | Token::Gte | Token::Lt | Token::Lte => true,
        Token::Ident(w) => matches!(*w, "and" | "or" | "not" | "is" | "in" | "if" | "else"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_operator_chains_are_refused_before_parsing() {
        for chain in [" + 1", " ~ 1", " and 1", ".x", "[0]", "|string"] {
            let src = format!("{{% if true %}}\n{{{{ 1{} }}}}{{% endif %}}", chain.repeat(50_000));
            let err = check(&src).unwrap_err();
            assert!(err.contains("line 2 chains"), "{chain}: {err}");
        }
        assert!(check(&format!("{{{{ 1{} }}}}", " + 1".repeat(MAX_TAG_OPERATORS))).is_ok());
    }
}
