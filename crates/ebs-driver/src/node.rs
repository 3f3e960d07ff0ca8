//! The node service: everything that happens on the machine the volume is attached to.
//!
//! Domain code only (no gRPC types): the submodules wrap one real tool or kernel interface each,
//! and `service` strings them together into idempotent stage/publish/unpublish/unstage steps.

pub(crate) mod blkid;
pub(crate) mod cmd;
pub(crate) mod device;
pub(crate) mod findmnt;
pub(crate) mod format;
pub(crate) mod fsck;
pub(crate) mod fstype;
pub(crate) mod locks;
pub(crate) mod mount;
pub(crate) mod resize;
pub mod service;
pub(crate) mod stats;
