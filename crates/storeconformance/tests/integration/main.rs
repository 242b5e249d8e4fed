//! The suite's own integration tests, one binary: the JSONL store passes
//! every case, and plausibly broken stores — JSONL stores behind wrappers
//! that break one rule each — are caught by the case made for the rule
//! (`broken_stores`). They share no process-wide state, so they run as
//! threads of one process.

mod broken_stores;
