//! mecated's integration tests, one binary. Most start the built `mecated`
//! (or `mecak8s`) as real processes on temporary store directories, driven
//! over HTTP and stopped with real signals (`support`): two servers on one
//! store (`processes`); a SIGTERM that drains (`drain`); a killed run
//! ended as interrupted by the next owner (`interrupted`); side effects
//! fenced at their destination (`effects`); replicas behind a round-robin proxy (`replicas`,
//! `replica_edge_cases`); leases from etcd (`etcd_leases`, with the `etcd`
//! feature), from the Kubernetes API emulator (`k8s_leases`, with `k8s`),
//! from a gRPC lease service (`lease_service`); sessions and leases in
//! PostgreSQL (`postgres_leases`, `postgres_store`, with `postgres`);
//! `mecak8s` as a deployment runs it (`mecak8s`); `mecated leases`
//! (`leases_cli`); the operator page
//! in headless Chromium (`operator_page`); bearer tokens and roles, the
//! exposure check, token file reloads and the audit trail (`auth`, some of
//! it in-process). Others run the server
//! in-process: every route against the OpenAPI document (`router`); who
//! owns a run (`ownership`); many followers of one session (`fanout`);
//! incarnations under one owner id
//! (`incarnations`); the transcript an agent sees (`transcripts`);
//! listing pages (`session_listing`); a rewound store (`state_rewound`); a
//! misconfigured lease service (`service_safety`). And the deployment
//! manifests, rendered by `kubectl kustomize` (`deploy_manifests`).
//!
//! The signals go to the servers, never to this process, and nothing here
//! changes the environment or the working directory, so they run as
//! threads of one process. `tests/partitions.rs` is a binary of its own:
//! its threads move into network namespaces.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod deploy_manifests;
mod drain;
mod effects;
mod etcd_leases;
mod fanout;
mod incarnations;
mod interrupted;
mod k8s_leases;
mod lease_service;
mod leases_cli;
mod mecak8s;
mod operator_page;
mod ownership;
mod postgres_leases;
mod postgres_store;
mod processes;
mod replica_edge_cases;
mod replicas;
mod resume;
mod router;
mod service_safety;
mod session_listing;
mod state_rewound;
mod transcripts;
mod unsynced_leases;
