//! The statements, one per operation, kept as lean as the bare statement
//! each is built on (every statement is parsed and planned afresh, so its
//! size is its cost): the common answer comes from the write itself, and
//! only a refusal reads the row again, in a statement of its own, which
//! also sees the newest holder. Each is a single statement, so each is its
//! own transaction on any connection a pooler picks; each judges
//! expiry with the database's `now()`, so no client's clock frees a
//! session; and each answers the write-ahead log position it ran at, by
//! which a client notices a database that went back (see `floors`).

use crate::schema::Tables;

/// The texts of the statements for one deployment's tables.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) acquire: String,
    pub(crate) renew: String,
    pub(crate) renew_many: String,
    pub(crate) release: String,
    pub(crate) current: String,
    pub(crate) row: String,
}

/// Whole milliseconds from the database's `now()` to `t`, rounded down:
/// a client never believes a grant lives longer than the database does.
fn ms_left(t: &str) -> String {
    format!("floor(extract(epoch FROM ({t} - now())) * 1000)::bigint")
}

/// The database clock in milliseconds since the epoch: a floor for every
/// new token, so tokens issued after a restore from an older copy still
/// exceed those the copy lost (as long as the database's clock does not go
/// back by more than the time since they were issued).
const CLOCK_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

const LSN: &str = "pg_current_wal_lsn()::text";

/// A write's condition that the database is not behind the log position
/// the client saw before sending it ($5): on a database restored or failed
/// over to a standby that lost commits, a write of a client that saw them
/// changes nothing while the database is behind what it saw, and the
/// client's read of the row then reports it `Rewound`. Checked only after
/// the commit, a refused renewal would still extend the row and move the
/// new primary's log on, closing the window in which every other client
/// that saw the lost commits could tell.
const AT_OR_PAST: &str = "pg_current_wal_lsn() >= $5::pg_lsn";

/// The same for release, whose position is $4.
const AT_OR_PAST4: &str = "pg_current_wal_lsn() >= $4::pg_lsn";

impl Statements {
    pub(crate) fn new(t: &Tables) -> Self {
        let leases = &t.leases;
        Self {
            acquire: acquire(leases),
            renew: renew(leases),
            renew_many: renew_many(leases),
            release: release(leases),
            current: current(leases),
            row: row(leases),
        }
    }
}

/// $1 session, $2 owner, $3 TTL in ms, $4 floor, $5 the log position
/// seen (nothing is written behind it). Free, expired or ours:
/// granted; no row answered means held. The live holder re-acquiring keeps
/// its token unless it does not exceed the floor; any other grant takes a
/// token above the row's, the floor and the database clock (in ms): the
/// proposed row's token, the clock read once, before any wait for the
/// row's lock (a later reading would only be higher, and either is past
/// every token lost before the statement). The conflict branch
/// re-reads the row under its lock, so two racing acquires cannot both
/// win. A grant always lives exactly the TTL from the statement's `now()`,
/// so the answer need not say how long it has left.
fn acquire(leases: &str) -> String {
    format!(
        "INSERT INTO {leases} AS l (session_id, owner, token, expires_at)
         SELECT $1, $2, GREATEST($4 + 1, {CLOCK_MS}), now() + $3 * interval '1 millisecond'
         WHERE {AT_OR_PAST}
         ON CONFLICT (session_id) DO UPDATE SET
             owner = EXCLUDED.owner,
             token = CASE
                 WHEN l.owner = EXCLUDED.owner AND l.expires_at > now() AND l.token > $4
                 THEN l.token
                 ELSE GREATEST(l.token + 1, EXCLUDED.token)
             END,
             expires_at = EXCLUDED.expires_at
         WHERE l.owner IS NULL OR l.expires_at <= now() OR l.owner = EXCLUDED.owner
         RETURNING l.token, {LSN}"
    )
}

/// $1 session, $2 owner, $3 token, $4 TTL in ms, $5 the log position seen.
/// Renewed while the row is
/// still this grant, even past its expiry: nobody took it, or the row
/// would have changed. No row answered: not renewed (`row` says why). A
/// renewed grant lives exactly the TTL from the statement's `now()`.
fn renew(leases: &str) -> String {
    format!(
        "UPDATE {leases} SET expires_at = now() + $4 * interval '1 millisecond'
         WHERE session_id = $1 AND owner = $2 AND token = $3 AND {AT_OR_PAST}
         RETURNING {LSN}"
    )
}

/// $1 sessions, $2 owners, $3 tokens, $4 TTL in ms, $5 the log position
/// seen: every renewal in one
/// statement, each under renew's rule, answered in the order asked (NULL
/// for a lease not renewed; `row` says why). A grant is matched on all of
/// session, owner and token, so a stale value beside the current one in
/// one batch renews nothing.
fn renew_many(leases: &str) -> String {
    format!(
        "WITH want AS (
             SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
                 WITH ORDINALITY AS w(session_id, owner, token, n)
         ), up AS (
             UPDATE {leases} l SET expires_at = now() + $4 * interval '1 millisecond'
             FROM want
             WHERE l.session_id = want.session_id AND l.owner = want.owner
                 AND l.token = want.token AND {AT_OR_PAST}
             RETURNING want.n
         )
         SELECT want.n, up.n IS NOT NULL, {LSN}
         FROM want LEFT JOIN up ON up.n = want.n
         ORDER BY want.n"
    )
}

/// $1 session, $2 owner, $3 token, $4 the log position seen: only this
/// grant's hold goes; the row and
/// its token stay. No row answered: nothing of it was held (`row` says
/// whether the table went back).
fn release(leases: &str) -> String {
    format!(
        "UPDATE {leases} SET owner = NULL, expires_at = NULL
         WHERE session_id = $1 AND owner = $2 AND token = $3 AND {AT_OR_PAST4}
         RETURNING token, {LSN}"
    )
}

/// $1 session: the live holder, if any.
fn current(leases: &str) -> String {
    format!(
        "SELECT owner, token, {left}, {LSN} FROM {leases}
         WHERE session_id = $1 AND owner IS NOT NULL AND expires_at > now()",
        left = ms_left("expires_at"),
    )
}

/// $1 session: the row as it is (one answer row, NULLs when there is none),
/// for a refusal's reason.
fn row(leases: &str) -> String {
    format!(
        "SELECT r.owner, r.token, {left}, {LSN}
         FROM (SELECT 1) AS one LEFT JOIN {leases} r ON r.session_id = $1",
        left = ms_left("r.expires_at"),
    )
}
