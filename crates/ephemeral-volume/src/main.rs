//! `csi-ephemeral-volume-controller`: flags in, `ephemeral_volume::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;
use ephemeral_volume::Flags;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(flags.v);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(async {
            sidecar::install_crypto_provider();
            let config = flags.config();
            let client = sidecar::build_client(
                flags.kubeconfig_path().as_deref(),
                &ephemeral_volume::user_agent(),
                flags.kube_api_qps,
                flags.kube_api_burst,
            )
            .await?;
            let shutdown = sidecar::shutdown_on_signals();
            ephemeral_volume::run(client, config, shutdown).await?;
            Ok(())
        })
}
