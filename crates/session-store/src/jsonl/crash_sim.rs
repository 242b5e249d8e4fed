//! Machine-crash simulation for session files.
//!
//! Under `cfg(test)` the store logs what it does to each session file:
//! bytes appended, lengths cut to, successful `fdatasync`s, files linked
//! into place already synced. The model replays a prefix of that log —
//! the machine loses power after any operation — keeping two images of
//! the file: the page cache (what every process sees) and the durable
//! bytes (the page cache as of the last successful sync). A power loss may
//! leave on disk any state the page cache passed through since that sync,
//! cut at any length, with any of its sectors lost (zeros) or holding
//! unrelated bytes. Every such image is put in a fresh directory and read
//! by a fresh store, which must read it (never `Corrupt`), show every
//! acknowledged write, none reported failed, an interrupted batch whole
//! or not at all, and take the next write.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// One thing the store did to a session file.
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Bytes written at the end of the file (not yet synced).
    Append(Vec<u8>),
    /// The file cut to this length (not yet synced).
    SetLen(u64),
    /// A successful `fdatasync`: the page cache is durable. The thread it
    /// ran on.
    Sync(std::thread::ThreadId),
    /// The file linked into place with these bytes, synced.
    Created(Vec<u8>),
}

static LOG: Mutex<Vec<(PathBuf, Op)>> = Mutex::new(Vec::new());

fn log() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Op)>> {
    LOG.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Called by the store after each operation on a session file.
pub(super) fn record(path: &Path, op: Op) {
    log().push((path.to_path_buf(), op));
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::Ordering;

    use lease_port::{FencingToken, OwnerId, SessionId};
    use serde_json::{Value, json};

    use super::*;
    use crate::jsonl::{FsyncPolicy, JsonlOptions, JsonlStore};
    use crate::{SessionStore, StoreErrorKind, WriteFence};

    /// The operations logged for `path`, oldest first.
    pub(in crate::jsonl) fn ops(path: &Path) -> Vec<Op> {
        log()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, op)| op.clone())
            .collect()
    }

    /// The file after `ops`: the states its page cache went through since
    /// the last sync, the durable one first.
    pub(in crate::jsonl) fn states_since_sync(ops: &[Op]) -> Vec<Vec<u8>> {
        let mut cache = Vec::new();
        let mut states = vec![Vec::new()];
        for op in ops {
            match op {
                Op::Append(bytes) => {
                    cache.extend_from_slice(bytes);
                    states.push(cache.clone());
                }
                Op::SetLen(len) => {
                    cache.resize(*len as usize, 0);
                    states.push(cache.clone());
                }
                Op::Sync(_) => states = vec![cache.clone()],
                Op::Created(bytes) => {
                    cache = bytes.clone();
                    states = vec![cache.clone()];
                }
            }
        }
        states
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// Unrelated bytes, with line ends and JSON punctuation among them.
        fn garbage(&mut self, len: usize) -> Vec<u8> {
            (0..len)
                .map(|_| match self.below(8) {
                    0 => b'\n',
                    1 => b'{',
                    2 => b'"',
                    _ => self.next() as u8,
                })
                .collect()
        }
    }

    /// Sector size of the simulated disk: small, so that sectors split
    /// lines in every way.
    const SECTOR: usize = 16;

    /// Every image a power loss may leave, given the states since the last
    /// sync (the first one durable).
    fn crash_images(states: &[Vec<u8>], rng: &mut Rng) -> BTreeSet<Vec<u8>> {
        let durable = &states[0];
        // Bytes every state agrees on are on disk whatever happens.
        let mut fixed = states.iter().map(Vec::len).min().unwrap_or(0);
        for s in states {
            fixed = fixed.min(s.iter().zip(durable).take_while(|(a, b)| a == b).count());
        }
        let longest = states.iter().map(Vec::len).max().unwrap_or(0);
        let mut images = BTreeSet::new();
        for s in states {
            // Written back in order, up to any length (the length may come
            // from a later state than the bytes: the rest reads as zeros).
            for len in fixed..=longest {
                let mut image = s[..len.min(s.len())].to_vec();
                image.resize(len, 0);
                images.insert(image);
            }
            // Sectors lost, or holding bytes from elsewhere.
            for _ in 0..6 {
                let len = fixed + rng.below((longest - fixed) as u64 + 1) as usize;
                let mut image = s[..len.min(s.len())].to_vec();
                image.resize(len, 0);
                let mut at = fixed;
                while at < len {
                    let end = (at - at % SECTOR + SECTOR).min(len);
                    match rng.below(4) {
                        0 => image[at..end].fill(0),
                        1 => image[at..end].copy_from_slice(&rng.garbage(end - at)),
                        2 => {
                            let other = &states[rng.below(states.len() as u64) as usize];
                            for (i, b) in image[at..end].iter_mut().enumerate() {
                                *b = other.get(at + i).copied().unwrap_or(0);
                            }
                        }
                        _ => {}
                    }
                    at = end;
                }
                images.insert(image);
            }
        }
        images
    }

    fn fence(t: u64) -> WriteFence {
        WriteFence::new(
            FencingToken::new(t),
            OwnerId::new(format!("holder-of-{t}")).unwrap(),
        )
    }

    /// What the session holds: `None` when it does not exist.
    type Content = Option<Vec<Value>>;

    /// One store call of the scenario.
    struct Call {
        /// The log positions (for the session file) before and after it.
        ops: (usize, usize),
        /// What it would leave, and whether it said it did.
        intended: Content,
        token: Option<u64>,
        ok: bool,
    }

    async fn content(store: &JsonlStore, s: &SessionId) -> Result<Content, crate::StoreError> {
        match store.read(s, 1, 1000).await {
            Ok(page) => Ok(Some(page.events.into_iter().map(|e| e.payload).collect())),
            Err(e) if e.kind() == StoreErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Checks one crash image: readable, an allowed content and mark, and
    /// the next write taken.
    async fn check_image(
        image: &[u8],
        file_name: &std::ffi::OsStr,
        s: &SessionId,
        allowed: &[(Content, Option<u64>)],
    ) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file_name), image).unwrap();
        let opts = JsonlOptions::default().fsync(FsyncPolicy::Never);
        let store = JsonlStore::open(dir.path(), opts.clone()).unwrap();
        let got = content(&store, s)
            .await
            .map_err(|e| format!("unreadable: {e}"))?;
        let mark = store
            .high_water(s)
            .await
            .map_err(|e| format!("no mark: {e}"))?
            .map(FencingToken::get);
        if !allowed
            .iter()
            .any(|(c, m)| *c == got && m.unwrap_or(0) <= mark.unwrap_or(0))
        {
            return Err(format!("read {got:?} (mark {mark:?}); allowed {allowed:?}"));
        }
        // The next write is taken, after whatever the crash left.
        if got.is_none() {
            store
                .create(s)
                .await
                .map_err(|e| format!("cannot create again: {e}"))?;
        }
        store
            .append(s, fence(100), &[json!("next")])
            .await
            .map_err(|e| format!("next write refused: {e}"))?;
        let fresh = JsonlStore::open(dir.path(), opts).unwrap();
        let page = fresh.read(s, 1, 1000).await.map_err(|e| e.to_string())?;
        let mut want = got.unwrap_or_default();
        want.push(json!("next"));
        let after: Vec<Value> = page.events.into_iter().map(|e| e.payload).collect();
        if after != want || page.unfinished_write {
            return Err(format!(
                "after the next write: {after:?}, torn {}",
                page.unfinished_write
            ));
        }
        Ok(())
    }

    /// The scenario, with `Always`: appends of one and several events, an
    /// append whose sync fails, a deletion, a re-creation. Then every
    /// crash image after every operation is checked.
    #[tokio::test]
    async fn every_crash_image_reads_as_the_acknowledged_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
        let s = SessionId::new("crash").unwrap();
        let path = store.path_of(&s);
        let mut calls: Vec<Call> = Vec::new();
        let mut current: Content = None;
        let logged = || ops(&path).len();

        // (what, token, events or deletion/creation, inject a failed sync)
        enum Step {
            Create,
            Append(u64, Vec<Value>, bool),
            Delete(u64),
        }
        let steps = vec![
            Step::Create,
            Step::Append(1, vec![json!("a1")], false),
            Step::Append(2, vec![json!("b1"), json!("b2"), json!("b3")], false),
            Step::Append(5, vec![json!("x1"), json!("x2")], true),
            Step::Append(3, vec![json!("c1")], false),
            Step::Delete(3),
            Step::Create,
            Step::Append(4, vec![json!("d1"), json!("d2")], false),
        ];
        for step in steps {
            let before = logged();
            let (intended, token, ok) = match step {
                Step::Create => (Some(vec![]), None, store.create(&s).await.is_ok()),
                Step::Append(t, events, fail_sync) => {
                    if fail_sync {
                        store.core.fail_syncs.store(1, Ordering::Relaxed);
                    }
                    let mut after = current.clone().unwrap_or_default();
                    after.extend(events.iter().cloned());
                    let ok = store.append(&s, fence(t), &events).await.is_ok();
                    assert_eq!(ok, !fail_sync);
                    (Some(after), Some(t), ok)
                }
                Step::Delete(t) => (None, Some(t), store.delete(&s, fence(t)).await.is_ok()),
            };
            if ok {
                current = intended.clone();
            }
            calls.push(Call {
                ops: (before, logged()),
                intended,
                token,
                ok,
            });
        }
        assert_eq!(
            content(&store, &s).await.unwrap(),
            Some(vec![json!("d1"), json!("d2")])
        );

        let all_ops = ops(&path);
        let file_name = path.file_name().unwrap().to_owned();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut failures = Vec::new();
        let mut checked = 0;
        for k in 0..=all_ops.len() {
            // What was acknowledged by then, and the call under way.
            let mut before: Content = None;
            let mut mark: Option<u64> = None;
            let mut allowed = Vec::new();
            for call in &calls {
                if call.ops.1 <= k {
                    if call.ok {
                        before = call.intended.clone();
                        mark = mark.max(call.token);
                    }
                } else if call.ops.0 < k {
                    // Under way: whole or not at all (a failed one too: it
                    // had not said so yet).
                    allowed.push((call.intended.clone(), mark));
                }
            }
            allowed.push((before, mark));
            for image in crash_images(&states_since_sync(&all_ops[..k]), &mut rng) {
                checked += 1;
                if let Err(e) = check_image(&image, &file_name, &s, &allowed).await {
                    failures.push(format!(
                        "crash after op {k} ({:?}), image {:?}: {e}",
                        all_ops.get(k.wrapping_sub(1)).map(|op| match op {
                            Op::Append(_) => "append",
                            Op::SetLen(_) => "cut",
                            Op::Sync(_) => "sync",
                            Op::Created(_) => "created",
                        }),
                        String::from_utf8_lossy(&image)
                    ));
                }
            }
        }
        assert!(checked > 1000, "{checked}");
        assert!(
            failures.is_empty(),
            "{} of {checked} crash images mishandled; first ones:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
