//! `csi-cluster`: flags in, then `cluster::up` until Ctrl-C/SIGTERM, `cluster::down` or
//! `cluster::status`.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use cluster::{Command, Flags};

fn main() -> anyhow::Result<()> {
    cluster::cap_malloc_arenas();
    let flags = Flags::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        match flags.command {
            Command::Up(up) => {
                let config = up.config()?;
                if config.background {
                    cluster::background::start(&config).await?;
                } else {
                    let shutdown = component_runtime::shutdown_on_signals();
                    cluster::up(config, shutdown).await?;
                }
            }
            Command::Down(down) => {
                let pid = cluster::down(&down.data_dir, Duration::from_secs(down.timeout)).await?;
                println!(
                    "csi-cluster (pid {pid}) on {} stopped",
                    down.data_dir.display()
                );
            }
            Command::Status(status) => {
                let json = match status.output.as_str() {
                    "json" => true,
                    "text" => false,
                    other => anyhow::bail!("--output {other:?}: want text or json"),
                };
                print!("{}", cluster::status(&status.data_dir, json).await?);
            }
            Command::Demo(demo) => cluster::demo::run(demo).await?,
            Command::Bench { args } => anyhow::bail!(
                "`csi-cluster bench` is `csi-bench stack` now: run `csi-bench stack {}` (docs/csi-bench/stack.md)",
                args.join(" ")
            ),
            Command::Chaos(flags) => {
                let report =
                    cluster::chaos::run_until(&flags, component_runtime::shutdown_on_signals())
                        .await?;
                for v in &report.violations {
                    println!("violation {v}");
                }
                println!(
                    "seed {}: {} files written, {} read back, {:.0}s",
                    report.seed,
                    report.files_written,
                    report.files_verified,
                    report.elapsed.as_secs_f64()
                );
                println!("{}", report.summary());
                if report.interrupted {
                    println!("(interrupted: the schedule was cut short)");
                }
                if !report.violations.is_empty() {
                    anyhow::bail!("replay: {}", flags.replay(report.seed));
                }
            }
        }
        Ok(())
    })
}
