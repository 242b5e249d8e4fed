//! The suite must catch broken stores: each flaw below is a bug a real
//! store could plausibly have, put into a JSONL store by a wrapper, and at
//! least the named case must fail on it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, OwnerId, SessionId};
use serde_json::{Value, json};
use session_store::{
    AppendReceipt, CancelRequest, DEFAULT_MAX_EVENT_BYTES, Fence, FsyncPolicy, JsonlOptions,
    JsonlStore, ListCursor, Page, SessionPage, SessionStore, StoreError, StoreErrorKind,
    WriteFence, check_list_limit,
};
use storeconformance::{StoreFactory, check_all};

/// The event size limit the factories declare.
const MAX_EVENT_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// None: the JSONL store itself, which must pass everything.
    None,
    /// No flaw either: a store that cannot allow unfenced writes and has
    /// no event size limit, which must pass everything too.
    NoOptionalParts,
    /// A token below the mark is written (under the mark's fence).
    AcceptsLowerToken,
    /// The mark's token from another writer is written.
    AcceptsEqualTokenFromOther,
    /// A writer that once held the mark is still taken for its writer
    /// after a higher token from another writer moved it.
    LosesWriterBinding,
    /// Tokens are compared as doubles: 2^53 passes for 2^53 + 1.
    TokensAsFloats,
    /// Deletion does not check the fence.
    DeleteIgnoresFence,
    /// A client not configured for unfenced writes accepts them.
    AllowsUnfencedWhenNotAllowed,
    /// A client allowing unfenced writes accepts them on a session that
    /// took a fenced write.
    AcceptsUnfencedOnFencedSession,
    /// A session created again numbers its events from 1.
    SeqsRestartAfterRecreate,
    /// The receipt's numbers come from a read made before the write, so
    /// racing writers are handed the same numbers.
    RacyReceipts,
    /// A page holds as many events as the store likes, whatever the limit.
    IgnoresPageLimit,
    /// The declared event size limit is not enforced.
    IgnoresEventLimit,
    /// A batch is written event by event: an invalid event leaves the ones
    /// before it written, and readers see half a batch.
    BatchEventByEvent,
    /// A listing cursor is a position in the listing, not an id: sessions
    /// created or deleted before it shift the next page.
    PositionCursor,
    /// Binding another authority replaces nothing but answers success.
    RebindsAuthority,
    /// Binding reads the record, then writes it: racing first bindings
    /// all believe they won.
    RacyBinding,
    /// A wait only looks again at its timeout.
    WaitNeverWakes,
    /// A wait answers "appended" at once.
    WaitAlwaysTrue,
    /// A wait for a cancel request answers the recorded one, whatever
    /// count it was asked to wait past.
    CancelWaitIgnoresCount,
    /// A wait for a cancel request only looks again at its timeout.
    CancelWaitNeverWakes,
    /// A request for an earlier run replaces the recorded one.
    CancelLowersToken,
    /// The last number is one short: a wait from it wakes at once.
    LastSeqOneShort,
    /// A conditional append writes wherever the log ends.
    AppendAfterIgnoresPosition,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the clients of one broken store share, as a broken database would.
#[derive(Default)]
struct Shared {
    /// Every writer that had a fenced write accepted, per session.
    writers: Mutex<HashMap<SessionId, HashSet<OwnerId>>>,
    /// How far the current incarnation's numbers are shifted down.
    offsets: Mutex<HashMap<SessionId, u64>>,
    /// The last number of a deleted incarnation.
    ended_at: Mutex<HashMap<SessionId, u64>>,
    /// Where a listing cursor's next page starts, by the id it names.
    positions: Mutex<HashMap<SessionId, usize>>,
    /// The cancel request a flawed store answers instead of the recorded.
    lowered: Mutex<HashMap<SessionId, CancelRequest>>,
}

/// What a flawed client does instead of taking a refusal.
enum Retry {
    /// Writes under this fence.
    As(WriteFence),
    /// Writes through a client allowing unfenced writes.
    Lax,
    /// Writes under the mark, whose writer it learns by asking.
    UnderMark(FencingToken),
}

struct Broken {
    flaw: Flaw,
    /// The client as configured.
    inner: JsonlStore,
    /// A client of the same directory allowing unfenced writes.
    lax: JsonlStore,
    allows_unfenced: bool,
    shared: Arc<Shared>,
}

impl Broken {
    fn retry(
        &self,
        s: &SessionId,
        fence: &WriteFence,
        e: &StoreError,
        deleting: bool,
    ) -> Option<Retry> {
        match e {
            StoreError::Fenced {
                presented,
                presented_by,
                high_water,
                high_water_owner: Some(owner),
                ..
            } => {
                let bend = if deleting {
                    self.flaw == Flaw::DeleteIgnoresFence
                } else {
                    match self.flaw {
                        Flaw::AcceptsLowerToken => presented < high_water,
                        Flaw::AcceptsEqualTokenFromOther => presented == high_water,
                        Flaw::TokensAsFloats => {
                            presented != high_water
                                && presented.get() as f64 == high_water.get() as f64
                        }
                        Flaw::LosesWriterBinding => {
                            presented == high_water
                                && lock(&self.shared.writers)
                                    .get(s)
                                    .is_some_and(|w| w.contains(presented_by))
                        }
                        _ => false,
                    }
                };
                bend.then(|| Retry::As(Fence::new(*high_water, owner.clone()).into()))
            }
            StoreError::Unfenced {
                high_water: None, ..
            } if self.flaw == Flaw::AllowsUnfencedWhenNotAllowed
                && *fence == WriteFence::Unfenced =>
            {
                Some(Retry::Lax)
            }
            StoreError::Unfenced {
                high_water: Some(h),
                ..
            } if self.flaw == Flaw::AcceptsUnfencedOnFencedSession
                && self.allows_unfenced
                && !deleting =>
            {
                Some(Retry::UnderMark(*h))
            }
            _ => None,
        }
    }

    /// The mark's fence, learnt from the refusal of a token that cannot
    /// pass it.
    async fn mark_of(&self, s: &SessionId, mark: FencingToken) -> Option<WriteFence> {
        let probe = WriteFence::new(FencingToken::new(0), OwnerId::new("probe").unwrap());
        match self.inner.append(s, probe, &[json!(null)]).await {
            Err(StoreError::Fenced {
                high_water_owner: Some(owner),
                ..
            }) => Some(WriteFence::new(mark, owner)),
            _ => None,
        }
    }

    /// The last number the session's current incarnation used, in the
    /// wrapped store's numbering.
    async fn last_seq(&self, s: &SessionId) -> Result<u64, StoreError> {
        let mut last = self.offset(s);
        let mut from = 1;
        loop {
            let page = self.inner.read(s, from, 1000).await?;
            last = page.events.last().map_or(last, |e| e.seq);
            match page.next_seq {
                Some(n) => from = n,
                None => return Ok(last),
            }
        }
    }

    fn offset(&self, s: &SessionId) -> u64 {
        lock(&self.shared.offsets).get(s).copied().unwrap_or(0)
    }

    async fn append_one(
        &self,
        s: &SessionId,
        fence: &WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        let before = match self.flaw {
            Flaw::RacyReceipts => Some(self.last_seq(s).await?),
            _ => None,
        };
        if before.is_some() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let r = match self.inner.append(s, fence.clone(), events).await {
            Ok(r) => r,
            Err(e) => match self.retry(s, fence, &e, false) {
                None => return Err(e),
                Some(Retry::As(f)) => self.inner.append(s, f, events).await?,
                Some(Retry::Lax) => self.lax.append(s, fence.clone(), events).await?,
                Some(Retry::UnderMark(h)) => match self.mark_of(s, h).await {
                    Some(f) => self.inner.append(s, f, events).await?,
                    None => return Err(e),
                },
            },
        };
        if let WriteFence::Fenced(f) = fence {
            lock(&self.shared.writers)
                .entry(s.clone())
                .or_default()
                .insert(f.owner().clone());
        }
        let r = match before {
            Some(last) => AppendReceipt {
                first_seq: last + 1,
                last_seq: last + events.len() as u64,
            },
            None => r,
        };
        let off = self.offset(s);
        Ok(AppendReceipt {
            first_seq: r.first_seq - off,
            last_seq: r.last_seq - off,
        })
    }

    /// Listing pages by position, remembered per cursor.
    async fn list_by_position(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        check_list_limit(limit)?;
        let all = self.inner.list().await?;
        let mut positions = lock(&self.shared.positions);
        let start = after
            .map_or(0, |c| {
                positions
                    .get(c.last())
                    .copied()
                    .unwrap_or_else(|| all.partition_point(|s| s <= c.last()))
            })
            .min(all.len());
        let end = (start + limit).min(all.len());
        let page = all[start..end].to_vec();
        if let Some(last) = page.last() {
            positions.insert(last.clone(), end);
        }
        Ok(SessionPage::new(page, all.len() > end))
    }
}

#[async_trait]
impl SessionStore for Broken {
    async fn create(&self, s: &SessionId) -> Result<(), StoreError> {
        self.inner.create(s).await?;
        if let Some(end) = lock(&self.shared.ended_at).remove(s) {
            lock(&self.shared.offsets).insert(s.clone(), end);
        }
        Ok(())
    }

    async fn append(
        &self,
        s: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        if self.flaw != Flaw::BatchEventByEvent || events.len() < 2 {
            return self.append_one(s, &fence, events).await;
        }
        let mut receipt: Option<AppendReceipt> = None;
        for e in events {
            let r = self.append_one(s, &fence, std::slice::from_ref(e)).await?;
            receipt = Some(AppendReceipt {
                first_seq: receipt.map_or(r.first_seq, |p| p.first_seq),
                last_seq: r.last_seq,
            });
            // As a round trip per event would take.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(receipt.expect("a batch of two or more"))
    }

    async fn append_after(
        &self,
        s: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        if self.flaw == Flaw::AppendAfterIgnoresPosition {
            return self.append(s, fence, events).await.map(Some);
        }
        let off = self.offset(s);
        let written = self
            .inner
            .append_after(s, fence.clone(), after.saturating_add(off), events)
            .await?;
        if let (Some(_), WriteFence::Fenced(f)) = (&written, &fence) {
            lock(&self.shared.writers)
                .entry(s.clone())
                .or_default()
                .insert(f.owner().clone());
        }
        Ok(written.map(|r| AppendReceipt {
            first_seq: r.first_seq - off,
            last_seq: r.last_seq - off,
        }))
    }

    async fn read(&self, s: &SessionId, from_seq: u64, limit: usize) -> Result<Page, StoreError> {
        let limit = match self.flaw {
            Flaw::IgnoresPageLimit => 1000,
            _ => limit,
        };
        let off = self.offset(s);
        let mut page = self
            .inner
            .read(s, from_seq.saturating_add(off), limit)
            .await?;
        for e in &mut page.events {
            e.seq -= off;
        }
        page.next_seq = page.next_seq.map(|n| n - off);
        Ok(page)
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.inner.list().await
    }

    async fn list_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        match self.flaw {
            Flaw::PositionCursor => self.list_by_position(after, limit).await,
            _ => self.inner.list_page(after, limit).await,
        }
    }

    async fn delete(&self, s: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let end = match self.flaw {
            Flaw::SeqsRestartAfterRecreate => Some(self.last_seq(s).await?),
            _ => None,
        };
        match self.inner.delete(s, fence.clone()).await {
            Ok(()) => {}
            Err(e) => match self.retry(s, &fence, &e, true) {
                Some(Retry::As(f)) => self.inner.delete(s, f).await?,
                Some(Retry::Lax) => self.lax.delete(s, fence).await?,
                _ => return Err(e),
            },
        }
        if let Some(end) = end {
            lock(&self.shared.ended_at).insert(s.clone(), end);
        }
        Ok(())
    }

    async fn high_water(&self, s: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        self.inner.high_water(s).await
    }

    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        let first =
            self.flaw == Flaw::RacyBinding && self.inner.recorded_authority().await?.is_none();
        if first {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        match self.inner.bind_authority(authority).await {
            Err(e)
                if e.kind() == StoreErrorKind::AuthorityMismatch
                    && (first || self.flaw == Flaw::RebindsAuthority) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.inner.recorded_authority().await
    }

    async fn wait_for_append(
        &self,
        s: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        match self.flaw {
            Flaw::WaitAlwaysTrue => {
                self.read(s, 1, 1).await?;
                Ok(true)
            }
            Flaw::WaitNeverWakes => {
                self.read(s, 1, 1).await?;
                tokio::time::sleep(timeout).await;
                Ok(!self.read(s, after_seq + 1, 1).await?.events.is_empty())
            }
            _ => {
                let off = self.offset(s);
                self.inner
                    .wait_for_append(s, after_seq + off, timeout)
                    .await
            }
        }
    }

    async fn last_seq(&self, s: &SessionId) -> Result<u64, StoreError> {
        let last = self.inner.last_seq(s).await?.saturating_sub(self.offset(s));
        Ok(match self.flaw {
            Flaw::LastSeqOneShort => last.saturating_sub(1),
            _ => last,
        })
    }

    async fn request_cancel(&self, s: &SessionId, run: FencingToken) -> Result<(), StoreError> {
        self.keeps_cancel_requests()?;
        if self.flaw == Flaw::CancelLowersToken {
            let serial = self.inner.cancel_request(s).await?.map_or(0, |r| r.serial);
            lock(&self.shared.lowered).insert(
                s.clone(),
                CancelRequest {
                    run,
                    serial: serial + 1,
                },
            );
        }
        self.inner.request_cancel(s, run).await
    }

    async fn cancel_request(&self, s: &SessionId) -> Result<Option<CancelRequest>, StoreError> {
        self.keeps_cancel_requests()?;
        let recorded = self.inner.cancel_request(s).await?;
        Ok(lock(&self.shared.lowered).get(s).copied().or(recorded))
    }

    async fn wait_for_cancel_request(
        &self,
        s: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<CancelRequest>, StoreError> {
        self.keeps_cancel_requests()?;
        match self.flaw {
            Flaw::CancelWaitIgnoresCount => self.cancel_request(s).await,
            Flaw::CancelWaitNeverWakes => {
                tokio::time::sleep(timeout).await;
                Ok(self
                    .cancel_request(s)
                    .await?
                    .filter(|r| r.serial > after_serial))
            }
            _ => {
                self.inner
                    .wait_for_cancel_request(s, after_serial, timeout)
                    .await
            }
        }
    }
}

impl Broken {
    /// `Unsupported` for the store without optional parts, as a store
    /// keeping no cancel requests answers.
    fn keeps_cancel_requests(&self) -> Result<(), StoreError> {
        if self.flaw == Flaw::NoOptionalParts {
            return Err(StoreError::Unsupported {
                what: "cancel requests",
            });
        }
        Ok(())
    }
}

struct Factory {
    dir: tempfile::TempDir,
    flaw: Flaw,
    shared: Arc<Shared>,
}

impl Factory {
    fn new(flaw: Flaw) -> Self {
        Factory {
            dir: tempfile::tempdir().unwrap(),
            flaw,
            shared: Arc::default(),
        }
    }

    fn client(&self, allows_unfenced: bool) -> Arc<dyn SessionStore> {
        let limit = match self.flaw {
            Flaw::IgnoresEventLimit => DEFAULT_MAX_EVENT_BYTES,
            _ => MAX_EVENT_BYTES,
        };
        let open = |lax| {
            let opts = JsonlOptions::default()
                .fsync(FsyncPolicy::Never)
                .max_event_bytes(limit)
                .allow_unfenced(lax);
            JsonlStore::open(self.dir.path(), opts).unwrap()
        };
        Arc::new(Broken {
            flaw: self.flaw,
            inner: open(allows_unfenced),
            lax: open(true),
            allows_unfenced,
            shared: Arc::clone(&self.shared),
        })
    }
}

#[async_trait]
impl StoreFactory for Factory {
    async fn store(&self) -> Arc<dyn SessionStore> {
        self.client(false)
    }

    async fn unfenced_store(&self) -> Option<Arc<dyn SessionStore>> {
        (self.flaw != Flaw::NoOptionalParts).then(|| self.client(true))
    }

    fn max_event_bytes(&self) -> Option<usize> {
        (self.flaw != Flaw::NoOptionalParts).then_some(MAX_EVENT_BYTES)
    }

    fn keeps_cancel_requests(&self) -> bool {
        self.flaw != Flaw::NoOptionalParts
    }
}

/// The cases that fail on a store with `flaw`, and their messages.
async fn failing_cases(flaw: Flaw) -> Vec<(&'static str, String)> {
    let report = check_all(move || async move { Factory::new(flaw) }).await;
    report
        .into_iter()
        .filter_map(|c| Some((c.name, c.failure?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jsonl_store_passes_everything() {
    assert_eq!(failing_cases(Flaw::None).await, []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_optional_parts_passes_everything() {
    assert_eq!(failing_cases(Flaw::NoOptionalParts).await, []);
}

/// One test per flaw: the whole suite runs against it, the cases it fails
/// are printed, and the named one must be among them.
macro_rules! caught_by {
    ($($test:ident: $flaw:ident => $case:literal $(, $says:literal)?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let failing = failing_cases(Flaw::$flaw).await;
            let names: Vec<&str> = failing.iter().map(|(name, _)| *name).collect();
            println!("{:?} caught by {names:?}", Flaw::$flaw);
            let Some((_, message)) = failing.iter().find(|(name, _)| *name == $case) else {
                panic!("{:?} was not caught by {}; caught by {names:?}", Flaw::$flaw, $case);
            };
            $(assert!(message.contains($says), "{} says {message:?}", $case);)?
            let _ = message;
        }
    )*};
}

caught_by! {
    a_lower_token_accepted: AcceptsLowerToken => "lower_token_refused",
        "after a wrote with token 5: a appends with token 4 through the writer's client: \
         expected a refusal (Fenced), but it succeeded";
    an_equal_token_from_another_writer_accepted: AcceptsEqualTokenFromOther
        => "equal_token_from_another_writer_refused", "after x wrote with token 5";
    an_equal_token_race_with_two_winners: AcceptsEqualTokenFromOther
        => "racing_equal_tokens_one_writer_wins", "exactly one must win";
    the_writer_binding_lost: LosesWriterBinding => "higher_token_binds_its_writer",
        "after x wrote with token 5, then y with token 6: x appends with token 6";
    tokens_compared_as_doubles: TokensAsFloats => "tokens_compare_exactly",
        "mark 9007199254740993: write with token 9007199254740992";
    a_deletion_unfenced: DeleteIgnoresFence => "delete_is_fenced", "y deletes with token 4";
    unfenced_writes_not_configured_but_accepted: AllowsUnfencedWhenNotAllowed
        => "unfenced_refused_unless_allowed", "through a client not allowing unfenced writes";
    unfenced_writes_on_a_fenced_session: AcceptsUnfencedOnFencedSession
        => "unfenced_refused_once_fenced", "session holding x's token-3 event";
    a_sequence_number_repeated_after_recreation: SeqsRestartAfterRecreate
        => "recreated_session_keeps_mark_and_numbers", "reusing a sequence number";
    a_sequence_number_repeated_by_racing_writers: RacyReceipts
        => "racing_writers_never_repeat_a_sequence_number";
    the_page_limit_ignored: IgnoresPageLimit => "read_paging", "reading 3 from seq 4 gave seqs";
    a_page_limit_of_zero_taken: IgnoresPageLimit => "bad_input_is_invalid", "limit 0";
    the_event_limit_ignored: IgnoresEventLimit => "bad_input_is_invalid", "over the limit";
    half_a_batch_written: BatchEventByEvent => "bad_input_is_invalid", "refused input wrote";
    half_a_batch_read: BatchEventByEvent => "paging_under_concurrent_appends";
    a_cursor_by_position: PositionCursor => "listing_under_concurrent_changes";
    another_authority_bound_over_the_first: RebindsAuthority => "authority_binding",
        "expected a refusal (AuthorityMismatch), but it succeeded";
    racing_first_bindings_all_won: RacyBinding => "racing_first_bindings";
    a_wait_that_never_wakes: WaitNeverWakes => "wait_wakes_on_append", "no answer within";
    a_wait_that_always_wakes: WaitAlwaysTrue => "wait_times_out", "reported an event";
    a_cancel_wait_past_no_count: CancelWaitIgnoresCount => "cancel_requests_wake_the_holder",
        "ended before any was made";
    a_cancel_wait_that_never_wakes: CancelWaitNeverWakes => "cancel_requests_wake_the_holder",
        "no answer within";
    a_cancel_request_lowering_the_token: CancelLowersToken
        => "cancel_requests_wake_the_holder", "a request for run 3 changed the record";
    a_last_number_one_short: LastSeqOneShort => "last_seq_follows_appends", "the last number";
    a_conditional_append_past_its_position: AppendAfterIgnoresPosition
        => "append_after_writes_only_onto_the_log_it_names", "expected nothing written";
}
