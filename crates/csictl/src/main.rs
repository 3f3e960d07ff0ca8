//! `csictl`: a CSI command-line client for any driver socket, and `csictl demo`.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = csictl::Cli::parse();
    csictl::run(cli).await?;
    Ok(())
}
