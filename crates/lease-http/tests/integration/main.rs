//! lease-http's integration tests: `examples/chat.rs` run as real
//! processes over one directory.

mod two_processes;
