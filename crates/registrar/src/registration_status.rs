//! What the kubelet last said of the registration: the registration service writes it, the
//! health endpoint reads it. A leaf below both.

use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

/// The last status the kubelet reported: `None` before its first NotifyRegistrationStatus.
#[derive(Default)]
pub(crate) struct Status {
    last: Mutex<Option<Result<(), String>>>,
    /// Cancelled when the kubelet reports a failed registration: the registrar stops.
    pub(crate) failed: CancellationToken,
}

impl Status {
    pub(crate) fn get(&self) -> Option<Result<(), String>> {
        self.lock().clone()
    }

    pub(crate) fn set(&self, status: Result<(), String>) {
        let failed = status.is_err();
        *self.lock() = Some(status);
        if failed {
            self.failed.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<(), String>>> {
        // Plain data; a panic elsewhere while holding the lock leaves it consistent.
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
