//! Just enough of PostgreSQL's frontend/backend protocol (version 3) for
//! the helpers to see a server is up and to run plain SQL on it: a startup
//! without a password (trust, over the server's own Unix socket) and simple
//! queries whose values come back as text. Tests use a real client.

use std::io::{Read, Write};
use std::time::Duration;

/// The protocol version of a startup message: 3.0.
const PROTOCOL_3: i32 = 196_608;

/// How long one message may take to arrive.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Rows of a simple query, each value as text (`None` for NULL).
pub(crate) type Rows = Vec<Vec<Option<String>>>;

/// Why a conversation with the server failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The connection failed or broke.
    Io(std::io::Error),
    /// The server answered with an error (`FATAL 57P03: the database
    /// system is starting up`, `ERROR 42P07: …`).
    Server {
        /// Severity, SQLSTATE and message, as one line.
        text: String,
    },
    /// Something this client does not speak (an authentication request,
    /// an unknown message).
    Unexpected(String),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        WireError::Io(e)
    }
}

impl WireError {
    pub(crate) fn into_io(self) -> std::io::Error {
        match self {
            WireError::Io(e) => e,
            WireError::Server { text, .. } => std::io::Error::other(text),
            WireError::Unexpected(what) => std::io::Error::other(what),
        }
    }
}

/// Sends a startup message for `user` on `database`.
pub(crate) fn send_startup(
    stream: &mut impl Write,
    user: &str,
    database: &str,
) -> std::io::Result<()> {
    let mut body = PROTOCOL_3.to_be_bytes().to_vec();
    for (key, value) in [("user", user), ("database", database)] {
        body.extend_from_slice(key.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let len = i32::try_from(body.len() + 4).map_err(std::io::Error::other)?;
    let mut message = len.to_be_bytes().to_vec();
    message.extend_from_slice(&body);
    stream.write_all(&message)
}

/// One message: its type byte and body.
pub(crate) fn read_message(stream: &mut impl Read) -> Result<(u8, Vec<u8>), WireError> {
    let mut header = [0u8; 5];
    stream.read_exact(&mut header)?;
    let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let len = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_sub(4))
        .filter(|l| *l <= 64 << 20)
        .ok_or_else(|| WireError::Unexpected(format!("a message of length {len}")))?;
    let mut body = vec![0; len];
    stream.read_exact(&mut body)?;
    Ok((header[0], body))
}

/// Starts a session that needs no password and waits until the server is
/// ready for a query.
pub(crate) fn start_trusted<S: Read + Write>(
    stream: &mut S,
    user: &str,
    database: &str,
) -> Result<(), WireError> {
    send_startup(stream, user, database)?;
    loop {
        let (kind, body) = read_message(stream)?;
        match kind {
            b'R' if body.get(..4) == Some(&[0, 0, 0, 0]) => {}
            b'R' => {
                return Err(WireError::Unexpected(format!(
                    "the server asks for a password (authentication request {:?})",
                    body.get(..4)
                )));
            }
            b'E' => return Err(server_error(&body)),
            b'Z' => return Ok(()),
            // Parameter statuses, the backend key, notices.
            _ => {}
        }
    }
}

/// Runs `sql` (one or more statements) as a simple query; the rows of
/// every statement that returned some, in order.
pub(crate) fn simple_query<S: Read + Write>(stream: &mut S, sql: &str) -> Result<Rows, WireError> {
    let mut message = vec![b'Q'];
    let len = i32::try_from(sql.len() + 5).map_err(std::io::Error::other)?;
    message.extend_from_slice(&len.to_be_bytes());
    message.extend_from_slice(sql.as_bytes());
    message.push(0);
    stream.write_all(&message)?;
    let mut rows = Vec::new();
    let mut failed = None;
    loop {
        let (kind, body) = read_message(stream)?;
        match kind {
            b'D' => rows.push(data_row(&body)?),
            b'E' => failed = Some(server_error(&body)),
            b'Z' => return failed.map_or(Ok(rows), Err),
            // Row descriptions, command tags, notices, empty queries.
            _ => {}
        }
    }
}

/// Ends the session politely.
pub(crate) fn terminate(stream: &mut impl Write) {
    let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
}

fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, WireError> {
    let bad = || WireError::Unexpected("a malformed data row".into());
    let count = u16::from_be_bytes(
        body.get(..2)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let mut at = 2;
    let mut values = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let len_bytes: [u8; 4] = body
            .get(at..at + 4)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?;
        at += 4;
        let len = i32::from_be_bytes(len_bytes);
        if len < 0 {
            values.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| bad())?;
        let value = body.get(at..at + len).ok_or_else(bad)?;
        at += len;
        values.push(Some(String::from_utf8_lossy(value).into_owned()));
    }
    Ok(values)
}

/// An ErrorResponse's fields as one line: `FATAL 57P03: the database
/// system is starting up`.
fn server_error(body: &[u8]) -> WireError {
    let (mut severity, mut code, mut message) = (String::new(), String::new(), String::new());
    for field in body.split(|b| *b == 0) {
        let Some((&tag, value)) = field.split_first() else {
            continue;
        };
        let value = String::from_utf8_lossy(value).into_owned();
        match tag {
            b'V' => severity = value,
            b'S' if severity.is_empty() => severity = value,
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
    }
    WireError::Server {
        text: format!("{severity} {code}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_rows_keep_nulls_and_text() {
        let mut body = 2u16.to_be_bytes().to_vec();
        body.extend_from_slice(&(-1i32).to_be_bytes());
        body.extend_from_slice(&3i32.to_be_bytes());
        body.extend_from_slice(b"abc");
        assert_eq!(data_row(&body).unwrap(), vec![None, Some("abc".into())]);
        assert!(data_row(&body[..7]).is_err());
    }

    #[test]
    fn server_errors_read_as_one_line() {
        let body = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0";
        match server_error(body) {
            WireError::Server { text } => {
                assert_eq!(text, "FATAL 57P03: the database system is starting up");
            }
            other => panic!("{other:?}"),
        }
    }
}
