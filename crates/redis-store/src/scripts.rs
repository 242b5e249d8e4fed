//! The Lua scripts: every check and the write it guards run as one script,
//! so Redis executes them with nothing in between. A script's writes reach
//! the append-only file together (wrapped in MULTI/EXEC), so a crash never
//! leaves half of one.
//!
//! Numbers that must stay exact (tokens, sequence numbers) travel and are
//! stored as decimal strings: Lua 5.1 numbers are doubles, and `tostring`
//! of a large one prints an exponent. Tokens are compared by length, then
//! byte by byte (never with `<` on strings, which follows the server's
//! collation locale).

use std::sync::LazyLock;

use redis::Script;

/// A script that writes, wrapped so Redis keeps the prefix's change
/// counter (see [`Keys::clock`](crate::keys::Keys::clock)): KEYS[1] is the
/// counter and ARGV[1] the highest value the caller saw; the body sees the
/// rest as its KEYS and ARGV. Below the caller's value the script refuses
/// before the body runs (`{'rewound', now, seen}`); otherwise the body runs
/// and the counter advances, and the reply is `{'clock', counter, body's
/// reply}`. An error reply of the body passes through as it is (nothing
/// was written then, as the body guarantees).
fn clocked(body: &str) -> Script {
    Script::new(&format!(
        "{CLOCK_CHECK}local function body(KEYS, ARGV)\n{body}\nend\n\
         local out = body(K, A)\n\
         if type(out) == 'table' and out.err then return out end\n\
         return {{'clock', redis.call('INCR', KEYS[1]), out}}\n"
    ))
}

/// A script that only reads: the same check and reply as [`clocked`],
/// without advancing the counter.
fn clocked_read(body: &str) -> Script {
    Script::new(&format!(
        "{CLOCK_CHECK}local function body(KEYS, ARGV)\n{body}\nend\n\
         return {{'clock', clock_now, body(K, A)}}\n"
    ))
}

/// The counter compared with the caller's floor, then the caller's keys
/// and arguments without the counter's, for the body.
const CLOCK_CHECK: &str = r#"
local clock_now = tonumber(redis.call('GET', KEYS[1]) or '0')
local clock_seen = tonumber(ARGV[1])
if clock_now < clock_seen then return {'rewound', clock_now, clock_seen} end
local K, A = {}, {}
for i = 2, #KEYS do K[i - 1] = KEYS[i] end
for i = 2, #ARGV do A[i - 1] = ARGV[i] end
"#;

/// The fence check shared by append and delete.
///
/// Besides the prefix's counter ([`clocked`]), each session's record only
/// grows: its sequence number and its mark are never lowered, not even by
/// a deletion. A record below what this client saw of it went back, which
/// the counter alone can miss once other processes' writes after a loss
/// carried it past this client's floor.
///
/// KEYS: 1 record, 2 events, 3 fencing authority, 4 the session's lease
/// token record when the store is fenced by its own leases, else `''`.
/// ARGV: 1 `f` (fenced) or `u` (unfenced), 2 token, 3 owner, 4 `1` when
/// unfenced writes are allowed, 5 the authority this client bound (empty:
/// none), 6 the time in milliseconds, 7 and 8 the highest sequence number
/// and mark this client saw of the session (`0`: none).
///
/// A record below what the client saw went back; so did a token record
/// below the token presented (`{'unissued', issued}`): no lease of this
/// Redis issued that token, so Redis lost the grant that did.
///
/// Leaves `r` (the record's fields) and `raise` (whether the write raises
/// the mark) for the body; returns early with a refusal.
/// `cmp(a, b)`: -1, 0 or 1 as decimal strings `a` and `b` compare as the
/// numbers they spell.
macro_rules! cmp {
    () => {
        r#"
local function cmp(a, b)
  if #a ~= #b then
    if #a < #b then return -1 else return 1 end
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      if x < y then return -1 else return 1 end
    end
  end
  return 0
end
"#
    };
}

macro_rules! fence_check {
    () => {
        concat!(
            cmp!(),
            r#"
if ARGV[5] ~= '' then
  local bound = redis.call('GET', KEYS[3])
  if bound ~= ARGV[5] then return {'authority', bound} end
end
local r = redis.call('HMGET', KEYS[1], 'live', 'seq', 'mark', 'writer')
if cmp(r[2] or '0', ARGV[7]) < 0 or cmp(r[3] or '0', ARGV[8]) < 0 then
  return {'rewound', r[2] or '0', r[3] or '0'}
end
if r[1] ~= '1' then return {'notfound'} end
if ARGV[1] == 'f' and KEYS[4] ~= '' then
  local issued = redis.call('HGET', KEYS[4], 'issued') or '0'
  if cmp(ARGV[2], issued) > 0 then return {'unissued', issued} end
end
local raise = false
if ARGV[1] == 'f' then
  if r[3] then
    local c = cmp(ARGV[2], r[3])
    if c < 0 or (c == 0 and r[4] ~= ARGV[3]) then return {'fenced', r[3], r[4]} end
    raise = c > 0
  else
    raise = true
  end
elseif ARGV[4] ~= '1' or r[3] then
  return {'unfenced', r[3]}
end
"#
        )
    };
}

/// Appends ARGV[12..] as events after the fence check, then publishes
/// ARGV[10] (the session id) on the channel ARGV[9] for the processes
/// waiting on it. With ARGV[11] not empty, only onto a log whose last
/// sequence number it is: else `moved` and the number, nothing written. Only the first `XADD` can fail (when the stream's last
/// entry is not the recorded sequence number); it is called with `pcall`
/// before anything else is written, so such a refusal writes nothing. The
/// later ones add strictly greater ids and cannot fail. A first `XADD`
/// refused for another reason (Redis out of memory) is the script's error,
/// as the command's would be: nothing was written. The publish is a
/// `pcall` too: a user whose ACL allows it no channel still appends, and
/// its waiters read on their own schedule.
pub(crate) static APPEND: LazyLock<Script> = LazyLock::new(|| {
    clocked(concat!(
        fence_check!(),
        r#"
if ARGV[11] ~= '' and (r[2] or '0') ~= ARGV[11] then return {'moved', r[2] or '0'} end
local seq = tonumber(r[2] or '0')
local first = seq + 1
for i = 12, #ARGV do
  seq = seq + 1
  local id = string.format('%d-0', seq)
  local added
  if ARGV[1] == 'f' then
    added = redis.pcall('XADD', KEYS[2], id, 'ts', ARGV[6], 'k', ARGV[2], 'w', ARGV[3], 'p', ARGV[i])
  else
    added = redis.pcall('XADD', KEYS[2], id, 'ts', ARGV[6], 'p', ARGV[i])
  end
  if type(added) == 'table' and added.err then
    if i == 12 and not string.find(added.err, 'equal or smaller', 1, true) then
      return redis.error_reply(added.err)
    end
    return {'corrupt', added.err, id}
  end
end
redis.call('HSET', KEYS[1], 'seq', string.format('%d', seq))
if raise then redis.call('HSET', KEYS[1], 'mark', ARGV[2], 'writer', ARGV[3]) end
redis.pcall('PUBLISH', ARGV[9], ARGV[10])
return {'ok', string.format('%d', first), string.format('%d', seq)}
"#
    ))
});

/// Deletes after the fence check: the events go, the record (sequence
/// number, mark) stays with `live` 0. KEYS[5] the session list, ARGV[9]
/// the session id.
pub(crate) static DELETE: LazyLock<Script> = LazyLock::new(|| {
    clocked(concat!(
        fence_check!(),
        r#"
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'live', '0')
if raise then redis.call('HSET', KEYS[1], 'mark', ARGV[2], 'writer', ARGV[3]) end
redis.call('ZREM', KEYS[5], ARGV[9])
return {'ok'}
"#
    ))
});

/// KEYS: 1 record, 2 events, 3 session list. ARGV: 1 session id.
pub(crate) static CREATE: LazyLock<Script> = LazyLock::new(|| {
    clocked(
        r#"
if redis.call('HGET', KEYS[1], 'live') == '1' then return 'exists' end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'live', '1')
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return 'ok'
"#,
    )
});

/// KEYS: 1 record, 2 events. ARGV: 1 first entry id, 2 count, 3 and 4 the
/// highest sequence number and mark this client saw of the session. Nil
/// when the session does not exist; else `{'page', seq, mark, entries}`
/// with the record's sequence number and mark, or a refusal when the
/// record is below what the client saw.
pub(crate) static READ: LazyLock<Script> = LazyLock::new(|| {
    clocked_read(concat!(
        cmp!(),
        r#"
local r = redis.call('HMGET', KEYS[1], 'live', 'seq', 'mark')
if cmp(r[2] or '0', ARGV[3]) < 0 or cmp(r[3] or '0', ARGV[4]) < 0 then
  return {'rewound', r[2] or '0', r[3] or '0'}
end
if r[1] ~= '1' then return false end
return {'page', r[2] or '0', r[3] or '0', redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', ARGV[2])}
"#
    ))
});

/// KEYS: 1 a key. ARGV: 1 a candidate value. Sets the key to the candidate
/// unless it has a value, and answers the value it has.
pub(crate) static GET_OR_SET: LazyLock<Script> = LazyLock::new(|| {
    clocked(
        r#"
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"#,
    )
});

/// KEYS: 1 lease, 2 token record, 3 lease authority. ARGV: 1 owner, 2 TTL
/// in milliseconds, 3 the authority the client knows, 4 the floor: the
/// token must exceed it (`0`: none).
///
/// The token record is a hash that never expires: `issued`, the last token
/// handed out (only ever raised), and `grant`, the last grant made
/// (emptied by its release). The live holder re-acquiring keeps its token
/// while it is above the floor; anyone taking a free lease gets the next
/// token, above the floor: `issued` is first raised to the floor, so every
/// later takeover stays above it too. Answers `{'ok', token, 'kept'}` for
/// the live holder keeping its token, `{'ok', token, 'new'}` for a new
/// grant.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    clocked(concat!(
        cmp!(),
        r#"
local auth = redis.call('GET', KEYS[3])
if auth ~= ARGV[3] then return {'authority', auth} end
local held = redis.call('GET', KEYS[1])
if held then
  local sp = string.find(held, ' ', 1, true)
  if not sp then return {'corrupt', held} end
  local owner = string.sub(held, sp + 1)
  if owner ~= ARGV[1] then return {'held', owner} end
  local mine = string.sub(held, 1, sp - 1)
  if cmp(mine, ARGV[4]) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {'ok', mine, 'kept'}
  end
end
local issued = redis.call('HGET', KEYS[2], 'issued') or '0'
if cmp(issued, ARGV[4]) < 0 then redis.call('HSET', KEYS[2], 'issued', ARGV[4]) end
redis.call('HINCRBY', KEYS[2], 'issued', 1)
local token = redis.call('HGET', KEYS[2], 'issued')
local grant = token .. ' ' .. ARGV[1]
redis.call('HSET', KEYS[2], 'grant', grant)
redis.call('SET', KEYS[1], grant, 'PX', ARGV[2])
return {'ok', token, 'new'}
"#
    ))
});

/// KEYS: for each lease, its grant key then its token record. ARGV: 1 TTL
/// in milliseconds, then for each lease the grant `"<token> <owner>"` the
/// caller holds. Answers, per lease, 1 (renewed), the grant held instead,
/// 0 (nobody holds it and it cannot be reclaimed), or -1: the token was
/// never issued here (the token record is below it, so Redis went back).
///
/// A lapsed grant is reclaimed only while it is still the last grant made:
/// nobody acquired since (that makes a new grant) and its holder did not
/// release it (that empties the record). Otherwise it is lost.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    clocked(concat!(
        cmp!(),
        r#"
local out = {}
for i = 1, #KEYS / 2 do
  local lease, tokens = KEYS[2 * i - 1], KEYS[2 * i]
  local want = ARGV[i + 1]
  local held = redis.call('GET', lease)
  local sp = string.find(want, ' ', 1, true)
  local issued = redis.call('HGET', tokens, 'issued') or '0'
  if sp and cmp(string.sub(want, 1, sp - 1), issued) > 0 then
    out[i] = -1
  elseif held == want then
    redis.call('PEXPIRE', lease, ARGV[1])
    out[i] = 1
  elseif held then
    out[i] = held
  elseif redis.call('HGET', tokens, 'grant') == want then
    redis.call('SET', lease, want, 'PX', ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#
    ))
});

/// KEYS: 1 lease, 2 token record. ARGV: 1 the grant `"<token> <owner>"`.
/// Deletes the lease only while it is that grant, and forgets the grant so
/// a late renew cannot reclaim it.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    clocked(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'grant', '')
  return 1
end
return 0
"#,
    )
});

/// KEYS: 1 lease. The grant and its remaining milliseconds, in one step.
pub(crate) static CURRENT: LazyLock<Script> = LazyLock::new(|| {
    clocked_read(
        r#"
local held = redis.call('GET', KEYS[1])
if not held then return false end
return {held, redis.call('PTTL', KEYS[1])}
"#,
    )
});

/// KEYS: 1 the session's record. Its high-water mark, or false.
pub(crate) static HIGH_WATER: LazyLock<Script> =
    LazyLock::new(|| clocked_read("return redis.call('HGET', KEYS[1], 'mark')"));

/// KEYS: 1 the session's cancel record (a hash of `run` and `serial`).
/// ARGV: 1 the run's token, 2 the appends' channel, 3 the cancel message.
/// Raises `run` to it unless a later run is recorded, counts the request,
/// and publishes the message, best effort like an append's, so the
/// holder's wait wakes. Compared as strings of digits by length first, so
/// tokens above 2^53 compare exactly.
pub(crate) static RECORD_CANCEL: LazyLock<Script> = LazyLock::new(|| {
    clocked(
        r#"
local run = redis.call('HGET', KEYS[1], 'run')
local new = ARGV[1]
if run and (#run > #new or (#run == #new and run > new)) then
  return 0
end
redis.call('HSET', KEYS[1], 'run', new)
local serial = redis.call('HINCRBY', KEYS[1], 'serial', 1)
redis.pcall('PUBLISH', ARGV[2], ARGV[3])
return serial
"#,
    )
});

/// KEYS: 1 the session's cancel record. Its `run` and `serial`.
pub(crate) static CANCEL_REQUEST: LazyLock<Script> =
    LazyLock::new(|| clocked_read("return redis.call('HMGET', KEYS[1], 'run', 'serial')"));
