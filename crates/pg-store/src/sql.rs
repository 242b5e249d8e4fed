//! The statements, one per operation. Each is a single statement, so each
//! is its own transaction on whatever connection a pooler picks, and none
//! leaves anything behind on its connection.
//!
//! The two fenced writes (append, delete) first lock the session's row
//! (`FOR UPDATE` in a materialized CTE), then — when the leases live in the
//! same database — share-lock the session's lease row, then decide in one
//! `CASE` (the verdict) and write only under `'ok'`. Under READ COMMITTED a
//! row lock waits for a concurrent writer and then reads the row as it
//! committed, so the check sees the latest mark and sequence number; the
//! `UPDATE` of the same row re-reads that version too. Every write runs at
//! or after the lock, so two writers of one session are serialised by the
//! row, and the sequence numbers an append takes follow the row it locked.

use crate::schema::Tables;

/// The texts of the statements for one deployment's tables.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) append: String,
    pub(crate) delete: String,
    pub(crate) create: String,
    pub(crate) read: String,
    pub(crate) high_water: String,
    pub(crate) list_all: String,
    pub(crate) list_first: String,
    pub(crate) list_after: String,
    pub(crate) bind: String,
    pub(crate) recorded: String,
    pub(crate) request_cancel: String,
    pub(crate) cancel_request: String,
    pub(crate) last_seq: String,
}

const LSN: &str = "pg_current_wal_lsn()::text";

impl Statements {
    /// `leases`: the lease table of the same database every fenced write
    /// checks, when there is one.
    pub(crate) fn new(t: &Tables, leases: Option<&str>) -> Self {
        let sessions = &t.sessions;
        let authority = &t.authority;
        Self {
            append: append(t, leases),
            delete: delete(t, leases),
            create: create(sessions),
            read: read(t),
            high_water: format!(
                "SELECT s.mark::text, s.last_seq, {LSN}
                 FROM (SELECT 1) AS one LEFT JOIN {sessions} s ON s.session_id = $1"
            ),
            list_all: format!("SELECT session_id FROM {sessions} WHERE live ORDER BY session_id"),
            // Both walk the partial index on live ids in order and stop
            // after the page: a page costs the page, not the table.
            list_first: format!(
                "SELECT session_id FROM {sessions} WHERE live ORDER BY session_id LIMIT $1"
            ),
            list_after: format!(
                "SELECT session_id FROM {sessions} WHERE live AND session_id > $1
                 ORDER BY session_id LIMIT $2"
            ),
            // Racing first bindings: the loser's insert waits for the
            // winner's commit and does nothing, and its snapshot, taken
            // before, shows no row; the caller asks again.
            bind: format!(
                "WITH ins AS (
                     INSERT INTO {authority} (singleton, authority, marker)
                     VALUES (true, $1, gen_random_uuid()::text)
                     ON CONFLICT (singleton) DO NOTHING
                     RETURNING authority, marker
                 )
                 SELECT authority, marker FROM ins
                 UNION ALL
                 SELECT authority, marker FROM {authority} WHERE NOT EXISTS (SELECT 1 FROM ins)"
            ),
            recorded: format!("SELECT authority FROM {authority}"),
            request_cancel: request_cancel(t),
            cancel_request: format!(
                "SELECT run::text, serial FROM {} WHERE session_id = $1",
                t.cancels
            ),
            // The session's row with the log position, as a read checks
            // them; no event is read.
            last_seq: format!(
                "SELECT s.live, s.last_seq, s.mark::text, {LSN}
                 FROM (SELECT 1) AS one LEFT JOIN {sessions} s ON s.session_id = $1"
            ),
        }
    }
}

/// The session row locked, the lease row share-locked when checked, and
/// the verdict. Parameters shared by append and delete: $1 session, $2
/// fenced, $3 token (decimal text; NULL unfenced), $4 writer (NULL
/// unfenced), $5 unfenced writes allowed, $6 the authority marker this
/// client bound ('' none), $7 and $8 the highest sequence number and mark
/// this client saw of the session (0 and NULL: none), $9 the highest log
/// position it saw.
///
/// The lease check: the session's lease row is live (`expires_at >
/// clock_timestamp()`, read once the session's row is locked: a write that
/// waited for the lock is judged when it writes, not when it was sent),
/// holds exactly the presented token, and names the writer's
/// owner — the writer is the owner, or the owner followed by `#` and an
/// incarnation id (lease-keeper's `owner#<16 hex>`; an owner too long for
/// that suffix is cut to fit, which the last alternative reads).
/// `FOR SHARE` makes a takeover (an update of the lease row) wait for the
/// write, and the write wait for a takeover under way, then see its row.
///
/// `position`, when not empty, is one more check after those: an
/// append's `moved` when the log's last sequence number is not `$12`.
fn guard(t: &Tables, leases: Option<&str>, position: &str) -> String {
    let sessions = &t.sessions;
    let authority = &t.authority;
    let (lease_cte, lease_check) = match leases {
        Some(leases) => (
            format!(
                "lease AS MATERIALIZED (
                     SELECT l.owner, l.token, l.expires_at > clock_timestamp() AS live
                     FROM {leases} l
                     WHERE l.session_id = $1 AND $2 AND EXISTS (SELECT 1 FROM s)
                     FOR SHARE OF l
                 ),"
            ),
            "WHEN NOT EXISTS (
                 SELECT 1 FROM lease
                 WHERE lease.live AND lease.token = $3::numeric
                     AND ($4 = lease.owner
                          OR starts_with($4, lease.owner || '#')
                          OR (octet_length(lease.owner) > 239 AND octet_length($4) > 252
                              AND $4 ~ '#[0-9a-f]{16}$'
                              AND starts_with(lease.owner, left($4, length($4) - 17))))
             ) THEN 'lease'"
                .to_owned(),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "s AS MATERIALIZED (
             SELECT live, last_seq, mark, mark_writer
             FROM {sessions} WHERE session_id = $1 FOR UPDATE
         ),
         {lease_cte}
         chk AS MATERIALIZED (
             SELECT CASE
                 WHEN pg_current_wal_lsn() < $9::pg_lsn THEN 'lsn'
                 WHEN $6 <> '' AND NOT EXISTS (
                     SELECT 1 FROM {authority} a WHERE a.marker = $6
                 ) THEN 'authority'
                 WHEN s.last_seq IS NULL THEN
                     CASE WHEN $7 > 0 OR $8 IS NOT NULL THEN 'rewound' ELSE 'notfound' END
                 WHEN s.last_seq < $7
                     OR ($8 IS NOT NULL AND (s.mark IS NULL OR s.mark < $8::numeric))
                     THEN 'rewound'
                 WHEN NOT s.live THEN 'notfound'
                 WHEN NOT $2 THEN
                     CASE WHEN NOT ($5 AND s.mark IS NULL) THEN 'unfenced' {position} ELSE 'ok' END
                 WHEN s.mark IS NOT NULL AND ($3::numeric < s.mark
                     OR ($3::numeric = s.mark AND s.mark_writer <> $4)) THEN 'fenced'
                 {lease_check}
                 {position}
                 ELSE 'ok'
             END AS verdict
             FROM (SELECT 1) AS one LEFT JOIN s ON true
         )"
    )
}

/// The answer of both fenced writes, one row: verdict, the row's sequence
/// number, mark and writer as locked, the new last sequence number, how
/// many events were written, how many notifications sent, the recorded
/// authority, the log position, and the lease row (owner, token, live)
/// when checked.
fn answer(t: &Tables, leases: Option<&str>, written: &str) -> String {
    let authority = &t.authority;
    let (lease_cols, lease_join) = match leases {
        Some(_) => (
            "lease.owner, lease.token::text, lease.live",
            "LEFT JOIN lease ON true",
        ),
        None => ("NULL::text, NULL::text, NULL::boolean", ""),
    };
    format!(
        "SELECT chk.verdict, s.last_seq, s.mark::text, s.mark_writer, up.last_seq,
                {written}, (SELECT count(*) FROM note),
                (SELECT a.authority FROM {authority} a), {LSN}, {lease_cols}
         FROM chk LEFT JOIN s ON true LEFT JOIN up ON true {lease_join}"
    )
}

/// The mark after an accepted fenced write: raised to a higher token and
/// bound to its writer. `col` is `mark` or `mark_writer`.
fn raised(col: &str, to: &str) -> String {
    format!(
        "{col} = CASE WHEN $2 AND (t.mark IS NULL OR $3::numeric > t.mark)
                      THEN {to} ELSE t.{col} END"
    )
}

/// Append: the guard, then (under `'ok'`) the session's last sequence
/// number raised by the batch, the mark raised, every event inserted from
/// `unnest($10)` (the serialised events, with $11 their sizes) under the
/// numbers that follow the locked row's, and the session's id notified on
/// the channel. All or nothing: one statement. With `$12` not null, only
/// onto a log whose last sequence number it is (else `'moved'`, nothing
/// written).
fn append(t: &Tables, leases: Option<&str>) -> String {
    let (sessions, events, channel) = (&t.sessions, &t.events, &t.channel);
    format!(
        "WITH {guard},
         up AS (
             UPDATE {sessions} t SET
                 last_seq = t.last_seq + cardinality($10::text[]),
                 {mark},
                 {writer}
             FROM chk
             WHERE t.session_id = $1 AND chk.verdict = 'ok'
             RETURNING t.last_seq
         ),
         ins AS (
             INSERT INTO {events} (session_id, seq, token, writer, at, bytes, payload)
             SELECT $1, up.last_seq - cardinality($10::text[]) + p.n, $3::numeric, $4, now(),
                    p.bytes, p.payload::json
             FROM up, unnest($10::text[], $11::int4[]) WITH ORDINALITY AS p(payload, bytes, n)
             RETURNING seq
         ),
         note AS MATERIALIZED (SELECT pg_notify('{channel}', $1) FROM up)
         {answer}",
        guard = guard(
            t,
            leases,
            "WHEN $12::int8 IS NOT NULL AND s.last_seq <> $12::int8 THEN 'moved'"
        ),
        mark = raised("mark", "$3::numeric"),
        writer = raised("mark_writer", "$4"),
        answer = answer(t, leases, "(SELECT count(*) FROM ins)"),
    )
}

/// Delete: the guard, then (under `'ok'`) the session marked not live,
/// the events of this life hidden (`erased_through`) and removed, the mark
/// raised, and the deletion notified (waiters learn it is gone). Events
/// committed by an append that raced the deletion's snapshot are hidden
/// all the same, and removed by the session's next deletion.
fn delete(t: &Tables, leases: Option<&str>) -> String {
    let (sessions, events, channel) = (&t.sessions, &t.events, &t.channel);
    format!(
        "WITH {guard},
         up AS (
             UPDATE {sessions} t SET
                 live = false,
                 erased_through = t.last_seq,
                 {mark},
                 {writer}
             FROM chk
             WHERE t.session_id = $1 AND chk.verdict = 'ok'
             RETURNING t.last_seq
         ),
         gone AS (
             DELETE FROM {events} e USING up
             WHERE e.session_id = $1 AND e.seq <= up.last_seq
         ),
         note AS MATERIALIZED (SELECT pg_notify('{channel}', $1) FROM up)
         {answer}",
        guard = guard(t, leases, ""),
        mark = raised("mark", "$3::numeric"),
        writer = raised("mark_writer", "$4"),
        answer = answer(t, leases, "NULL::bigint"),
    )
}

/// $1 session, $2 and $3 the sequence number and mark this client saw of
/// it, $4 the log position it saw. A new id inserts its row; a deleted
/// session's row comes back to life with its mark and last sequence
/// number. Answers the verdict, whether it created, the row as it was,
/// and the log position.
fn create(sessions: &str) -> String {
    format!(
        "WITH prev AS MATERIALIZED (
             SELECT live, last_seq, mark FROM {sessions} WHERE session_id = $1 FOR UPDATE
         ),
         chk AS MATERIALIZED (
             SELECT CASE
                 WHEN pg_current_wal_lsn() < $4::pg_lsn THEN 'lsn'
                 WHEN prev.last_seq IS NULL THEN
                     CASE WHEN $2 > 0 OR $3 IS NOT NULL THEN 'rewound' ELSE 'new' END
                 WHEN prev.last_seq < $2
                     OR ($3 IS NOT NULL AND (prev.mark IS NULL OR prev.mark < $3::numeric))
                     THEN 'rewound'
                 WHEN prev.live THEN 'exists'
                 ELSE 'again'
             END AS verdict
             FROM (SELECT 1) AS one LEFT JOIN prev ON true
         ),
         ins AS (
             INSERT INTO {sessions} (session_id, live)
             SELECT $1, true FROM chk WHERE chk.verdict = 'new'
             ON CONFLICT (session_id) DO NOTHING
             RETURNING 1
         ),
         up AS (
             UPDATE {sessions} t SET live = true
             FROM chk WHERE t.session_id = $1 AND chk.verdict = 'again'
             RETURNING 1
         )
         SELECT chk.verdict, (SELECT count(*) FROM ins) + (SELECT count(*) FROM up),
                prev.last_seq, prev.mark::text, {LSN}
         FROM chk LEFT JOIN prev ON true"
    )
}

/// $1 session, $2 first sequence number, $3 the most events, $4 the most
/// bytes. One snapshot reads the row and the page, so a page never holds
/// part of a batch. One row per event read plus the one after the page
/// (its payload left out, its number the next page's start); no event
/// row, only the session's, when there are none. Payloads past the byte
/// budget are never sent: a row goes out when the one before it was kept
/// (the first always is). Columns: live, last sequence number, mark, then
/// the event's seq, token, time in ms, payload (NULL past the page), log
/// position.
fn read(t: &Tables) -> String {
    let (sessions, events) = (&t.sessions, &t.events);
    format!(
        "SELECT s.live, s.last_seq, s.mark::text, p.seq, p.token, p.at_ms,
                CASE WHEN p.rn <= $3 AND (p.rn = 1 OR p.used <= $4) THEN p.payload::text END,
                {LSN}
         FROM {sessions} s
         LEFT JOIN LATERAL (
             SELECT q.*, row_number() OVER w AS rn, sum(q.bytes) OVER w AS used
             FROM (
                 SELECT e.seq, e.token::text AS token,
                        floor(extract(epoch FROM e.at) * 1000)::bigint AS at_ms,
                        e.bytes, e.payload
                 FROM {events} e
                 WHERE s.live AND e.session_id = s.session_id
                     AND e.seq > s.erased_through AND e.seq >= $2
                 ORDER BY e.seq
                 LIMIT $3 + 1
             ) q
             WINDOW w AS (ORDER BY q.seq ROWS UNBOUNDED PRECEDING)
         ) p ON true
         WHERE s.session_id = $1 AND (p.rn IS NULL OR p.rn <= 2 OR p.used - p.bytes <= $4)
         ORDER BY p.seq"
    )
}

/// $1 session, $2 the run's token (decimal text), $3 the notification's
/// payload. Records a request for a live session only: raises the run to
/// $2 unless a later run is recorded, counting the request (a request for
/// an earlier run changes nothing), and notifies the session's waiters in
/// the same transaction. Columns: whether the session is live, the count
/// now (NULL when nothing was recorded), the notifications sent.
fn request_cancel(t: &Tables) -> String {
    let (sessions, cancels, channel) = (&t.sessions, &t.cancels, &t.channel);
    format!(
        "WITH s AS (SELECT session_id FROM {sessions} WHERE session_id = $1 AND live),
         rec AS (
             INSERT INTO {cancels} AS c (session_id, run, serial)
             SELECT session_id, $2::numeric, 1 FROM s
             ON CONFLICT (session_id) DO UPDATE SET run = EXCLUDED.run, serial = c.serial + 1
                 WHERE c.run <= EXCLUDED.run
             RETURNING serial
         ),
         note AS MATERIALIZED (SELECT pg_notify('{channel}', $3) FROM rec)
         SELECT EXISTS (SELECT 1 FROM s), (SELECT serial FROM rec), (SELECT count(*) FROM note)"
    )
}
