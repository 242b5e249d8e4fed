//! The JSONL store's integration tests, one binary, each on temporary
//! directories of its own: fencing, crash safety, bad input and several
//! "processes" (store instances with their own caches and open file
//! descriptions) on one directory (`jsonl`); the store directory's
//! generation (`generation`); paged listing (`listing`); waiting for
//! appends and cancel requests (`follow`); concurrent cancel requests
//! (`cancel_races`). They share no process-wide state, so they run as
//! threads of one process.

#[cfg(feature = "cancel-requests")]
mod cancel_races;
mod follow;
mod generation;
mod jsonl;
mod listing;
