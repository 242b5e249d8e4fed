//! The one reading of the files a backend's configuration names: TLS
//! material, bearer tokens and passwords.
//!
//! Each server used to read them its own way, so a file one accepted could
//! be refused by the other, or, worse, mean another secret to it. Every
//! file is read once, at start-up, and a file that cannot be meant (empty,
//! not text where text is due) is refused there, naming it, rather than
//! failing later as a handshake or an authentication nobody can trace back
//! to the file.

use std::path::Path;

use crate::error::{FileError, FileErrorKind};

/// The PEM file at `path` (a CA, a certificate or a private key), `what`
/// naming its role in errors ("etcd CA"). A file with nothing but
/// whitespace in it is refused: no TLS configuration can be built from it.
pub fn read_tls_file(path: &Path, what: &str) -> Result<Vec<u8>, FileError> {
    let bytes = read(path, what)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(FileError::new(
            FileErrorKind::Empty,
            what,
            path,
            "is empty".into(),
        ));
    }
    Ok(bytes)
}

/// The bearer token in the file at `path`: its text with surrounding
/// whitespace dropped (a token never holds any, and editors and secret
/// mounts add line endings). A file that is not UTF-8, or holds only
/// whitespace, is refused.
pub fn read_token_file(path: &Path, what: &str) -> Result<String, FileError> {
    let text = String::from_utf8(read(path, what)?).map_err(|e| {
        FileError::new(FileErrorKind::NotText, what, path, "is not UTF-8".into()).with_source(e)
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(FileError::new(
            FileErrorKind::Empty,
            what,
            path,
            "holds no token".into(),
        ));
    }
    Ok(token.to_owned())
}

/// The etcd user `user` with the password in the file at `path`.
///
/// The rule is [`etcdlease::Credentials::from_password_file`]'s, the only
/// place it is written: the file's line ending (every trailing `\r` and
/// `\n`) is not part of the password; an empty, multi-line or non-UTF-8
/// file is refused, naming the file. So a password file reads as one
/// password to every server that takes one.
#[cfg(feature = "etcd")]
pub fn read_etcd_credentials(
    user: &str,
    path: &Path,
) -> Result<etcdlease::Credentials, lease_port::LeaseError> {
    etcdlease::Credentials::from_password_file(user, path)
}

/// A password file: the password alone, on one line. Its line ending (one
/// or several `\n`, `\r\n`) is not part of it; an empty file, more than
/// one line, or text that is not UTF-8 is refused — the rule
/// `etcdlease::Credentials::from_password_file` keeps for etcd.
pub fn read_password_file(path: &Path, what: &str) -> Result<String, FileError> {
    let text = String::from_utf8(read(path, what)?).map_err(|e| {
        FileError::new(FileErrorKind::NotText, what, path, "is not UTF-8".into()).with_source(e)
    })?;
    let password = text.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(FileError::new(
            FileErrorKind::Empty,
            what,
            path,
            "holds no password".into(),
        ));
    }
    if password.contains(['\r', '\n']) {
        return Err(FileError::new(
            FileErrorKind::Refused,
            what,
            path,
            "holds more than one line: a password file holds the password alone".into(),
        ));
    }
    Ok(password.to_owned())
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, FileError> {
    std::fs::read(path).map_err(|e| {
        FileError::new(
            FileErrorKind::Unreadable,
            what,
            path,
            format!("cannot be read: {e}"),
        )
        .with_source(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_its_one_line_without_the_line_ending() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, body: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        for body in [&b"right"[..], b"right\n", b"right\n\n", b"right\r\n"] {
            let p = file("ok", body);
            assert_eq!(read_password_file(&p, "password").unwrap(), "right");
        }
        let kind = |body: &[u8]| {
            read_password_file(&file("bad", body), "password")
                .unwrap_err()
                .kind()
        };
        assert_eq!(kind(b""), FileErrorKind::Empty);
        assert_eq!(kind(b"\n"), FileErrorKind::Empty);
        assert_eq!(kind(b"one\ntwo\n"), FileErrorKind::Refused);
        assert_eq!(kind(&[0xff, 0xfe]), FileErrorKind::NotText);
        // Spaces are the password's own.
        assert_eq!(
            read_password_file(&file("sp", b" pw \n"), "p").unwrap(),
            " pw "
        );
    }

    fn file(content: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    #[test]
    fn a_tls_file_is_read_as_it_is_and_an_empty_one_refused() {
        let pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let (_dir, path) = file(pem);
        assert_eq!(read_tls_file(&path, "etcd CA").unwrap(), pem);
        for empty in [&b""[..], b"\n", b" \r\n\t"] {
            let (_dir, path) = file(empty);
            let e = read_tls_file(&path, "etcd CA").unwrap_err();
            assert_eq!(e.kind(), FileErrorKind::Empty, "{empty:?}");
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named_with_its_role_and_cause() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("client-key.pem");
        let e = read_tls_file(&missing, "etcd client key").unwrap_err();
        assert_eq!(e.kind(), FileErrorKind::Unreadable);
        assert_eq!(e.path(), missing);
        let text = e.to_string();
        assert!(text.starts_with("the etcd client key "), "{text}");
        assert!(text.contains(&missing.display().to_string()), "{text}");
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the io error is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        // A directory is no file either.
        let e = read_token_file(dir.path(), "token file").unwrap_err();
        assert_eq!(e.kind(), FileErrorKind::Unreadable);
    }

    #[test]
    fn a_token_is_its_text_without_surrounding_whitespace() {
        for (content, expected) in [
            (&b"t0ken"[..], Some("t0ken")),
            (b"t0ken\n", Some("t0ken")),
            (b"t0ken\r\n\r\n", Some("t0ken")),
            (b"  t0ken \n", Some("t0ken")),
            (b"", None),
            (b" \n\n", None),
        ] {
            let (_dir, path) = file(content);
            match expected {
                Some(token) => assert_eq!(read_token_file(&path, "token").unwrap(), token),
                None => assert_eq!(
                    read_token_file(&path, "token").unwrap_err().kind(),
                    FileErrorKind::Empty,
                    "{content:?}"
                ),
            }
        }
        let (_dir, path) = file(&[0xff, 0xfe, b'\n']);
        let e = read_token_file(&path, "token").unwrap_err();
        assert_eq!(e.kind(), FileErrorKind::NotText);
        assert!(e.to_string().contains("is not UTF-8"), "{e}");
    }

    /// Both servers read etcd passwords through here: a file ending in two
    /// newlines (`echo` into a file an editor then saved) is one password,
    /// the same as the file without them.
    #[cfg(feature = "etcd")]
    #[test]
    fn a_password_file_is_one_password_however_many_line_endings_it_has() {
        use etcdlease::Credentials;
        use lease_port::LeaseErrorKind;
        for content in [
            "s3cret",
            "s3cret\n",
            "s3cret\n\n",
            "s3cret\r\n",
            "s3cret\r\n\r\n",
        ] {
            let (_dir, path) = file(content.as_bytes());
            assert_eq!(
                read_etcd_credentials("app", &path).unwrap(),
                Credentials::new("app", "s3cret"),
                "{content:?}"
            );
        }
        for refused in [&b""[..], b"\n\n", b"one\ntwo\n", &[0xff, 0xfe]] {
            let (_dir, path) = file(refused);
            let e = read_etcd_credentials("app", &path).unwrap_err();
            assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{refused:?}");
            assert!(
                e.to_string().contains(&path.display().to_string()),
                "the error names the file: {e}"
            );
        }
    }
}
