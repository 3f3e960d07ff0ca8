//! The trivial handler: marks VolumeAttachments attached without calling anything and without
//! finalizers (the external-attacher design, docs/design/external-attacher.md,
//! "Trivial handler"; also `--dummy`).

use std::sync::Arc;

use crate::slim_objects::Va;

use super::Handler;
use crate::Error;
use crate::context::{Ctx, writes};

pub(crate) struct TrivialHandler {
    ctx: Arc<Ctx>,
}

impl TrivialHandler {
    pub(crate) fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }
}

#[async_trait::async_trait]
impl Handler for TrivialHandler {
    async fn attach(&self, va: Arc<Va>, _force: bool) -> Result<(), Error> {
        writes::mark_attached_trivially(&self.ctx.va_api, &self.ctx.fresh_vas, &va).await
    }

    async fn detach(&self, va: Arc<Va>, _force: bool) -> Result<(), Error> {
        // Nothing to detach. A finalizer left by an earlier run with a CSI handler (the driver
        // lost PUBLISH_UNPUBLISH_VOLUME) would block the deletion forever: drop it.
        if !writes::has_finalizer(va.as_ref(), &self.ctx.finalizer) {
            return Ok(());
        }
        let name = va.metadata.name.clone().unwrap_or_default();
        writes::remove_finalizer(
            &self.ctx.va_objects(),
            &format!("VolumeAttachment {name}"),
            va,
            &self.ctx.finalizer,
        )
        .await?;
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "trivial"
    }
}
