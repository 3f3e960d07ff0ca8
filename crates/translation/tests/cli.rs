//! The `csi-translate` binary, run as a user would run it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_csi-translate"))
}

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/mixed-cluster.yaml")
}

fn run_with_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn csi-translate");
    let written = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes());
    // A command that refuses its arguments exits before reading stdin; the pipe then breaks,
    // and the exit status and stderr (which the tests check) tell what happened.
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    child.wait_with_output().expect("wait")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The row of the plan table for `name`, split into columns (two or more spaces apart).
fn plan_row(table: &str, name: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .find(|cols| cols.get(1).is_some_and(|c| c == name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
}

#[test]
fn plan_of_the_mixed_example_lists_every_object_with_its_verdict() {
    let out = bin().arg("plan").arg(example()).output().expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "KIND",
            "NAME",
            "PLUGIN",
            "CSI",
            "DRIVER",
            "TRANSLATES",
            "REASON"
        ]
    );

    let expect = [
        (
            "pv-ebs-data",
            "PersistentVolume",
            "kubernetes.io/aws-ebs",
            "ebs.csi.aws.com",
            "yes",
            "volumeHandle vol-0123456789abcdef0",
        ),
        (
            "pv-gce-regional",
            "PersistentVolume",
            "kubernetes.io/gce-pd",
            "pd.csi.storage.gke.io",
            "yes",
            "volumeHandle projects/UNSPECIFIED/regions/europe-west1/disks/shared-disk",
        ),
        (
            "pv-azure-file",
            "PersistentVolume",
            "kubernetes.io/azure-file",
            "file.csi.azure.com",
            "yes",
            "volumeHandle #myaccount#uploads#pv-azure-file#web",
        ),
        (
            "pv-azure-dedicated",
            "PersistentVolume",
            "kubernetes.io/azure-disk",
            "disk.csi.azure.com",
            "no",
            "spec.azureDisk.kind",
        ),
        (
            "pv-nfs-home",
            "PersistentVolume",
            "nfs",
            "-",
            "no",
            "in-tree source nfs has no CSI migration",
        ),
        (
            "pv-already-csi",
            "PersistentVolume",
            "kubernetes.io/aws-ebs",
            "ebs.csi.aws.com",
            "no",
            "already a CSI volume",
        ),
        (
            "gp2",
            "StorageClass",
            "kubernetes.io/aws-ebs",
            "ebs.csi.aws.com",
            "yes",
            "-",
        ),
        (
            "standard-rwo",
            "StorageClass",
            "kubernetes.io/gce-pd",
            "pd.csi.storage.gke.io",
            "no",
            "cannot simultaneously set allowedTopologies",
        ),
        (
            "vsphere-thin",
            "StorageClass",
            "kubernetes.io/vsphere-volume",
            "csi.vsphere.vmware.com",
            "yes",
            "-",
        ),
        (
            "ebs-csi",
            "StorageClass",
            "kubernetes.io/aws-ebs",
            "ebs.csi.aws.com",
            "no",
            "already provisioned by a CSI driver",
        ),
        (
            "local-storage",
            "StorageClass",
            "kubernetes.io/no-provisioner",
            "-",
            "no",
            "is not an in-tree plugin with CSI migration",
        ),
    ];
    for (name, kind, plugin, driver, translates, reason) in expect {
        let row = plan_row(&table, name);
        assert_eq!(
            &row[..5],
            [kind, name, plugin, driver, translates],
            "row {name}: {row:?}"
        );
        assert!(
            row[5].contains(reason),
            "row {name}: reason {:?} lacks {reason:?}",
            row[5]
        );
    }
    assert!(
        table.contains("11 objects: 5 translate to CSI, 6 do not"),
        "{table}"
    );
}

#[test]
fn pv_translates_both_ways_through_stdin_and_json() {
    let pv = r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"p","labels":{"topology.kubernetes.io/zone":"us-east-1a"}},
        "spec":{"awsElasticBlockStore":{"volumeID":"aws://us-east-1a/vol-1","partition":2,"fsType":"xfs"}}}"#;
    let out = run_with_stdin(&["pv", "-", "-o", "json"], pv);
    assert!(out.status.success(), "{}", stderr(&out));
    let csi: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json output");
    assert_eq!(csi["spec"]["csi"]["driver"], "ebs.csi.aws.com");
    assert_eq!(csi["spec"]["csi"]["volumeHandle"], "vol-1");
    assert_eq!(csi["spec"]["csi"]["volumeAttributes"]["partition"], "2");
    assert_eq!(
        csi["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
        "topology.ebs.csi.aws.com/zone"
    );

    // And back, from the YAML the first step would print.
    let out = run_with_stdin(&["pv", "-"], pv);
    let yaml = stdout(&out);
    assert!(
        yaml.starts_with("---\n") && yaml.contains("driver: ebs.csi.aws.com"),
        "{yaml}"
    );
    let back = run_with_stdin(&["pv", "-", "--to", "in-tree", "-o", "json"], &yaml);
    assert!(back.status.success(), "{}", stderr(&back));
    let back: serde_json::Value = serde_json::from_slice(&back.stdout).expect("json");
    assert_eq!(back["spec"]["awsElasticBlockStore"]["volumeID"], "vol-1");
    assert_eq!(back["spec"]["awsElasticBlockStore"]["partition"], 2);
    assert!(back["spec"].get("csi").is_none());
}

#[test]
fn storageclass_and_inline_translate() {
    let sc = "kind: StorageClass\nmetadata: {name: fast}\nprovisioner: kubernetes.io/gce-pd\nparameters: {fsType: ext4, zone: us-central1-a}\n";
    let out = run_with_stdin(&["storageclass", "-", "-o", "json"], sc);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["provisioner"], "pd.csi.storage.gke.io");
    assert_eq!(v["parameters"]["csi.storage.k8s.io/fstype"], "ext4");
    assert_eq!(
        v["allowedTopologies"][0]["matchLabelExpressions"][0]["key"],
        "topology.gke.io/zone"
    );

    let pod = "kind: Pod\nmetadata: {name: web, namespace: shop}\nspec:\n  containers: [{name: c, image: nginx}]\n  volumes:\n  - name: cfg\n    configMap: {name: x}\n  - name: files\n    azureFile: {secretName: s, shareName: share}\n";
    let out = run_with_stdin(&["inline", "-", "-o", "json"], pod);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["spec"]["csi"]["volumeHandle"], "#s#share#files#shop",
        "namespace comes from the pod"
    );
    assert_eq!(v["spec"]["volumeMode"], "Filesystem");
}

#[test]
fn malformed_input_names_the_document_and_the_field() {
    let text = "kind: PersistentVolume\nmetadata: {name: ok}\nspec: {gcePersistentDisk: {pdName: d}}\n---\nkind: PersistentVolume\nmetadata: {name: broken}\nspec:\n  gcePersistentDisk: {pdName: d, partition: [1]}\n";
    let out = run_with_stdin(&["pv", "-"], text);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("document 2 (PersistentVolume \"broken\")"),
        "{err}"
    );
    assert!(err.contains("spec.gcePersistentDisk.partition"), "{err}");
    assert!(
        stdout(&out).is_empty(),
        "nothing is printed when a document fails"
    );

    let out = run_with_stdin(&["plan", "-"], "key: [unclosed\n");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not valid YAML or JSON"),
        "{}",
        stderr(&out)
    );

    let out = bin()
        .args(["pv", "/nonexistent/file.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot read /nonexistent/file.yaml"),
        "{}",
        stderr(&out)
    );

    let out = run_with_stdin(
        &["storageclass", "-", "--to", "in-tree"],
        "kind: StorageClass\nprovisioner: x\n",
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only PersistentVolumes translate back"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn vectors_command_reports_and_sets_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"plugin":"gce-pd","function":"RepairVolumeHandle","name":"ok","input":{"nodeID":"projects/p/zones/z-a/instances/i","volumeHandle":"projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d"},"expected":{"volumeHandle":"projects/p/zones/z-a/disks/d"},"expect_error":false,"compare":"volumeHandle"}"#;
    let bad = good
        .replace(r#""name":"ok""#, r#""name":"wrong""#)
        .replace("zones/z-a/disks", "zones/other/disks");
    let path = dir.path().join("v.jsonl");
    std::fs::write(&path, format!("{good}\n")).unwrap();
    let out = bin().arg("vectors").arg(&path).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "PASS gce-pd RepairVolumeHandle ok\n1 passed, 0 failed, 0 skipped\n"
    );

    std::fs::write(&path, format!("{good}\n{bad}\n")).unwrap();
    let out = bin().arg("vectors").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("FAIL gce-pd RepairVolumeHandle wrong"),
        "{text}"
    );
    assert!(text.ends_with("1 passed, 1 failed, 0 skipped\n"), "{text}");
}

#[test]
fn vectors_command_runs_rows_of_the_public_functions_in_upstream_shapes() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/extra.jsonl");
    let out = bin().arg("vectors").arg(&path).output().unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("PASS translator GetInTreePluginNameFromSpec pv and vol: the pv wins"),
        "{text}"
    );
    assert!(text.ends_with("62 passed, 0 failed, 0 skipped\n"), "{text}");
}
