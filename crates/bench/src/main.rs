//! `csi-bench`: the benchmarks of csi-rs's components under load (docs/csi-bench.md).

use clap::{Parser, Subcommand};
use csi_bench::{adc, attacher, node, provision};

/// Benchmarks of CSI components under load, each against an embedded API server with the
/// component under test as a child process: times, API writes by party, memory and CPU.
#[derive(Debug, Parser)]
#[command(name = "csi-bench", version)]
struct Cli {
    /// Log level of csi-bench and what it runs in-process (API server, controllers, ec2-sim)
    /// on stderr: 0 warnings only, 1 info, 2 debug, 3 and above trace. The processes under
    /// test log to their own files. Default: 1 for attacher and adc, 0 for node and provision
    /// (the in-process controllers' info lines for 1,000 objects cost the CPU they report);
    /// stack logs every component to its data dir's logs/ instead. RUST_LOG overrides.
    #[arg(short = 'v', long = "v", global = true)]
    v: Option<u8>,

    #[command(subcommand)]
    command: Command,
}

/// Each subcommand's help is its benchmark's (the first line in this list).
#[derive(Debug, Subcommand)]
enum Command {
    Attacher(attacher::cli::Flags),
    Adc(adc::cli::Flags),
    Node(node::cli::Flags),
    Provision(provision::cli::Flags),
    #[cfg(feature = "stack")]
    Stack(csi_bench::stack::Flags),
}

impl Command {
    fn default_verbosity(&self) -> u8 {
        match self {
            Command::Attacher(_) | Command::Adc(_) => 1,
            Command::Node(_) | Command::Provision(_) => 0,
            #[cfg(feature = "stack")]
            Command::Stack(_) => 0,
        }
    }

    async fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Attacher(f) => attacher::cli::run(f).await,
            Command::Adc(f) => adc::cli::run(f).await,
            Command::Node(f) => node::cli::run(f).await,
            Command::Provision(f) => provision::cli::run(f).await,
            #[cfg(feature = "stack")]
            Command::Stack(f) => Ok(csi_bench::stack::run(f).await?),
        }
    }
}

fn init_logging(v: u8) {
    let level = match v {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> anyhow::Result<()> {
    // Go's single-dash flags too (`-runs=3`), as the components under test take them.
    let cli = Cli::parse_from(component_runtime::normalize_go_args(std::env::args_os()));
    #[cfg(feature = "stack")]
    if let Command::Stack(_) = cli.command {
        // The whole stack runs here: the same allocator set-up as csi-cluster's, or its memory
        // would not be csi-cluster's; before the runtime starts any thread. Its components log
        // to files of their own and it handles signals itself (stopping its clusters).
        cluster::cap_malloc_arenas();
        return runtime()?.block_on(cli.command.run());
    }
    init_logging(cli.v.unwrap_or_else(|| cli.command.default_verbosity()));
    runtime()?.block_on(async {
        // SIGINT/SIGTERM drops the run's future: its guards kill the processes, unmount,
        // release loop devices and remove the temp dirs.
        let shutdown = component_runtime::shutdown_on_signals();
        tokio::select! {
            r = cli.command.run() => r,
            () = shutdown.cancelled() => {
                eprintln!("csi-bench: interrupted; processes stopped, mounts and temp dirs removed");
                std::process::exit(130);
            }
        }
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the tokio runtime: {e}"))
}
