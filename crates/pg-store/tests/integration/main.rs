//! The PostgreSQL store's integration tests, one binary, against real
//! PostgreSQL servers (and PgBouncers) each test starts for itself: the
//! store contract's suite, `storeconformance`, directly and through
//! PgBouncer in transaction mode (`store_conformance`); and what is this
//! store's own: the same-database lease check (`leases`), followers woken
//! by `NOTIFY` and the pooler fallback (`follow`), one transaction per
//! append, the index behind listing pages, the schema, bad configuration
//! (`store`), and a database that went back (`rewind`), also by a failover
//! to a standby that lost the last appends (`failover`); an append its
//! caller gave up on, cancelled on the server (`abandoned`).

mod abandoned;
mod failover;
mod follow;
mod leases;
mod rewind;
mod store;
mod store_conformance;
mod support;
