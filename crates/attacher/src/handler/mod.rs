//! What happens to one VolumeAttachment (the external-attacher design,
//! docs/design/external-attacher.md, "Design"): the CSI handler calls the driver; the trivial
//! handler (drivers without PUBLISH_UNPUBLISH_VOLUME, and `--dummy`) only marks VolumeAttachments
//! attached and uses no finalizers.

mod csi;
mod trivial;

use std::sync::Arc;

use crate::slim_objects::Va;

pub(crate) use self::csi::{CsiHandler, Source, source_of};
pub(crate) use self::trivial::TrivialHandler;
use crate::Error;

#[async_trait::async_trait]
pub(crate) trait Handler: Send + Sync {
    /// Brings a VolumeAttachment without deletionTimestamp to `attached: true`. `force`: the
    /// reconciler found the driver disagreeing with the status; attach even if it says attached.
    async fn attach(&self, va: Arc<Va>, force: bool) -> Result<(), Error>;

    /// Detaches a VolumeAttachment being deleted and lets it go.
    async fn detach(&self, va: Arc<Va>, force: bool) -> Result<(), Error>;

    /// For logs and the start-up message.
    fn kind(&self) -> &'static str;
}
