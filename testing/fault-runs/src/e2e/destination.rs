//! The service the runs' side effects go to: a downstream HTTP service
//! guarding each effect with `lease_http::EffectFence`, as the server
//! guide tells one to, and recording every request it judged, in the
//! order it judged them, for the checker ([`EffectAttempt`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use lease_history::Recorder;
use lease_history::server_log::EffectAttempt;
use lease_http::{EffectClaim, EffectFence, EffectTicket, HttpError, Refusal};

use super::agent::RUN_ID_HEADER;
use super::lock;

/// The destination of one end-to-end run, serving until dropped.
pub(crate) struct Destination {
    addr: SocketAddr,
    judged: Arc<Judge>,
    server: tokio::task::JoinHandle<()>,
}

struct Judge {
    fence: EffectFence,
    /// The broken variant: the fence is asked with every token as 0, so it
    /// still refuses a repeated key but no longer a stale owner.
    ignores_tokens: bool,
    rec: Recorder,
    /// Taken across the fence's judgement, so the record's order is the
    /// fence's.
    attempts: Mutex<Vec<EffectAttempt>>,
}

impl Destination {
    /// Listens on a free loopback port.
    pub(crate) async fn start(rec: Recorder, ignores_tokens: bool) -> Result<Self, String> {
        let judged = Arc::new(Judge {
            fence: EffectFence::new(),
            ignores_tokens,
            rec,
            attempts: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .route("/effect", axum::routing::post(effect))
            .with_state(Arc::clone(&judged));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("the effects' destination: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Destination {
            addr,
            judged,
            server,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it judged so far, in its order.
    pub(crate) fn attempts(&self) -> Vec<EffectAttempt> {
        lock(&self.judged.attempts).clone()
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn effect(
    State(judge): State<Arc<Judge>>,
    headers: HeaderMap,
    claim: EffectClaim,
) -> Response {
    let run_id = headers
        .get(RUN_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let asked = if judge.ignores_tokens {
        EffectClaim {
            token: 0,
            ..claim.clone()
        }
    } else {
        claim.clone()
    };
    let mut attempts = lock(&judge.attempts);
    // The effect itself is instant here: admitted is performed.
    let judged = judge.fence.admit(&asked).map(EffectTicket::done);
    attempts.push(EffectAttempt {
        session: claim.session.as_str().into(),
        token: claim.token,
        run_id,
        key: claim.key.clone().unwrap_or_default(),
        at: judge.rec.now(),
        performed: judged.is_ok(),
        outcome: match judged {
            Ok(()) => "performed",
            Err(Refusal::Stale { .. }) => "stale",
            Err(Refusal::Repeat) => "repeat",
            Err(Refusal::InProgress) => "in-progress",
        }
        .into(),
    });
    drop(attempts);
    match judged {
        Ok(()) => StatusCode::OK.into_response(),
        Err(refused) => HttpError::from(refused).into_response(),
    }
}
