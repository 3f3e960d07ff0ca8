//! The CSI controller calls the attacher makes, each with `--timeout` as its deadline (sent as
//! `grpc-timeout` and enforced here too, so a driver that never answers cannot hold a worker)
//! and recorded in `csi_sidecar_operations_seconds`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, ListVolumesRequest,
    ListVolumesResponse, VolumeCapability,
};
use tonic::transport::Channel;

use crate::Error;
use crate::metrics::Metrics;

const PUBLISH: &str = "/csi.v1.Controller/ControllerPublishVolume";
const UNPUBLISH: &str = "/csi.v1.Controller/ControllerUnpublishVolume";
const LIST_VOLUMES: &str = "/csi.v1.Controller/ListVolumes";

/// What ControllerPublishVolume needs.
#[derive(Debug, Clone)]
pub(crate) struct Publish {
    pub volume_id: String,
    pub node_id: String,
    pub capability: VolumeCapability,
    pub readonly: bool,
    pub secrets: BTreeMap<String, String>,
    pub volume_context: BTreeMap<String, String>,
    pub migrated: bool,
}

#[derive(Clone)]
pub(crate) struct CsiClient {
    channel: Channel,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for CsiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl CsiClient {
    pub(crate) fn new(channel: Channel, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            channel,
            timeout,
            metrics,
        }
    }

    fn client(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    /// Runs one call with the deadline and records it.
    async fn call<T, F>(
        &self,
        method: &'static str,
        path: &'static str,
        migrated: bool,
        fut: F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let deadline_passed = || {
            (
                tonic::Code::DeadlineExceeded,
                format!("no answer within {:?} (--timeout)", self.timeout),
            )
        };
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            // A server that enforces our grpc-timeout ends the call itself (tonic answers
            // CANCELLED "Timeout expired"); for us that is the deadline passing, as for a Go
            // client.
            Ok(Err(status))
                if status.code() == tonic::Code::Cancelled && started.elapsed() >= self.timeout =>
            {
                Err(deadline_passed())
            }
            Ok(Err(status)) => Err((status.code(), status.message().to_string())),
            Err(_) => Err(deadline_passed()),
        };
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err((code, _)) => *code,
        };
        self.metrics
            .csi_call(path, code, started.elapsed(), migrated);
        result.map_err(|(code, message)| Error::Csi {
            method,
            code,
            message,
        })
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.timeout);
        req
    }

    /// ControllerPublishVolume; returns the publish context (the attachment metadata).
    pub(crate) async fn publish(&self, p: Publish) -> Result<BTreeMap<String, String>, Error> {
        let req = self.request(ControllerPublishVolumeRequest {
            volume_id: p.volume_id,
            node_id: p.node_id,
            volume_capability: Some(p.capability),
            readonly: p.readonly,
            secrets: p.secrets.into_iter().collect::<HashMap<_, _>>(),
            volume_context: p.volume_context.into_iter().collect::<HashMap<_, _>>(),
        });
        let mut client = self.client();
        let resp = self
            .call(
                "ControllerPublishVolume",
                PUBLISH,
                p.migrated,
                client.controller_publish_volume(req),
            )
            .await?;
        Ok(resp.publish_context.into_iter().collect())
    }

    /// ControllerUnpublishVolume.
    pub(crate) async fn unpublish(
        &self,
        volume_id: String,
        node_id: String,
        secrets: BTreeMap<String, String>,
        migrated: bool,
    ) -> Result<(), Error> {
        let req = self.request(ControllerUnpublishVolumeRequest {
            volume_id,
            node_id,
            secrets: secrets.into_iter().collect::<HashMap<_, _>>(),
        });
        let mut client = self.client();
        self.call(
            "ControllerUnpublishVolume",
            UNPUBLISH,
            migrated,
            client.controller_unpublish_volume(req),
        )
        .await?;
        Ok(())
    }

    /// One page of ListVolumes.
    pub(crate) async fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> Result<ListVolumesResponse, Error> {
        let req = self.request(ListVolumesRequest {
            max_entries,
            starting_token,
        });
        let mut client = self.client();
        self.call("ListVolumes", LIST_VOLUMES, false, client.list_volumes(req))
            .await
    }
}
