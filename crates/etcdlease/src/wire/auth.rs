//! etcd's user authentication: a name and password exchanged for a token
//! that every later request carries.
//!
//! etcd's tokens lapse: a simple token after `--auth-token-ttl` (300 s) of
//! disuse and at every restart of the member that issued it, a JWT at its
//! expiry, and any token once the cluster's users or roles change. A
//! request refused for its token is sent once more with a new one.

use std::sync::Mutex;

use tonic::metadata::MetadataValue;

use crate::EtcdError;

/// A user name and password for an etcd cluster with authentication
/// enabled.
#[derive(Clone)]
pub struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl Credentials {
    /// The user `user` with password `password`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The user `user` with the password held in the file at `path`: one
    /// line, its line ending (any trailing `\n` and `\r`, as editors and
    /// `kubectl create secret --from-file` leave them) not part of it. A
    /// file that is not UTF-8, empty, or holds a line break inside the
    /// password is refused rather than sent as a password that cannot be
    /// meant: every program reading a password file this way reads the
    /// same password from it.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("password");
    /// std::fs::write(&path, "s3cret\r\n")?;
    /// let credentials = etcdlease::Credentials::from_password_file("app", &path)?;
    /// assert_eq!(credentials, etcdlease::Credentials::new("app", "s3cret"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_password_file(
        user: impl Into<String>,
        path: impl AsRef<std::path::Path>,
    ) -> Result<Self, lease_port::LeaseError> {
        let path = path.as_ref();
        let invalid = |why: String| {
            lease_port::LeaseError::invalid(format!(
                "the etcd password file {}: {why}",
                path.display()
            ))
        };
        let bytes = std::fs::read(path).map_err(|e| invalid(format!("cannot be read: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|_| invalid("is not UTF-8".into()))?;
        let password = text.trim_end_matches(['\r', '\n']);
        if password.is_empty() {
            return Err(invalid("holds no password".into()));
        }
        if password.contains(['\r', '\n']) {
            return Err(invalid(
                "holds more than one line: a password file holds the password alone".into(),
            ));
        }
        Ok(Credentials::new(user, password))
    }
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Self) -> bool {
        self.user == other.user && self.password == other.password
    }
}

impl Eq for Credentials {}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The credentials of a client and the token they last bought.
pub(super) struct Auth {
    pub(super) credentials: Credentials,
    token: Mutex<Option<MetadataValue<tonic::metadata::Ascii>>>,
    /// One authentication at a time: etcd hashes the password with bcrypt
    /// on every attempt, which is slow on purpose.
    pub(super) authenticating: tokio::sync::Mutex<()>,
}

impl Auth {
    pub(super) fn new(credentials: Credentials) -> Self {
        Auth {
            credentials,
            token: Mutex::new(None),
            authenticating: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn token(&self) -> Option<MetadataValue<tonic::metadata::Ascii>> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn set(&self, token: &str) -> Result<(), EtcdError> {
        let value = token.parse().map_err(|_| EtcdError::Malformed {
            call: "Authenticate",
            detail: "etcd answered a token that cannot be sent as request metadata".into(),
        })?;
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        Ok(())
    }

    /// Drops `used` when it is still the current token: a request was
    /// refused for it.
    pub(super) fn forget(&self, used: &MetadataValue<tonic::metadata::Ascii>) {
        let mut token = self.token.lock().unwrap_or_else(|e| e.into_inner());
        if token.as_ref() == Some(used) {
            *token = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_debug_output() {
        let shown = format!("{:?}", Credentials::new("app", "s3cret"));
        assert!(
            shown.contains("app") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn a_refused_token_is_forgotten_only_if_still_current() {
        let auth = Auth::new(Credentials::new("u", "p"));
        auth.set("one").unwrap();
        let one = auth.token().unwrap();
        auth.set("two").unwrap();
        auth.forget(&one);
        assert_eq!(auth.token().unwrap(), "two");
        let two = auth.token().unwrap();
        auth.forget(&two);
        assert!(auth.token().is_none());
        assert!(auth.set("no\nnewlines in headers").is_err());
    }
}

#[cfg(test)]
mod password_file_tests {
    use super::Credentials;

    #[test]
    fn a_password_file_reads_the_same_however_its_line_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        for (content, expected) in [
            ("pw", Some("pw")),
            ("pw\n", Some("pw")),
            ("pw\r\n", Some("pw")),
            ("pw\n\n", Some("pw")),
            ("pw\r\n\r\n", Some("pw")),
            ("p w \n", Some("p w ")),
            ("", None),
            ("\n", None),
            ("one\ntwo\n", None),
            ("one\rtwo", None),
        ] {
            std::fs::write(&path, content).unwrap();
            let read = Credentials::from_password_file("u", &path);
            match expected {
                Some(password) => {
                    assert_eq!(
                        read.unwrap(),
                        Credentials::new("u", password),
                        "{content:?}"
                    );
                }
                None => assert_eq!(
                    read.unwrap_err().kind(),
                    lease_port::LeaseErrorKind::Invalid,
                    "{content:?}"
                ),
            }
        }
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(Credentials::from_password_file("u", &path).is_err());
        assert!(Credentials::from_password_file("u", dir.path().join("missing")).is_err());
    }
}
