//! Between port values and wire messages. Remaining time, never wall-clock
//! time, crosses the wire: each side reads its own clock.

use std::time::{Duration, SystemTime};

use lease_port::{FencingToken, Lease, LeaseError, OwnerId, SessionId};

use crate::pb;

/// The wire form of `lease` as the server sends it: remaining time judged
/// on the server's clock at `now`, and the authority that granted it.
#[cfg(feature = "server")]
pub(crate) fn lease_to_wire(lease: &Lease, now: SystemTime, authority: &str) -> pb::Lease {
    let remaining = lease.expiry().duration_since(now).unwrap_or(Duration::ZERO);
    pb::Lease {
        session_id: lease.session_id().as_str().to_owned(),
        owner: lease.owner().as_str().to_owned(),
        token: lease.token().get(),
        remaining: Some(duration_to_wire(remaining)),
        authority: authority.to_owned(),
    }
}

#[cfg(feature = "server")]
pub(crate) fn duration_to_wire(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

pub(crate) fn duration_from_wire(d: &prost_types::Duration) -> Result<Duration, LeaseError> {
    let secs = u64::try_from(d.seconds)
        .map_err(|_| LeaseError::invalid("the lease service sent a negative remaining time"))?;
    let nanos = u32::try_from(d.nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| LeaseError::invalid("the lease service sent a malformed duration"))?;
    Ok(Duration::new(secs, nanos))
}

/// The wire reference to a grant, as the client sends it.
pub(crate) fn lease_ref(lease: &Lease) -> pb::LeaseRef {
    pb::LeaseRef {
        session_id: lease.session_id().as_str().to_owned(),
        owner: lease.owner().as_str().to_owned(),
        token: lease.token().get(),
    }
}

/// A grant named on the wire, as the server receives it. The expiry is a
/// placeholder: backends identify a grant by session, owner and token.
#[cfg(feature = "server")]
pub(crate) fn lease_from_ref(
    r: Option<&pb::LeaseRef>,
    now: SystemTime,
) -> Result<Lease, LeaseError> {
    // A token no grant carries (0, say) is not malformed: it names a lease
    // the caller does not hold, and the backend answers that as such.
    let r = r.ok_or_else(|| LeaseError::invalid("the request names no lease"))?;
    Ok(Lease::new(
        SessionId::new(&r.session_id)?,
        OwnerId::new(&r.owner)?,
        FencingToken::new(r.token),
        now,
    ))
}

/// The grant a client believes in, from the server's answer to a request
/// it sent at `sent` for `session` and `owner`: the expiry is counted from
/// the sending, so a slow answer never lengthens it. An answer about any
/// other session or owner, or with token 0, is refused.
pub(crate) fn lease_from_wire(
    wire: Option<&pb::Lease>,
    session: &SessionId,
    owner: &OwnerId,
    sent: SystemTime,
) -> Result<Lease, LeaseError> {
    let wire = wire.ok_or_else(|| LeaseError::transient("the lease service answered no lease"))?;
    if wire.session_id != session.as_str() || wire.owner != owner.as_str() {
        return Err(LeaseError::invalid(format!(
            "the lease service answered for {}/{} when asked for {session}/{owner}",
            wire.session_id, wire.owner
        )));
    }
    if wire.token == 0 {
        return Err(LeaseError::invalid("the lease service granted token 0"));
    }
    let remaining = wire
        .remaining
        .as_ref()
        .map(duration_from_wire)
        .transpose()?
        .ok_or_else(|| LeaseError::invalid("the lease service sent no remaining time"))?;
    let expiry = sent
        .checked_add(remaining)
        .ok_or_else(|| LeaseError::invalid("the remaining time overflows the clock"))?;
    Ok(Lease::new(
        session.clone(),
        owner.clone(),
        FencingToken::new(wire.token),
        expiry,
    ))
}

// Both ends meet here, so the server's too.
#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_counted_from_the_sending() {
        let (s, o) = (SessionId::new("s").unwrap(), OwnerId::new("o").unwrap());
        let server_now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let granted = Lease::new(
            s.clone(),
            o.clone(),
            FencingToken::new(7),
            server_now + Duration::from_secs(10),
        );
        let wire = lease_to_wire(&granted, server_now, "a");
        // The client's clock is an hour off; only the difference matters.
        let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(4600);
        let lease = lease_from_wire(Some(&wire), &s, &o, sent).unwrap();
        assert_eq!(lease.expiry(), sent + Duration::from_secs(10));
        assert_eq!(lease.token(), FencingToken::new(7));
    }

    #[test]
    fn answers_about_something_else_are_refused() {
        let (s, o) = (SessionId::new("s").unwrap(), OwnerId::new("o").unwrap());
        let mut wire = pb::Lease {
            session_id: "other".into(),
            owner: "o".into(),
            token: 1,
            remaining: Some(duration_to_wire(Duration::from_secs(1))),
            authority: String::new(),
        };
        let now = SystemTime::now();
        assert!(lease_from_wire(Some(&wire), &s, &o, now).is_err());
        wire.session_id = "s".into();
        wire.token = 0;
        assert!(lease_from_wire(Some(&wire), &s, &o, now).is_err());
        wire.token = 1;
        wire.remaining = Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        });
        assert!(lease_from_wire(Some(&wire), &s, &o, now).is_err());
        wire.remaining = None;
        assert!(lease_from_wire(Some(&wire), &s, &o, now).is_err());
    }

    #[test]
    fn refs_are_validated() {
        let now = SystemTime::now();
        assert!(lease_from_ref(None, now).is_err());
        let bad = pb::LeaseRef {
            session_id: String::new(),
            owner: "o".into(),
            token: 1,
        };
        assert!(lease_from_ref(Some(&bad), now).is_err());
    }
}
