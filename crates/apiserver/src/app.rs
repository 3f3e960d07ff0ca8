//! The state every request handler shares: the store, the configuration, authentication,
//! metrics and the audit trail. Built by `server`, read by `handlers`, `watch` and `discovery`.

use std::net::SocketAddr;

use tokio::sync::watch;

use crate::audit::AuditLog;
use crate::auth::Tokens;
use crate::config::Config;
use crate::resources::ResourceId;
use crate::store::Store;

/// State shared by every request.
pub(crate) struct App {
    pub store: Store,
    pub config: Config,
    pub addr: SocketAddr,
    pub namespaces: ResourceId,
    pub shutdown: watch::Receiver<bool>,
    pub metrics: crate::metrics::Metrics,
    pub audit: AuditLog,
    pub tokens: Tokens,
    /// The CA clients trust (PEM and DER).
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
}
