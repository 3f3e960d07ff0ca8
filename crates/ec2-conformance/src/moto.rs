//! `moto_server` as a child process on an ephemeral 127.0.0.1 port, killed on drop.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Error;

/// How long moto (a Python/Flask app) gets to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Another process can take the port between our probe and moto's bind: try a few ports.
const PORT_ATTEMPTS: usize = 3;

/// Where `moto_server` is: `$CSI_RS_VENV/bin`, then `PATH`, then the default venv that
/// `scripts/setup` creates (`$HOME/.cache/csi-rs-venv`). `None` when none has it.
pub fn find_moto_server() -> Option<PathBuf> {
    find_in(
        std::env::var_os("CSI_RS_VENV"),
        std::env::var_os("PATH"),
        std::env::var_os("HOME"),
    )
}

fn find_in(
    venv: Option<OsString>,
    path: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(venv) = venv {
        candidates.push(PathBuf::from(venv).join("bin/moto_server"));
    }
    if let Some(path) = path {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("moto_server")));
    }
    if let Some(home) = home {
        candidates.push(PathBuf::from(home).join(".cache/csi-rs-venv/bin/moto_server"));
    }
    candidates.into_iter().find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A running `moto_server`. Each test starts its own, so no state leaks between tests.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    endpoint: String,
    // Kept so the log outlives the process; removed on drop.
    log: tempfile::NamedTempFile,
}

impl MotoServer {
    /// Starts `moto_server` (see [`find_moto_server`]) and waits until it answers HTTP.
    pub async fn start() -> Result<Self, Error> {
        let program = find_moto_server().ok_or(Error::MotoNotFound)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            match Self::start_once(&program).await {
                Ok(server) => return Ok(server),
                Err(err @ Error::MotoExited { .. }) => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or(Error::MotoNotFound))
    }

    async fn start_once(program: &Path) -> Result<Self, Error> {
        let port = free_port()?;
        let log = tempfile::Builder::new()
            .prefix("moto-server-")
            .suffix(".log")
            .tempfile()
            .map_err(|source| Error::Io {
                what: "creating the moto_server log file".into(),
                source,
            })?;
        let out = log.reopen().map_err(|source| Error::Io {
            what: "opening the moto_server log file".into(),
            source,
        })?;
        let err = log.reopen().map_err(|source| Error::Io {
            what: "opening the moto_server log file".into(),
            source,
        })?;
        let child = Command::new(program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                program: program.to_path_buf(),
                source,
            })?;
        let mut server = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        };
        server.wait_ready(port).await?;
        tracing::info!(endpoint = %server.endpoint, "moto_server ready");
        Ok(server)
    }

    /// The base URL to give the SDK as `endpoint_url`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The process ID of the `moto_server` process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        text.get(start..).unwrap_or_default().to_string()
    }

    async fn wait_ready(&mut self, port: u16) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::MotoExited {
                    status: status.to_string(),
                    log: self.log_tail(),
                });
            }
            if answers_http(port).await {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(Error::MotoNotReady {
                    endpoint: self.endpoint.clone(),
                    waited: READY_TIMEOUT,
                    log: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        // Kill and reap, so no moto process outlives the test, also when the test panicked.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago (bind to :0, read the port, release it).
fn free_port() -> Result<u16, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
        what: "binding 127.0.0.1:0 to find a free port".into(),
        source,
    })?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|source| Error::Io {
            what: "reading the ephemeral port".into(),
            source,
        })
}

/// True when something on `port` answers an HTTP request with a status line.
async fn answers_http(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(b"GET /moto-api/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1."))
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_moto(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let exe = dir.join("moto_server");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    #[test]
    fn venv_comes_before_path_and_home() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = fake_moto(&tmp.path().join("venv/bin"));
        let on_path = fake_moto(&tmp.path().join("path"));
        let home = fake_moto(&tmp.path().join("home/.cache/csi-rs-venv/bin"));
        let path = OsString::from(tmp.path().join("path"));
        let found = |v: bool, p: bool, h: bool| {
            find_in(
                v.then(|| tmp.path().join("venv").into()),
                p.then(|| path.clone()),
                h.then(|| tmp.path().join("home").into()),
            )
        };
        assert_eq!(found(true, true, true), Some(venv));
        assert_eq!(found(false, true, true), Some(on_path));
        assert_eq!(found(false, false, true), Some(home));
        assert_eq!(found(false, false, false), None);
    }

    #[test]
    fn a_file_that_is_not_executable_does_not_count() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("moto_server"), "").unwrap();
        assert_eq!(find_in(None, Some(tmp.path().into()), None), None);
    }

    #[tokio::test]
    async fn moto_answers_and_is_killed_on_drop() {
        if find_moto_server().is_none() {
            test_support::skip_or_fail("moto_server not found (run scripts/setup)");
            return;
        }
        let moto = MotoServer::start().await.unwrap();
        let pid = moto.pid();
        let port: u16 = moto.endpoint().rsplit(':').next().unwrap().parse().unwrap();
        assert!(answers_http(port).await);
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(moto);
        // Killed and reaped: the process is gone and the port no longer answers.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert!(!answers_http(port).await);
    }
}
