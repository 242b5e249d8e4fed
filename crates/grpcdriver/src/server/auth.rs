//! Authentication of lease calls: who the caller is ([`Caller`]), from its
//! bearer token or its client certificate, and which owner ids it may act
//! for ([`super::identity`]).

use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use super::identity::{CertName, ClientIdentity, IdentityStore, OwnerScope};
use crate::pb::Reason;
use crate::status::reason_status;

/// The name of a caller the service does not authenticate (loopback, or
/// insecure serving allowed).
pub(crate) const ANONYMOUS: &str = "anonymous";
/// The name of a caller admitted by the one token all clients share.
pub(crate) const SHARED_TOKEN: &str = "bearer";

/// What a caller presented, kept so a long-lived stream can look it up
/// again after the identities are replaced.
#[derive(Debug, Clone)]
enum Presented {
    Nothing,
    SharedToken,
    Token(String),
    Certificate(Vec<CertName>),
}

/// An authenticated caller, put in each request's extensions by
/// [`Authenticator`] for the handlers.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) identity: Arc<ClientIdentity>,
    presented: Presented,
    /// The identity store's generation the identity was looked up in.
    generation: u64,
}

impl Caller {
    pub(crate) fn name(&self) -> Arc<str> {
        self.identity.shared_name()
    }

    pub(crate) fn owners(&self) -> &OwnerScope {
        self.identity.owners()
    }
}

/// How the server authenticates: any combination of one shared bearer
/// token, per-client identities, and client certificates.
#[derive(Debug, Default)]
pub(crate) struct Authenticator {
    pub(crate) shared_token: Option<Arc<str>>,
    pub(crate) identities: Option<IdentityStore>,
    /// Mutual TLS is required: every caller has a verified certificate.
    pub(crate) mutual_tls: bool,
}

impl Authenticator {
    /// Whether anything is asked of a caller.
    pub(crate) fn authenticates(&self) -> bool {
        self.shared_token.is_some() || self.identities.is_some() || self.mutual_tls
    }

    /// Whether callers are told apart: each may act only for its own
    /// owners, unlike callers of a shared token or of no credential.
    pub(crate) fn tells_callers_apart(&self) -> bool {
        self.identities.is_some() || self.mutual_tls
    }

    fn generation(&self) -> u64 {
        self.identities
            .as_ref()
            .map_or(0, IdentityStore::generation)
    }

    /// The caller of a call with `metadata`, whose connection presented the
    /// certificate names `certs` (empty without mutual TLS).
    pub(crate) fn authenticate(
        &self,
        metadata: &MetadataMap,
        certs: Vec<CertName>,
    ) -> Result<Caller, Status> {
        let token = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_credentials);
        let shared = |t: &str| {
            self.shared_token
                .as_ref()
                .is_some_and(|s| constant_time_eq(t.as_bytes(), s.as_bytes()))
        };
        let by_cert = |certs: Vec<CertName>| {
            if certs.is_empty() {
                Presented::Nothing
            } else {
                Presented::Certificate(certs)
            }
        };
        let presented = match token {
            // Without identities, a certificate names the caller even when
            // a shared token is required beside it.
            Some(t) if shared(t) && self.mutual_tls && self.identities.is_none() => by_cert(certs),
            Some(t) if shared(t) => Presented::SharedToken,
            Some(t) if self.identities.is_some() => Presented::Token(t.to_owned()),
            Some(_) if self.shared_token.is_some() => {
                return Err(unauthenticated("the bearer token is not accepted"));
            }
            // With identities, the shared token is one credential among
            // others; without, it is required of everyone.
            None if self.shared_token.is_some() && self.identities.is_none() => {
                return Err(unauthenticated(
                    "lease calls need `authorization: Bearer <token>`",
                ));
            }
            _ => by_cert(certs),
        };
        let generation = self.generation();
        let identity = self.identify(&presented)?;
        Ok(Caller {
            identity,
            presented,
            generation,
        })
    }

    /// Looks `caller`'s credential up again if the identities were
    /// replaced since it was: a revoked token ends its streams too.
    pub(crate) fn recheck(&self, caller: &mut Caller) -> Result<(), Status> {
        let generation = self.generation();
        if generation != caller.generation {
            caller.identity = self.identify(&caller.presented)?;
            caller.generation = generation;
        }
        Ok(())
    }

    fn identify(&self, presented: &Presented) -> Result<Arc<ClientIdentity>, Status> {
        let any = |name: &str| Arc::new(ClientIdentity::new(name, OwnerScope::Any));
        match (presented, &self.identities) {
            // A shared token cannot tell its holders apart; with
            // identities beside it, it is the one credential that may name
            // any owner (the operator chose to keep it).
            (Presented::SharedToken, _) => Ok(any(SHARED_TOKEN)),
            (Presented::Token(t), Some(ids)) => ids
                .current()
                .for_token(t)
                .cloned()
                .ok_or_else(|| unauthenticated("the bearer token is not accepted")),
            (Presented::Certificate(names), Some(ids)) => {
                ids.current().for_cert(names).cloned().ok_or_else(|| {
                    unauthenticated(&format!(
                        "no identity is given to the client certificate naming {}",
                        list(names)
                    ))
                })
            }
            // Mutual TLS without an identities file: a certificate acts
            // for the owners under its own name, so one client's
            // certificate never releases another's leases.
            (Presented::Certificate(names), None) => {
                let name = names
                    .iter()
                    .find(|n| matches!(n, CertName::Uri(_)))
                    .or_else(|| names.first())
                    .map(|n| match n {
                        CertName::Uri(u) | CertName::Dns(u) => u.clone(),
                    })
                    .ok_or_else(|| unauthenticated("the client certificate names nobody"))?;
                let prefix = format!("{name}/");
                Ok(Arc::new(ClientIdentity::new(
                    name,
                    OwnerScope::Prefixes(vec![prefix]),
                )))
            }
            (Presented::Nothing, _) if self.authenticates() => Err(unauthenticated(
                "lease calls need `authorization: Bearer <token>` or a client certificate",
            )),
            (Presented::Nothing | Presented::Token(_), _) => Ok(any(ANONYMOUS)),
        }
    }
}

fn list(names: &[CertName]) -> String {
    if names.is_empty() {
        return "no DNS or URI name".into();
    }
    names
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn unauthenticated(message: &str) -> Status {
    reason_status(Reason::Unauthenticated, message, None)
}

/// The interceptor in front of the lease service: authenticates every
/// call and hands the handlers its [`Caller`].
#[derive(Clone)]
pub(crate) struct AuthLayer(pub(crate) Arc<Authenticator>);

impl tonic::service::Interceptor for AuthLayer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let certs = if self.0.mutual_tls || self.0.identities.is_some() {
            peer_cert_names(&request)
        } else {
            Vec::new()
        };
        let caller = self.0.authenticate(request.metadata(), certs)?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// The DNS and URI names of the certificate the connection's client
/// presented (and TLS verified); empty without one.
#[cfg(feature = "tls")]
fn peer_cert_names(request: &Request<()>) -> Vec<CertName> {
    let Some(chain) = request.peer_certs() else {
        return Vec::new();
    };
    let Some(leaf) = chain.first() else {
        return Vec::new();
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return Vec::new();
    };
    cert.valid_uri_names()
        .map(|u| CertName::Uri(u.to_owned()))
        .chain(
            cert.valid_dns_names()
                .map(|d| CertName::Dns(d.to_ascii_lowercase())),
        )
        .collect()
}

#[cfg(not(feature = "tls"))]
fn peer_cert_names(_: &Request<()>) -> Vec<CertName> {
    Vec::new()
}

/// The token of an `authorization` value whose scheme is `Bearer`, in any
/// letter case (the scheme is case-insensitive; some stacks send `bearer`).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares without an early exit, so the time taken does not tell an
/// attacker how much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::identity::{Identities, hash_token};

    #[test]
    fn the_scheme_is_case_insensitive_and_nothing_else_is() {
        assert_eq!(bearer_credentials("Bearer abc"), Some("abc"));
        assert_eq!(bearer_credentials("bearer abc"), Some("abc"));
        assert_eq!(bearer_credentials("BEARER  abc "), Some("abc"));
        assert_eq!(bearer_credentials("Basic abc"), None);
        assert_eq!(bearer_credentials("Bearerabc"), None);
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    fn bearer(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    fn with_identities(text: &str) -> Authenticator {
        Authenticator {
            identities: Some(IdentityStore::new(Identities::parse(text).unwrap())),
            ..Authenticator::default()
        }
    }

    #[test]
    fn each_credential_names_its_own_caller() {
        let auth = with_identities(&format!(
            "token a a/ {}\ncert b b/ dns:b.example\n",
            hash_token("ta")
        ));
        let a = auth.authenticate(&bearer("ta"), Vec::new()).unwrap();
        assert_eq!(&*a.name(), "a");
        let b = auth
            .authenticate(&MetadataMap::new(), vec![CertName::Dns("b.example".into())])
            .unwrap();
        assert_eq!(&*b.name(), "b");
        for (metadata, certs) in [
            (bearer("tb"), Vec::new()),
            (MetadataMap::new(), Vec::new()),
            (MetadataMap::new(), vec![CertName::Dns("c.example".into())]),
        ] {
            let e = auth.authenticate(&metadata, certs).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        }
    }

    #[test]
    fn a_certificate_without_identities_acts_under_its_own_name() {
        let auth = Authenticator {
            mutual_tls: true,
            ..Authenticator::default()
        };
        let caller = auth
            .authenticate(
                &MetadataMap::new(),
                vec![
                    CertName::Dns("x.example".into()),
                    CertName::Uri("spiffe://d/x".into()),
                ],
            )
            .unwrap();
        assert_eq!(&*caller.name(), "spiffe://d/x");
        assert_eq!(
            caller.owners(),
            &OwnerScope::Prefixes(vec!["spiffe://d/x/".into()])
        );
    }

    #[test]
    fn a_replaced_identity_is_looked_up_again_and_a_revoked_one_refused() {
        let store = IdentityStore::new(
            Identities::parse(&format!("token a a/ {}\n", hash_token("ta"))).unwrap(),
        );
        let auth = Authenticator {
            identities: Some(store.clone()),
            ..Authenticator::default()
        };
        let mut caller = auth.authenticate(&bearer("ta"), Vec::new()).unwrap();
        store.replace(Identities::parse(&format!("token a a/,z/ {}\n", hash_token("ta"))).unwrap());
        auth.recheck(&mut caller).unwrap();
        assert_eq!(
            caller.owners(),
            &OwnerScope::Prefixes(vec!["a/".into(), "z/".into()])
        );
        store.replace(Identities::default());
        let e = auth.recheck(&mut caller).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }
}
