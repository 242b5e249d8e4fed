//! The statements, one per operation. Each is a single statement, so each
//! is its own transaction on any connection a pooler picks; each judges
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

impl Statements {
    pub(crate) fn new(t: &Tables) -> Self {
        let leases = &t.leases;
        let acquire = acquire(leases);
        // $1 session, $2 owner, $3 token, $4 TTL in ms. Renewed while the
        // row is still this grant, even past its expiry: nobody took it,
        // or the row would have changed. Otherwise the row says why.
        let renew = format!(
            "WITH up AS (
                 UPDATE {leases} SET expires_at = now() + $4 * interval '1 millisecond'
                 WHERE session_id = $1 AND owner = $2 AND token = $3
                 RETURNING expires_at
             )
             SELECT {up_left}, NULL::text, NULL::bigint, NULL::bigint, {LSN} FROM up
             UNION ALL
             SELECT NULL::bigint, r.owner, r.token, {r_left}, {LSN}
             FROM (SELECT 1) AS one
             LEFT JOIN {leases} r ON r.session_id = $1
             WHERE NOT EXISTS (SELECT 1 FROM up)",
            up_left = ms_left("up.expires_at"),
            r_left = ms_left("r.expires_at"),
        );
        // $1 sessions, $2 owners, $3 tokens, $4 TTL in ms: every renewal in
        // one statement, each under renew's rule, answered in the order
        // asked. A grant is matched on all of session, owner and token, so
        // a stale value beside the current one in one batch renews nothing.
        let renew_many = format!(
            "WITH want AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
                     WITH ORDINALITY AS w(session_id, owner, token, n)
             ), up AS (
                 UPDATE {leases} l SET expires_at = now() + $4 * interval '1 millisecond'
                 FROM want
                 WHERE l.session_id = want.session_id AND l.owner = want.owner
                     AND l.token = want.token
                 RETURNING l.session_id, l.owner, l.token, l.expires_at
             )
             SELECT want.n, {up_left}, r.owner, r.token, {r_left}, {LSN}
             FROM want
             LEFT JOIN up ON up.session_id = want.session_id AND up.owner = want.owner
                 AND up.token = want.token
             LEFT JOIN {leases} r ON r.session_id = want.session_id
             ORDER BY want.n",
            up_left = ms_left("up.expires_at"),
            r_left = ms_left("r.expires_at"),
        );
        // $1 session, $2 owner, $3 token: only this grant's hold goes; the
        // row and its token stay.
        let release = format!(
            "WITH up AS (
                 UPDATE {leases} SET owner = NULL, expires_at = NULL
                 WHERE session_id = $1 AND owner = $2 AND token = $3
                 RETURNING token
             )
             SELECT r.token, {LSN}
             FROM (SELECT 1) AS one LEFT JOIN {leases} r ON r.session_id = $1"
        );
        // $1 session: the live holder, if any.
        let current = format!(
            "SELECT owner, token, {left}, {LSN} FROM {leases}
             WHERE session_id = $1 AND owner IS NOT NULL AND expires_at > now()",
            left = ms_left("expires_at"),
        );
        Self {
            acquire,
            renew,
            renew_many,
            release,
            current,
        }
    }
}

/// $1 session, $2 owner, $3 TTL in ms, $4 floor. Free, expired or
/// ours: granted. The live holder re-acquiring keeps its token unless
/// it does not exceed the floor; any other grant takes the next
/// token above the row's, the floor and the database clock (in ms). The conflict branch
/// re-reads the row under its lock, so two racing acquires cannot
/// both win. When nothing is granted, the row as it was says who
/// holds it.
fn acquire(leases: &str) -> String {
    format!(
        "WITH prev AS (
             SELECT owner, token, expires_at FROM {leases} WHERE session_id = $1
         ), up AS (
             INSERT INTO {leases} AS l (session_id, owner, token, expires_at)
             VALUES ($1, $2, GREATEST($4 + 1, {CLOCK_MS}),
                     now() + $3 * interval '1 millisecond')
             ON CONFLICT (session_id) DO UPDATE SET
                 owner = EXCLUDED.owner,
                 token = CASE
                     WHEN l.owner = EXCLUDED.owner AND l.expires_at > now() AND l.token > $4
                     THEN l.token
                     ELSE GREATEST(l.token + 1, $4 + 1, {CLOCK_MS})
                 END,
                 expires_at = EXCLUDED.expires_at
             WHERE l.owner IS NULL OR l.expires_at <= now() OR l.owner = EXCLUDED.owner
             RETURNING l.token, l.expires_at
         )
         SELECT up.token, {up_left}, NULL::text, NULL::bigint, {LSN} FROM up
         UNION ALL
         SELECT NULL::bigint, NULL::bigint,
                CASE WHEN prev.expires_at > now() THEN prev.owner END,
                CASE WHEN prev.expires_at > now() THEN {prev_left} END,
                {LSN}
         FROM prev WHERE NOT EXISTS (SELECT 1 FROM up)",
        up_left = ms_left("up.expires_at"),
        prev_left = ms_left("prev.expires_at"),
    )
}
