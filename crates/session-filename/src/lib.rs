//! Safe file names for session ids.
//!
//! A [`SessionId`] is arbitrary text (`"../../etc/passwd"`, `"Chat/7"`,
//! 256 bytes of emoji). Backends that keep one file per session must never
//! join it raw into a path. [`stem`] turns it into a file-name stem that:
//!
//! - contains only `[a-z0-9_%~-]`, so no separator, no `.` (hence never `.`,
//!   `..` or a hidden file) and no upper case, which a case-insensitive file
//!   system (macOS, Windows) would fold together with lower case;
//! - is injective: ids up to [`MAX_PLAIN_STEM`] encoded bytes are
//!   percent-encoded byte by byte (reversible, see [`decode`]); longer ids
//!   become `~<readable prefix>~<sha256>`, and `~` never appears in a plain
//!   stem, so the two forms cannot meet;
//! - is at most [`MAX_STEM_LEN`] bytes, well under the usual 255-byte limit,
//!   leaving room for a suffix such as `.lease`.
//!
//! Hashed stems are not reversible; backends store the full id inside the
//! file and compare it on open, which also turns a (practically impossible)
//! SHA-256 collision into a detected error instead of shared state.
//!
//! # Example
//!
//! ```
//! use lease_port::SessionId;
//! use session_filename::{decode, stem};
//!
//! let id = SessionId::new("../Chat 7")?;
//! let s = stem(&id);
//! assert_eq!(s, "%2e%2e%2f%43hat%207");
//! assert_eq!(decode(&s).as_deref(), Some("../Chat 7"));
//!
//! let long = SessionId::new("x".repeat(200))?;
//! assert!(stem(&long).starts_with('~'));
//! assert!(stem(&long).len() <= session_filename::MAX_STEM_LEN);
//! # Ok::<(), lease_port::LeaseError>(())
//! ```

use std::fmt::Write as _;

use lease_port::SessionId;
use sha2::{Digest, Sha256};

/// Plain (reversible) stems longer than this are replaced by a hashed stem.
pub const MAX_PLAIN_STEM: usize = 120;

/// The longest stem [`stem`] returns.
pub const MAX_STEM_LEN: usize = MAX_PLAIN_STEM;

const HASHED_PREFIX: usize = MAX_STEM_LEN - 2 - 64;

fn is_plain(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')
}

fn percent_encode(input: &str) -> String {
    let mut out = String::with_capacity(input.len());
    for &b in input.as_bytes() {
        if is_plain(b) {
            out.push(b as char);
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02x}");
        }
    }
    out
}

/// The file-name stem for `id`. Deterministic across processes, versions and
/// platforms: it names files other processes open.
pub fn stem(id: &SessionId) -> String {
    let mut plain = percent_encode(id.as_str());
    if plain.len() <= MAX_PLAIN_STEM {
        return plain;
    }
    let digest = Sha256::digest(id.as_str().as_bytes());
    let mut out = String::with_capacity(MAX_STEM_LEN);
    out.push('~');
    // A readable prefix for operators; never split an escape in two.
    plain.truncate(HASHED_PREFIX);
    if let Some(pos) = plain.rfind('%').filter(|&p| p + 3 > plain.len()) {
        plain.truncate(pos);
    }
    out.push_str(&plain);
    out.push('~');
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The session id a plain stem encodes; `None` for hashed or malformed
/// stems (read the id stored in the file instead).
pub fn decode(stem: &str) -> Option<String> {
    if stem.contains('~') {
        return None;
    }
    let bytes = stem.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = stem.get(i + 1..i + 3)?;
                let b = u8::from_str_radix(hex, 16).ok()?;
                if is_plain(b) || hex.bytes().any(|h| h.is_ascii_uppercase()) {
                    return None; // not what `stem` writes: refuse aliases
                }
                out.push(b);
                i += 3;
            }
            b if is_plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(s: &str) -> SessionId {
        SessionId::new(s).unwrap()
    }

    #[test]
    fn traversal_and_separators_are_neutralised() {
        for raw in [
            "..",
            ".",
            "a/b",
            "a\\b",
            "/etc/passwd",
            ".hidden",
            "C:\\x",
            "a:b",
        ] {
            let s = stem(&id(raw));
            assert!(
                !s.contains('/') && !s.contains('\\') && !s.contains('.'),
                "{s}"
            );
            assert!(!s.contains(':'), "{s}");
            assert_eq!(decode(&s).as_deref(), Some(raw));
        }
    }

    #[test]
    fn case_differences_survive_case_folding() {
        let a = stem(&id("Chat"));
        let b = stem(&id("chat"));
        assert_ne!(a.to_lowercase(), b.to_lowercase());
    }

    #[test]
    fn long_ids_hash_within_limit_and_differ() {
        let a = "é".repeat(128);
        let mut b = a.clone();
        b.pop();
        b.push('è');
        let (sa, sb) = (stem(&id(&a)), stem(&id(&b)));
        assert!(sa.len() <= MAX_STEM_LEN && sb.len() <= MAX_STEM_LEN);
        assert!(sa.starts_with('~'));
        assert_ne!(sa, sb);
        assert_eq!(decode(&sa), None);
    }

    #[test]
    fn decode_refuses_aliases() {
        assert_eq!(decode("%61"), None, "plain byte written encoded");
        assert_eq!(decode("%2E"), None, "upper-case hex");
        assert_eq!(decode("%2"), None);
        assert_eq!(decode("A"), None);
    }

    proptest! {
        #[test]
        fn stems_are_safe_bounded_and_injective(a in "\\PC{1,200}", b in "\\PC{1,200}") {
            prop_assume!(a.len() <= lease_port::MAX_ID_LEN && b.len() <= lease_port::MAX_ID_LEN);
            let (sa, sb) = (stem(&id(&a)), stem(&id(&b)));
            prop_assert!(sa.len() <= MAX_STEM_LEN);
            prop_assert!(sa.bytes().all(|c| is_plain(c) || c == b'%' || c == b'~'));
            if let Some(d) = decode(&sa) { prop_assert_eq!(&d, &a); }
            prop_assert_eq!(a == b, sa == sb);
        }
    }
}
