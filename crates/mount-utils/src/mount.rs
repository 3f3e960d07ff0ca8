//! mount and umount through the real commands (they handle mtab, helpers and the kernel's
//! option parsing exactly as an operator's shell would).

use std::path::Path;

use crate::cmd;
use crate::findmnt;
use crate::fstype::FsType;
use crate::{Error, Result};

/// `mount -t FS [-o OPTS] SOURCE TARGET`.
pub async fn mount(source: &Path, target: &Path, fs: FsType, options: &[String]) -> Result<()> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["-t".as_ref(), fs.as_str().as_ref()];
    let joined = options.join(",");
    if !joined.is_empty() {
        args.push("-o".as_ref());
        args.push(joined.as_ref());
    }
    args.push(source.as_os_str());
    args.push(target.as_os_str());
    cmd::run_ok("mount", &args).await?;
    Ok(())
}

/// `mount --bind SOURCE TARGET`, then, if `read_only`, `mount -o remount,bind,ro TARGET`: a bind
/// mount ignores `ro` on its first call, so read-only takes two steps. If the second step fails
/// the writable bind is taken down again rather than left behind.
pub async fn bind(source: &Path, target: &Path, read_only: bool) -> Result<()> {
    cmd::run_ok(
        "mount",
        ["--bind".as_ref(), source.as_os_str(), target.as_os_str()],
    )
    .await?;
    if read_only {
        let remount = cmd::run_ok(
            "mount",
            [
                "-o".as_ref(),
                "remount,bind,ro".as_ref(),
                target.as_os_str(),
            ],
        )
        .await;
        if let Err(e) = remount {
            if let Err(undo) = unmount(target).await {
                tracing::error!(target = %target.display(), error = %undo, "could not undo writable bind mount");
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts everything stacked at `target`. Returns how many mounts were removed; a target
/// that is not mounted (or does not exist) is not an error: that is the retried-call case.
pub async fn unmount(target: &Path) -> Result<usize> {
    let mut removed = 0;
    // Bounded: a mount that keeps coming back (or a umount that lies) must not spin forever.
    // Each check is one statx: unmounting thousands of volumes read the whole mount table
    // twice per volume before.
    for _ in 0..32 {
        if !findmnt::is_mounted(target).await? {
            return Ok(removed);
        }
        let out = cmd::run("umount", [target.as_os_str()]).await?;
        if out.code == Some(0) {
            removed += 1;
            continue;
        }
        if !findmnt::is_mounted(target).await? {
            // Someone else unmounted it meanwhile: the goal is reached all the same.
            return Ok(removed);
        }
        return Err(cmd::command_error("umount", &[target.as_os_str()], &out));
    }
    Err(Error::StillMounted {
        target: target.to_path_buf(),
        removed,
    })
}
