//! The fenced store, a host of its own: each write carries its fence (the
//! lease's token and the writer's id) over the simulated network, so a
//! write can be delayed, cut off, or land after its writer gave up on it.
//!
//! One line per request, `W <session> <token> <writer> <tag>`; one line
//! per answer, `OK` or `FENCED`.

use std::sync::Arc;
use std::time::Duration;

use lease_port::WriteFence;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::world::{Mark, World};

/// The store's port.
pub(crate) const STORE_PORT: u16 = 7879;

/// How the store decides a write from its mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreRule {
    /// The rule as built: a token above the mark, or the mark's own token
    /// from the writer that set it.
    Fenced,
    /// Broken: every write is applied.
    Unfenced,
    /// Broken: the mark's token is accepted from any writer.
    EqualTokenFromAnyWriter,
}

impl StoreRule {
    fn admits(self, mark: Option<&Mark>, fence: &Mark) -> bool {
        let Some(mark) = mark else { return true };
        match self {
            StoreRule::Unfenced => true,
            StoreRule::Fenced => {
                fence.token > mark.token
                    || (fence.token == mark.token && fence.writer == mark.writer)
            }
            StoreRule::EqualTokenFromAnyWriter => fence.token >= mark.token,
        }
    }
}

/// Serves the store until the host is crashed.
pub(crate) async fn serve(world: Arc<World>, rule: StoreRule) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", STORE_PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let world = Arc::clone(&world);
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let answer = match parse(&line) {
                    Some((session, fence, tag)) => {
                        let at = turmoil::sim_elapsed().unwrap_or_default();
                        if world.store_write(at, session, fence, tag, |m, f| rule.admits(m, f)) {
                            "OK\n"
                        } else {
                            "FENCED\n"
                        }
                    }
                    None => "BAD\n",
                };
                if write.write_all(answer.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

fn parse(line: &str) -> Option<(&str, Mark, &str)> {
    let mut parts = line.split(' ');
    let (Some("W"), Some(session), Some(token), Some(writer), Some(tag), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let token = token.parse().ok()?;
    let writer = writer.to_owned();
    Some((session, Mark { token, writer }, tag))
}

/// What became of a write, as its writer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    Applied,
    Fenced,
    /// No answer: it may or may not have been applied, and may still be.
    Unknown,
}

/// Sends one write on a connection of its own and waits up to `patience`
/// for the answer. Dropped, it stops waiting; what was sent may still land.
pub(crate) async fn write(
    session: &str,
    fence: &WriteFence,
    tag: &str,
    patience: Duration,
) -> WriteOutcome {
    let WriteFence::Fenced(fence) = fence else {
        return WriteOutcome::Fenced;
    };
    let request = format!(
        "W {session} {} {} {tag}\n",
        fence.token().get(),
        fence.owner().as_str()
    );
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect(("store", STORE_PORT)).await?;
        let (read, mut write) = stream.into_split();
        write.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        BufReader::new(read).read_line(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(patience, exchange).await {
        Ok(Ok(answer)) if answer == "OK\n" => WriteOutcome::Applied,
        Ok(Ok(answer)) if answer == "FENCED\n" => WriteOutcome::Fenced,
        _ => WriteOutcome::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(token: u64, writer: &str) -> Mark {
        Mark {
            token,
            writer: writer.to_owned(),
        }
    }

    #[test]
    fn the_fenced_rule_binds_the_mark_to_its_writer() {
        let m = mark(5, "a#1");
        let rule = StoreRule::Fenced;
        assert!(rule.admits(None, &mark(1, "x")));
        assert!(rule.admits(Some(&m), &mark(6, "b#1")));
        assert!(rule.admits(Some(&m), &mark(5, "a#1")));
        assert!(!rule.admits(Some(&m), &mark(5, "b#1")));
        assert!(!rule.admits(Some(&m), &mark(4, "a#1")));
        assert!(StoreRule::EqualTokenFromAnyWriter.admits(Some(&m), &mark(5, "b#1")));
        assert!(StoreRule::Unfenced.admits(Some(&m), &mark(1, "b#1")));
    }

    #[test]
    fn requests_parse_whole_or_not_at_all() {
        let (s, m, t) = parse("W chat 7 p1#ab p1.0.3").unwrap();
        assert_eq!((s, m, t), ("chat", mark(7, "p1#ab"), "p1.0.3"));
        assert!(parse("W chat x p1 t").is_none());
        assert!(parse("W chat 7 p1 t extra").is_none());
        assert!(parse("R chat 7 p1 t").is_none());
    }
}
