//! The CSI v1.12 wire contract for csi-rs.
//!
//! - [`v1`]: messages, enums, clients and servers generated from our `proto/csi.proto`
//!   (package `csi.v1`, so gRPC paths are `/csi.v1.<Service>/<Method>`). Every service is
//!   generated with default stubs: a server implements only what it supports and the rest
//!   answers `UNIMPLEMENTED`, as the spec asks.
//! - [`FILE_DESCRIPTOR_SET`]: the compiled descriptor, for gRPC reflection.
//! - Capability constructors on the generated types (see [`v1::PluginCapability::service`] and
//!   friends), so drivers and COs do not spell out nested oneofs by hand.
//! - [`serve_unix`] / [`connect_unix`]: serve and dial CSI over a unix socket, the way kubelet
//!   and the sidecars talk to a driver.
//! - `Debug` for every request that carries `secrets` prints the secret keys but never the
//!   values (the spec's `csi_secret` rule: secrets must not be logged).
//!
//! ```
//! use csi_spec::v1::identity_client::IdentityClient;
//! use csi_spec::v1::identity_server::{Identity, IdentityServer};
//! use csi_spec::v1::{GetPluginInfoRequest, GetPluginInfoResponse};
//! use tonic::{Request, Response, Status};
//!
//! struct Plugin;
//!
//! #[tonic::async_trait]
//! impl Identity for Plugin {
//!     async fn get_plugin_info(
//!         &self,
//!         _: Request<GetPluginInfoRequest>,
//!     ) -> Result<Response<GetPluginInfoResponse>, Status> {
//!         Ok(Response::new(GetPluginInfoResponse {
//!             name: "example.csi.io".into(),
//!             vendor_version: "1.0.0".into(),
//!             ..Default::default()
//!         }))
//!     }
//!     // Probe and GetPluginCapabilities: generated stubs answer UNIMPLEMENTED.
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let endpoint = format!("unix://{}/csi.sock", dir.path().display());
//! let socket = csi_spec::UnixSocket::bind(&endpoint)?; // ready to dial from here on
//! let router = tonic::transport::Server::builder().add_service(IdentityServer::new(Plugin));
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(socket.serve(router, async { let _ = stopped.await; }));
//!
//! let mut client = IdentityClient::new(csi_spec::connect_unix(&endpoint).await?);
//! let info = client.get_plugin_info(GetPluginInfoRequest {}).await?.into_inner();
//! assert_eq!(info.name, "example.csi.io");
//!
//! drop(client);
//! let _ = stop.send(());
//! server.await??; // the socket file is gone now
//! # Ok(())
//! # }
//! ```

mod authority;
mod capability;
pub mod faults;
mod redact;
mod unix;

use std::path::PathBuf;

pub use authority::AuthorityFix;
pub use unix::{UnixSocket, connect_unix, connect_unix_lazy, parse_endpoint, serve_unix};

/// Generated from `proto/csi.proto` (package `csi.v1`).
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    reason = "generated code"
)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

/// Encoded `google.protobuf.FileDescriptorSet` of `csi.proto` and the google/protobuf files it
/// imports,
/// for registering with a gRPC reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("csi_descriptor");

/// The CSI spec version this crate implements.
pub const CSI_SPEC_VERSION: &str = "1.12.0";

/// Errors from the unix-socket helpers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint string is not `unix://PATH`, `unix:PATH` or a plain path.
    #[error("CSI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        endpoint: String,
        reason: &'static str,
    },
    /// Something is listening on the socket already: refusing to steal it.
    #[error("CSI endpoint {path}: another server is already listening on this socket")]
    InUse { path: PathBuf },
    /// A file that is not a socket sits where the socket should go: refusing to delete it.
    #[error("CSI endpoint {path}: exists and is not a unix socket")]
    NotASocket { path: PathBuf },
    /// A filesystem or socket call failed.
    #[error("CSI endpoint {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server or channel failed.
    #[error("CSI endpoint {path}: {op}: {source}")]
    Transport {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
}

/// grpc-go's `codes.Code.String()`: the `grpc_status_code` / `code` label values the Go CSI
/// sidecars and drivers write in their metrics (tonic's own names differ: `Ok`, `Cancelled`).
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod go_code_name_tests {
    use super::go_code_name;
    use tonic::Code;

    #[test]
    fn names_are_grpc_go_s_not_tonic_s() {
        assert_eq!(go_code_name(Code::Ok), "OK");
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(Code::FailedPrecondition), "FailedPrecondition");
        // Every code by number: grpc-go's names are the tonic variant names except these two.
        for n in 0..=16 {
            let code = Code::from_i32(n);
            let expected = match code {
                Code::Ok => "OK".to_owned(),
                Code::Cancelled => "Canceled".to_owned(),
                other => format!("{other:?}"),
            };
            assert_eq!(go_code_name(code), expected, "code {n}");
        }
    }
}
