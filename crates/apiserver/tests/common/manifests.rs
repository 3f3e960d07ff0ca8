//! What the deploy manifest tests use: rendering an overlay with `kubectl kustomize`, the
//! rendered objects, reading pod specs (containers, mounts, arguments, the driver's socket) out
//! of them, running kubectl against a server, and asking our binaries for their flags.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kube::core::GroupVersionKind;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// The overlays operators install (`kubectl apply -k deploy/kubernetes/overlays/<x>`).
pub const OVERLAYS: &[&str] = &["ebs", "hostpath"];

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

pub fn overlay_dir(overlay: &str) -> PathBuf {
    deploy_dir().join("kubernetes/overlays").join(overlay)
}

pub fn kubectl_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// kubectl, or why the test cannot run (the caller skips with it).
pub fn kubectl_or_skip() -> Option<PathBuf> {
    let bin = kubectl_path();
    if bin.is_none() {
        test_support::skip_or_fail("kubectl is not on PATH (scripts/setup installs it)");
    }
    bin
}

/// One Kubernetes object of a rendered overlay.
#[derive(Clone)]
pub struct Doc {
    pub origin: String,
    pub obj: Value,
}

impl Doc {
    pub fn kind(&self) -> &str {
        self.obj["kind"].as_str().unwrap_or("")
    }
    pub fn name(&self) -> &str {
        self.obj["metadata"]["name"].as_str().unwrap_or("")
    }
    pub fn namespace(&self) -> Option<&str> {
        self.obj["metadata"]["namespace"].as_str()
    }
    /// The pod template's spec of a workload, `None` for other kinds.
    pub fn pod_spec(&self) -> Option<&Value> {
        matches!(self.kind(), "Deployment" | "DaemonSet" | "StatefulSet")
            .then(|| &self.obj["spec"]["template"]["spec"])
    }
}

/// Every document of a YAML stream, each checked for apiVersion, kind and name.
pub fn parse(text: &str, origin: &str) -> Vec<Doc> {
    let values: Vec<Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|e| panic!("{origin}: not valid YAML: {e}"));
    let mut docs = Vec::new();
    for (i, obj) in values.into_iter().filter(|v| !v.is_null()).enumerate() {
        let origin = format!("{origin} document {}", i + 1);
        for field in ["apiVersion", "kind"] {
            assert!(
                obj[field].as_str().is_some_and(|s| !s.is_empty()),
                "{origin}: no {field}"
            );
        }
        docs.push(Doc { origin, obj });
    }
    docs
}

/// `kubectl kustomize` of an overlay: the YAML stream and its objects (each with a name).
pub fn render(kubectl: &Path, overlay: &str) -> (String, Vec<Doc>) {
    let dir = overlay_dir(overlay);
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs = parse(&text, &format!("overlay {overlay}"));
    assert!(!docs.is_empty(), "overlay {overlay} renders nothing");
    for d in &docs {
        assert!(!d.name().is_empty(), "{}: no metadata.name", d.origin);
    }
    (text, docs)
}

/// Every `*.yaml` under `dir`, sorted.
pub fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

/// A container's mounts: volume name → mount path.
pub fn mounts(c: &Value) -> BTreeMap<String, String> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `$(VAR)` in an argument, expanded from the container's plain `env` values as the kubelet
/// does; variables from the downward API or secrets become `value-of-VAR`.
pub fn expand(arg: &str, c: &Value) -> String {
    let mut out = arg.to_string();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        let value = e["value"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("value-of-{name}"));
        out = out.replace(&format!("$({name})"), &value);
    }
    out
}

/// A container's arguments with `$(VAR)` expanded; panics on a variable the container does
/// not define (the kubelet would pass `$(VAR)` through literally).
pub fn args(c: &Value) -> Vec<String> {
    let name = c["name"].as_str().unwrap_or("");
    let env_names: BTreeSet<&str> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    let raw: Vec<&str> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().unwrap())
        .collect();
    for a in &raw {
        for var in a.split("$(").skip(1) {
            let var = var.split(')').next().unwrap_or("");
            assert!(
                env_names.contains(var),
                "{name}: argument {a} refers to the undefined variable {var}"
            );
        }
    }
    raw.iter().map(|a| expand(a, c)).collect()
}

/// The value of `--name=value` among `args`.
pub fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
}

/// A unix socket address as a path (`unix:///p`, `unix:/p` or `/p`).
pub fn socket_path(address: &str) -> &str {
    address
        .strip_prefix("unix://")
        .or_else(|| address.strip_prefix("unix:"))
        .unwrap_or(address)
}

/// The binary a container runs: the last path part of its image, without the tag
/// (`csi-rs/csi-attacher:v0.1.0` → `csi-attacher`).
pub fn binary_of(c: &Value) -> String {
    let image = c["image"].as_str().unwrap();
    let last = image.rsplit('/').next().unwrap();
    last.split(':').next().unwrap().to_string()
}

/// The volume (name, path inside it) of the mount of `c` that holds `path`: the longest
/// mount path that is a prefix of it.
pub fn volume_holding(c: &Value, path: &str) -> Option<(String, String)> {
    mounts(c)
        .into_iter()
        .filter(|(_, m)| Path::new(path).starts_with(m.as_str()))
        .max_by_key(|(_, m)| m.len())
        .map(|(v, m)| {
            let rest = Path::new(path).strip_prefix(m.as_str()).unwrap();
            (v, rest.to_str().unwrap().to_string())
        })
}

/// A pod's volumes by name.
pub fn volumes(pod: &Value) -> BTreeMap<String, Value> {
    pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v.clone()))
        .collect()
}

/// Long flag names (`--name`) in a clap `--help` text: those that start an option line.
pub fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .flat_map(|l| {
            l.split([' ', ',', '=', '['])
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A binary of this workspace in the target dir the tests run from (`target/debug`).
pub fn built_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join(name);
    bin.is_file().then_some(bin)
}

pub fn gvk(obj: &Value) -> GroupVersionKind {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap())
}
/// Whether everything `want` says is in `got` (the server adds defaults and metadata).
pub fn subset(want: &Value, got: &Value, path: &str) -> Result<(), String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let here = format!("{path}.{k}");
                match g.get(k) {
                    Some(gv) => subset(v, gv, &here)?,
                    None if v.is_null() => {}
                    None => return Err(format!("{here} is missing")),
                }
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => w
            .iter()
            .zip(g)
            .enumerate()
            .try_for_each(|(i, (a, b))| subset(a, b, &format!("{path}[{i}]"))),
        (w, g) if w == g => Ok(()),
        (w, g) => Err(format!("{path}: wrote {w}, read back {g}")),
    }
}
pub fn containers(pod: &Value) -> &Vec<Value> {
    pod["containers"].as_array().unwrap()
}
/// kubectl against the server whose kubeconfig is `dir/kubeconfig`; panics unless it succeeds
/// within 60 s, else its stdout.
pub async fn kubectl(bin: &Path, dir: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env("KUBECONFIG", dir.join("kubeconfig"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).await.unwrap();
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} finished within 60s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
/// The driver container of a pod: the one that serves CSI (`--endpoint`).
pub fn driver_of(pod: &Value) -> &Value {
    let drivers: Vec<&Value> = containers(pod)
        .iter()
        .filter(|c| flag(&args(c), "--endpoint").is_some())
        .collect();
    assert_eq!(drivers.len(), 1, "one driver container per pod");
    drivers[0]
}
/// Where the driver's socket is: (volume, path inside the volume).
pub fn driver_socket(pod: &Value) -> (String, String) {
    let driver = driver_of(pod);
    let endpoint = flag(&args(driver), "--endpoint").unwrap().to_string();
    let path = socket_path(&endpoint);
    volume_holding(driver, path).unwrap_or_else(|| {
        panic!(
            "{}: socket {path} is in no volume, so no sidecar can reach it",
            driver["name"]
        )
    })
}
/// `bin --help`, and whether `bin ARGS --help` parses (clap checks each argument and its value
/// before it reaches `--help`, which then ends the process without starting anything).
pub fn ask_binary(bin: &Path, argv: &[String]) -> (BTreeSet<String>, Result<(), String>) {
    let help = Command::new(bin).arg("--help").output().unwrap();
    assert!(help.status.success(), "{} --help", bin.display());
    let flags = help_flags(&String::from_utf8_lossy(&help.stdout));
    let parsed = Command::new(bin)
        .args(argv)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    let verdict = if parsed.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&parsed.stderr).into_owned())
    };
    (flags, verdict)
}
pub fn flag_name(arg: &str) -> &str {
    arg.split('=').next().unwrap()
}
/// The port of an `--http-endpoint` value (`:8080`, `0.0.0.0:9808`).
pub fn endpoint_port(v: &str) -> u16 {
    v.rsplit(':').next().unwrap().parse().unwrap()
}
