//! What the deploy manifest tests share: rendering an overlay with `kubectl kustomize`, the
//! rendered objects, and reading pod specs (containers, mounts, arguments) out of them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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
