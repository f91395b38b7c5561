//! GBNF (llama.cpp's grammar format, which vLLM and xgrammar's `grammar`
//! structural tag format also read) written in llguidance's Lark dialect:
//! one translation for the top-level `grammar` constraint and for a
//! `grammar` inside a structural tag.

/// A GBNF grammar (llama.cpp's, which vLLM also reads) in llguidance's Lark
/// dialect, which already takes most of GBNF's expressions (`x{2,3}`,
/// quoted strings): `name ::= body` becomes `name: body`, character
/// classes become regexes (`/[a-z]/`), hyphens in rule names become
/// underscores, and `root` is the start rule. Continuation
/// lines are kept as they are.
pub(crate) fn to_lark(g: &str) -> String {
    let mut out = String::with_capacity(g.len() + 16);
    if g.lines()
        .any(|l| l.trim_start().starts_with("root") && l.contains("::="))
    {
        out.push_str("start: root\n");
    }
    for line in g.lines() {
        let line = line.replacen("::=", ":", 1);
        // Hyphens outside quotes and brackets are in rule names.
        let (mut quote, mut bracket, mut escaped) = (false, false, false);
        for c in line.chars() {
            match c {
                '-' if !quote && !bracket => out.push('_'),
                // A character class is a regex in Lark: `/[a-z]/`.
                '[' if !quote && !bracket && !escaped => {
                    bracket = true;
                    out.push_str("/[");
                }
                ']' if bracket && !escaped => {
                    bracket = false;
                    out.push_str("]/");
                }
                '/' if bracket => out.push_str("\\/"),
                '"' if !bracket && !escaped => {
                    quote = !quote;
                    out.push(c);
                }
                _ => out.push(c),
            }
            escaped = c == '\\' && !escaped;
        }
        out.push('\n');
    }
    out
}
