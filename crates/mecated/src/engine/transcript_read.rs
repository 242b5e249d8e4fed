//! Reading what a run hands its agent: as much of the session as the
//! agent's [`TranscriptScope`] asks for, from the cache where it can.
//!
//! A run's cost must not grow with its session when the agent does not
//! read the session's whole history: an agent that reads none gets its
//! claim alone, and one that sums up the past in checkpoint events gets
//! what follows the newest, found by reading backwards from the claim, so
//! a run never reads further back than that checkpoint, cached or not.

use lease_port::SessionId;
use session_store::{StoreError, StoredEvent};

use super::Engine;
use crate::agent::TranscriptScope;
use crate::transcript::{CachedTranscript, Transcript, is_checkpoint};

/// Events asked of the store in one read.
const TRANSCRIPT_PAGE: usize = 1000;

/// Events read per step backwards while looking for a checkpoint: small
/// enough that an agent checkpointing often reads little past it, large
/// enough that one checkpointing rarely costs few round trips.
const CHECKPOINT_WINDOW: u64 = 256;

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
        let from_checkpoint = match self.inner.agent.transcript_scope() {
            TranscriptScope::ClaimOnly => return self.claim_only(session, claim_seq).await,
            TranscriptScope::Full => false,
            TranscriptScope::SinceCheckpoint => true,
        };
        let cache = &self.inner.transcripts;
        if let Some(mut cached) = cache.take(session) {
            let mut newer = self.read_from(session, cached.last().seq).await?;
            if newer.first() == Some(cached.last()) {
                newer.remove(0);
                let claim = newer.iter().find(|e| e.seq == claim_seq).cloned();
                cached.extend(newer, from_checkpoint);
                let transcript = cached.transcript();
                cache.put(session, cached);
                return Ok((transcript, claim));
            }
            // Deleted since (and perhaps created again): start afresh.
        }
        let events = if from_checkpoint {
            self.read_since_checkpoint(session, claim_seq).await?
        } else {
            self.read_from(session, 1).await?
        };
        let claim = events.iter().find(|e| e.seq == claim_seq).cloned();
        let Some(cached) = CachedTranscript::new(events) else {
            return Ok((Transcript::default(), claim));
        };
        // One copy, shared by the run and the cache (which keeps it only
        // if it fits).
        let transcript = cached.transcript();
        cache.put(session, cached);
        Ok((transcript, claim))
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

    /// Every event of `session` from `from` on.
    async fn read_from(
        &self,
        session: &SessionId,
        from: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.read_range(session, from, u64::MAX).await
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

    /// The events from the newest checkpoint at or before `claim_seq` up
    /// to the claim, or from the session's first event when it has none.
    async fn read_since_checkpoint(
        &self,
        session: &SessionId,
        claim_seq: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        // Where the session's present life begins: a read from 1 starts
        // at its first event. Asked, not inferred from a window that
        // starts late, since a store may leave gaps in its numbers.
        let first = match self.inner.store.read(session, 1, 1).await?.events.first() {
            Some(e) => e.seq,
            None => return Ok(Vec::new()),
        };
        // Newest window first.
        let mut windows: Vec<Vec<StoredEvent>> = Vec::new();
        let mut to = claim_seq;
        loop {
            let from = to.saturating_sub(CHECKPOINT_WINDOW - 1).max(first);
            let mut window = self.read_range(session, from, to).await?;
            let reached_start = from <= first;
            let checkpoint = window.iter().rposition(|e| is_checkpoint(&e.payload));
            if let Some(at) = checkpoint {
                window.drain(..at);
            }
            windows.push(window);
            if checkpoint.is_some() || reached_start {
                break;
            }
            to = from - 1;
        }
        Ok(windows.into_iter().rev().flatten().collect())
    }
}
