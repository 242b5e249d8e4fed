//! Who may call the HTTP API: bearer tokens, each with a name and roles,
//! read from a file that holds only their SHA-256 hashes.
//!
//! # The token file
//!
//! One token a line, three fields separated by spaces or tabs; blank lines
//! and lines whose first character (after blanks) is `#` are ignored:
//!
//! ```text
//! # name      roles           hash of the token
//! dashboard   read            sha256:1f2d…(64 hex digits)
//! chat-bot    read,run        sha256:9a0c…
//! ops         read,run,admin  sha256:77e1…
//! ```
//!
//! - The *name* (`[A-Za-z0-9._-]`, 1 to 64 characters, unique in the
//!   file) is who the audit trail and the logs say acted.
//! - The *roles* are a comma-separated set of `read`, `run` and `admin`.
//!   They are independent: a role grants what it names and nothing else,
//!   so a clean-up job that only deletes cannot start runs. Starting a run
//!   needs `read` as well as `run`, since the agent answers from the
//!   session's transcript; `run` alone creates sessions and cancels runs.
//!   A token that should do everything lists all three.
//! - The *hash* is `sha256:` and the lowercase or uppercase hex SHA-256 of
//!   the token's bytes, exactly as the client sends them
//!   (`printf %s "$TOKEN" | sha256sum`, or `mecated hash-token`). Two
//!   lines may not share a hash: one token would be two callers.
//!
//! A file that cannot be read, a malformed line (named by its number) and
//! a file without any token are refused ([`TokenFileError`]): at start-up
//! the server does not start, and a reload keeps the tokens it had. An
//! empty file is refused, not taken as "revoke everything", because an
//! editor that truncates the file before writing it would otherwise lock
//! every client out for a moment; to revoke every token, stop the server.
//!
//! A presented token is hashed, and its hash compared with every hash of
//! the file in constant time, so neither the token nor how much of a hash
//! it matched can be learnt from the time an answer takes.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use sha2::{Digest, Sha256};

/// What a token may do. Each role grants only what it names (see the
/// module docs).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sessions, their events (paged and followed), who holds a session's
    /// lease, and the metrics.
    Read,
    /// Creating sessions, starting runs and cancelling them. Starting a
    /// run also needs [`Role::Read`]: its answer is what the agent made of
    /// the session's transcript.
    Run,
    /// Deleting sessions: destructive maintenance.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Read, Role::Run, Role::Admin];

    /// The role as the token file and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Run => "run",
            Role::Admin => "admin",
        }
    }

    const fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == text)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Roles(u8);

impl Roles {
    /// Every role: what a caller has when authentication is off.
    pub const ALL: Roles = Roles(0b111);

    /// No role.
    pub const NONE: Roles = Roles(0);

    /// The set of the roles listed.
    pub const fn of(roles: &[Role]) -> Roles {
        let mut set = 0;
        let mut i = 0;
        while i < roles.len() {
            set |= roles[i].bit();
            i += 1;
        }
        Roles(set)
    }

    /// Whether `role` is in the set.
    pub fn contains(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// The roles of the set, in the order of [`Role::ALL`].
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.contains(*r))
    }

    /// The first role of `self` that `held` lacks.
    pub fn missing_from(self, held: Roles) -> Option<Role> {
        self.iter().find(|r| !held.contains(*r))
    }

    /// The set with `role` added.
    #[must_use]
    pub fn with(self, role: Role) -> Roles {
        Roles(self.0 | role.bit())
    }
}

impl FromIterator<Role> for Roles {
    fn from_iter<I: IntoIterator<Item = Role>>(iter: I) -> Self {
        iter.into_iter().fold(Roles::NONE, Roles::with)
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Role::name).collect();
        f.write_str(&names.join(","))
    }
}

/// Who made a request: a token's name and roles, or [`Caller::anonymous`]
/// when the server runs without authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    name: Arc<str>,
    roles: Roles,
}

impl Caller {
    /// The name the audit trail gives requests to a server without
    /// authentication.
    pub const ANONYMOUS: &'static str = "anonymous";

    /// The caller of a server without authentication: every role.
    pub fn anonymous() -> Self {
        Self {
            name: Arc::from(Self::ANONYMOUS),
            roles: Roles::ALL,
        }
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token's roles.
    pub fn roles(&self) -> Roles {
        self.roles
    }
}

/// What is wrong with one line of a token file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineProblem {
    /// Not the three fields `NAME ROLES sha256:HEX`.
    #[error("expected three fields, `NAME ROLES sha256:HEX`, found {0}")]
    FieldCount(usize),
    /// A name with characters outside `[A-Za-z0-9._-]`, too long, or one
    /// the audit trail gives callers without a token (`anonymous`,
    /// `unauthenticated`).
    #[error(
        "the name {0:?} is not 1 to {MAX_NAME_LEN} of the characters A-Z, a-z, 0-9, `.`, `_` and \
         `-`, other than `anonymous` and `unauthenticated`"
    )]
    BadName(String),
    /// A role other than `read`, `run` and `admin`.
    #[error("unknown role {0:?}: the roles are read, run and admin, comma-separated")]
    UnknownRole(String),
    /// The hash is not `sha256:` and 64 hex digits.
    #[error(
        "the hash is not `sha256:` and 64 hex digits (write `printf %s \"$TOKEN\" | sha256sum` \
         or `mecated hash-token`, never the token itself)"
    )]
    BadHash,
    /// The name is on an earlier line too.
    #[error("the name {name:?} is already used on line {first}")]
    DuplicateName {
        /// The name.
        name: String,
        /// The line it was first used on.
        first: usize,
    },
    /// The hash is on an earlier line too: one token, two callers.
    #[error("the same token hash is already on line {first}")]
    DuplicateHash {
        /// The line it was first on.
        first: usize,
    },
}

/// How a token file was refused, for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFileErrorKind {
    /// The file could not be read.
    Unreadable,
    /// A line is malformed.
    Malformed,
    /// The file holds no token.
    Empty,
}

/// Why a token file was refused: at start-up the server does not start,
/// and a reload keeps the previous tokens.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("cannot read the token file {}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("token file {} line {line}: {problem}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        problem: LineProblem,
    },
    /// No line holds a token.
    #[error(
        "the token file {} holds no token: every request would be refused (to revoke every \
         token, stop the server)",
        path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl TokenFileError {
    /// What kind of refusal this is.
    pub fn kind(&self) -> TokenFileErrorKind {
        match self {
            Self::Unreadable { .. } => TokenFileErrorKind::Unreadable,
            Self::Malformed { .. } => TokenFileErrorKind::Malformed,
            Self::Empty { .. } => TokenFileErrorKind::Empty,
        }
    }
}

/// The longest token name.
pub const MAX_NAME_LEN: usize = 64;

const HASH_PREFIX: &str = "sha256:";

#[derive(Debug)]
struct Entry {
    caller: Caller,
    hash: [u8; 32],
}

/// The tokens of one reading of a token file.
#[derive(Debug)]
pub struct TokenSet {
    entries: Vec<Entry>,
}

impl TokenSet {
    /// Parses a token file's text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, TokenFileError> {
        let mut entries: Vec<(usize, Entry)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let entry =
                parse_line(line, &entries).map_err(|problem| TokenFileError::Malformed {
                    path: path.to_owned(),
                    line: number,
                    problem,
                })?;
            entries.push((number, entry));
        }
        if entries.is_empty() {
            return Err(TokenFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            entries: entries.into_iter().map(|(_, e)| e).collect(),
        })
    }

    /// Reads and parses the token file at `path`.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// How many tokens the set holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always false: a token file without tokens is refused.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller `presented` (a bearer token as sent) authenticates, if
    /// any. Every hash is compared, in constant time, whatever matches.
    pub fn authenticate(&self, presented: &str) -> Option<Caller> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.find(&hash).map(|e| e.caller.clone())
    }

    fn find(&self, hash: &[u8; 32]) -> Option<&Entry> {
        let mut found = None;
        for entry in &self.entries {
            if same_hash(&entry.hash, hash) {
                found = Some(entry);
            }
        }
        found
    }
}

/// A token as it was accepted, to be asked again later whether the token
/// file in force still grants it a role: a response that goes on (a
/// follow) outlives the check made when it began, and must not outlive
/// the token's removal.
#[derive(Debug, Clone)]
pub struct Grant {
    tokens: Arc<TokenFile>,
    /// The set the token was last found in: while it is still the one in
    /// force, nothing needs looking up.
    seen_in: Arc<TokenSet>,
    /// The token's roles in `seen_in`.
    roles: Roles,
    hash: [u8; 32],
}

impl Grant {
    /// The caller `presented` authenticates as in `tokens` now, with the
    /// grant to ask again later.
    pub fn authenticate(tokens: &Arc<TokenFile>, presented: &str) -> Option<(Caller, Grant)> {
        let set = tokens.current();
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let caller = set.find(&hash)?.caller.clone();
        let grant = Grant {
            tokens: Arc::clone(tokens),
            seen_in: set,
            roles: caller.roles(),
            hash,
        };
        Some((caller, grant))
    }

    /// Whether the token file in force still grants the token `role`: not
    /// when the token was removed (or replaced under its name) or lost the
    /// role.
    pub fn still_grants(&mut self, role: Role) -> bool {
        self.roles_now().contains(role)
    }

    /// The roles the token file in force grants the token: none once the
    /// token was removed (or replaced under its name).
    pub fn roles_now(&mut self) -> Roles {
        let current = self.tokens.current();
        if !Arc::ptr_eq(&current, &self.seen_in) {
            self.roles = current
                .find(&self.hash)
                .map_or(Roles::NONE, |e| e.caller.roles());
            self.seen_in = current;
        }
        self.roles
    }

    /// What tells this token apart from every other, the one it replaced
    /// under its name included: its hash.
    pub(crate) fn key(&self) -> [u8; 32] {
        self.hash
    }
}

/// Compares two hashes without stopping at the first difference.
fn same_hash(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

fn parse_line(line: &str, earlier: &[(usize, Entry)]) -> Result<Entry, LineProblem> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [name, roles, hash] = fields[..] else {
        return Err(LineProblem::FieldCount(fields.len()));
    };
    // The audit trail's own words for callers without a token must never
    // name one.
    let name_ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !["anonymous", "unauthenticated"].contains(&name);
    if !name_ok {
        return Err(LineProblem::BadName(name.to_owned()));
    }
    let roles = roles
        .split(',')
        .map(|r| Role::parse(r).ok_or_else(|| LineProblem::UnknownRole(r.to_owned())))
        .collect::<Result<Roles, _>>()?;
    let hash = parse_hash(hash).ok_or(LineProblem::BadHash)?;
    if let Some((first, _)) = earlier.iter().find(|(_, e)| &*e.caller.name == name) {
        return Err(LineProblem::DuplicateName {
            name: name.to_owned(),
            first: *first,
        });
    }
    if let Some((first, _)) = earlier.iter().find(|(_, e)| e.hash == hash) {
        return Err(LineProblem::DuplicateHash { first: *first });
    }
    Ok(Entry {
        caller: Caller {
            name: Arc::from(name),
            roles,
        },
        hash,
    })
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix(HASH_PREFIX)?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let digit = |c: u8| (c as char).to_digit(16);
        *byte = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(out)
}

/// What a token file holds for `token`: `sha256:` and its hash in
/// lowercase hex.
pub fn hash_token(token: &str) -> String {
    let hash = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(HASH_PREFIX.len() + 64);
    out.push_str(HASH_PREFIX);
    for byte in hash {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Why a text cannot be a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadToken {
    /// Nothing but blanks.
    #[error("the token is empty")]
    Empty,
    /// A character an `Authorization` header cannot carry inside a token.
    #[error("the token holds a blank, a control character or a non-ASCII character")]
    Character,
}

/// The token a client would send for `text` (surrounding blanks and the
/// line ending dropped, as HTTP drops them from a header), or why none
/// could.
pub fn token_from_text(text: &str) -> Result<&str, BadToken> {
    let token = text.trim();
    if token.is_empty() {
        return Err(BadToken::Empty);
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(BadToken::Character);
    }
    Ok(token)
}

/// The SHA-256 of the file's contents, `None` when it cannot be read: a
/// rewrite is told by what it says, never by a time or a size that a copy
/// (`cp -p`, `rsync -t`, a restore) may keep.
fn stamp(path: &Path) -> Option<[u8; 32]> {
    std::fs::read(path)
        .ok()
        .map(|bytes| Sha256::digest(&bytes).into())
}

/// How a reload went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// The file was read; this many tokens are in force now.
    Tokens(usize),
    /// The file had not changed since it was last read.
    Unchanged,
}

/// The tokens in force, and the file they come from; reloaded without a
/// restart (on SIGHUP, or when the file changes).
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    current: RwLock<Arc<TokenSet>>,
    /// The file as last read, successfully or not: a malformed file is
    /// not read again (nor logged again) until it changes. Held across a
    /// whole reload, so a reload on SIGHUP and one on a change never put
    /// an older read in force after a newer one.
    seen: Mutex<Option<[u8; 32]>>,
}

impl TokenFile {
    /// Reads the token file at `path`, refusing it as a reload would.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, TokenFileError> {
        let path = path.into();
        let seen = stamp(&path);
        let set = TokenSet::load(&path)?;
        Ok(Self {
            path,
            current: RwLock::new(Arc::new(set)),
            seen: Mutex::new(seen),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tokens in force.
    pub fn current(&self) -> Arc<TokenSet> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads the file again; on success its tokens replace the ones in
    /// force, on failure those stay in force.
    pub fn reload(&self) -> Result<Reloaded, TokenFileError> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        self.reload_locked(&mut seen)
    }

    fn reload_locked(&self, seen: &mut Option<[u8; 32]>) -> Result<Reloaded, TokenFileError> {
        *seen = stamp(&self.path);
        let set = TokenSet::load(&self.path)?;
        let count = set.len();
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
        Ok(Reloaded::Tokens(count))
    }

    /// [`reload`](Self::reload)s when the file's contents changed since it
    /// was last read.
    pub fn reload_if_changed(&self) -> Result<Reloaded, TokenFileError> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if stamp(&self.path) == *seen {
            return Ok(Reloaded::Unchanged);
        }
        self.reload_locked(&mut seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb";

    fn parse(text: &str) -> Result<TokenSet, TokenFileError> {
        TokenSet::parse(text, Path::new("tokens"))
    }

    fn problem(text: &str) -> (usize, LineProblem) {
        match parse(text) {
            Err(TokenFileError::Malformed { line, problem, .. }) => (line, problem),
            other => panic!("{text:?} was not refused as malformed: {other:?}"),
        }
    }

    #[test]
    fn a_token_is_known_by_its_hash_and_carries_its_name_and_roles() {
        assert_eq!(hash_token("a"), A);
        let set = parse(&format!(
            "# who\n\n  ops read,admin {A}  \nbot\trun\t{}\n",
            hash_token("b").to_uppercase().replace("SHA256:", "sha256:")
        ))
        .unwrap();
        assert_eq!(set.len(), 2);
        let ops = set.authenticate("a").unwrap();
        assert_eq!(ops.name(), "ops");
        assert!(ops.roles().contains(Role::Read) && ops.roles().contains(Role::Admin));
        assert!(!ops.roles().contains(Role::Run));
        assert_eq!(ops.roles().to_string(), "read,admin");
        assert_eq!(set.authenticate("b").unwrap().name(), "bot");
        for wrong in ["", "A", "a ", "b\n", A] {
            assert_eq!(set.authenticate(wrong), None, "{wrong:?}");
        }
    }

    #[test]
    fn a_malformed_line_is_refused_naming_its_number() {
        let b = hash_token("b");
        let cases = [
            (format!("ops read {A} extra"), 1, LineProblem::FieldCount(4)),
            (format!("# c\nops {A}"), 2, LineProblem::FieldCount(2)),
            (
                format!("op$ read {A}"),
                1,
                LineProblem::BadName("op$".into()),
            ),
            (
                format!("{} read {A}", "n".repeat(65)),
                1,
                LineProblem::BadName("n".repeat(65)),
            ),
            (
                format!("anonymous read {A}"),
                1,
                LineProblem::BadName("anonymous".into()),
            ),
            (
                format!("unauthenticated read {A}"),
                1,
                LineProblem::BadName("unauthenticated".into()),
            ),
            (
                format!("ops read,write {A}"),
                1,
                LineProblem::UnknownRole("write".into()),
            ),
            (
                format!("ops read, {A}"),
                1,
                LineProblem::UnknownRole(String::new()),
            ),
            ("ops read secret-token".into(), 1, LineProblem::BadHash),
            (format!("ops read {}", &A[..70]), 1, LineProblem::BadHash),
            (
                format!("ops read {}", A.replace('a', "g")),
                1,
                LineProblem::BadHash,
            ),
            (
                format!("ops read sha1:{}", &A[7..]),
                1,
                LineProblem::BadHash,
            ),
            (
                format!("ops read {A}\nops run {b}"),
                2,
                LineProblem::DuplicateName {
                    name: "ops".into(),
                    first: 1,
                },
            ),
            (
                format!("ops read {A}\n\nbot run {A}"),
                3,
                LineProblem::DuplicateHash { first: 1 },
            ),
        ];
        for (text, line, expected) in cases {
            assert_eq!(problem(&text), (line, expected.clone()), "{text:?}");
            let e = parse(&text).unwrap_err();
            assert_eq!(e.kind(), TokenFileErrorKind::Malformed);
            assert!(
                e.to_string()
                    .starts_with(&format!("token file tokens line {line}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_file_without_tokens_is_refused() {
        for text in ["", "\n", "# only a comment\n  \n"] {
            assert_eq!(parse(text).unwrap_err().kind(), TokenFileErrorKind::Empty);
        }
        let missing = TokenSet::load(Path::new("/nonexistent/tokens")).unwrap_err();
        assert_eq!(missing.kind(), TokenFileErrorKind::Unreadable);
    }

    #[test]
    fn a_token_text_is_what_a_header_would_carry() {
        assert_eq!(token_from_text("  abc\n"), Ok("abc"));
        assert_eq!(token_from_text(" \n"), Err(BadToken::Empty));
        assert_eq!(token_from_text("a b"), Err(BadToken::Character));
        assert_eq!(token_from_text("a\u{e9}"), Err(BadToken::Character));
    }

    #[test]
    fn a_failed_reload_keeps_the_tokens_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("ops read {A}\n")).unwrap();
        let file = TokenFile::open(&path).unwrap();
        assert_eq!(file.reload_if_changed().unwrap(), Reloaded::Unchanged);
        // Replaced by rename, as a Secret update does: a new inode.
        let next = dir.path().join("next");
        std::fs::write(&next, "ops read not-a-hash\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        let e = file.reload_if_changed().unwrap_err();
        assert_eq!(e.kind(), TokenFileErrorKind::Malformed);
        assert!(file.current().authenticate("a").is_some());
        // Not read again until it changes.
        assert_eq!(file.reload_if_changed().unwrap(), Reloaded::Unchanged);
        std::fs::write(&next, format!("bot run {}\n", hash_token("b"))).unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(file.reload_if_changed().unwrap(), Reloaded::Tokens(1));
        assert!(file.current().authenticate("a").is_none());
        assert_eq!(file.current().authenticate("b").unwrap().name(), "bot");
    }
}
