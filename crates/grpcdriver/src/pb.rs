//! The wire types and service stubs generated from
//! `proto/mecatl/lease/v1/lease.proto` by `cargo xtask proto` (checked in,
//! so building this crate needs no `protoc`; CI fails if they go stale).

#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
#![allow(rust_2018_idioms)]

include!("gen/mecatl.lease.v1.rs");

/// The encoded descriptor set of the contract and its imports, which the
/// server's reflection service hands to tools such as `grpcurl`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("gen/mecatl.lease.v1.binpb");

/// The fully qualified service name, as gRPC routes and health report it.
pub const SERVICE_NAME: &str = "mecatl.lease.v1.LeaseService";
