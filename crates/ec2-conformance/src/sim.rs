//! `ec2_sim::Simulator` in a temp state dir, on its own thread and runtime.
//!
//! The simulator lives on a dedicated thread so that dropping the guard can shut it down
//! synchronously (join the thread) even while a test panics: the simulator's shutdown is what
//! releases its loop devices, and it must finish before the temp dir goes away.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use ec2_sim::{Faults, SimConfig, Simulator};
use tokio::sync::{mpsc, oneshot};

use crate::Error;

enum Command {
    Counts(oneshot::Sender<BTreeMap<String, u64>>),
    SetFaults(Faults, oneshot::Sender<()>),
    LoopDevice(String, oneshot::Sender<Option<String>>),
}

/// A running simulator on 127.0.0.1 with an ephemeral port and a temp state dir.
#[derive(Debug)]
pub struct SimServer {
    endpoint: String,
    state_dir: PathBuf,
    device_dir: PathBuf,
    // `None` once shut down; dropping the sender tells the thread to shut the simulator down.
    commands: Option<mpsc::UnboundedSender<Command>>,
    thread: Option<JoinHandle<Result<(), String>>>,
    // Declared last: removed only after the simulator thread has finished.
    _temp: tempfile::TempDir,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Counts(_) => f.write_str("Counts"),
            Command::SetFaults(faults, _) => write!(f, "SetFaults({faults:?})"),
            Command::LoopDevice(volume, _) => write!(f, "LoopDevice({volume})"),
        }
    }
}

impl SimServer {
    /// Starts a simulator with the default config (fast timing, file backing).
    pub fn start() -> Result<Self, Error> {
        Self::start_with(|_| {})
    }

    /// Starts a simulator whose config `adjust` may change; `state_dir` (and `device_dir`
    /// unless set) point into a fresh temp dir.
    pub fn start_with(adjust: impl FnOnce(&mut SimConfig)) -> Result<Self, Error> {
        let temp = tempfile::Builder::new()
            .prefix("ec2-conformance-sim-")
            .tempdir()
            .map_err(|source| Error::Io {
                what: "creating the simulator state dir".into(),
                source,
            })?;
        let mut config = SimConfig {
            state_dir: temp.path().join("state"),
            credentials: ec2_sim::Credentials::single(
                crate::client::CREDENTIALS.0,
                crate::client::CREDENTIALS.1,
            ),
            ..SimConfig::default()
        };
        adjust(&mut config);
        let state_dir = config.state_dir.clone();
        let device_dir = config.device_dir();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<String, String>>();
        let (commands, rx) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("ec2-sim".into())
            .spawn(move || run_simulator(config, ready_tx, rx))
            .map_err(|source| Error::Io {
                what: "spawning the simulator thread".into(),
                source,
            })?;
        let mut server = Self {
            endpoint: String::new(),
            state_dir,
            device_dir,
            commands: Some(commands),
            thread: Some(thread),
            _temp: temp,
        };
        match ready_rx.recv() {
            Ok(Ok(endpoint)) => {
                server.endpoint = endpoint;
                Ok(server)
            }
            Ok(Err(message)) => Err(Error::Sim(message)),
            Err(_) => Err(Error::Sim(
                "the simulator thread ended before it reported its endpoint".into(),
            )),
        }
    }

    /// The base URL to give the SDK as `endpoint_url`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The simulator's state dir (volume images live below it).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Where the simulator puts attachment symlinks.
    pub fn device_dir(&self) -> &Path {
        &self.device_dir
    }

    /// Calls per EC2 action so far.
    pub async fn call_counts(&self) -> Result<BTreeMap<String, u64>, Error> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Counts(tx))?;
        rx.await.map_err(|_| gone())
    }

    /// Replaces the fault injection settings.
    pub async fn set_faults(&self, faults: Faults) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::SetFaults(faults, tx))?;
        rx.await.map_err(|_| gone())
    }

    /// The loop device backing the volume's attachment (loop backing only).
    pub async fn loop_device(&self, volume_id: &str) -> Result<Option<String>, Error> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::LoopDevice(volume_id.to_string(), tx))?;
        rx.await.map_err(|_| gone())
    }

    fn send(&self, command: Command) -> Result<(), Error> {
        self.commands
            .as_ref()
            .ok_or_else(gone)?
            .send(command)
            .map_err(|_| gone())
    }

    /// Shuts the simulator down (releasing its loop devices) and reports how that went.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), Error> {
        self.commands = None;
        match self.thread.take() {
            None => Ok(()),
            Some(thread) => match thread.join() {
                Ok(result) => result.map_err(Error::Sim),
                Err(_) => Err(Error::Sim("the simulator thread panicked".into())),
            },
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            eprintln!("ec2-conformance: simulator shutdown: {err}");
        }
    }
}

fn gone() -> Error {
    Error::Sim("the simulator is not running".into())
}

fn run_simulator(
    config: SimConfig,
    ready: std::sync::mpsc::Sender<Result<String, String>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) -> Result<(), String> {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            let message = format!("building the simulator runtime: {err}");
            let _ = ready.send(Err(message.clone()));
            return Err(message);
        }
    };
    runtime.block_on(async move {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let sim = match Simulator::start(config, addr).await {
            Ok(sim) => sim,
            Err(err) => {
                let message = format!("starting the simulator: {err}");
                let _ = ready.send(Err(message.clone()));
                return Err(message);
            }
        };
        let _ = ready.send(Ok(sim.endpoint()));
        while let Some(command) = commands.recv().await {
            match command {
                Command::Counts(reply) => {
                    let _ = reply.send(sim.call_counts());
                }
                Command::SetFaults(faults, reply) => {
                    sim.set_faults(faults);
                    let _ = reply.send(());
                }
                Command::LoopDevice(volume, reply) => {
                    let _ = reply.send(sim.loop_device(&volume));
                }
            }
        }
        sim.shutdown()
            .await
            .map_err(|err| format!("shutting the simulator down: {err}"))
    })
}
