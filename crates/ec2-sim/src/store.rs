//! `STATE/state.json`: loaded at start, written atomically after every change.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::Error;
use crate::model::Cloud;

pub(crate) fn state_file(state_dir: &Path) -> PathBuf {
    state_dir.join("state.json")
}

pub(crate) fn load(state_dir: &Path) -> Result<Cloud, Error> {
    let path = state_file(state_dir);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| Error::State { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Cloud::default()),
        Err(source) => Err(Error::Io { path, source }),
    }
}

/// Temp file, fsync, rename over the old file, fsync the directory: a crash leaves either the
/// old or the new state, never a torn file.
pub(crate) fn save(state_dir: &Path, cloud: &Cloud) -> Result<(), Error> {
    let path = state_file(state_dir);
    let tmp = state_dir.join("state.json.tmp");
    let bytes = serde_json::to_vec(cloud).map_err(|source| Error::State {
        path: path.clone(),
        source,
    })?;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io { path: p, source }
    };
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(state_dir)
        .and_then(|d| d.sync_all())
        .map_err(io(state_dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().volumes.is_empty());
        let mut c = Cloud::default();
        c.tokens.insert(
            "CreateVolume/t".into(),
            crate::model::Token {
                fingerprint: "f".into(),
                ids: vec!["vol-1".into()],
                volume: None,
            },
        );
        save(dir.path(), &c).unwrap();
        assert!(!dir.path().join("state.json.tmp").exists());
        assert_eq!(load(dir.path()).unwrap().tokens.len(), 1);
    }

    #[test]
    fn corrupt_state_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("state.json"), b"{not json").unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("state.json"), "{err}");
    }
}
