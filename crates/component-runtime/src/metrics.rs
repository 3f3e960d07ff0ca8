//! `csi_sidecar_operations_seconds`: the CSI call histogram every Go sidecar exports
//! (csi-lib-utils `metrics.CSIMetricsManager`), with the same name, labels and buckets so
//! existing dashboards and alerts keep working.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// csi-lib-utils' buckets, in seconds.
pub const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    driver_name: String,
    method_name: String,
    grpc_status_code: String,
    migrated: String,
}

fn new_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// The operations histogram of one sidecar talking to one driver (cheap to clone).
#[derive(Clone, Debug)]
pub struct OperationMetrics {
    driver_name: String,
    family: Family<OperationLabels, Histogram, fn() -> Histogram>,
}

impl OperationMetrics {
    /// Registers `csi_sidecar_operations_seconds` in `registry` for `driver_name`.
    pub fn register(registry: &mut Registry, driver_name: &str) -> Self {
        let family: Family<OperationLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(new_histogram);
        registry.register(
            "csi_sidecar_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            family.clone(),
        );
        Self {
            driver_name: driver_name.to_owned(),
            family,
        }
    }

    /// Records one CSI call: `method` is the full gRPC path
    /// (`/csi.v1.Controller/ControllerPublishVolume`), `code` its outcome.
    pub fn observe(&self, method: &str, code: tonic::Code, elapsed: Duration, migrated: bool) {
        self.family
            .get_or_create(&OperationLabels {
                driver_name: self.driver_name.clone(),
                method_name: method.to_owned(),
                grpc_status_code: csi_spec::go_code_name(code).to_owned(),
                migrated: migrated.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_go_labels_and_buckets() {
        let mut registry = Registry::default();
        let metrics = OperationMetrics::register(&mut registry, "ebs.csi.aws.com");
        metrics.observe(
            "/csi.v1.Controller/ControllerPublishVolume",
            tonic::Code::Ok,
            Duration::from_millis(300),
            false,
        );
        metrics.observe(
            "/csi.v1.Controller/ControllerPublishVolume",
            tonic::Code::DeadlineExceeded,
            Duration::from_secs(20),
            true,
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("# TYPE csi_sidecar_operations_seconds histogram"),
            "{text}"
        );
        let ok = "driver_name=\"ebs.csi.aws.com\",method_name=\"/csi.v1.Controller/ControllerPublishVolume\",grpc_status_code=\"OK\",migrated=\"false\"";
        assert!(
            text.contains(&format!("csi_sidecar_operations_seconds_count{{{ok}}} 1")),
            "{text}"
        );
        // 0.3 s lands in the 0.5 bucket, not the 0.25 one.
        assert!(
            text.contains(&format!(
                "csi_sidecar_operations_seconds_bucket{{le=\"0.25\",{ok}}} 0"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "csi_sidecar_operations_seconds_bucket{{le=\"0.5\",{ok}}} 1"
            )),
            "{text}"
        );
        assert!(
            text.contains("grpc_status_code=\"DeadlineExceeded\",migrated=\"true\""),
            "{text}"
        );
        assert!(text.contains("le=\"600.0\""), "{text}");
    }
}
