//! The control plane's shared watch caches: one copy of the cluster's pods, claims, volumes,
//! nodes and storage objects read by the attach/detach controller, the PV controller, the
//! ephemeral-volume and StatefulSet controllers and the scheduler, instead of one each (as
//! kube-controller-manager's controllers share one informer factory). They run on a thread and
//! runtime of their own, so a component that is killed and started again (`csi-cluster chaos`)
//! finds them warm, as a controller restarted inside a running kube-controller-manager would;
//! they list and watch as `system:kube-controller-manager`. Each component run as its own
//! binary keeps caches of its own.
//!
//! The per-node csi-provisioners (`--node-deployment`) of one driver share theirs the same way
//! ([`Informers::provisioners`]): each would otherwise cache every claim and volume of the
//! cluster.

use component_runtime::SharedCaches;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// Stops the caches and their thread when dropped.
pub(crate) struct Informers {
    caches: SharedCaches,
    runtime: tokio::runtime::Handle,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Informers {
    /// Caches read through `client`, started as components ask for them.
    pub(crate) fn start(client: kube::Client) -> Result<Self, Error> {
        let stop = CancellationToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let until = stop.clone();
        let thread = std::thread::Builder::new()
            .name("informers".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(runtime.handle().clone()));
                runtime.block_on(until.cancelled());
            })
            .map_err(|e| Error::start("the shared informers' thread", e))?;
        let runtime = rx
            .recv()
            .map_err(|e| Error::start("the shared informers' runtime", e))?
            .map_err(|e| Error::start("the shared informers' runtime", e))?;
        Ok(Self {
            caches: SharedCaches::new(client, runtime.clone(), stop.clone()),
            runtime,
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn caches(&self) -> SharedCaches {
        self.caches.clone()
    }

    /// Watch caches for the node-deployment csi-provisioners of one driver, read through
    /// `client` (that driver's provisioner identity), on this thread.
    pub(crate) fn provisioners(&self, client: &kube::Client) -> provisioner::Informers {
        provisioner::Informers::spawn(client, &self.runtime, &self.stop)
    }
}

impl Drop for Informers {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
