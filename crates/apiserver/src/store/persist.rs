//! Optional persistence (`--data-dir`): a snapshot plus an append-only log of writes.
//!
//! Writes are handed to a background thread so a commit never waits for the disk. On open the
//! snapshot and the log are replayed, a fresh snapshot is written and the log starts empty.
//!
//! A write the disk refuses (a full disk) is kept in memory and tried again every second, and
//! until it goes through the store refuses new writes ([`Persister::failing`]), as
//! kube-apiserver does when etcd is out of space. Acknowledging writes that cannot be made
//! durable would lose them at the next restart (`csi-cluster chaos` lost a PV that way).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

use super::stored::{Stored, key_of};
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
    /// Why the log cannot be written now; `None` while it can.
    failing: Arc<Mutex<Option<String>>>,
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
        let failing = Arc::new(Mutex::new(None));
        let f = failing.clone();
        thread::Builder::new()
            .name("apiserver-persist".into())
            .spawn(move || writer(rx, file, path, f))
            .map_err(|e| io_err(&log_path, e))?;
        Ok((Self { tx, failing }, loaded))
    }

    /// Appends one committed write; the object goes in as the store's text, not re-serialized.
    pub fn record(&self, res: ResourceId, rv: u64, obj: &Stored, deleted: bool) {
        let field = if deleted { "delete" } else { "object" };
        let res = Value::String(resource_key(res));
        let line = format!(r#"{{"rv":{rv},"res":{res},"{field}":{}}}"#, obj.json());
        let _ = self.tx.send(Msg::Line(line));
    }

    /// Why writes cannot be made durable now (the store refuses them meanwhile).
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
        let key = key_of(obj);
        state[res].insert(key, obj.clone());
    } else if let Some(obj) = entry.get("delete") {
        state[res].remove(&key_of(obj));
    }
}

fn writer(
    rx: mpsc::Receiver<Msg>,
    mut out: File,
    path: PathBuf,
    failing: Arc<Mutex<Option<String>>>,
) {
    let set = |why: Option<String>| {
        *failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    };
    // Lines not yet on disk, oldest first: kept until a write of them went through.
    let mut pending: Vec<String> = Vec::new();
    // The last write failed midway: a partial line may end the file.
    let mut torn = false;
    loop {
        let first = if pending.is_empty() {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            }
        } else {
            // Failing: try again every second even if nothing new comes (the store refuses
            // new writes until these are on disk).
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        };
        let mut flushes = Vec::new();
        let mut next = first;
        // Batch whatever is queued, then write once.
        while let Some(m) = next.take() {
            match m {
                Msg::Line(l) => pending.push(l),
                Msg::Flush(done) => flushes.push(done),
            }
            next = rx.try_recv().ok();
        }
        if !pending.is_empty() {
            let mut buf = String::new();
            if torn {
                // End a torn line, which the reader skips as unreadable.
                buf.push('\n');
            }
            for l in &pending {
                buf.push_str(l);
                buf.push('\n');
            }
            match out.write_all(buf.as_bytes()) {
                Ok(()) => {
                    if torn {
                        tracing::info!(path = %path.display(), lines = pending.len(), "the write log is writable again");
                    }
                    pending.clear();
                    torn = false;
                    set(None);
                }
                Err(e) => {
                    if !torn {
                        tracing::error!(path = %path.display(), error = %e, lines = pending.len(), "writing the write log failed: refusing writes until it works again");
                    }
                    torn = true;
                    set(Some(format!("writing {}: {e}", path.display())));
                }
            }
        }
        if !flushes.is_empty() {
            let _ = out.sync_data();
            if !pending.is_empty() {
                tracing::error!(path = %path.display(), lines = pending.len(), "flushed with writes the disk refused: they are not durable");
            }
            for done in flushes {
                let _ = done.send(());
            }
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
            let a = Stored::new(&json!({"metadata": {"name": "a", "namespace": "d"}}));
            let b = Stored::new(&json!({"metadata": {"name": "b", "namespace": "d"}}));
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
