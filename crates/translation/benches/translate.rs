//! Translations per second for a PV of each plugin, in-tree -> CSI and back.
//!
//! `cargo bench -p csi-translation` (results in docs/benchmarks.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // bench setup: a panic is a broken bench

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use csi_translation::{translate_csi_pv_to_in_tree, translate_in_tree_pv_to_csi};
use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::json;

/// A realistic PV of each plugin: name, labels, capacity, claim, zone where the plugin has one.
fn sample_pvs() -> Vec<(&'static str, PersistentVolume)> {
    let base = |labels: serde_json::Value, source: (&str, serde_json::Value)| {
        let mut spec = json!({
            "capacity": {"storage": "100Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "standard",
            "claimRef": {"namespace": "shop", "name": "data-db-0"},
        });
        spec[source.0] = source.1;
        serde_json::from_value::<PersistentVolume>(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pvc-6f1e4e3b-2f43-4a4e-9d3c-3f2b1c0d9e8a", "labels": labels},
            "spec": spec,
        }))
        .unwrap()
    };
    let zone = |z: &str, r: &str| json!({"topology.kubernetes.io/zone": z, "topology.kubernetes.io/region": r});
    vec![
        (
            "aws-ebs",
            base(
                zone("us-east-1a", "us-east-1"),
                (
                    "awsElasticBlockStore",
                    json!({"volumeID": "aws://us-east-1a/vol-0123456789abcdef0", "fsType": "ext4"}),
                ),
            ),
        ),
        (
            "gce-pd",
            base(
                zone("us-central1-a__us-central1-c", "us-central1"),
                (
                    "gcePersistentDisk",
                    json!({"pdName": "pvc-disk", "fsType": "ext4"}),
                ),
            ),
        ),
        (
            "azure-disk",
            base(
                json!({}),
                (
                    "azureDisk",
                    json!({"diskName": "d", "diskURI": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d", "kind": "Managed", "cachingMode": "ReadOnly", "fsType": "ext4"}),
                ),
            ),
        ),
        (
            "azure-file",
            base(
                json!({}),
                (
                    "azureFile",
                    json!({"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "shop"}),
                ),
            ),
        ),
        (
            "cinder",
            base(
                zone("nova", "RegionOne"),
                (
                    "cinder",
                    json!({"volumeID": "5c1e3c1a-8d8b-4b8e-9c1f-1f2e3d4c5b6a", "fsType": "ext4"}),
                ),
            ),
        ),
        (
            "vsphere",
            base(
                zone("zone-a", "region-1"),
                (
                    "vsphereVolume",
                    json!({"volumePath": "[vsanDatastore] kubevols/pvc-disk.vmdk", "fsType": "ext4", "storagePolicyName": "gold"}),
                ),
            ),
        ),
        (
            "portworx",
            base(
                json!({}),
                (
                    "portworxVolume",
                    json!({"volumeID": "1234567890", "fsType": "ext4"}),
                ),
            ),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let mut to_csi = c.benchmark_group("in-tree to CSI");
    to_csi.throughput(Throughput::Elements(1));
    for (name, pv) in sample_pvs() {
        to_csi.bench_function(name, |b| {
            b.iter(|| translate_in_tree_pv_to_csi(black_box(&pv)).unwrap())
        });
    }
    to_csi.finish();

    let mut back = c.benchmark_group("CSI to in-tree");
    back.throughput(Throughput::Elements(1));
    for (name, pv) in sample_pvs() {
        let csi = translate_in_tree_pv_to_csi(&pv).unwrap();
        back.bench_function(name, |b| {
            b.iter(|| translate_csi_pv_to_in_tree(black_box(&csi)).unwrap())
        });
    }
    back.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
