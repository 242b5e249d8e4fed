//! Where everything lives in Redis: one prefix, and per session a group of
//! keys sharing a hash tag made from the session id.

use lease_port::SessionId;

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "mecatl:";

/// Key names under one prefix.
///
/// A session's keys are `<prefix>{<id>}:<part>`, where `<id>` is the
/// session id with `%`, `{` and `}` percent-encoded. The encoding is
/// injective (`%` itself is encoded), and because the encoded id holds no
/// brace, the braces around it are the key's hash tag: all of one session's
/// keys land in one cluster slot. The prefix may hold no brace, or it would
/// become the hash tag instead.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    /// `None` when `prefix` holds a brace or a control character.
    pub(crate) fn new(prefix: &str) -> Option<Keys> {
        let fine = !prefix.contains(['{', '}']) && !prefix.chars().any(char::is_control);
        fine.then(|| Keys {
            prefix: prefix.to_owned(),
        })
    }

    fn session(&self, session: &SessionId, part: &str) -> String {
        let id = session.as_str();
        let mut key = String::with_capacity(self.prefix.len() + id.len() + part.len() + 3);
        key.push_str(&self.prefix);
        key.push('{');
        for c in id.chars() {
            match c {
                '%' => key.push_str("%25"),
                '{' => key.push_str("%7B"),
                '}' => key.push_str("%7D"),
                c => key.push(c),
            }
        }
        key.push_str("}:");
        key.push_str(part);
        key
    }

    /// The live grant: a string `"<token> <owner>"` with a server-side
    /// expiry, present only while the lease is held.
    pub(crate) fn lease(&self, session: &SessionId) -> String {
        self.session(session, "lease")
    }

    /// The session's token record: the last token issued (only ever
    /// incremented) and the last grant made. Never expires.
    pub(crate) fn lease_tokens(&self, session: &SessionId) -> String {
        self.session(session, "lease-tokens")
    }

    /// The session's record: whether it exists, its last sequence number,
    /// its high-water mark and the mark's writer. Kept after deletion.
    pub(crate) fn record(&self, session: &SessionId) -> String {
        self.session(session, "record")
    }

    /// The session's events: a stream whose entry ids are `<seq>-0`.
    pub(crate) fn events(&self, session: &SessionId) -> String {
        self.session(session, "events")
    }

    /// The run tokens a cancel was requested for: a sorted set scored by
    /// token, so its greatest member is the request that counts and
    /// adding one is atomic and idempotent.
    pub(crate) fn cancel_requests(&self, session: &SessionId) -> String {
        self.session(session, "cancel")
    }

    /// Every existing session id, in a sorted set with equal scores (so in
    /// byte order).
    pub(crate) fn sessions(&self) -> String {
        format!("{}sessions", self.prefix)
    }

    /// The lease authority this database and prefix hand tokens out under.
    pub(crate) fn lease_authority(&self) -> String {
        format!("{}lease-authority", self.prefix)
    }

    /// The lease authority recorded as fencing the store.
    pub(crate) fn fencing_authority(&self) -> String {
        format!("{}fencing-authority", self.prefix)
    }

    /// The prefix's change counter: every write script advances it by one,
    /// so it only grows while Redis keeps what it confirmed. A value below
    /// one a client saw means Redis went back.
    pub(crate) fn clock(&self) -> String {
        format!("{}clock", self.prefix)
    }

    /// The channel every append publishes its session id on (a channel,
    /// not a key: it holds nothing).
    pub(crate) fn appends_channel(&self) -> String {
        format!("{}appends", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SessionId {
        SessionId::new(s).unwrap()
    }

    #[test]
    fn session_ids_are_encoded_injectively_inside_the_hash_tag() {
        let keys = Keys::new("p:").unwrap();
        assert_eq!(keys.events(&sid("chat-7")), "p:{chat-7}:events");
        assert_eq!(keys.events(&sid("a}b{c%")), "p:{a%7Db%7Bc%25}:events");
        // "%7D" typed literally and "}" differ once encoded.
        assert_ne!(keys.record(&sid("%7D")), keys.record(&sid("}")));
        // The hash tag is the whole encoded id, whatever the id holds.
        let key = keys.lease(&sid("x}:lease"));
        let open = key.find('{').unwrap();
        let close = open + key[open..].find('}').unwrap();
        assert_eq!(&key[open + 1..close], "x%7D:lease");
    }

    #[test]
    fn a_prefix_with_a_brace_or_control_character_is_refused() {
        assert!(Keys::new("a{b").is_none());
        assert!(Keys::new("a}b").is_none());
        assert!(Keys::new("a\nb").is_none());
        assert!(Keys::new("").is_some());
    }
}
