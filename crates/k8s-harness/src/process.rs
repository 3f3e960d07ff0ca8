//! The cluster's child processes: each in its own process group (so a stop reaches whatever it
//! forked), output to a log file in the temp dir, and `PR_SET_PDEATHSIG(SIGKILL)` so that a test
//! process that is killed outright (no `Drop`) leaves none behind.
//!
//! The kernel sends the parent-death signal when the *thread* that forked the child ends, not
//! the process. Tests run on tokio workers and `spawn_blocking` threads that come and go, so
//! every child is forked by one thread the cluster owns ([`Spawner`]) and joins last.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::Error;

type Job = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The thread that forks every child of one cluster.
#[derive(Debug)]
pub(crate) struct Spawner {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spawner {
    pub(crate) fn new() -> Result<Spawner, Error> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("k8s-harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map_err(|e| Error::io("starting the spawner thread".into(), e))?;
        Ok(Spawner {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    fn spawn(&self, cmd: Command) -> std::io::Result<Child> {
        let gone = || std::io::Error::other("the spawner thread is gone");
        let (reply_tx, reply_rx) = mpsc::channel();
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send((cmd, reply_tx))
            .map_err(|_| gone())?;
        reply_rx.recv().map_err(|_| gone())?
    }

    /// Ends the thread (after the children are stopped: its end SIGKILLs any that are not).
    pub(crate) fn shutdown(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One running component.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    exited: Option<String>,
}

impl Proc {
    /// Starts `program args` with its output in `log`.
    pub(crate) fn start(
        spawner: &Spawner,
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Proc, Error> {
        let out = std::fs::File::create(&log)
            .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env_remove("KUBECONFIG")
            .process_group(0);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        let parent = rustix::process::getpid();
        // SAFETY: the closure runs in the forked child before exec and only makes two
        // async-signal-safe system calls (prctl, getppid); it allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                // The parent may have died between fork and prctl: then no signal would come.
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("parent exited before exec"));
                }
                Ok(())
            });
        }
        let child = spawner
            .spawn(cmd)
            .map_err(|e| Error::io(format!("starting {name} ({})", program.display()), e))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log,
            exited: None,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the process has exited.
    pub(crate) fn exited(&mut self) -> Option<String> {
        if self.exited.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exited = Some(status.to_string());
            }
        }
        self.exited.clone()
    }

    fn signal_group(&self, signal: Signal) {
        if let Some(pid) = i32::try_from(self.pid()).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }
}

/// SIGTERM to every process group, up to `grace` for them to exit, then SIGKILL to every group
/// (also to those whose leader exited: what they forked may live on) and reap.
pub(crate) fn stop_all(procs: &mut [Proc], grace: Duration) {
    for p in procs.iter() {
        p.signal_group(Signal::TERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && procs.iter_mut().any(|p| p.exited().is_none()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in procs.iter_mut() {
        p.signal_group(Signal::KILL);
        let _ = p.child.wait();
    }
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn tail(log: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `n` distinct free TCP ports on 127.0.0.1, found by binding port 0 (all held until every one
/// is picked, so they differ).
pub fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port".into(), e))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::io("reading a bound port".into(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, "a\nb\nc\nd\n").unwrap();
        assert_eq!(tail(&log, 2), "c\nd");
        assert_eq!(tail(&log, 10), "a\nb\nc\nd");
        assert_eq!(tail(&dir.path().join("none"), 3), "");
    }

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports = free_ports(5).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 5);
        for p in ports {
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }

    #[test]
    fn a_child_gets_its_own_group_and_dies_with_its_forking_thread() {
        let dir = tempfile::tempdir().unwrap();
        let mut spawner = Spawner::new().unwrap();
        let mut p = Proc::start(
            &spawner,
            "sleeper",
            Path::new("/bin/sh"),
            &["-c".into(), "echo started; exec sleep 60".into()],
            dir.path().join("sleeper.log"),
        )
        .unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap();
        let pgrp: u32 = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .nth(2)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(pgrp, p.pid(), "leads its own process group");
        assert!(p.exited().is_none());
        // The spawner thread ends: the kernel kills the child (PR_SET_PDEATHSIG).
        spawner.shutdown();
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.exited().is_none() {
            assert!(
                Instant::now() < deadline,
                "child outlived its forking thread"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            p.exited().unwrap().contains("signal: 9"),
            "{:?}",
            p.exited()
        );
    }
}
