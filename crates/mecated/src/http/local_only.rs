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

use axum::extract::Request;
use axum::http::{Method, header};

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
        // Read as a request's name is: without blanks around it, its port
        // or the root's trailing dot.
        Self(
            names
                .into_iter()
                .map(|n| {
                    host_name(n.as_ref().trim())
                        .trim_end_matches('.')
                        .to_ascii_lowercase()
                })
                .filter(|n| !n.is_empty())
                .collect(),
        )
    }

    /// Whether `name` is one of the names given, not one admitted for
    /// being an address or `localhost`.
    fn lists(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.');
        self.0.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    fn admits(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.');
        name.parse::<IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || name
                .rsplit_once('.')
                .is_some_and(|(_, top)| top.eq_ignore_ascii_case("localhost"))
            || self.lists(name)
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

/// Refuses a request of a server without authentication addressed to a
/// name it does not answer under, or a write sent from another origin.
/// Run by each route's guard, so a refused delete is audited as any other.
pub(crate) fn check(allowed: &AllowedHosts, request: &Request) -> Result<(), ApiError> {
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
    let authority = origin.split_once("://").map(|(_, authority)| authority);
    let same = authority.is_some_and(|a| host.is_some_and(|h| a.eq_ignore_ascii_case(h)));
    // Behind a proxy that sets `Host` to this server's own address, the
    // browser's origin is the proxy's name: one the operator listed.
    let listed = authority.is_some_and(|a| allowed.lists(host_name(a)));
    if same || listed {
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

    /// an `--allowed-host` is not read the way a
    /// request's `Host` is. A request's name loses its trailing dot, the
    /// allowed name keeps it, so `--allowed-host mecated.prod.svc.cluster.local.`
    /// (the absolute form, as in a resolv.conf or a CoreDNS config) matches
    /// no request at all; and `MECATED_ALLOWED_HOSTS="a.svc, b.svc"` keeps
    /// the blank, so `b.svc` is refused. Either way the operator's
    /// Service name is answered 403 with a message telling them to add the
    /// name they did add.
    #[test]
    fn allowed_host_names_are_read_like_request_names() {
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
