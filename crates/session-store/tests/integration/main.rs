//! The JSONL store's integration tests, one binary, each on temporary
//! directories of its own: the store contract's suite, `storeconformance`,
//! which every store runs — fencing, unfenced writes, authority binding,
//! paging, racing writers, waiting for appends, bad input
//! (`conformance`); and what is the JSONL store's own: file and crash
//! safety, legacy marks, locks held elsewhere and reclaiming, with several
//! "processes" (store instances with their own caches and open file
//! descriptions) on one directory (`jsonl`); the store directory's
//! generation (`generation`); full listing pages (`listing`); cancel
//! requests (`follow`) and concurrent ones (`cancel_races`); the directory
//! watch that wakes waiters (`watch`). They share
//! no process-wide state, so they run as threads of one process.

#[cfg(feature = "cancel-requests")]
mod cancel_races;
mod conformance;
mod follow;
mod generation;
mod jsonl;
mod listing;
mod watch;
