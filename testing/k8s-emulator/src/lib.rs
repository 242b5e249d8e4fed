//! A stand-in for the Kubernetes API server that serves
//! `coordination.k8s.io/v1` Lease objects over real HTTP, for tests of code
//! that leases through Kubernetes.
//!
//! # When to choose it
//!
//! When a test needs the API server's behaviour for leases — atomic
//! compare-and-set on `resourceVersion`, 409 `Conflict` versus 409
//! `AlreadyExists`, delete preconditions, validation (422 `Invalid`),
//! `Status` bodies, watches — and no cluster can be run. The client under
//! test talks to it through a kubeconfig, so its whole HTTP stack runs;
//! `kubectl` works against it too. It also does what a cluster cannot do on
//! demand: inject latency, 5xx replies and replies lost after the write
//! committed, rewind or wipe the Lease storage as a restored or lost etcd
//! would ([`Emulator::snapshot`], [`Emulator::restore`], [`Emulator::wipe`]),
//! refuse requests through an RBAC allow-list, and count requests per
//! verb.
//!
//! Against a real cluster, point the same tests at its kubeconfig instead.
//!
//! # Example
//!
//! ```
//! use k8s_emulator::{Emulator, EmulatorConfig, Verb};
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let emulator = Emulator::start(EmulatorConfig::default()).await?;
//! // Hand `emulator.kubeconfig_path()` to kube-rs or kubectl, or use the URL:
//! let url = format!("{}/apis/coordination.k8s.io/v1/namespaces/default/leases", emulator.url());
//! let client = reqwest::Client::new();
//! let created = client
//!     .post(&url)
//!     .bearer_auth(emulator.admin_token())
//!     .json(&serde_json::json!({"metadata": {"name": "lock"}, "spec": {"holderIdentity": "a"}}))
//!     .send()
//!     .await
//!     .unwrap();
//! assert_eq!(created.status(), 201);
//! assert_eq!(emulator.requests().get(Verb::Create, "leases"), 1);
//! # Ok::<(), k8s_emulator::EmulatorError>(())
//! # }).unwrap();
//! ```
//!
//! # What it serves
//!
//! - `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`: get,
//!   list (`labelSelector`, `fieldSelector` on `metadata.name` and
//!   `metadata.namespace`, `limit`/`continue`), watch, create, update,
//!   patch (JSON patch, merge patch, strategic merge patch, server-side
//!   apply), delete (with `preconditions`), deletecollection; `dryRun=All`
//!   and `fieldValidation` on writes. `/apis/coordination.k8s.io/v1/leases`
//!   lists and watches every namespace.
//! - Discovery (`/api`, `/api/v1`, `/apis`, `/apis/coordination.k8s.io/v1`,
//!   `/version`), namespaces (`GET /api/v1/namespaces[/{ns}]`) and an empty
//!   event list, which kubectl reads. Table replies for `kubectl get`.
//!
//! # Who each part serves
//!
//! Two kinds of client reach the emulator. *k8slease tests and fault runs*:
//! `k8slease`'s tests and benches, the servers' tests that lease through
//! it (`mecated`, `mecatl-leased`) and `testing/fault-runs`, all speaking
//! through kube-rs, which sends get, create, update (PUT) and a list by
//! label selector (the sessions on an owner lease) — and, from
//! k8slease's tests only, delete and a JSON merge patch. *kubectl*: the
//! real `kubectl` (`tests/integration/kubectl.rs`), which also reads
//! discovery and OpenAPI, lists with Table replies, watches, and patches
//! with strategic merge and server-side apply. The emulator's own HTTP
//! tests (`tests/integration/http_api.rs`) cover both.
//!
//! | module | serves | for what |
//! |---|---|---|
//! | `emulator` | both | [`Emulator`]: start, kubeconfigs, handles; [`Emulator::snapshot`], [`Emulator::restore`] and [`Emulator::wipe`] for k8slease tests and fault runs |
//! | `config` | both | [`EmulatorConfig`] |
//! | `kubeconfig` | both | the kubeconfig files kube-rs and kubectl read |
//! | `tls` | both | the CA and server certificate: kubectl sends tokens only over TLS, and k8slease's tests use the HTTPS kubeconfig |
//! | `server` | both | accept loop, routing, authentication, authorization, faults, the lease handlers |
//! | `store` | both | revision counter, compare-and-set, writes; its list, watch history and namespace reads serve kubectl |
//! | `decode`, `validation`, `status` | both | request bodies, Lease validation, `Status` failure replies |
//! | `rbac` | both | tokens for every client; [`Rbac::allow`] for k8slease's missing-verb test and kubectl's forbidden test |
//! | `verb` | both | [`Verb`], which RBAC, faults and counters are keyed by |
//! | `counters` | both | [`RequestCounters`]: k8slease's tests and benches count requests per operation; the kubectl test counts PATCHes. [`ConnectionCounters`]: k8slease's test of its connection bound |
//! | `patch` | both | patch types by content type, and JSON merge patch (k8slease's tests, `kubectl patch --type merge`) |
//! | `faults` | k8slease tests and fault runs | [`Faults`]: latency, 5xx, replies lost after commit |
//! | `patch::strategic` | kubectl | strategic merge patch (`kubectl apply`, `kubectl edit`) |
//! | `patch::json` | kubectl | JSON patch (`kubectl patch --type json`) |
//! | `list` | both | LeaseList replies: k8slease's list of the sessions on an owner lease; pages (`limit`, `continue`) and deletecollection replies for kubectl |
//! | `selector` | both | `labelSelector` (k8slease's list, kubectl), `fieldSelector` of list, watch, deletecollection |
//! | `watch` | kubectl | `?watch=1` streams |
//! | `table` | kubectl | `meta.k8s.io` Table replies for `kubectl get` |
//! | `discovery` | kubectl | `/api`, `/apis`, `/version` and the resource lists |
//! | `openapi` | kubectl | `/openapi/v3` (`kubectl apply`, `edit`, `explain`) |
//! | `core_v1` | kubectl | namespaces and the empty event list |
//! | `bin/k8s-emulator.rs` | kubectl | the emulator as a process, for a person with kubectl |
//!
//! Beside the kubectl-only modules, some kubectl-only branches live in
//! shared code: the watch, deletecollection and non-merge patch arms of
//! the lease handlers and the server-side apply checks (`server`), the
//! store's watch and namespace reads (`store`), `fieldValidation`
//! other than the default `Warn` (`decode`), and 410 `Expired` (`status`).
//!
//! # The API server's rules it keeps
//!
//! - One revision counter for every write (etcd's revision): each write
//!   gets the next value as its `resourceVersion`; list and watch report
//!   it. An update that changes nothing is not written and keeps its
//!   `resourceVersion`.
//! - PUT needs `metadata.resourceVersion` for an existing lease (leases do
//!   not allow unconditional updates: 422 `must be specified for an
//!   update`); a stale one is 409 `Conflict`. PUT to an absent lease
//!   creates it (leases allow create-on-update). A `metadata.uid` in the
//!   body is a precondition: a PUT whose uid is not the stored object's —
//!   another object under the same name, or none because it was deleted —
//!   is 409 `Conflict` and creates nothing, so a client writing back an
//!   object it read never re-creates one deleted meanwhile. PATCH without
//!   a `resourceVersion` applies to the current object; with one it must
//!   match.
//! - POST of an existing name is 409 `AlreadyExists`; into a namespace the
//!   emulator does not serve, 404 `namespaces "x" not found`.
//! - Server-set metadata: `uid`, `creationTimestamp`, `resourceVersion`.
//!   Leases have no `generation` set by the server (the lease strategy does
//!   not set it), so none is invented.
//! - Validation: DNS-subdomain names, label keys and values,
//!   `spec.leaseDurationSeconds > 0`, `spec.leaseTransitions >= 0`,
//!   `spec.preferredHolder` only with `spec.strategy` (422 with
//!   `details.causes`). `acquireTime`/`renewTime` must be RFC 3339 with
//!   exactly six fractional digits, which is a decoding error (400) as in
//!   the API server.
//! - Objects with finalizers are marked for deletion and removed when the
//!   last finalizer goes.
//!
//! Not modelled: `managedFields` and field ownership (server-side apply
//! merges the configuration into the object without conflict detection),
//! YAML or protobuf bodies, consistent snapshots across `continue` pages,
//! reads at an older `resourceVersion`, watch bookmarks other than the one
//! closing `sendInitialEvents`.

mod config;
mod core_v1;
mod counters;
mod decode;
mod discovery;
mod emulator;
mod faults;
mod kubeconfig;
mod list;
mod openapi;
mod patch;
mod rbac;
mod selector;
mod server;
mod status;
mod store;
mod table;
mod tls;
mod validation;
mod verb;
mod watch;

pub use config::EmulatorConfig;
pub use counters::{ConnectionCounters, RequestCounters};
pub use emulator::{Emulator, EmulatorError, EmulatorErrorKind, Snapshot};
pub use faults::{DroppedReply, Failure, Faults};
pub use rbac::{ANONYMOUS, Rbac};
pub use verb::Verb;
