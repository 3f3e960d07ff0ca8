//! Volume stats (the kubelet's volume stats aggregation): NodeGetVolumeStats for every
//! published PVC volume whose driver has GET_VOLUME_STATS, into the `kubelet_volume_stats_*`
//! gauges, every `period`.

use std::collections::BTreeMap;
use std::time::Duration;

use csi_spec::v1::NodeGetVolumeStatsRequest;
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::volume_usage::Unit;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::drivers::DriverRegistry;
use crate::metrics::{Metrics, PvcLabels};

/// One published PVC volume to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsTarget {
    pub driver: String,
    pub volume_handle: String,
    pub path: String,
}

pub async fn collect(
    drivers: DriverRegistry,
    metrics: Metrics,
    targets: watch::Receiver<BTreeMap<PvcLabels, StatsTarget>>,
    period: Duration,
    stop: CancellationToken,
) {
    let mut known: Vec<PvcLabels> = Vec::new();
    loop {
        let current = targets.borrow().clone();
        let gauges = metrics.volume_stats();
        for gone in known.iter().filter(|l| !current.contains_key(*l)) {
            gauges.remove(gone);
        }
        known = current.keys().cloned().collect();
        for (labels, t) in &current {
            let Some(d) = drivers.get(&t.driver).filter(|d| d.volume_stats) else {
                continue;
            };
            let mut req = tonic::Request::new(NodeGetVolumeStatsRequest {
                volume_id: t.volume_handle.clone(),
                volume_path: t.path.clone(),
                staging_target_path: String::new(),
            });
            req.set_timeout(Duration::from_secs(10));
            match NodeClient::new(d.channel.clone())
                .node_get_volume_stats(req)
                .await
            {
                Ok(resp) => {
                    for u in resp.into_inner().usage {
                        let (total, available, used) = (u.total, u.available, u.used);
                        if u.unit == Unit::Bytes as i32 {
                            gauges.capacity_bytes.get_or_create(labels).set(total);
                            gauges.available_bytes.get_or_create(labels).set(available);
                            gauges.used_bytes.get_or_create(labels).set(used);
                        } else if u.unit == Unit::Inodes as i32 {
                            gauges.inodes.get_or_create(labels).set(total);
                            gauges.inodes_free.get_or_create(labels).set(available);
                            gauges.inodes_used.get_or_create(labels).set(used);
                        }
                    }
                }
                Err(s) => {
                    tracing::debug!(pvc = %format!("{}/{}", labels.namespace, labels.persistentvolumeclaim), error = %s, "NodeGetVolumeStats failed")
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
