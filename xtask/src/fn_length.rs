//! Tidy: no function in a crate's `src/` runs past [`BUDGET`] lines, save
//! the ones [`ALLOWED`] names, each at most as long as it is listed. The
//! list may only shrink: a listed function that grew fails, and so does
//! one that now fits or is gone (take it off the list).
//!
//! A function is measured from its `fn` line to its closing brace. The
//! scanner knows Rust's strings, characters, lifetimes and comments well
//! enough that braces inside them do not count; tests (`#[cfg(test)]`
//! modules) and generated code are not measured.

use std::fs;
use std::path::Path;

/// The most lines a function may have.
pub(crate) const BUDGET: usize = 100;

/// Functions over the budget today: (file under the workspace root, name,
/// the most lines it may have). Shorten one and lower or drop its entry.
pub(crate) const ALLOWED: &[(&str, &str, usize)] = &[
    ("testing/k8s-emulator/src/openapi.rs", "schemas", 119),
    ("testing/k8s-emulator/src/server.rs", "leases", 133),
    ("testing/k8s-emulator/src/store.rs", "update", 113),
    ("testing/lease-history/src/check.rs", "store_fencing", 129),
    ("testing/lease-history/src/runner.rs", "worker", 126),
    ("testing/lease-history/src/server_log.rs", "check_log", 129),
    ("testing/lease-history/src/timeline.rs", "render_svg", 256),
    ("crates/session-store/src/jsonl/generation.rs", "claim", 139),
    ("crates/redis-store/src/store.rs", "fenced", 163),
    ("crates/mecated/src/cli.rs", "leases", 136),
    ("testing/fault-runs/src/e2e/mod.rs", "run", 142),
    ("testing/fault-runs/src/injectors.rs", "inject", 138),
];

/// A function found in a file: its name, first line and length in lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Function {
    pub(crate) name: String,
    pub(crate) line: usize,
    pub(crate) lines: usize,
}

/// Every function in `text` outside `#[cfg(test)]` modules, with its
/// length.
pub(crate) fn functions(text: &str) -> Vec<Function> {
    let code = blank_literals_and_comments(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut skip_until_depth: Option<i64> = None;
    let mut depth: i64 = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if skip_until_depth.is_none()
            && trimmed.starts_with("#[cfg(test)]")
            && lines.get(i + 1).is_some_and(|next| {
                let next = next.trim_start();
                (next.starts_with("mod ") || next.starts_with("pub(crate) mod "))
                    && !next.contains(';')
            })
        {
            skip_until_depth = Some(depth);
        }
        let is_test = i > 0 && {
            let above = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .find(|l| !l.is_empty())
                .unwrap_or("");
            above.starts_with("#[test]") || above.starts_with("#[tokio::test")
        };
        if skip_until_depth.is_none()
            && !is_test
            && let Some(name) = fn_name(trimmed)
            && let Some(lines_long) = body_length(&lines[i..])
        {
            out.push(Function {
                name,
                line: i + 1,
                lines: lines_long,
            });
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    // The test module closed.
                    if skip_until_depth == Some(depth) {
                        skip_until_depth = None;
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    out
}

/// The function name when `line` starts a function item (after any
/// visibility and qualifiers).
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line;
    loop {
        let before = rest;
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub(in ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
            "extern \"C\" ",
            "default ",
        ] {
            if let Some(r) = rest.strip_prefix(prefix) {
                rest = r;
                if prefix == "pub(in " {
                    rest = rest.split_once(") ").map_or(rest, |(_, r)| r);
                }
            }
        }
        if rest == before {
            break;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Lines from the first line of `from` (a `fn` line) to the brace closing
/// its body; `None` for a declaration without a body (a trait method).
fn body_length(from: &[&str]) -> Option<usize> {
    let mut depth = 0i64;
    let mut opened = false;
    for (n, line) in from.iter().enumerate() {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth -= 1;
                    if opened && depth == 0 {
                        return Some(n + 1);
                    }
                }
                ';' if !opened && depth == 0 => return None,
                _ => {}
            }
        }
    }
    None
}

/// `text` with the contents of string and character literals and of
/// comments replaced by spaces (newlines kept), so that only code's own
/// braces remain.
fn blank_literals_and_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let next = chars.get(i + 1).copied();
        let after_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        i = match chars[i] {
            '/' if next == Some('/') => line_comment(&chars, i, &mut out),
            '/' if next == Some('*') => block_comment(&chars, i, &mut out),
            'r' if matches!(next, Some('"' | '#')) && !after_ident => {
                raw_string(&chars, i, &mut out)
            }
            '"' => string(&chars, i, &mut out),
            '\'' => char_literal(&chars, i, &mut out),
            c => {
                out.push(c);
                i + 1
            }
        };
    }
    out
}

fn blank(c: char) -> char {
    if c == '\n' { '\n' } else { ' ' }
}

/// `// …` to the end of the line; where the scan goes on.
fn line_comment(chars: &[char], mut i: usize, out: &mut String) -> usize {
    while i < chars.len() && chars[i] != '\n' {
        out.push(' ');
        i += 1;
    }
    i
}

/// `/* … */`, nested.
fn block_comment(chars: &[char], mut i: usize, out: &mut String) -> usize {
    let mut nesting = 0;
    while i < chars.len() {
        let pair = (chars[i], chars.get(i + 1).copied());
        if pair == ('/', Some('*')) || pair == ('*', Some('/')) {
            nesting += if pair.0 == '/' { 1 } else { -1 };
            out.push_str("  ");
            i += 2;
            if nesting == 0 {
                break;
            }
        } else {
            out.push(blank(chars[i]));
            i += 1;
        }
    }
    i
}

/// `r"…"`, `r#"…"#`, `r##"…"##`; an `r` that starts none is kept.
fn raw_string(chars: &[char], i: usize, out: &mut String) -> usize {
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    let hashes = j - i - 1;
    if chars.get(j) != Some(&'"') {
        out.push('r');
        return i + 1;
    }
    out.extend(std::iter::repeat_n(' ', j - i + 1));
    j += 1;
    while let Some(&c) = chars.get(j) {
        if c == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
            out.extend(std::iter::repeat_n(' ', hashes + 1));
            return j + hashes + 1;
        }
        out.push(blank(c));
        j += 1;
    }
    j
}

/// `"…"`, with its escapes.
fn string(chars: &[char], mut i: usize, out: &mut String) -> usize {
    out.push(' ');
    i += 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                out.push(' ');
                if let Some(&e) = chars.get(i + 1) {
                    out.push(blank(e));
                }
                i += 2;
            }
            '"' => {
                out.push(' ');
                return i + 1;
            }
            other => {
                out.push(blank(other));
                i += 1;
            }
        }
    }
    i
}

/// A character literal (`'x'`, `'\n'`, `'\u{7b}'`), or the quote of a
/// lifetime, which is kept.
fn char_literal(chars: &[char], i: usize, out: &mut String) -> usize {
    let end = if chars.get(i + 1) == Some(&'\\') {
        (i + 2..chars.len().min(i + 12)).find(|&k| chars[k] == '\'')
    } else {
        (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
    };
    match end {
        Some(end) => {
            out.extend(std::iter::repeat_n(' ', end - i + 1));
            end + 1
        }
        None => {
            out.push('\'');
            i + 1
        }
    }
}

/// What breaks the rule in the `src/` trees under `crate_dirs` (paths
/// reported relative to `root`), given the allowlist.
pub(crate) fn check(
    root: &Path,
    crate_dirs: &[std::path::PathBuf],
    allowed: &[(&str, &str, usize)],
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen_allowed = vec![false; allowed.len()];
    for dir in crate_dirs {
        for file in crate::tidy::rust_files(&dir.join("src")) {
            let rel = file.strip_prefix(root).unwrap_or(&file).to_string_lossy();
            // Generated by `cargo xtask proto`, not written by hand.
            if rel.contains("/src/gen/") {
                continue;
            }
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            // A name can recur in one file (methods of several types): the
            // allowlist speaks of the longest.
            let mut longest: Vec<Function> = Vec::new();
            for f in functions(&text) {
                match longest.iter_mut().find(|g| g.name == f.name) {
                    Some(g) if g.lines < f.lines => *g = f,
                    Some(_) => {}
                    None => longest.push(f),
                }
            }
            for f in longest {
                let listed = allowed
                    .iter()
                    .position(|(path, name, _)| *path == rel && *name == f.name);
                match listed {
                    Some(k) => {
                        seen_allowed[k] = true;
                        let most = allowed[k].2;
                        if f.lines > most {
                            problems.push(format!(
                                "{rel}:{} fn {} is {} lines, more than the {most} it is allowed: \
                                 shorten it",
                                f.line, f.name, f.lines
                            ));
                        } else if f.lines <= BUDGET {
                            problems.push(format!(
                                "{rel}:{} fn {} is {} lines, within the budget: take it off \
                                 the allowlist in xtask/src/fn_length.rs",
                                f.line, f.name, f.lines
                            ));
                        } else if f.lines < most {
                            problems.push(format!(
                                "{rel}:{} fn {} is {} lines: lower its allowance from {most}",
                                f.line, f.name, f.lines
                            ));
                        }
                    }
                    None if f.lines > BUDGET => problems.push(format!(
                        "{rel}:{} fn {} is {} lines, over the budget of {BUDGET}: split it (a \
                         pure decision and a short driver, or helpers with names)",
                        f.line, f.name, f.lines
                    )),
                    None => {}
                }
            }
        }
    }
    for (k, (path, name, _)) in allowed.iter().enumerate() {
        if !seen_allowed[k] {
            problems.push(format!(
                "{path}: fn {name} is on the allowlist but not found: take it off"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(text: &str) -> Vec<(String, usize)> {
        functions(text)
            .into_iter()
            .map(|f| (f.name, f.lines))
            .collect()
    }

    #[test]
    fn functions_are_measured_from_fn_to_closing_brace() {
        let text = "fn a() {\n    1\n}\n\npub(crate) async fn b(x: u8) -> u8\nwhere\n{\n    x\n}\n";
        assert_eq!(lengths(text), vec![("a".into(), 3), ("b".into(), 5)]);
    }

    #[test]
    fn braces_in_strings_chars_and_comments_do_not_count() {
        let text = concat!(
            "fn a() {\n",
            "    let s = \"}}}\";\n",
            "    let r = r#\"{ \" }\"#;\n",
            "    let c = '}';\n",
            "    let e = '\\u{7d}';\n",
            "    // }\n",
            "    /* } */\n",
            "    fn inner<'a>(x: &'a str) -> &'a str { x }\n",
            "}\n",
            "fn b() {}\n",
        );
        assert_eq!(
            lengths(text),
            vec![("a".into(), 9), ("inner".into(), 1), ("b".into(), 1)]
        );
    }

    #[test]
    fn trait_declarations_and_test_modules_are_not_measured() {
        let text = concat!(
            "trait T {\n    fn declared(&self);\n}\n",
            "fn kept() {}\n",
            "#[test]\nfn a_test() {\n}\n",
            "#[cfg(test)]\nmod tests {\n    fn in_tests() {\n    }\n}\n",
            "fn after() {}\n",
        );
        assert_eq!(lengths(text), vec![("kept".into(), 1), ("after".into(), 1)]);
    }

    fn long_fn(name: &str, lines: usize) -> String {
        let mut text = format!("fn {name}() {{\n");
        for _ in 0..lines - 2 {
            text.push_str("    work();\n");
        }
        text.push_str("}\n");
        text
    }

    #[test]
    fn the_allowlist_only_shrinks() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("crates/c");
        fs::create_dir_all(dir.join("src")).unwrap();
        let file = "crates/c/src/lib.rs";
        let write = |text: String| fs::write(root.path().join(file), text).unwrap();
        let check = |allowed: &[(&str, &str, usize)]| {
            check(root.path(), std::slice::from_ref(&dir), allowed)
        };

        write(long_fn("big", BUDGET + 20));
        assert_eq!(check(&[]).len(), 1, "an unlisted long function passed");
        assert!(check(&[(file, "big", BUDGET + 20)]).is_empty());
        assert!(
            check(&[(file, "big", BUDGET + 10)])[0].contains("shorten"),
            "a function grown past its allowance passed"
        );
        assert!(check(&[(file, "big", BUDGET + 30)])[0].contains("lower its allowance"));
        write(long_fn("big", BUDGET));
        assert!(check(&[(file, "big", BUDGET + 20)])[0].contains("take it off"));
        assert!(check(&[(file, "gone", BUDGET + 20)])[0].contains("not found"));
    }
}
