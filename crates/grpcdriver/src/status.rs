//! Errors on the wire: a [`LeaseError`] becomes a gRPC status with a
//! `google.rpc.ErrorInfo` detail (domain [`ERROR_DOMAIN`], reason one of
//! [`Reason`]), and a status becomes a [`LeaseError`] again — keyed on the
//! reason, never on the message text.

#[cfg(feature = "server")]
use std::collections::HashMap;

#[cfg(feature = "server")]
use lease_port::LeaseErrorKind;
use lease_port::{LeaseError, OwnerId};
use tonic::{Code, Status};
#[cfg(feature = "server")]
use tonic_types::ErrorDetails;
use tonic_types::StatusExt;

use crate::pb::{Failure, Reason};

/// The `ErrorInfo.domain` of every error this service sends.
pub const ERROR_DOMAIN: &str = "lease.mecatl.dev";

/// The `ErrorInfo.metadata` key naming the live holder.
const HOLDER_KEY: &str = "holder";

/// Which call failed: the same backend answer maps to a different status
/// depending on it (held on acquire is a conflict; held on renew means the
/// caller's token is stale).
#[cfg(feature = "server")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Acquire,
    Renew,
    Release,
    Get,
}

/// The reason a backend error is sent under.
#[cfg(feature = "server")]
pub(crate) fn reason_of(call: Call, e: &LeaseError) -> Reason {
    match e.kind() {
        LeaseErrorKind::Held if call == Call::Acquire => Reason::HeldElsewhere,
        LeaseErrorKind::Held => Reason::LeaseLost,
        LeaseErrorKind::Invalid => Reason::Invalid,
        LeaseErrorKind::Unsupported if call == Call::Get => Reason::MethodUnsupported,
        LeaseErrorKind::Unsupported => Reason::BackendUnsupported,
        LeaseErrorKind::Rewound => Reason::StateRewound,
        // Transient, and any kind added later: a client retries.
        _ => Reason::Unavailable,
    }
}

#[cfg(feature = "server")]
fn code_of(reason: Reason) -> Code {
    match reason {
        // FAILED_PRECONDITION is gRPC's "do not retry until the system's
        // state is fixed": true of a lease held by another owner and of an
        // authority whose state went back. The reason tells them apart.
        Reason::HeldElsewhere | Reason::StateRewound => Code::FailedPrecondition,
        Reason::LeaseLost => Code::Aborted,
        Reason::Invalid => Code::InvalidArgument,
        Reason::BackendUnsupported | Reason::MethodUnsupported => Code::Unimplemented,
        Reason::Unauthenticated => Code::Unauthenticated,
        Reason::NotPermitted => Code::PermissionDenied,
        Reason::Unavailable | Reason::Unspecified => Code::Unavailable,
    }
}

/// A status for a failed call, carrying the reason and the holder.
#[cfg(feature = "server")]
pub(crate) fn to_status(call: Call, e: &LeaseError) -> Status {
    reason_status(reason_of(call, e), e.message(), e.holder())
}

/// A status for `reason`, as the server sends it.
#[cfg(feature = "server")]
pub(crate) fn reason_status(reason: Reason, message: &str, holder: Option<&OwnerId>) -> Status {
    let mut metadata = HashMap::new();
    if let Some(h) = holder {
        metadata.insert(HOLDER_KEY.to_owned(), h.as_str().to_owned());
    }
    Status::with_error_details(
        code_of(reason),
        message,
        ErrorDetails::with_error_info(reason.as_str_name(), ERROR_DOMAIN, metadata),
    )
}

/// One lease's failure inside a batch answer.
#[cfg(feature = "server")]
pub(crate) fn to_failure(e: &LeaseError) -> Failure {
    Failure {
        reason: reason_of(Call::Renew, e).into(),
        message: e.message().to_owned(),
        holder: e
            .holder()
            .map(|h| h.as_str().to_owned())
            .unwrap_or_default(),
    }
}

/// What a failed call means to the client.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A lease answer: held, invalid, transient, unsupported.
    Lease(LeaseError),
    /// The server does not offer this optional method: fall back.
    MethodMissing,
}

/// Decodes a failed call. `optional` says whether the method is one a
/// server may lack (then a plain UNIMPLEMENTED means "fall back"); for a
/// required method a plain UNIMPLEMENTED means the address serves something
/// else, which is a misconfiguration, never "the backend cannot lease".
pub(crate) fn from_status(status: &Status, optional: bool) -> Refusal {
    if let Some(info) = status.get_details_error_info()
        && info.domain == ERROR_DOMAIN
        && let Some(reason) = Reason::from_str_name(&info.reason)
    {
        let holder = info
            .metadata
            .get(HOLDER_KEY)
            .and_then(|h| OwnerId::new(h).ok());
        return from_reason(reason, status.message(), holder, Some(status));
    }
    let message = status.message();
    let e = match status.code() {
        Code::Unimplemented if optional => return Refusal::MethodMissing,
        Code::Unimplemented => LeaseError::invalid(format!(
            "the server does not serve {}: {message}",
            crate::pb::SERVICE_NAME
        )),
        Code::InvalidArgument | Code::OutOfRange => {
            LeaseError::invalid(format!("the lease service refused the request: {message}"))
        }
        Code::Unauthenticated | Code::PermissionDenied => LeaseError::invalid(format!(
            "the lease service refused the credentials ({:?}): {message}",
            status.code()
        )),
        // Without our reason a FAILED_PRECONDITION or ABORTED is not known
        // to be about the lease (a proxy may say it): retrying is safe,
        // treating it as loss of a lease we may still hold is not needed.
        _ => LeaseError::transient(format!(
            "the lease service failed ({:?}): {message}",
            status.code()
        )),
    };
    Refusal::Lease(e.with_source(status.clone()))
}

fn from_reason(
    reason: Reason,
    message: &str,
    holder: Option<OwnerId>,
    status: Option<&Status>,
) -> Refusal {
    let e = match reason {
        Reason::HeldElsewhere | Reason::LeaseLost => {
            let e = LeaseError::held(holder);
            return Refusal::Lease(match status {
                Some(s) => e.with_source(s.clone()),
                None => e,
            });
        }
        Reason::Invalid => LeaseError::invalid(message.to_owned()),
        Reason::BackendUnsupported => LeaseError::unsupported(message.to_owned()),
        Reason::MethodUnsupported => return Refusal::MethodMissing,
        Reason::Unauthenticated => LeaseError::invalid(format!(
            "the lease service refused the credentials: {message}"
        )),
        Reason::NotPermitted => LeaseError::invalid(format!(
            "the lease service does not let this client act for that owner: {message}"
        )),
        Reason::StateRewound => LeaseError::rewound(message.to_owned()),
        Reason::Unavailable | Reason::Unspecified => LeaseError::transient(message.to_owned()),
    };
    Refusal::Lease(match status {
        Some(s) => e.with_source(s.clone()),
        None => e,
    })
}

/// Decodes one lease's failure inside a batch answer.
pub(crate) fn from_failure(f: &Failure) -> LeaseError {
    let reason = Reason::try_from(f.reason).unwrap_or(Reason::Unspecified);
    let holder = (!f.holder.is_empty())
        .then(|| OwnerId::new(&f.holder).ok())
        .flatten();
    match from_reason(reason, &f.message, holder, None) {
        Refusal::Lease(e) => e,
        // Renewal is not optional; a server saying so is broken.
        Refusal::MethodMissing => LeaseError::transient(format!(
            "the lease service answered a renewal with {}: {}",
            reason.as_str_name(),
            f.message
        )),
    }
}

// Round trips: both ends, so the server's too.
#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;

    fn round_trip(call: Call, e: LeaseError) -> LeaseError {
        match from_status(&to_status(call, &e), false) {
            Refusal::Lease(e) => e,
            Refusal::MethodMissing => panic!("not a missing method"),
        }
    }

    #[test]
    fn every_kind_survives_the_wire_with_its_holder() {
        let holder = OwnerId::new("b").unwrap();
        let held = round_trip(Call::Acquire, LeaseError::held(Some(holder.clone())));
        assert_eq!(held.kind(), LeaseErrorKind::Held);
        assert_eq!(held.holder(), Some(&holder));
        let lost = round_trip(Call::Renew, LeaseError::held(None));
        assert_eq!(lost.kind(), LeaseErrorKind::Held);
        assert_eq!(lost.holder(), None);
        for kind in [
            LeaseErrorKind::Invalid,
            LeaseErrorKind::Transient,
            LeaseErrorKind::Unsupported,
            LeaseErrorKind::Rewound,
        ] {
            let e = round_trip(Call::Renew, LeaseError::new(kind, "x"));
            assert_eq!(e.kind(), kind);
        }
    }

    #[test]
    fn statuses_follow_the_documented_codes() {
        let held = LeaseError::held(None);
        assert_eq!(
            to_status(Call::Acquire, &held).code(),
            Code::FailedPrecondition
        );
        assert_eq!(to_status(Call::Renew, &held).code(), Code::Aborted);
        let unsupported = LeaseError::unsupported("no");
        assert_eq!(
            to_status(Call::Get, &unsupported).code(),
            Code::Unimplemented
        );
        assert!(matches!(
            from_status(&to_status(Call::Get, &unsupported), false),
            Refusal::MethodMissing
        ));
        assert_eq!(
            to_status(Call::Release, &LeaseError::transient("x")).code(),
            Code::Unavailable
        );
        let rewound = LeaseError::rewound("went back");
        for call in [Call::Acquire, Call::Renew, Call::Release, Call::Get] {
            let status = to_status(call, &rewound);
            assert_eq!(status.code(), Code::FailedPrecondition, "{call:?}");
            let info = status.get_details_error_info().expect("an ErrorInfo");
            assert_eq!(info.reason, "STATE_REWOUND");
            assert_eq!(info.domain, ERROR_DOMAIN);
        }
    }

    #[test]
    fn a_plain_unimplemented_is_a_fallback_only_for_optional_methods() {
        let plain = Status::unimplemented("no such method");
        assert!(matches!(from_status(&plain, true), Refusal::MethodMissing));
        match from_status(&plain, false) {
            Refusal::Lease(e) => assert_eq!(e.kind(), LeaseErrorKind::Invalid),
            Refusal::MethodMissing => panic!("a required method cannot fall back"),
        }
    }

    #[test]
    fn statuses_from_elsewhere_never_mean_held_or_unsupported() {
        for code in [
            Code::FailedPrecondition,
            Code::Aborted,
            Code::Internal,
            Code::Unknown,
        ] {
            match from_status(&Status::new(code, "proxy"), false) {
                Refusal::Lease(e) => assert_eq!(e.kind(), LeaseErrorKind::Transient, "{code:?}"),
                Refusal::MethodMissing => panic!("{code:?}"),
            }
        }
        let foreign = Status::with_error_details(
            Code::FailedPrecondition,
            "x",
            ErrorDetails::with_error_info("HELD_ELSEWHERE", "example.com", HashMap::new()),
        );
        match from_status(&foreign, false) {
            Refusal::Lease(e) => assert_eq!(e.kind(), LeaseErrorKind::Transient),
            Refusal::MethodMissing => panic!(),
        }
    }

    #[test]
    fn batch_failures_round_trip() {
        let holder = OwnerId::new("b").unwrap();
        let f = to_failure(&LeaseError::held(Some(holder.clone())));
        let e = from_failure(&f);
        assert_eq!(e.kind(), LeaseErrorKind::Held);
        assert_eq!(e.holder(), Some(&holder));
        let e = from_failure(&to_failure(&LeaseError::rewound("went back")));
        assert_eq!(e.kind(), LeaseErrorKind::Rewound);
        assert_eq!(e.message(), "went back");
        let garbage = Failure {
            reason: 999,
            message: "?".into(),
            holder: String::new(),
        };
        assert_eq!(from_failure(&garbage).kind(), LeaseErrorKind::Transient);
    }
}
