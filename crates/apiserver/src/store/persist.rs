//! Optional persistence (`--data-dir`): a snapshot plus an append-only log of writes.
//!
//! Writes are handed to a background thread so a commit never waits for the disk. On open the
//! snapshot and the log are replayed, a fresh snapshot is written and the log starts empty.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use serde_json::{Value, json};

use crate::Error;
use crate::resources::{self, RESOURCES, ResourceId};

const SNAPSHOT: &str = "snapshot.json";
const LOG: &str = "log.jsonl";

enum Msg {
    Line(String),
    Flush(mpsc::Sender<()>),
}

pub(crate) struct Persister {
    tx: mpsc::Sender<Msg>,
}

impl std::fmt::Debug for Persister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Persister")
    }
}

/// What was on disk.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub rv: u64,
    pub objects: Vec<(ResourceId, Value)>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::DataDir {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn resource_key(res: ResourceId) -> String {
    let d = resources::get(res);
    format!("{}/{}/{}", d.group, d.version, d.plural)
}

fn resource_from_key(k: &str) -> Option<ResourceId> {
    let mut parts = k.splitn(3, '/');
    let (g, v, p) = (parts.next()?, parts.next()?, parts.next()?);
    resources::find(g, v, p)
}

impl Persister {
    pub fn open(dir: &Path) -> Result<(Self, Loaded), Error> {
        fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let snap_path = dir.join(SNAPSHOT);
        let log_path = dir.join(LOG);
        let mut state: Vec<std::collections::BTreeMap<(String, String), Value>> =
            RESOURCES.iter().map(|_| Default::default()).collect();
        let mut rv = 0u64;
        if snap_path.exists() {
            let text = fs::read_to_string(&snap_path).map_err(|e| io_err(&snap_path, e))?;
            let snap: Value = serde_json::from_str(&text).map_err(|e| io_err(&snap_path, e))?;
            rv = snap["resourceVersion"].as_u64().unwrap_or(0);
            for entry in snap["objects"].as_array().into_iter().flatten() {
                apply(&mut state, entry);
            }
        }
        if log_path.exists() {
            let f = File::open(&log_path).map_err(|e| io_err(&log_path, e))?;
            for line in BufReader::new(f).lines() {
                let line = line.map_err(|e| io_err(&log_path, e))?;
                // A torn last line (crash mid-write) is skipped: it was never acknowledged durable.
                let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                rv = rv.max(entry["rv"].as_u64().unwrap_or(0));
                apply(&mut state, &entry);
            }
        }
        let mut loaded = Loaded {
            rv,
            objects: Vec::new(),
        };
        let mut snap_objects = Vec::new();
        for (res, map) in state.into_iter().enumerate() {
            for obj in map.into_values() {
                snap_objects.push(json!({"res": resource_key(res), "object": obj}));
                loaded.objects.push((res, obj));
            }
        }
        let tmp = dir.join("snapshot.json.tmp");
        let body = json!({"resourceVersion": rv, "objects": snap_objects});
        fs::write(&tmp, serde_json::to_vec(&body).unwrap_or_default())
            .map_err(|e| io_err(&tmp, e))?;
        fs::rename(&tmp, &snap_path).map_err(|e| io_err(&snap_path, e))?;
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&log_path)
            .map_err(|e| io_err(&log_path, e))?;
        let (tx, rx) = mpsc::channel::<Msg>();
        let path: PathBuf = log_path.clone();
        thread::Builder::new()
            .name("apiserver-persist".into())
            .spawn(move || writer(rx, BufWriter::new(file), path))
            .map_err(|e| io_err(&log_path, e))?;
        Ok((Self { tx }, loaded))
    }

    pub fn record(&self, res: ResourceId, rv: u64, obj: &Value, deleted: bool) {
        let entry = if deleted {
            json!({"rv": rv, "res": resource_key(res), "delete": obj})
        } else {
            json!({"rv": rv, "res": resource_key(res), "object": obj})
        };
        let _ = self.tx.send(Msg::Line(entry.to_string()));
    }

    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

fn apply(state: &mut [std::collections::BTreeMap<(String, String), Value>], entry: &Value) {
    let Some(res) = entry["res"].as_str().and_then(resource_from_key) else {
        return;
    };
    if let Some(obj) = entry.get("object") {
        let key = crate::store::key_of(obj);
        state[res].insert(key, obj.clone());
    } else if let Some(obj) = entry.get("delete") {
        state[res].remove(&crate::store::key_of(obj));
    }
}

fn writer(rx: mpsc::Receiver<Msg>, mut out: BufWriter<File>, path: PathBuf) {
    while let Ok(msg) = rx.recv() {
        let mut pending = Some(msg);
        // Batch whatever is queued, then flush once.
        while let Some(m) = pending.take() {
            match m {
                Msg::Line(l) => {
                    if let Err(e) = writeln!(out, "{l}") {
                        tracing::error!(path = %path.display(), error = %e, "persisting a write failed");
                    }
                }
                Msg::Flush(done) => {
                    let _ = out.flush();
                    let _ = out.get_ref().sync_data();
                    let _ = done.send(());
                }
            }
            pending = rx.try_recv().ok();
        }
        if let Err(e) = out.flush() {
            tracing::error!(path = %path.display(), error = %e, "flushing the write log failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let pods = resources::find("", "v1", "pods").unwrap();
        {
            let (p, loaded) = Persister::open(dir.path()).unwrap();
            assert!(loaded.objects.is_empty());
            let a = json!({"metadata": {"name": "a", "namespace": "d"}});
            let b = json!({"metadata": {"name": "b", "namespace": "d"}});
            p.record(pods, 5, &a, false);
            p.record(pods, 6, &b, false);
            p.record(pods, 7, &a, true);
            p.flush();
        }
        let (_, loaded) = Persister::open(dir.path()).unwrap();
        assert_eq!(loaded.rv, 7);
        assert_eq!(loaded.objects.len(), 1);
        assert_eq!(loaded.objects[0].1["metadata"]["name"], "b");
        // The replayed state was folded into the snapshot: a third open sees the same.
        let (_, again) = Persister::open(dir.path()).unwrap();
        assert_eq!(again.objects.len(), 1);
        assert_eq!(again.rv, 7);
    }
}
