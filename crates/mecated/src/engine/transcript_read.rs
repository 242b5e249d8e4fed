//! Reading what a run hands its agent: as much of the session as the
//! agent's [`TranscriptScope`] asks for, through the run's claim and no
//! further, from the cache where it can.
//!
//! A run's cost must not grow with its session when the agent does not
//! read the session's whole history: an agent that reads none gets its
//! claim alone, and one that sums up the past in checkpoint events gets
//! what follows the newest, found by reading backwards from the claim, so
//! a run never reads further back than that checkpoint, cached or not.
//!
//! Every read stops at the claim. A holder paused past its lease between
//! its claim and this read may find a later owner's events after its
//! claim; its agent must never be handed them (nor their token).

use lease_port::SessionId;
use session_store::{StoreError, StoredEvent};

use super::Engine;
use crate::agent::TranscriptScope;
use crate::transcript::{CachedTranscript, Transcript, is_checkpoint};

/// Events asked of the store in one read.
const TRANSCRIPT_PAGE: usize = 1000;

/// The first window read backwards while looking for a checkpoint, each
/// next one twice as large up to a page: an agent checkpointing often
/// reads little past its checkpoint, one checkpointing rarely costs few
/// round trips.
const FIRST_WINDOW: u64 = 256;

/// What a backwards search for the newest checkpoint found.
struct SinceCheckpoint {
    /// The events from the checkpoint, or from where the search stopped,
    /// through the claim.
    events: Vec<StoredEvent>,
    /// Whether `events` begins with a checkpoint.
    found: bool,
}

impl Engine {
    /// The transcript a run whose claim is event `claim_seq` hands its
    /// agent, and the claim as stored.
    ///
    /// Starts from what the last run of the session here read, when the
    /// store still holds the event it ended with (see [`crate::transcript`]
    /// for why that proves the rest unchanged), and reads only from there;
    /// otherwise reads the transcript afresh, as far back as the scope
    /// asks.
    pub(super) async fn transcript(
        &self,
        session: &SessionId,
        claim_seq: u64,
    ) -> Result<(Transcript, Option<StoredEvent>), StoreError> {
        let from_checkpoint = match self.inner.scope {
            TranscriptScope::ClaimOnly => return self.claim_only(session, claim_seq).await,
            TranscriptScope::Full => false,
            TranscriptScope::SinceCheckpoint => true,
        };
        let cache = &self.inner.transcripts;
        let events = match cache.take(session) {
            Some(cached) => match self
                .extend(session, claim_seq, cached, from_checkpoint)
                .await?
            {
                Ok(extended) => return Ok(self.keep(session, extended, claim_seq)),
                // Deleted since (and perhaps created again), or summed up
                // by a checkpoint past the cache: start afresh.
                Err(fresh) => fresh,
            },
            None => None,
        };
        let events = match events {
            Some(events) => events,
            None if from_checkpoint => {
                self.since_checkpoint(session, claim_seq, None)
                    .await?
                    .events
            }
            None => self.read_range(session, 1, claim_seq).await?,
        };
        let claim = events.iter().find(|e| e.seq == claim_seq).cloned();
        match CachedTranscript::new(events) {
            Some(cached) => Ok(self.keep(session, cached, claim_seq)),
            None => Ok((Transcript::default(), claim)),
        }
    }

    /// `cached` brought up to the claim, or, when it cannot be (`Err`),
    /// the transcript read afresh if that was read on the way (`Some`).
    async fn extend(
        &self,
        session: &SessionId,
        claim_seq: u64,
        mut cached: CachedTranscript,
        from_checkpoint: bool,
    ) -> Result<Result<CachedTranscript, Option<Vec<StoredEvent>>>, StoreError> {
        let floor = cached.last_seq();
        let newer = if from_checkpoint && claim_seq.saturating_sub(floor) > FIRST_WINDOW {
            // Long since cached: a checkpoint may have summed it all up,
            // and reading forward from the cache would read everything.
            let search = self
                .since_checkpoint(session, claim_seq, Some(floor))
                .await?;
            if search.found {
                return Ok(Err(Some(search.events)));
            }
            search.events
        } else {
            self.read_range(session, floor, claim_seq).await?
        };
        let mut newer = newer.into_iter();
        if !newer.next().is_some_and(|first| cached.ends_with(&first)) {
            return Ok(Err(None));
        }
        cached.extend(newer.collect(), from_checkpoint);
        Ok(Ok(cached))
    }

    /// The transcript `cached` hands out, kept for the next run if it
    /// fits, and the claim, when it is the transcript's last event.
    fn keep(
        &self,
        session: &SessionId,
        cached: CachedTranscript,
        claim_seq: u64,
    ) -> (Transcript, Option<StoredEvent>) {
        let claim = cached.last_event().filter(|e| e.seq == claim_seq);
        // One copy, shared by the run and the cache (which keeps it only
        // if it fits).
        let transcript = cached.transcript();
        self.inner.transcripts.put(session, cached);
        (transcript, claim)
    }

    async fn claim_only(
        &self,
        session: &SessionId,
        claim_seq: u64,
    ) -> Result<(Transcript, Option<StoredEvent>), StoreError> {
        let page = self.inner.store.read(session, claim_seq, 1).await?;
        let claim = page.events.into_iter().find(|e| e.seq == claim_seq);
        let transcript =
            Transcript::from(claim.iter().map(|e| e.payload.clone()).collect::<Vec<_>>());
        Ok((transcript, claim))
    }

    /// The events of `session` numbered `from..=to`.
    async fn read_range(
        &self,
        session: &SessionId,
        from: u64,
        to: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut events = Vec::new();
        let mut from = from;
        while from <= to {
            let wanted = usize::try_from(to - from + 1).unwrap_or(usize::MAX);
            let page = self
                .inner
                .store
                .read(session, from, wanted.min(TRANSCRIPT_PAGE))
                .await?;
            events.extend(page.events.into_iter().take_while(|e| e.seq <= to));
            match page.next_seq {
                Some(next) => from = next,
                None => break,
            }
        }
        Ok(events)
    }

    /// The events from the newest checkpoint at or before `claim_seq`
    /// through the claim, searching no further back than `floor` (the
    /// session's first event when `None`).
    async fn since_checkpoint(
        &self,
        session: &SessionId,
        claim_seq: u64,
        floor: Option<u64>,
    ) -> Result<SinceCheckpoint, StoreError> {
        let floor = match floor {
            Some(floor) => floor,
            // Where the session's present life begins: a read from 1
            // starts at its first event. Asked, not inferred from a window
            // that starts late, since a store may leave gaps in its numbers.
            None => match self.inner.store.read(session, 1, 1).await?.events.first() {
                Some(e) => e.seq,
                None => {
                    return Ok(SinceCheckpoint {
                        events: Vec::new(),
                        found: false,
                    });
                }
            },
        };
        // Newest window first.
        let mut windows: Vec<Vec<StoredEvent>> = Vec::new();
        let (mut to, mut size) = (claim_seq, FIRST_WINDOW);
        let found = loop {
            let from = to.saturating_sub(size - 1).max(floor);
            let mut window = self.read_range(session, from, to).await?;
            let checkpoint = window.iter().rposition(|e| is_checkpoint(&e.payload));
            if let Some(at) = checkpoint {
                window.drain(..at);
            }
            windows.push(window);
            if checkpoint.is_some() || from <= floor {
                break checkpoint.is_some();
            }
            to = from - 1;
            size = (size * 2).min(TRANSCRIPT_PAGE as u64);
        };
        Ok(SinceCheckpoint {
            events: windows.into_iter().rev().flatten().collect(),
            found,
        })
    }
}
