//! The libpq keys `tokio_postgres::Config` does not read (or reads only in
//! part), taken out of a URL or a `key=value` string before the rest goes
//! to it.
//!
//! `tokio_postgres` refuses `sslrootcert`, `sslcert` and `sslkey` as
//! unknown options and knows `sslmode` only up to `require`, so these four
//! are read here and never reach it.

use crate::error::ConfigError;

/// The keys read here.
pub(crate) const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// A connection string split in two: what `tokio_postgres` reads, and the
/// TLS keys with their values (decoded), in the order given.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) rest: String,
    pub(crate) tls: Vec<(&'static str, String)>,
}

/// Splits `url`: a `postgres://` or `postgresql://` URL, or `key=value`
/// pairs.
pub(crate) fn split(url: &str) -> Result<Split, ConfigError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        split_url(url)
    } else {
        split_pairs(url)
    }
}

fn tls_key(key: &str) -> Option<&'static str> {
    TLS_KEYS.iter().copied().find(|k| *k == key)
}

fn split_url(url: &str) -> Result<Split, ConfigError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(Split {
            rest: url.to_owned(),
            tls: Vec::new(),
        });
    };
    let mut kept = Vec::new();
    let mut tls = Vec::new();
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match tls_key(&percent_decode(key)?) {
            Some(key) => tls.push((key, percent_decode(value)?)),
            None => kept.push(param),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(Split { rest, tls })
}

fn percent_decode(text: &str) -> Result<String, ConfigError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ConfigError::Malformed {
                    detail: format!("{text:?} holds a % not followed by two hex digits"),
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConfigError::Malformed {
        detail: format!("{text:?} does not decode to UTF-8"),
    })
}

/// `key = value` pairs as libpq reads them: whitespace around `=`
/// allowed, a value either single-quoted (`\'` and `\\` escaped) or a run
/// of non-blank characters (backslash escapes too).
fn split_pairs(text: &str) -> Result<Split, ConfigError> {
    let mut chars = text.chars().peekable();
    let mut kept = Vec::new();
    let mut tls = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConfigError::Malformed {
                detail: format!("{key:?} is not followed by `=`"),
            });
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let value = pair_value(&mut chars, &key)?;
        match tls_key(&key) {
            Some(key) => tls.push((key, value)),
            None => kept.push(format!("{key}='{}'", quote(&value))),
        }
    }
    Ok(Split {
        rest: kept.join(" "),
        tls,
    })
}

fn pair_value(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    key: &str,
) -> Result<String, ConfigError> {
    let quoted = chars.next_if_eq(&'\'').is_some();
    let mut value = String::new();
    loop {
        match chars.next() {
            None if quoted => {
                return Err(ConfigError::Malformed {
                    detail: format!("the value of {key:?} has no closing quote"),
                });
            }
            None => return Ok(value),
            Some('\'') if quoted => return Ok(value),
            Some(c) if !quoted && c.is_whitespace() => return Ok(value),
            Some('\\') => match chars.next() {
                Some(c) => value.push(c),
                None => {
                    return Err(ConfigError::Malformed {
                        detail: format!("the value of {key:?} ends in a lone backslash"),
                    });
                }
            },
            Some(c) => value.push(c),
        }
    }
}

fn quote(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
    }

    #[test]
    fn a_url_gives_up_its_tls_keys_and_keeps_the_rest() {
        let split = split(
            "postgres://u:p%40ss@db:5432/chat?sslmode=verify-full&connect_timeout=3\
             &sslrootcert=%2Fetc%2Fca%20dir%2Froot.pem&sslcert=c.pem&sslkey=k.pem",
        )
        .unwrap();
        assert_eq!(
            split.rest,
            "postgres://u:p%40ss@db:5432/chat?connect_timeout=3"
        );
        assert_eq!(
            split.tls,
            tls(&[
                ("sslmode", "verify-full"),
                ("sslrootcert", "/etc/ca dir/root.pem"),
                ("sslcert", "c.pem"),
                ("sslkey", "k.pem"),
            ])
        );
        let plain = split_url("postgresql://db/chat").unwrap();
        assert_eq!(plain.rest, "postgresql://db/chat");
        assert!(plain.tls.is_empty());
        let only_tls = split_url("postgres://db/chat?sslmode=require").unwrap();
        assert_eq!(only_tls.rest, "postgres://db/chat");
    }

    #[test]
    fn pairs_give_up_their_tls_keys_quoted_or_not() {
        let split = split(
            r"host=db  port = 5432 sslmode=verify-ca sslrootcert='/etc/my ca\'s.pem' user=o\'neil",
        )
        .unwrap();
        assert_eq!(split.rest, r"host='db' port='5432' user='o\'neil'");
        assert_eq!(
            split.tls,
            tls(&[
                ("sslmode", "verify-ca"),
                ("sslrootcert", "/etc/my ca's.pem")
            ])
        );
        let parsed: tokio_postgres::Config = split.rest.parse().unwrap();
        assert_eq!(parsed.get_user(), Some("o'neil"));
    }

    #[test]
    fn broken_strings_are_malformed_not_guessed() {
        for bad in [
            "postgres://db/x?sslrootcert=%zz",
            "postgres://db/x?sslrootcert=%ff",
            "host=db sslrootcert='unterminated",
            "host=db sslmode",
            "host=db sslkey=ends\\",
        ] {
            let err = split(bad).unwrap_err();
            assert!(matches!(err, ConfigError::Malformed { .. }), "{bad}: {err}");
        }
    }
}
