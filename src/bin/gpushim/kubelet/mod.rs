//! The kubelet device plugin API v1beta1: messages, the `DevicePlugin` server and the
//! `Registration` client, generated from api.proto (beside this file) into v1beta1.rs, which is
//! checked in; tests/device_plugin.rs generates it again (protox + tonic-prost-build, no system
//! protoc) and fails when it differs (`GPUSHIM_BLESS=1` rewrites it).

#[allow(clippy::all, dead_code, missing_docs, unreachable_pub)]
mod v1beta1;

pub use v1beta1::*;
