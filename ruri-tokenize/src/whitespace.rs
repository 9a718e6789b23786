//! The whitespace policy: keep prompt + text as given, or strip it exactly as Python's
//! `str.strip()` does.
//!
//! sentence-transformers 2.x–5.3 run `str(s).strip()` on prompt + text before tokenizing
//! (`Transformer.tokenize`); 5.4 and later do not. Ruri v3 was trained and evaluated with
//! stripping versions, and most indexes built before April 2026 hold stripped vectors; the
//! current sentence-transformers (6.x) and text-embeddings-inference embed the text as given.

use std::borrow::Cow;

/// What happens to whitespace at the ends of prompt + text before tokenizing.
///
/// The default is [`Whitespace::Keep`]: the text the caller passed is what the model sees,
/// as in sentence-transformers ≥ 5.4 (the current reference) and text-embeddings-inference.
/// Choose [`Whitespace::Strip`] to reproduce vectors from sentence-transformers 2.x–5.3 (how
/// Ruri v3 was trained and evaluated, and how most existing indexes were built): a document
/// ending in `"\n"`, or an empty text with a prompt (`"検索クエリ: "` becomes `"検索クエリ:"`),
/// embeds differently under the two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Whitespace {
    /// Tokenize prompt + text exactly as given.
    #[default]
    Keep,
    /// Remove leading and trailing whitespace from prompt + text, exactly as Python's
    /// `str.strip()` (see [`is_python_whitespace`] for the set, which is not Rust's
    /// [`char::is_whitespace`]).
    Strip,
}

impl Whitespace {
    /// The text the tokenizer sees: `prompt + text`, stripped under [`Whitespace::Strip`].
    ///
    /// ```
    /// use ruri_tokenize::Whitespace;
    ///
    /// assert_eq!(Whitespace::Keep.apply("検索クエリ: ", ""), "検索クエリ: ");
    /// assert_eq!(Whitespace::Strip.apply("検索クエリ: ", ""), "検索クエリ:");
    /// assert_eq!(Whitespace::Strip.apply("", "\u{3000}瑠璃\n"), "瑠璃");
    /// ```
    pub fn apply<'a>(self, prompt: &str, text: &'a str) -> Cow<'a, str> {
        let joined: Cow<'a, str> = if prompt.is_empty() {
            Cow::Borrowed(text)
        } else {
            Cow::Owned([prompt, text].concat())
        };
        match (self, joined) {
            (Whitespace::Keep, joined) => joined,
            (Whitespace::Strip, Cow::Borrowed(text)) => Cow::Borrowed(strip_python(text)),
            (Whitespace::Strip, Cow::Owned(joined)) => {
                let stripped = strip_python(&joined);
                if stripped.len() == joined.len() {
                    Cow::Owned(joined)
                } else {
                    Cow::Owned(stripped.to_owned())
                }
            }
        }
    }
}

/// Whether Python 3 counts `c` as whitespace (`str.isspace()`, the set `str.strip()`
/// removes): Unicode's `White_Space` characters plus the information separators
/// U+001C–U+001F, which Python includes because their bidirectional class is B or S.
///
/// The two sets differ exactly there: `'\x1c'.strip()` is `''` in Python, while Rust's
/// [`char::is_whitespace`] keeps U+001C. The committed test references list the set Python
/// 3.11 reports, and a test compares every code point with it.
pub fn is_python_whitespace(c: char) -> bool {
    matches!(c, '\u{1c}'..='\u{1f}') || c.is_whitespace()
}

/// `s` without leading and trailing Python whitespace: Python's `s.strip()`.
pub fn strip_python(s: &str) -> &str {
    s.trim_matches(is_python_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_removes_only_the_ends() {
        assert_eq!(strip_python(" \t瑠璃 色\u{3000}\n"), "瑠璃 色");
        assert_eq!(strip_python("\u{1c}\u{85}a\u{1f}"), "a");
        assert_eq!(strip_python("\u{200b}a\u{200b}"), "\u{200b}a\u{200b}");
        assert_eq!(strip_python(" \n\u{3000} "), "");
    }

    #[test]
    fn keep_joins_without_copying_when_there_is_no_prompt() {
        assert!(matches!(
            Whitespace::Keep.apply("", " a "),
            Cow::Borrowed(" a ")
        ));
        assert!(matches!(
            Whitespace::Strip.apply("", " a "),
            Cow::Borrowed("a")
        ));
        assert_eq!(Whitespace::Keep.apply("p: ", " a "), "p:  a ");
        assert_eq!(Whitespace::Strip.apply("p: ", " a \n"), "p:  a");
    }
}
