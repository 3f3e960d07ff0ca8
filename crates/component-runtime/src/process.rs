//! What every component binary's `main` does around its `run`: logging, the TLS provider, the
//! tokio runtime, and a shutdown token cancelled by SIGTERM or SIGINT.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// The tokio runtime a component runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeShape {
    /// One worker per core (tokio's default; `TOKIO_WORKER_THREADS` overrides it).
    #[default]
    PerCore,
    /// Exactly this many workers, and at most `max_blocking` threads for blocking calls
    /// (`None`: tokio's 512). For a component that mostly waits: every thread that allocates
    /// gets its own malloc arena.
    Fixed {
        workers: usize,
        max_blocking: Option<usize>,
    },
    /// Everything on the thread that calls `main` (blocking calls still get their pool).
    CurrentThread,
}

impl RuntimeShape {
    fn build(self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self {
            Self::PerCore => tokio::runtime::Builder::new_multi_thread(),
            Self::Fixed {
                workers,
                max_blocking,
            } => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(workers.max(1));
                if let Some(n) = max_blocking {
                    b.max_blocking_threads(n.max(1));
                }
                b
            }
            Self::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        };
        builder.enable_all().build()
    }
}

/// Runs a component: klog-style logging at `verbosity` (`-v`), rustls' process-wide provider,
/// a tokio runtime of `shape`, and `run(shutdown)` on it, where `shutdown` is cancelled by
/// SIGTERM or SIGINT. Returns what `run` returns.
pub fn run_component<F, Fut, E>(verbosity: u8, shape: RuntimeShape, run: F) -> Result<(), E>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: From<std::io::Error>,
{
    crate::init_logging(verbosity);
    shape.build()?.block_on(async {
        crate::install_crypto_provider();
        let shutdown = crate::shutdown_on_signals();
        run(shutdown).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_runs_the_component_and_returns_its_result() {
        for shape in [
            RuntimeShape::PerCore,
            RuntimeShape::Fixed {
                workers: 1,
                max_blocking: Some(2),
            },
            RuntimeShape::CurrentThread,
        ] {
            let threads = shape
                .build()
                .unwrap()
                .block_on(async { tokio::runtime::Handle::current().metrics().num_workers() });
            match shape {
                RuntimeShape::Fixed { workers, .. } => assert_eq!(threads, workers),
                RuntimeShape::CurrentThread => assert_eq!(threads, 1),
                RuntimeShape::PerCore => assert!(threads >= 1),
            }
        }
        let err = run_component(0, RuntimeShape::CurrentThread, |shutdown| async move {
            assert!(!shutdown.is_cancelled(), "no signal came");
            Err::<(), _>(std::io::Error::other("the component failed"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "the component failed");
    }
}
