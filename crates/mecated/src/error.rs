//! Error text shared by the engine, the HTTP edge and the operator commands.

/// The error and its sources, joined, each said once: lease-http's, so the
/// server's messages and its HTTP answers read alike.
pub use lease_http::error_chain;
