//! Container names and how anything read from the state directory is printed.
//!
//! - [`valid_container_name`]: the one rule for a container's name, wherever one comes from
//!   (`LIBSHARE_CONTAINER` in the shim, a claimed or cgroup name in the daemon, `sharectl
//!   set/get/reset`): 1-128 bytes of `A-Z a-z 0-9 . _ -`, not `.` or `..`. Runtimes' ids (12 hex
//!   digits) and Kubernetes-style names (`web-1`, `ns.pod`) fit; a name is a directory name
//!   under `<state dir>/containers`, so nothing in it can climb out or confuse a terminal.
//! - [`escape`]: the one way `sharectl` prints a name or any other string derived from the
//!   state directory (which may still hold a directory named before this rule, or by hand):
//!   control characters and anything but printable ASCII are written as escapes, so a name can
//!   neither send terminal sequences nor forge a line of a table.

use std::borrow::Cow;
use std::fmt::Write;

/// The longest container name, bytes.
pub const MAX_NAME_LEN: usize = 128;

/// The rule as one line says it (error messages).
pub const NAME_RULE: &str = "1-128 characters of A-Z a-z 0-9 . _ -, not '.' or '..'";

/// A container name libshare accepts: 1-128 bytes of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
pub fn valid_container_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_NAME_LEN
        && n != "."
        && n != ".."
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `s` safe to print on a terminal, in a table or inside a JSON string: printable ASCII stays
/// as it is (a valid container name is unchanged) except `\`, written `\\`; an ASCII control
/// character or DEL is written `\xNN` (ESC: `\x1b`); any other character (C1 controls,
/// invisible or bidirectional Unicode, anything non-ASCII) `\u{NNNN}`. The result is printable
/// ASCII only and never holds a newline.
pub fn escape(s: &str) -> Cow<'_, str> {
    let plain = |c: char| matches!(c, ' '..='~') && c != '\\';
    if s.chars().all(plain) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if plain(c) => out.push(c),
            c if c.is_ascii() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_a_safe_alphabet() {
        for good in [
            "web-1",
            "default",
            "4f3c2a1b0d9e",
            "ns.pod-7_x",
            "a",
            "..a",
            &"x".repeat(128),
        ] {
            assert!(valid_container_name(good), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\0b",
            "a b",
            "a\x1b[31m",
            "a\nb",
            "a\rb",
            "caf\u{e9}",
            "a\u{202e}b",
            "a:b",
            "$(x)",
            &"x".repeat(129),
        ] {
            assert!(!valid_container_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn escape_keeps_plain_text_and_escapes_the_rest() {
        assert!(matches!(escape("web-1"), Cow::Borrowed("web-1")));
        assert_eq!(escape("a b: c"), "a b: c");
        assert_eq!(escape("\x1b[2J"), "\\x1b[2J");
        assert_eq!(escape("a\nb\r\x07\x7f"), "a\\x0ab\\x0d\\x07\\x7f");
        assert_eq!(escape("\u{85}\u{9b}"), "\\u{0085}\\u{009b}");
        assert_eq!(escape("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(escape("\\x1b"), "\\\\x1b", "an escape cannot be forged");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn escaped_text_is_printable_ascii(s in "\\PC{0,20}|[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}a\\\\]{0,20}|\\PC{0,8}[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}]\\PC{0,8}") {
            let e = escape(&s);
            prop_assert!(e.chars().all(|c| matches!(c, ' '..='~')), "{:?}", e);
            prop_assert_eq!(valid_container_name(&s), valid_container_name(&e) && e == s);
        }
    }
}
