//! What the driver knows, in `<state-dir>/state.json`: volumes, snapshots, and where each
//! volume is staged and published. Written whole on every change through a temporary file,
//! fsync and rename, so a crash (SIGKILL included) leaves either the old or the new file,
//! never half of one. The records say what the driver did; the kernel's mount table and loop
//! devices are checked before a record is trusted (`node.rs`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The file's format version; a file with another version is refused, not guessed at.
pub(crate) const VERSION: u32 = 1;

pub(crate) const FILE_NAME: &str = "state.json";

/// How a volume is stored and used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// A directory, bind-mounted.
    Mount,
    /// A sparse image file behind a loop device.
    Block,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Mount => "mount",
            Kind::Block => "block",
        }
    }
}

/// Where a volume's initial content came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Source {
    Snapshot(String),
    Volume(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Volume {
    pub id: String,
    /// CreateVolume's name (the volume ID for an ephemeral volume).
    pub name: String,
    pub kind: Kind,
    pub capacity_bytes: u64,
    /// Created on NodePublish for a CSI ephemeral inline volume; deleted on NodeUnpublish.
    #[serde(default)]
    pub ephemeral: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<Staged>,
    /// Target path → how it is published.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub published: BTreeMap<PathBuf, Published>,
}

impl Volume {
    /// Staged or published somewhere on this node.
    pub(crate) fn in_use(&self) -> bool {
        self.staged.is_some() || !self.published.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Staged {
    pub path: PathBuf,
    /// The loop device a block volume had when it was staged (informational: the device is
    /// looked up by its backing file before use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_device: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Published {
    pub read_only: bool,
    /// The staging path it was bound from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_path: Option<PathBuf>,
    /// The access mode's name (SINGLE_NODE_WRITER, ...).
    pub access_mode: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub kind: Kind,
    pub size_bytes: u64,
    /// Creation time since the Unix epoch.
    pub created_secs: i64,
    pub created_nanos: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct State {
    pub version: u32,
    #[serde(default)]
    pub volumes: BTreeMap<String, Volume>,
    #[serde(default)]
    pub snapshots: BTreeMap<String, Snapshot>,
}

impl State {
    pub(crate) fn new() -> Self {
        Self {
            version: VERSION,
            ..Self::default()
        }
    }

    pub(crate) fn volume_by_name(&self, name: &str) -> Option<&Volume> {
        self.volumes.values().find(|v| v.name == name)
    }

    pub(crate) fn snapshot_by_name(&self, name: &str) -> Option<&Snapshot> {
        self.snapshots.values().find(|s| s.name == name)
    }

    /// Bytes promised to volumes (ephemeral ones included).
    pub(crate) fn used_bytes(&self) -> u64 {
        self.volumes
            .values()
            .fold(0u64, |acc, v| acc.saturating_add(v.capacity_bytes))
    }

    pub(crate) fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec_pretty(self)
    }

    pub(crate) fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let state: State = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if state.version != VERSION {
            return Err(format!(
                "format version {} is not the supported version {VERSION}",
                state.version
            ));
        }
        Ok(state)
    }
}

/// The state and the file it lives in.
#[derive(Debug)]
pub(crate) struct Store {
    path: PathBuf,
    pub state: State,
}

impl Store {
    /// Loads `<dir>/state.json`, or starts empty when there is none. A file that cannot be
    /// parsed is an error: starting empty would forget volumes that still exist.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(FILE_NAME);
        let state = match std::fs::read(&path) {
            Ok(bytes) => State::from_json(&bytes).map_err(|reason| Error::State {
                path: path.clone(),
                reason,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::new(),
            Err(e) => return Err(Error::io("reading", &path, e)),
        };
        Ok(Self { path, state })
    }

    /// Writes the state: temporary file, fsync, rename over the old one, fsync the directory.
    pub(crate) fn save(&self) -> Result<()> {
        let bytes = self.state.to_json().map_err(|e| Error::State {
            path: self.path.clone(),
            reason: format!("encoding: {e}"),
        })?;
        let tmp = self.path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()
        };
        write().map_err(|e| Error::io("writing", &tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| Error::io("renaming to", &self.path, e))?;
        if let Some(dir) = self.path.parent() {
            // The rename is durable once the directory entry is.
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::io("syncing", dir, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sample() -> State {
        let mut s = State::new();
        let mut published = BTreeMap::new();
        published.insert(
            PathBuf::from("/pods/p/mount"),
            Published {
                read_only: true,
                staging_path: Some(PathBuf::from("/staging/v1")),
                access_mode: "SINGLE_NODE_WRITER".into(),
            },
        );
        s.volumes.insert(
            "v1".into(),
            Volume {
                id: "v1".into(),
                name: "pvc-1".into(),
                kind: Kind::Block,
                capacity_bytes: 1 << 20,
                ephemeral: false,
                source: Some(Source::Snapshot("s1".into())),
                staged: Some(Staged {
                    path: "/staging/v1".into(),
                    loop_device: Some("/dev/loop7".into()),
                }),
                published,
            },
        );
        s.volumes.insert(
            "v2".into(),
            Volume {
                id: "v2".into(),
                name: "pvc-2".into(),
                kind: Kind::Mount,
                capacity_bytes: 3 << 20,
                ephemeral: true,
                source: None,
                staged: None,
                published: BTreeMap::new(),
            },
        );
        s.snapshots.insert(
            "s1".into(),
            Snapshot {
                id: "s1".into(),
                name: "snap".into(),
                source_volume_id: "v0".into(),
                kind: Kind::Block,
                size_bytes: 1 << 20,
                created_secs: 1_700_000_000,
                created_nanos: 5,
            },
        );
        s
    }

    #[test]
    fn round_trips_through_json() {
        let s = sample();
        let json = s.to_json().unwrap();
        assert_eq!(State::from_json(&json).unwrap(), s);
        let text = String::from_utf8(json).unwrap();
        // The wire names an operator reads in the file.
        assert!(text.contains("\"kind\": \"block\""), "{text}");
        assert!(text.contains("\"snapshot\": \"s1\""), "{text}");
        assert!(text.contains("\"loop_device\": \"/dev/loop7\""), "{text}");
        assert_eq!(s.used_bytes(), 4 << 20);
        assert_eq!(s.volume_by_name("pvc-2").unwrap().id, "v2");
        assert!(s.volume_by_name("pvc-3").is_none());
        assert!(s.volumes["v1"].in_use() && !s.volumes["v2"].in_use());
    }

    #[test]
    fn optional_fields_may_be_absent_and_versions_are_checked() {
        let minimal = br#"{"version":1,"volumes":{"a":{"id":"a","name":"n","kind":"mount","capacity_bytes":5}}}"#;
        let s = State::from_json(minimal).unwrap();
        assert!(!s.volumes["a"].ephemeral && s.volumes["a"].staged.is_none());
        assert!(s.snapshots.is_empty());
        let err = State::from_json(br#"{"version":2}"#).unwrap_err();
        assert!(err.contains("version 2"), "{err}");
        assert!(State::from_json(b"{not json").is_err());
    }

    #[test]
    fn store_saves_atomically_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        assert!(store.state.volumes.is_empty());
        store.state = sample();
        store.save().unwrap();
        assert!(!dir.path().join("state.json.tmp").exists());
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(again.state, sample());
        // A damaged file is an error naming it, not an empty start.
        std::fs::write(dir.path().join(FILE_NAME), b"{").unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("state.json"), "{err}");
    }
}
