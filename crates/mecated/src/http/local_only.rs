//! What a server without authentication answers: only requests addressed
//! to it by a local name, and no write a web page of another site sent.
//!
//! Without tokens, reaching the port is all it takes to act, and a browser
//! on the operator's machine can reach loopback. Two ways lead a web page
//! there: it rebinds its own DNS name to 127.0.0.1 and calls the API
//! "same-origin" (its requests then name the attacker's host in `Host`),
//! or it posts across origins without a preflight (its request carries an
//! `Origin` that is not this server). Both are refused here; a server with
//! bearer tokens needs neither check, since a browser never attaches a
//! bearer token on its own.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::wire::ErrorCode;

/// The names besides IP addresses and `localhost` under which a server
/// without authentication answers (`--allowed-host`), such as the name of
/// a Kubernetes Service in front of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts(Arc<[String]>);

impl AllowedHosts {
    /// These names, compared without regard to case; a port given with a
    /// name is ignored, since the check is of the name.
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self(
            names
                .into_iter()
                .map(|n| host_name(n.as_ref()).to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect(),
        )
    }

    fn admits(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.');
        name.parse::<IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || name
                .rsplit_once('.')
                .is_some_and(|(_, top)| top.eq_ignore_ascii_case("localhost"))
            || self.0.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// The name (or IP address, brackets removed) of a `Host` value, without
/// its port.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match host.rsplit_once(':') {
        // More than one colon and no brackets: an IPv6 address as is.
        Some((name, _)) if !name.contains(':') => name,
        _ => host,
    }
}

/// The middleware of a server without authentication: refuses a request
/// addressed to a name it does not answer to, and a write sent from
/// another origin.
pub(crate) async fn local_only(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    match check(&allowed, &request) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

fn check(allowed: &AllowedHosts, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    // HTTP/1.1 requires `Host`, and a browser always sends it; HTTP/2
    // carries it as the URI's authority. A request with neither came from
    // no browser.
    let host = headers
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"))
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if let Some(host) = host
        && !allowed.admits(host_name(host))
    {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "this server runs without authentication and answers only requests addressed \
                 to an IP address, localhost or a name given with --allowed-host; this one was \
                 addressed to {host:?} (a web page that rebinds its name to this address does \
                 that): nothing was done. Serve under that name with --allowed-host, or \
                 authenticate callers with --token-file"
            ),
        ));
    }
    let reads = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if reads {
        return Ok(());
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("\u{fffd}");
    let same = origin
        .split_once("://")
        .is_some_and(|(_, authority)| host.is_some_and(|h| authority.eq_ignore_ascii_case(h)));
    if same {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "this server runs without authentication and takes no write sent by a web page of \
             another origin ({origin:?}): nothing was done. Call it from the same origin, or \
             authenticate callers with --token-file"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_name_is_read_without_its_port_or_brackets() {
        for (host, name) in [
            ("127.0.0.1:8080", "127.0.0.1"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]:8080", "::1"),
            ("[::1]", "::1"),
            ("::1", "::1"),
            ("localhost:80", "localhost"),
            ("mecated.prod.svc", "mecated.prod.svc"),
        ] {
            assert_eq!(host_name(host), name, "{host}");
        }
    }

    #[test]
    fn ip_addresses_and_localhost_are_admitted_and_other_names_only_when_listed() {
        let none = AllowedHosts::default();
        for admitted in [
            "127.0.0.1",
            "10.1.2.3",
            "::1",
            "localhost",
            "LocalHost",
            "localhost.",
            "app.localhost",
        ] {
            assert!(none.admits(admitted), "{admitted}");
        }
        for refused in [
            "attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "",
        ] {
            assert!(!none.admits(refused), "{refused}");
        }
        let listed = AllowedHosts::new(["Mecated.Prod.svc:8080"]);
        assert!(listed.admits("mecated.prod.svc"));
        assert!(!listed.admits("prod.svc"));
    }

    /// Review 27b finding: an `--allowed-host` is not read the way a
    /// request's `Host` is. A request's name loses its trailing dot, the
    /// allowed name keeps it, so `--allowed-host mecated.prod.svc.cluster.local.`
    /// (the absolute form, as in a resolv.conf or a CoreDNS config) matches
    /// no request at all; and `MECATED_ALLOWED_HOSTS="a.svc, b.svc"` keeps
    /// the blank, so `b.svc` is refused. Either way the operator's
    /// Service name is answered 403 with a message telling them to add the
    /// name they did add.
    #[test]
    fn review27b_allowed_host_names_are_read_like_request_names() {
        let absolute = AllowedHosts::new(["mecated.prod.svc.cluster.local."]);
        assert!(
            absolute.admits("mecated.prod.svc.cluster.local"),
            "trailing dot in --allowed-host"
        );
        assert!(
            absolute.admits("mecated.prod.svc.cluster.local."),
            "trailing dot in both"
        );
        let listed = AllowedHosts::new("a.svc, b.svc".split(','));
        assert!(listed.admits("b.svc"), "a blank after the comma");
    }
}
