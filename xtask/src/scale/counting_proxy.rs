//! A plain-HTTP proxy in front of the Kubernetes API emulator that counts
//! the requests passing through it: the emulator counts them too, but only
//! for code in its own process, and the server measured here is another.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::Result;

/// Requests seen so far, by every connection.
pub(super) struct CountingProxy {
    /// `host:port` to send clients to.
    pub(super) addr: String,
    requests: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl CountingProxy {
    pub(super) fn start(upstream: &str) -> Result<CountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("proxy: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("proxy: {e}"))?
            .to_string();
        let requests = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopped, upstream) = (
            Arc::clone(&requests),
            Arc::clone(&stop),
            upstream.to_owned(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(&upstream)) else {
                    continue;
                };
                let count = Arc::clone(&count);
                std::thread::spawn(move || relay(client, server, &count));
            }
        });
        Ok(CountingProxy {
            addr,
            requests,
            stop,
        })
    }

    pub(super) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Acquire)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accepting thread, which then sees the stop.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Answers flow back untouched; requests are parsed just enough to be
/// counted one by one on a kept-alive connection.
fn relay(client: TcpStream, server: TcpStream, count: &AtomicU64) {
    let (Ok(mut back_from), Ok(mut back_to)) = (server.try_clone(), client.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut back_from, &mut back_to);
        let _ = back_to.shutdown(std::net::Shutdown::Both);
    });
    let mut from = BufReader::new(client);
    let mut to = server;
    while let Ok(Some(head)) = request_head(&mut from) {
        count.fetch_add(1, Ordering::AcqRel);
        if to.write_all(head.text.as_bytes()).is_err()
            || forward_body(&mut from, &mut to, &head).is_err()
        {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

struct Head {
    text: String,
    length: usize,
    chunked: bool,
}

/// The next request's line and headers, `None` at the end of the stream.
fn request_head(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Head>> {
    let mut head = Head {
        text: String::new(),
        length: 0,
        chunked: false,
    };
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        head.text.push_str(&line);
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            return Ok(Some(head));
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => head.length = value.trim().parse().unwrap_or(0),
                "transfer-encoding" => head.chunked = value.trim().eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
    }
}

fn forward_body(
    from: &mut BufReader<TcpStream>,
    to: &mut TcpStream,
    head: &Head,
) -> std::io::Result<()> {
    if !head.chunked {
        let mut body = vec![0; head.length];
        from.read_exact(&mut body)?;
        return to.write_all(&body);
    }
    loop {
        let mut size_line = String::new();
        from.read_line(&mut size_line)?;
        to.write_all(size_line.as_bytes())?;
        let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other("bad chunk size"))?;
        let mut chunk = vec![0; size + 2];
        from.read_exact(&mut chunk)?;
        to.write_all(&chunk)?;
        if size == 0 {
            return Ok(());
        }
    }
}
