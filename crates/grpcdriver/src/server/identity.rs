//! Who a caller is, and which owner ids it may act for.
//!
//! A lease is only as safe as the owner id on it: `Renew` and `Release`
//! need nothing but the owner and the token, and `Get` tells both. So a
//! service whose every client may name any owner lets one misconfigured
//! or compromised client release every session and take it. Each
//! credential therefore maps to a client *name* (for logs and metrics) and
//! to the owner id *prefixes* it may use; a call naming any other owner is
//! refused with `PERMISSION_DENIED`, reason `NOT_PERMITTED`.
//!
//! The identities come from a file ([`Identities::parse`]), one credential
//! a line:
//!
//! ```text
//! # kind  name      owner prefixes      credential
//! token   chat-a    chat-a/             sha256:<64 hex digits>
//! cert    chat-b    chat-b/,batch/      uri:spiffe://example.org/ns/chat/sa/chat-b
//! cert    chat-c    chat-c/             dns:chat-c.chat.svc
//! token   ops       *                   sha256:<64 hex digits>
//! ```
//!
//! - `token` lines hold the SHA-256 of a bearer token ([`hash_token`]),
//!   never the token: a copy of the file admits no one.
//! - `cert` lines name a client certificate by one of its subject
//!   alternative names (DNS or URI), as verified by mutual TLS.
//! - Owner prefixes are comma-separated, each ending in `/` (so `web-1/`
//!   never admits `web-10/…`), none the beginning of another identity's;
//!   `*` alone admits every owner id (an operator's tool, say).
//! - One name may have several lines (an old and a new token during a
//!   rotation) if they give it the same prefixes.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use lease_port::OwnerId;
use sha2::{Digest, Sha256};

/// The longest client name: names label metrics and log lines.
const MAX_NAME_LEN: usize = 64;
/// The longest owner prefix: a client's owner ids are its prefix and a
/// name of its own (host, process), within the 256 bytes of an owner id.
const MAX_PREFIX_LEN: usize = 128;
/// Names the service gives callers it does not tell apart; no identity
/// may take one.
const RESERVED_NAMES: [&str; 2] = ["anonymous", "bearer"];

/// The owner ids one identity may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerScope {
    /// Every owner id.
    Any,
    /// Owner ids beginning with one of these (none empty).
    Prefixes(Vec<String>),
}

impl OwnerScope {
    /// Whether `owner` is one this scope may act for.
    pub fn admits(&self, owner: &OwnerId) -> bool {
        match self {
            OwnerScope::Any => true,
            OwnerScope::Prefixes(p) => p.iter().any(|p| owner.as_str().starts_with(p.as_str())),
        }
    }

    /// The prefixes as the wire states them: an empty one for [`Any`].
    ///
    /// [`Any`]: OwnerScope::Any
    pub fn wire_prefixes(&self) -> Vec<String> {
        match self {
            OwnerScope::Any => vec![String::new()],
            OwnerScope::Prefixes(p) => p.clone(),
        }
    }
}

impl fmt::Display for OwnerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerScope::Any => f.write_str("*"),
            OwnerScope::Prefixes(p) => f.write_str(&p.join(",")),
        }
    }
}

/// An authenticated caller: its name and the owner ids it may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    name: Arc<str>,
    owners: OwnerScope,
}

impl ClientIdentity {
    /// A caller named `name` acting for `owners`.
    pub fn new(name: impl Into<Arc<str>>, owners: OwnerScope) -> Self {
        Self {
            name: name.into(),
            owners,
        }
    }

    /// The name logs and metrics give the caller.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn shared_name(&self) -> Arc<str> {
        Arc::clone(&self.name)
    }

    /// The owner ids it may act for.
    pub fn owners(&self) -> &OwnerScope {
        &self.owners
    }
}

/// A subject alternative name of a client certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CertName {
    /// A DNS name, compared without regard to ASCII letter case.
    Dns(String),
    /// A URI (a SPIFFE id, say), compared exactly.
    Uri(String),
}

impl CertName {
    fn normalised(self) -> Self {
        match self {
            CertName::Dns(d) => CertName::Dns(d.to_ascii_lowercase()),
            uri => uri,
        }
    }
}

impl fmt::Display for CertName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertName::Dns(d) => write!(f, "dns:{d}"),
            CertName::Uri(u) => write!(f, "uri:{u}"),
        }
    }
}

/// What is wrong with an identities file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentitiesErrorKind {
    /// The file could not be read.
    Unreadable,
    /// A line is not `KIND NAME OWNERS CREDENTIAL`, or one of its fields is
    /// malformed.
    Malformed,
    /// Two lines give one credential, or one name two owner scopes.
    Conflict,
}

/// An identities file refused: which line, and why. Nothing of the file
/// is used (a reload that fails keeps the identities in force).
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {detail}", .path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default(), .line.map(|l| format!("line {l}")).unwrap_or_else(|| "identities".into()))]
pub struct IdentitiesError {
    kind: IdentitiesErrorKind,
    path: Option<PathBuf>,
    line: Option<usize>,
    detail: String,
    #[source]
    source: Option<std::io::Error>,
}

impl IdentitiesError {
    fn at(line: usize, kind: IdentitiesErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            path: None,
            line: Some(line),
            detail: detail.into(),
            source: None,
        }
    }

    /// What went wrong, to match on.
    pub fn kind(&self) -> IdentitiesErrorKind {
        self.kind
    }

    /// The line (from 1) at fault, when one is.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

/// The SHA-256 of a bearer token as an identities file holds it:
/// `sha256:` and 64 lower-case hex digits.
///
/// ```
/// assert_eq!(
///     grpcdriver::hash_token("secret"),
///     "sha256:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
/// );
/// ```
pub fn hash_token(token: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(token.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of a bearer token, as the identities keep it.
pub(crate) fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Every credential a service accepts, each with its identity.
#[derive(Debug, Clone, Default)]
pub struct Identities {
    /// SHA-256 of a token → its identity. Looked up by the hash of what a
    /// caller presents: how long a lookup takes tells nothing of a token.
    tokens: HashMap<[u8; 32], Arc<ClientIdentity>>,
    certs: HashMap<CertName, Arc<ClientIdentity>>,
}

impl Identities {
    /// Reads the identities file at `path` ([`Identities::parse`]).
    pub fn from_file(path: &Path) -> Result<Self, IdentitiesError> {
        let text = read_text(path)?;
        Self::parse_file(path, &text)
    }

    fn parse_file(path: &Path, text: &str) -> Result<Self, IdentitiesError> {
        Self::parse(text).map_err(|mut e| {
            e.path = Some(path.to_path_buf());
            e
        })
    }

    /// Parses an identities file's text (format in the module docs). Blank
    /// lines and lines starting with `#` are skipped.
    pub fn parse(text: &str) -> Result<Self, IdentitiesError> {
        let mut out = Identities::default();
        let mut scopes: HashMap<Arc<str>, Arc<ClientIdentity>> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let entry = Entry::parse(n, line)?;
            let identity = match scopes.get(entry.name.as_ref()) {
                Some(known) if known.owners != entry.owners => {
                    return Err(IdentitiesError::at(
                        n,
                        IdentitiesErrorKind::Conflict,
                        format!(
                            "`{}` was given owners `{}` on an earlier line, `{}` here",
                            entry.name, known.owners, entry.owners
                        ),
                    ));
                }
                Some(known) => Arc::clone(known),
                None => {
                    let id = Arc::new(ClientIdentity::new(Arc::clone(&entry.name), entry.owners));
                    scopes.insert(entry.name, Arc::clone(&id));
                    id
                }
            };
            let fresh = match entry.credential {
                Credential::Token(hash) => out.tokens.insert(hash, identity).is_none(),
                Credential::Cert(name) => out.certs.insert(name, identity).is_none(),
            };
            if !fresh {
                return Err(IdentitiesError::at(
                    n,
                    IdentitiesErrorKind::Conflict,
                    "this credential is on an earlier line too",
                ));
            }
        }
        check_overlap(&scopes).map_err(|detail| IdentitiesError {
            kind: IdentitiesErrorKind::Conflict,
            path: None,
            line: None,
            detail,
            source: None,
        })?;
        Ok(out)
    }

    /// How many credentials it holds.
    pub fn len(&self) -> usize {
        self.tokens.len() + self.certs.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The identity of a presented bearer token.
    pub fn for_token(&self, token: &str) -> Option<&Arc<ClientIdentity>> {
        self.for_digest(&token_digest(token))
    }

    pub(crate) fn for_digest(&self, digest: &[u8; 32]) -> Option<&Arc<ClientIdentity>> {
        self.tokens.get(digest)
    }

    /// The identity a certificate's names give: `Ok(None)` when none has
    /// one, an error naming both when they give two (which of them the
    /// certificate acts as must not depend on the order of its names).
    pub fn for_cert<'a>(
        &self,
        names: impl IntoIterator<Item = &'a CertName>,
    ) -> Result<Option<&Arc<ClientIdentity>>, String> {
        let mut found: Option<&Arc<ClientIdentity>> = None;
        for name in names {
            let Some(id) = self.certs.get(&name.clone().normalised()) else {
                continue;
            };
            match found {
                Some(f) if f.name != id.name => {
                    return Err(format!(
                        "the client certificate's names give it two identities, `{}` and `{}`",
                        f.name, id.name
                    ));
                }
                _ => found = Some(id),
            }
        }
        Ok(found)
    }
}

fn read_text(path: &Path) -> Result<String, IdentitiesError> {
    std::fs::read_to_string(path).map_err(|e| IdentitiesError {
        kind: IdentitiesErrorKind::Unreadable,
        path: Some(path.to_path_buf()),
        line: None,
        detail: format!("cannot read it: {e}"),
        source: Some(e),
    })
}

fn text_digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

enum Credential {
    Token([u8; 32]),
    Cert(CertName),
}

struct Entry {
    name: Arc<str>,
    owners: OwnerScope,
    credential: Credential,
}

impl Entry {
    fn parse(n: usize, line: &str) -> Result<Self, IdentitiesError> {
        let bad = |detail: String| IdentitiesError::at(n, IdentitiesErrorKind::Malformed, detail);
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let [kind, name, owners, credential] = fields[..] else {
            return Err(bad(format!(
                "expected `token|cert NAME OWNER-PREFIXES CREDENTIAL`, found {} fields",
                fields.len()
            )));
        };
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(bad(format!(
                "name `{name}`: 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 . _ -"
            )));
        }
        if RESERVED_NAMES.contains(&name) {
            return Err(bad(format!(
                "name `{name}` is the service's own for callers it does not tell apart"
            )));
        }
        let owners = parse_owners(owners).map_err(bad)?;
        let credential = match kind {
            "token" => Credential::Token(parse_hash(credential).map_err(bad)?),
            "cert" => Credential::Cert(parse_cert_name(credential).map_err(bad)?),
            other => return Err(bad(format!("kind `{other}`: expected `token` or `cert`"))),
        };
        Ok(Entry {
            name: Arc::from(name),
            owners,
            credential,
        })
    }
}

fn parse_owners(text: &str) -> Result<OwnerScope, String> {
    if text == "*" {
        return Ok(OwnerScope::Any);
    }
    let prefixes: Vec<String> = text.split(',').map(str::to_owned).collect();
    for p in &prefixes {
        // Without a separator at its end, `web-1` would admit `web-10/…`:
        // another client's owner ids.
        if p.len() < 2 || !p.ends_with('/') || p.len() > MAX_PREFIX_LEN || p.contains('*') {
            return Err(format!(
                "owner prefix `{p}`: each ends in `/` and is at most {MAX_PREFIX_LEN} bytes \
                 (`web-a/`, `chat/web-a/`); `*` alone admits every owner"
            ));
        }
    }
    Ok(OwnerScope::Prefixes(prefixes))
}

/// Refuses two identities one of whose prefixes begins the other's: the
/// first could act for the second's owners.
fn check_overlap(scopes: &HashMap<Arc<str>, Arc<ClientIdentity>>) -> Result<(), String> {
    let mut all: Vec<(&str, &str)> = scopes
        .iter()
        .filter_map(|(name, id)| match &id.owners {
            OwnerScope::Prefixes(p) => Some(p.iter().map(move |p| (name.as_ref(), p.as_str()))),
            OwnerScope::Any => None,
        })
        .flatten()
        .collect();
    all.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)));
    for (i, (name, prefix)) in all.iter().enumerate() {
        // Sorted, a prefix is followed by every string it begins.
        for (other, longer) in &all[i + 1..] {
            if !longer.starts_with(prefix) {
                break;
            }
            if other != name {
                return Err(format!(
                    "`{name}`'s owner prefix `{prefix}` begins `{other}`'s `{longer}`: \
                     `{name}` could act for `{other}`'s owners"
                ));
            }
        }
    }
    Ok(())
}

fn parse_hash(text: &str) -> Result<[u8; 32], String> {
    let hex = text
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            "a token credential is `sha256:` and 64 hex digits (the token's hash, never the token)"
                .to_owned()
        })?;
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn parse_cert_name(text: &str) -> Result<CertName, String> {
    match text.split_once(':') {
        Some(("dns", name)) if !name.is_empty() => Ok(CertName::Dns(name.to_owned())),
        Some(("uri", uri)) if !uri.is_empty() => Ok(CertName::Uri(uri.to_owned())),
        _ => Err(format!(
            "certificate name `{text}`: expected `dns:NAME` or `uri:URI`"
        )),
    }
    .map(CertName::normalised)
}

/// The identities a running server authenticates against, replaceable
/// while it serves: [`IdentityStore::replace`] (or [`reload`]) takes
/// effect for the next call, and for the next batch of a KeepAlive stream
/// opened before it.
///
/// Cheap to clone; clones share the identities.
///
/// [`reload`]: IdentityStore::reload
#[derive(Debug, Clone)]
pub struct IdentityStore {
    inner: Arc<StoreInner>,
}

#[derive(Debug)]
struct StoreInner {
    current: RwLock<Arc<Identities>>,
    /// Raised by every replacement, so a long-lived stream can tell that
    /// its caller's credential must be looked up again.
    generation: AtomicU64,
    path: Option<PathBuf>,
    /// The SHA-256 of the file's text last put in force: a rewrite is
    /// told by its contents, never by times or sizes a copy may keep.
    loaded: std::sync::Mutex<Option<[u8; 32]>>,
}

impl IdentityStore {
    /// A store holding `identities`, with no file behind it.
    pub fn new(identities: Identities) -> Self {
        Self::with_path(identities, None)
    }

    /// A store read from `path`, which [`reload`](IdentityStore::reload)
    /// reads again.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, IdentitiesError> {
        let path = path.into();
        let text = read_text(&path)?;
        let identities = Identities::parse_file(&path, &text)?;
        let store = Self::with_path(identities, Some(path));
        *store.loaded() = Some(text_digest(&text));
        Ok(store)
    }

    fn with_path(identities: Identities, path: Option<PathBuf>) -> Self {
        Self {
            inner: Arc::new(StoreInner {
                current: RwLock::new(Arc::new(identities)),
                generation: AtomicU64::new(0),
                path,
                loaded: std::sync::Mutex::new(None),
            }),
        }
    }

    fn loaded(&self) -> std::sync::MutexGuard<'_, Option<[u8; 32]>> {
        self.inner
            .loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The identities in force.
    pub fn current(&self) -> Arc<Identities> {
        let current = self
            .inner
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&current)
    }

    pub(crate) fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Puts `identities` in force in place of the current ones.
    pub fn replace(&self, identities: Identities) {
        let mut current = self
            .inner
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *current = Arc::new(identities);
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Reads the file the store came from again and puts it in force; a
    /// file that is refused changes nothing. Returns how many credentials
    /// are now in force. A store without a file is left as it is.
    pub fn reload(&self) -> Result<usize, IdentitiesError> {
        self.reload_from_file(true)
            .map(|n| n.unwrap_or_else(|| self.current().len()))
    }

    /// [`reload`](IdentityStore::reload) when the file's contents differ
    /// from those last put in force: `Ok(None)` when they do not. Cheap
    /// enough to call every few seconds (one read of a small file).
    pub fn reload_if_changed(&self) -> Result<Option<usize>, IdentitiesError> {
        self.reload_from_file(false)
    }

    fn reload_from_file(&self, always: bool) -> Result<Option<usize>, IdentitiesError> {
        let Some(path) = &self.inner.path else {
            return Ok(None);
        };
        let text = read_text(path)?;
        let digest = text_digest(&text);
        if !always && *self.loaded() == Some(digest) {
            return Ok(None);
        }
        let identities = Identities::parse_file(path, &text)?;
        let n = identities.len();
        // Under the digest's lock, so two reloads racing put in force the
        // text whose digest stays recorded.
        let mut loaded = self.loaded();
        self.replace(identities);
        *loaded = Some(digest);
        Ok(Some(n))
    }

    /// The file behind the store, if any.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(s: &str) -> OwnerId {
        OwnerId::new(s).unwrap()
    }

    #[test]
    fn a_file_maps_tokens_and_certificates_to_names_and_prefixes() {
        let text = format!(
            "# comment\n\n token chat-a chat-a/ {}\ncert chat-b chat-b/,batch/ uri:spiffe://x/chat-b\n\
             cert chat-c chat-c/ dns:Chat-C.example\ntoken ops * {}\ntoken chat-a chat-a/ {}\n",
            hash_token("a-old"),
            hash_token("ops-token"),
            hash_token("a-new"),
        );
        let ids = Identities::parse(&text).unwrap();
        assert_eq!(ids.len(), 5);
        let a = ids.for_token("a-old").unwrap();
        assert_eq!(a.name(), "chat-a");
        assert!(Arc::ptr_eq(a, ids.for_token("a-new").unwrap()));
        assert!(a.owners().admits(&owner("chat-a/host/1")));
        assert!(!a.owners().admits(&owner("chat-b/host/1")));
        assert!(!a.owners().admits(&owner("chat-")));
        assert!(ids.for_token("a-older").is_none());
        assert!(ids.for_token("").is_none());

        let b = ids
            .for_cert(&[
                CertName::Dns("unknown".into()),
                CertName::Uri("spiffe://x/chat-b".into()),
            ])
            .unwrap()
            .unwrap();
        assert_eq!(b.name(), "chat-b");
        assert!(b.owners().admits(&owner("batch/7")));
        // DNS names match in any letter case; URIs exactly.
        assert_eq!(
            ids.for_cert(&[CertName::Dns("chat-c.EXAMPLE".into())])
                .unwrap()
                .unwrap()
                .name(),
            "chat-c"
        );
        assert!(
            ids.for_cert(&[CertName::Uri("SPIFFE://x/chat-b".into())])
                .unwrap()
                .is_none()
        );
        let ops = ids.for_token("ops-token").unwrap();
        assert!(ops.owners().admits(&owner("anyone")));
        assert_eq!(ops.owners().wire_prefixes(), vec![String::new()]);
        // Names that give a certificate two identities: refused, whatever
        // their order.
        let e = ids
            .for_cert(&[
                CertName::Dns("chat-c.example".into()),
                CertName::Uri("spiffe://x/chat-b".into()),
            ])
            .unwrap_err();
        assert!(e.contains("two identities"), "{e}");
    }

    #[test]
    fn no_identity_may_act_for_another_s_owners() {
        let h = |t: &str| hash_token(t);
        // `web-1` would admit `web-10/…`; `chat/` would admit `chat/b/…`.
        for (text, kind) in [
            (
                format!("token w web-1 {}", h("a")),
                IdentitiesErrorKind::Malformed,
            ),
            (
                format!("token a chat/ {}\ntoken b chat/b/ {}", h("a"), h("b")),
                IdentitiesErrorKind::Conflict,
            ),
            (
                format!("token b x/,chat/b/ {}\ntoken a chat/ {}", h("b"), h("a")),
                IdentitiesErrorKind::Conflict,
            ),
            (
                format!("token a chat/ {}\ntoken b chat/ {}", h("a"), h("b")),
                IdentitiesErrorKind::Conflict,
            ),
            (
                format!("token bearer b/ {}", h("a")),
                IdentitiesErrorKind::Malformed,
            ),
            (
                format!("token anonymous b/ {}", h("a")),
                IdentitiesErrorKind::Malformed,
            ),
            (
                format!("token a {}/ {}", "p".repeat(MAX_PREFIX_LEN), h("a")),
                IdentitiesErrorKind::Malformed,
            ),
        ] {
            let e = Identities::parse(&text).expect_err(&text);
            assert_eq!(e.kind(), kind, "{text}: {e}");
        }
        // One identity's own prefixes may nest, and `*` nests with all.
        Identities::parse(&format!(
            "token a a/,a/b/ {}\ntoken ops * {}\ntoken ab ab/ {}",
            h("a"),
            h("o"),
            h("ab")
        ))
        .unwrap();
    }

    #[test]
    fn a_bad_line_is_refused_by_its_number_and_kind() {
        let h = hash_token("t");
        let cases: [(String, IdentitiesErrorKind); 10] = [
            ("token a a/".into(), IdentitiesErrorKind::Malformed),
            (
                format!("token a a/ {h} extra"),
                IdentitiesErrorKind::Malformed,
            ),
            (format!("key a a/ {h}"), IdentitiesErrorKind::Malformed),
            (format!("token a/b a/ {h}"), IdentitiesErrorKind::Malformed),
            (
                format!("token a a/,,b/ {h}"),
                IdentitiesErrorKind::Malformed,
            ),
            (format!("token a a/,* {h}"), IdentitiesErrorKind::Malformed),
            (
                "token a a/ plain-secret".into(),
                IdentitiesErrorKind::Malformed,
            ),
            ("cert a a/ email:x@y".into(), IdentitiesErrorKind::Malformed),
            (
                format!("token a a/ {h}\ntoken b b/ {h}"),
                IdentitiesErrorKind::Conflict,
            ),
            (
                format!("token a a/ {h}\ntoken a b/ {}", hash_token("u")),
                IdentitiesErrorKind::Conflict,
            ),
        ];
        for (text, kind) in cases {
            let text = format!("# header\n{text}");
            let e = Identities::parse(&text).expect_err(&text);
            assert_eq!(e.kind(), kind, "{text}: {e}");
            let line = text.lines().count();
            assert_eq!(e.line(), Some(line), "{text}: {e}");
            assert!(e.to_string().contains(&format!("line {line}")), "{e}");
        }
    }

    #[test]
    fn a_rewrite_keeping_the_size_and_times_is_still_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identities");
        std::fs::write(&path, format!("token a a/ {}\n", hash_token("one"))).unwrap();
        let store = IdentityStore::from_file(&path).unwrap();
        assert_eq!(store.reload_if_changed().unwrap(), None, "unchanged");
        let times = std::fs::metadata(&path).unwrap().modified().unwrap();
        // The same length: one hash in place of another, written in place
        // with its old modification time put back.
        std::fs::write(&path, format!("token a a/ {}\n", hash_token("two"))).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(times)
            .unwrap();
        assert_eq!(store.reload_if_changed().unwrap(), Some(1));
        assert!(store.current().for_token("one").is_none());
        assert!(store.current().for_token("two").is_some());
        assert_eq!(store.reload_if_changed().unwrap(), None);
    }

    #[test]
    fn a_reload_that_fails_keeps_what_is_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identities");
        std::fs::write(&path, format!("token a a/ {}\n", hash_token("one"))).unwrap();
        let store = IdentityStore::from_file(&path).unwrap();
        let before = store.generation();
        std::fs::write(&path, "token a a/ not-a-hash\n").unwrap();
        let e = store.reload().unwrap_err();
        assert_eq!(e.kind(), IdentitiesErrorKind::Malformed);
        assert!(store.current().for_token("one").is_some());
        assert_eq!(store.generation(), before);

        std::fs::write(&path, format!("token a a/ {}\n", hash_token("two"))).unwrap();
        assert_eq!(store.reload().unwrap(), 1);
        assert!(store.current().for_token("one").is_none());
        assert!(store.current().for_token("two").is_some());
        assert!(store.generation() > before);
    }
}
