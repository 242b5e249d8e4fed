//! The emulator's integration tests, one binary: its API rules over real
//! HTTP (`http_api`), and the real `kubectl` against it, the emulator's own
//! binary included (`kubectl`). They share no process-wide state, so they
//! run as threads of one process.

mod http_api;
mod kubectl;
