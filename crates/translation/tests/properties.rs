//! Property tests: for every plugin, generated valid in-tree PVs survive in-tree -> CSI ->
//! in-tree unchanged; zones survive as CSI topology; and no input, however odd, panics.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use std::collections::BTreeMap;

use csi_translation::cli::{Command, Direction, Format, run_text};
use csi_translation::plugins::plugins;
use csi_translation::topology::{
    LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_ZONE, topology_key_exists,
};
use csi_translation::{
    is_pv_migratable, repair_volume_handle, translate_csi_pv_to_in_tree,
    translate_in_tree_inline_volume_to_csi, translate_in_tree_pv_to_csi,
    translate_in_tree_storage_class_to_csi,
};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, ObjectReference, PersistentVolume,
    PersistentVolumeSpec, PortworxVolumeSource, Volume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use serde_json::{Value, json};

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,20}"
}

fn fs_type() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(
        prop_oneof![Just("ext4"), Just("xfs"), Just("ext3")].prop_map(str::to_string),
    )
}

/// Go's bool with omitempty: "absent" or "true" (`false` is not written, as upstream; a
/// separate test checks that it is dropped).
fn read_only() -> impl Strategy<Value = Option<bool>> {
    prop_oneof![Just(None), Just(Some(true))]
}

/// Partition 0 means "whole disk" and is written as no partition.
fn partition() -> impl Strategy<Value = Option<i32>> {
    proptest::option::of(1..=127i32)
}

/// Metadata and spec fields no plugin touches: they must come back as they were.
fn pv_shell() -> impl Strategy<Value = PersistentVolume> {
    (
        name(),
        proptest::option::of(proptest::collection::btree_map(
            "[a-z]{1,8}",
            "[a-z0-9]{0,8}",
            0..3,
        )),
        proptest::option::of(name()),
        prop_oneof![
            Just(None),
            Just(Some("Retain".to_string())),
            Just(Some("Delete".to_string()))
        ],
        proptest::option::of((name(), name())),
        1..1000u32,
    )
        .prop_map(
            |(name, labels, class, reclaim, claim, gib)| PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels,
                    ..Default::default()
                },
                spec: Some(PersistentVolumeSpec {
                    capacity: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(format!("{gib}Gi")),
                    )])),
                    storage_class_name: class,
                    persistent_volume_reclaim_policy: reclaim,
                    claim_ref: claim.map(|(ns, n)| ObjectReference {
                        namespace: Some(ns),
                        name: Some(n),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                status: None,
            },
        )
}

fn access_modes(all: bool) -> impl Strategy<Value = Option<Vec<String>>> {
    let modes: Vec<&'static str> = if all {
        vec!["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"]
    } else {
        // GCE PD narrows modes to the one its CSI driver accepts; these are already narrow.
        vec!["ReadWriteOnce", "ReadOnlyMany"]
    };
    proptest::option::of(proptest::sample::select(modes).prop_map(|m| vec![m.to_string()]))
}

fn with_source(
    shell: PersistentVolume,
    modes: Option<Vec<String>>,
    set: impl FnOnce(&mut PersistentVolumeSpec),
) -> PersistentVolume {
    let mut pv = shell;
    let spec = pv.spec.get_or_insert_with(Default::default);
    spec.access_modes = modes;
    set(spec);
    pv
}

fn aws_pv() -> impl Strategy<Value = PersistentVolume> {
    (
        pv_shell(),
        access_modes(true),
        "vol-[0-9a-f]{8,17}",
        fs_type(),
        partition(),
        read_only(),
    )
        .prop_map(|(shell, modes, id, fs, part, ro)| {
            with_source(shell, modes, |s| {
                s.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: id,
                    fs_type: fs,
                    partition: part,
                    read_only: ro,
                })
            })
        })
}

fn gce_pv() -> impl Strategy<Value = PersistentVolume> {
    (
        pv_shell(),
        access_modes(false),
        name(),
        fs_type(),
        partition(),
        read_only(),
    )
        .prop_map(|(shell, modes, pd, fs, part, ro)| {
            with_source(shell, modes, |s| {
                s.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: pd,
                    fs_type: fs,
                    partition: part,
                    read_only: ro,
                })
            })
        })
}

fn azure_disk_pv() -> impl Strategy<Value = PersistentVolume> {
    let caching = proptest::option::of(
        prop_oneof![Just("None"), Just("ReadOnly"), Just("ReadWrite")].prop_map(str::to_string),
    );
    (pv_shell(), access_modes(true), "[a-f0-9-]{4,36}", name(), name(), caching, fs_type(), read_only()).prop_map(
        |(shell, modes, sub, rg, disk, caching, fs, ro)| {
            with_source(shell, modes, |s| {
                s.azure_disk = Some(AzureDiskVolumeSource {
                    disk_uri: format!(
                        "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/disks/{disk}"
                    ),
                    disk_name: disk,
                    // Translating back always says Managed: only managed disks migrate.
                    kind: Some("Managed".to_string()),
                    caching_mode: caching,
                    // Go pointers that translating back always sets (as upstream does):
                    // absent comes back as `""` / `false`.
                    fs_type: Some(fs.unwrap_or_default()),
                    read_only: Some(ro.unwrap_or(false)),
                })
            })
        },
    )
}

fn azure_file_pv() -> impl Strategy<Value = PersistentVolume> {
    let secret = prop_oneof![
        "[a-z]{3,12}",
        "[a-z0-9]{3,12}".prop_map(|a| format!("azure-storage-account-{a}-secret"))
    ];
    (
        pv_shell(),
        access_modes(true),
        secret,
        name(),
        name(),
        read_only(),
        proptest::option::of(name()),
    )
        .prop_map(|(shell, modes, secret, share, ns, ro, rg)| {
            let mut pv = with_source(shell, modes, |s| {
                s.azure_file = Some(AzureFilePersistentVolumeSource {
                    secret_name: secret,
                    share_name: share,
                    secret_namespace: Some(ns),
                    read_only: ro,
                })
            });
            if let Some(rg) = rg {
                pv.metadata.annotations = Some(BTreeMap::from([(
                    "kubernetes.io/azure-file-resource-group".to_string(),
                    rg,
                )]));
            }
            pv
        })
}

fn cinder_pv() -> impl Strategy<Value = PersistentVolume> {
    (
        pv_shell(),
        access_modes(true),
        "[0-9a-f-]{8,36}",
        fs_type(),
        read_only(),
    )
        .prop_map(|(shell, modes, id, fs, ro)| {
            with_source(shell, modes, |s| {
                s.cinder = Some(CinderPersistentVolumeSource {
                    volume_id: id,
                    fs_type: fs,
                    read_only: ro,
                    secret_ref: None,
                })
            })
        })
}

fn vsphere_pv() -> impl Strategy<Value = PersistentVolume> {
    (
        pv_shell(),
        access_modes(true),
        name(),
        name(),
        fs_type(),
        proptest::option::of("[A-Za-z ]{1,20}"),
    )
        .prop_map(|(shell, modes, ds, file, fs, policy)| {
            with_source(shell, modes, |s| {
                s.vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
                    volume_path: format!("[{ds}] kubevols/{file}.vmdk"),
                    fs_type: fs,
                    storage_policy_name: policy,
                    storage_policy_id: None,
                })
            })
        })
}

fn portworx_pv() -> impl Strategy<Value = PersistentVolume> {
    (
        pv_shell(),
        access_modes(true),
        "[0-9]{6,19}",
        fs_type(),
        read_only(),
    )
        .prop_map(|(shell, modes, id, fs, ro)| {
            with_source(shell, modes, |s| {
                s.portworx_volume = Some(PortworxVolumeSource {
                    volume_id: id,
                    fs_type: fs,
                    read_only: ro,
                })
            })
        })
}

fn assert_round_trip(pv: &PersistentVolume, driver: &str) -> Result<(), TestCaseError> {
    let before = pv.clone();
    prop_assert!(is_pv_migratable(pv));
    let csi =
        translate_in_tree_pv_to_csi(pv).map_err(|e| TestCaseError::fail(format!("to CSI: {e}")))?;
    prop_assert_eq!(pv, &before, "the input is not modified");
    let source = csi.spec.as_ref().and_then(|s| s.csi.as_ref());
    prop_assert_eq!(source.map(|c| c.driver.as_str()), Some(driver));
    let back =
        translate_csi_pv_to_in_tree(&csi).map_err(|e| TestCaseError::fail(format!("back: {e}")))?;
    prop_assert_eq!(&back, pv);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn aws_ebs_round_trips(pv in aws_pv()) { assert_round_trip(&pv, "ebs.csi.aws.com")?; }

    #[test]
    fn gce_pd_round_trips(pv in gce_pv()) { assert_round_trip(&pv, "pd.csi.storage.gke.io")?; }

    #[test]
    fn azure_disk_round_trips(pv in azure_disk_pv()) { assert_round_trip(&pv, "disk.csi.azure.com")?; }

    #[test]
    fn azure_file_round_trips(pv in azure_file_pv()) { assert_round_trip(&pv, "file.csi.azure.com")?; }

    #[test]
    fn cinder_round_trips(pv in cinder_pv()) { assert_round_trip(&pv, "cinder.csi.openstack.org")?; }

    #[test]
    fn vsphere_round_trips(pv in vsphere_pv()) { assert_round_trip(&pv, "csi.vsphere.vmware.com")?; }

    #[test]
    fn portworx_round_trips(pv in portworx_pv()) { assert_round_trip(&pv, "pxd.portworx.com")?; }

    /// A zoned PV of a plugin with topology keeps its zone: as the CSI key on the way out, and as
    /// a Kubernetes zone key (never the CSI key) on the way back.
    #[test]
    fn zones_survive_as_topology(
        pv in prop_oneof![aws_pv(), gce_pv(), cinder_pv(), vsphere_pv()],
        locale in "[a-z]{2}",
        word in "[a-z]{4,7}",
        digit in 1..=9u8,
        letters in proptest::collection::btree_set("[a-f]", 1..3),
        beta in any::<bool>(),
    ) {
        let spec = pv.spec.as_ref().unwrap();
        let (is_gce, is_aws) = (spec.gce_persistent_disk.is_some(), spec.aws_elastic_block_store.is_some());
        // Zone names as each cloud writes them; only GCE PD has regional (multi-zone) disks.
        let zones: Vec<String> = if is_gce {
            letters.iter().map(|l| format!("{locale}-{word}{digit}-{l}")).collect()
        } else if is_aws {
            letters.iter().take(1).map(|l| format!("{locale}-{word}-{digit}{l}")).collect()
        } else {
            letters.iter().take(1).map(|l| format!("{word}{digit}{l}")).collect()
        };
        let mut pv = pv;
        let key = if beta { LABEL_FAILURE_DOMAIN_BETA_ZONE } else { LABEL_TOPOLOGY_ZONE };
        pv.metadata.labels.get_or_insert_with(BTreeMap::new).insert(key.to_string(), zones.join("__"));

        let csi = translate_in_tree_pv_to_csi(&pv).unwrap();
        let driver_key = match csi.spec.as_ref().unwrap().csi.as_ref().unwrap().driver.as_str() {
            "ebs.csi.aws.com" => "topology.ebs.csi.aws.com/zone",
            "pd.csi.storage.gke.io" => "topology.gke.io/zone",
            "cinder.csi.openstack.org" => "topology.cinder.csi.openstack.org/zone",
            _ => "topology.csi.vmware.com/zone",
        };
        let csi_zones = csi_translation::topology::topology_values(&csi, driver_key);
        prop_assert_eq!(&csi_zones, &zones);

        let back = translate_csi_pv_to_in_tree(&csi).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(!topology_key_exists(&back, driver_key));
        prop_assert_eq!(csi_translation::topology::topology_values(&back, key), zones.clone());
        prop_assert_eq!(back.metadata.labels.as_ref().unwrap().get(key), Some(&zones.join("__")));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// What `csi-translate pv` prints (YAML, or JSON) reads back as exactly the library's
    /// translation, whatever characters the labels and names hold.
    #[test]
    fn cli_output_reads_back_as_the_translation(
        pv in prop_oneof![vsphere_pv(), azure_file_pv(), aws_pv(), gce_pv()],
        note in "\\PC{0,16}",
        json_out in any::<bool>(),
    ) {
        let mut pv = pv;
        pv.metadata.labels.get_or_insert_with(BTreeMap::new).insert("note".into(), note);
        let expected = translate_in_tree_pv_to_csi(&pv).unwrap();
        let format = if json_out { Format::Json } else { Format::Yaml };
        let command = Command::Pv { input: "-".into(), direction: Direction::ToCsi, format };
        let out = run_text(&command, &serde_json::to_string(&pv).unwrap(), "prop").unwrap();
        let read: Vec<PersistentVolume> = if json_out {
            vec![serde_json::from_str(&out.text).unwrap()]
        } else {
            serde_saphyr::from_multiple(&out.text).unwrap()
        };
        prop_assert_eq!(read, vec![expected], "output:\n{}", out.text);
    }
}

/// JSON values shaped like Kubernetes objects, with strings chosen to hit parsers' edges.
fn odd_string() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("")),
        Just(json!("aws://")),
        Just(json!("aws://zone/")),
        Just(json!("aws:///vol-")),
        Just(json!("projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d")),
        Just(json!("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d/x")),
        Just(json!("#")),
        Just(json!("##")),
        Just(json!("a#b#c#d#e#f")),
        Just(json!("http")),
        Just(json!("https://x/vhds/")),
        Just(json!(
            "/subscriptions//resourceGroups//providers/Microsoft.Compute/disks/"
        )),
        Just(json!("azure-storage-account--secret")),
        Just(json!("a__b__")),
        Just(json!("us-east-1-")),
        Just(json!("-")),
        Just(json!("\u{0}\u{feff}é漢")),
        ".{0,12}".prop_map(Value::String),
        any::<i64>().prop_map(|n| json!(n)),
        any::<bool>().prop_map(|b| json!(b)),
        Just(Value::Null),
    ]
}

fn odd_map() -> impl Strategy<Value = Value> {
    let keys = prop_oneof![
        Just("fstype"),
        Just("FsType"),
        Just("zone"),
        Just("zones"),
        Just("iopsPerGB"),
        Just("partition"),
        Just("kind"),
        Just("cachingmode"),
        Just("shareName"),
        Just("secretName"),
        Just("secretNamespace"),
        Just("initialvolumefilepath"),
        Just("storagepolicyname"),
        Just("datastore"),
        Just("openstorage.io/auth-secret-name"),
        Just("openstorage.io/auth-secret-namespace"),
        Just("kubernetes.io/azure-file-resource-group"),
        Just("topology.kubernetes.io/zone"),
        Just("failure-domain.beta.kubernetes.io/zone"),
        Just("failure-domain.beta.kubernetes.io/region"),
    ];
    proptest::collection::btree_map(keys.prop_map(str::to_string), odd_string(), 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

fn odd_affinity() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("topology.kubernetes.io/zone"),
        Just("failure-domain.beta.kubernetes.io/zone"),
        Just("topology.kubernetes.io/region"),
        Just("failure-domain.beta.kubernetes.io/region"),
        Just("topology.gke.io/zone"),
        Just("topology.ebs.csi.aws.com/zone"),
        Just("topology.csi.vmware.com/zone"),
        Just("topology.csi.vmware.com/region"),
        Just("topology.cinder.csi.openstack.org/zone"),
    ];
    let expr = (key, proptest::collection::vec("[a-z0-9-]{0,12}", 0..3))
        .prop_map(|(k, v)| json!({"key": k, "operator": "In", "values": v}));
    proptest::collection::vec(proptest::collection::vec(expr, 0..3), 0..3)
        .prop_map(|terms| json!({"required": {"nodeSelectorTerms": terms.into_iter().map(|t| json!({"matchExpressions": t})).collect::<Vec<_>>()}}))
}

fn odd_source() -> impl Strategy<Value = (String, Value)> {
    let field = prop_oneof![
        Just("awsElasticBlockStore"),
        Just("gcePersistentDisk"),
        Just("azureDisk"),
        Just("azureFile"),
        Just("cinder"),
        Just("vsphereVolume"),
        Just("portworxVolume"),
        Just("csi"),
    ];
    let source = proptest::collection::btree_map(
        prop_oneof![
            Just("volumeID"),
            Just("pdName"),
            Just("diskName"),
            Just("diskURI"),
            Just("kind"),
            Just("cachingMode"),
            Just("secretName"),
            Just("shareName"),
            Just("secretNamespace"),
            Just("volumePath"),
            Just("storagePolicyName"),
            Just("fsType"),
            Just("readOnly"),
            Just("partition"),
            Just("driver"),
            Just("volumeHandle"),
        ]
        .prop_map(str::to_string),
        odd_string(),
        0..8,
    );
    (
        field,
        source,
        odd_map(),
        proptest::sample::select(vec![
            "ebs.csi.aws.com",
            "pd.csi.storage.gke.io",
            "disk.csi.azure.com",
            "file.csi.azure.com",
            "cinder.csi.openstack.org",
            "csi.vsphere.vmware.com",
            "pxd.portworx.com",
            "other",
        ]),
    )
        .prop_map(|(field, src, attrs, driver)| {
            let mut src: serde_json::Map<String, Value> = src.into_iter().collect();
            if field == "csi" {
                src.insert("driver".into(), json!(driver));
                src.insert("volumeAttributes".into(), attrs);
            }
            (field.to_string(), Value::Object(src))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Whatever the object holds, every entry point returns (Ok or Err) instead of panicking.
    #[test]
    fn no_input_panics(
        (field, source) in odd_source(),
        labels in odd_map(),
        annotations in odd_map(),
        params in odd_map(),
        affinity in odd_affinity(),
        modes in proptest::collection::vec(prop_oneof![Just("ReadWriteOnce"), Just("ReadOnlyMany"), Just("ReadWriteMany"), Just("X")], 0..3),
        handle in ".{0,40}",
        node in ".{0,40}",
        ns in ".{0,8}",
    ) {
        let pv_json = json!({
            "metadata": {"name": "p", "labels": labels, "annotations": annotations},
            "spec": {field.clone(): source.clone(), "nodeAffinity": affinity, "accessModes": modes, "claimRef": {"namespace": ns}},
        });
        // A field of the wrong JSON type is a deserialisation error, which is fine.
        if let Ok(pv) = serde_json::from_value::<PersistentVolume>(pv_json.clone()) {
            let _ = translate_in_tree_pv_to_csi(&pv);
            let _ = translate_csi_pv_to_in_tree(&pv);
            for p in plugins() {
                let _ = p.translate_in_tree_pv_to_csi(&pv);
                let _ = p.translate_csi_pv_to_in_tree(&pv);
            }
        }
        if let Ok(vol) = serde_json::from_value::<Volume>(json!({"name": "v", field: source})) {
            let _ = translate_in_tree_inline_volume_to_csi(&vol, &ns);
        }
        let sc_json = json!({"provisioner": "", "parameters": params,
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["1", "a-1"]}]}]});
        if let Ok(sc) = serde_json::from_value::<StorageClass>(sc_json) {
            for p in plugins() {
                let _ = translate_in_tree_storage_class_to_csi(p.in_tree_plugin_name(), &sc);
            }
        }
        for p in plugins() {
            let _ = repair_volume_handle(p.csi_plugin_name(), &handle, &node);
        }
        let text = serde_json::to_string(&pv_json).unwrap();
        for cmd in commands() {
            let _ = run_text(&cmd, &text, "prop");
        }
    }

    /// Arbitrary text through the YAML/JSON reader and every command.
    #[test]
    fn no_text_panics(text in "(kind: |apiVersion: |spec:|  |- |\\{|\\}|\\[|\\]|:|,|\"|#|&a|\\*a|---\n|\n|[a-zA-Z0-9]{1,6})*") {
        for cmd in commands() {
            let _ = run_text(&cmd, &text, "prop");
        }
    }
}

fn commands() -> Vec<Command> {
    let input = String::from("-");
    vec![
        Command::Pv {
            input: input.clone(),
            direction: Direction::ToCsi,
            format: Format::Yaml,
        },
        Command::Pv {
            input: input.clone(),
            direction: Direction::ToInTree,
            format: Format::Json,
        },
        Command::Inline {
            input: input.clone(),
            namespace: String::new(),
            format: Format::Yaml,
        },
        Command::StorageClass {
            input: input.clone(),
            format: Format::Json,
        },
        Command::Plan { input },
    ]
}

#[test]
fn vsphere_inline_storage_policy_is_an_error_not_a_crash() {
    let vol: Volume = serde_json::from_value(json!({
        "name": "v",
        "vsphereVolume": {"volumePath": "[ds] a.vmdk", "storagePolicyName": "gold"}
    }))
    .unwrap();
    let err = translate_in_tree_inline_volume_to_csi(&vol, "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("vsphereVolume.storagePolicyName"), "{err}");
}
