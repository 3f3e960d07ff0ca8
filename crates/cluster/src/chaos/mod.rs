//! `csi-cluster chaos`: a randomized fault test of the whole stack.
//!
//! A seeded schedule drives a throw-away cluster: claims and pods are created and deleted,
//! pods move between nodes (the old one still terminating while the new one is created),
//! claims are deleted under their pods and recreated under the same name, pods are deleted a
//! moment after they are created (in the middle of stage or publish), CSI calls fail before or
//! after the driver did the work (fault proxies in front of every driver socket, see
//! [`csi_spec::faults`]) or are held back, EC2 calls are throttled or slowed, every component
//! is killed and started again (apiserver-lite restarted from its data dir, breaking every
//! watch), and the hostpath CSIDriver's `attachRequired` is flipped
//! (the field is immutable, so the object is replaced, as an operator would).
//!
//! All along, invariants are checked from sources that are not the components themselves
//! ([`check`]): ec2-sim's attachment record (no volume detached while its device was mounted,
//! none held by two instances), `/proc/self/mountinfo` (no Ready pod without its volume
//! mounted), the API and EC2 (no Bound claim's volume gone) and the data (every file written
//! through a pod is read back, byte for byte, the next time a pod of that claim is Ready).
//! After the schedule the faults stop, every component runs again, and once the cluster has
//! settled no CSI mount may be left without a pod that wants it; then everything is deleted
//! and nothing (PV, VolumeAttachment, EC2 volume, mount) may be left.
//!
//! The seed fixes the schedule (which operation, on which claim, node or component, which
//! fault, how long to wait), not the interleaving with the components' own work, which the
//! machine decides: a failing seed replays the same schedule, usually the same failure.

mod check;
mod rng;
mod schedule;

use std::path::PathBuf;
use std::time::Duration;

pub use check::Violation;
pub use rng::SplitMix64;

use crate::Error;

/// `csi-cluster chaos` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ChaosFlags {
    /// The schedule's seed; default: from the clock (printed, so the run can be replayed).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// How long the faulty schedule runs (`90s`, `3m`, `1h`, or seconds); settling and the
    /// final clean-up come after it.
    #[arg(long, default_value = "3m", value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Duration,

    /// Nodes (one zone, so every EBS volume can move to every node).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub nodes: usize,

    /// Claims in play at once (even ones on ebs-sc, odd ones on hostpath).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub claims: usize,

    /// How long the cluster may take to settle after the schedule, and to delete everything.
    #[arg(long, default_value = "3m", value_name = "DURATION", value_parser = parse_duration)]
    pub settle: Duration,

    /// Where the cluster lives (kept afterwards, with its logs). Default: a temp dir under
    /// /var/tmp, removed afterwards unless a violation was found.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Breaks the storage itself once, behind the components' backs, so a run proves that
    /// its checks see what they are there to see (the test of the test).
    #[arg(long, hide = true, value_enum, value_name = "KIND")]
    pub sabotage: Vec<Sabotage>,
}

/// What `--sabotage` breaks, each once, through the first pod whose file was written.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// Unmounts the pod's volume under it (a node agent tearing down a running pod).
    Unmount,
    /// Overwrites the file written through the pod (lost or corrupted data).
    Corrupt,
    /// Removes the backing file of a Bound claim's EBS volume (a volume deleted under its claim).
    DeleteVolume,
}

impl ChaosFlags {
    /// A run of `duration` with every other flag at its default.
    pub fn new(seed: u64, duration: Duration) -> Self {
        Self {
            seed: Some(seed),
            duration,
            nodes: 3,
            claims: 8,
            settle: Duration::from_secs(180),
            data_dir: None,
            sabotage: Vec::new(),
        }
    }

    /// The command line that replays this run.
    pub fn replay(&self, seed: u64) -> String {
        format!(
            "csi-cluster chaos --seed {seed} --duration {}s --nodes {} --claims {}",
            self.duration.as_secs(),
            self.nodes,
            self.claims
        )
    }
}

/// `90s`, `3m`, `1h`, `500ms` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 3m, 1h)"))?;
    let d = match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m or h)")),
    };
    Ok(d)
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub seed: u64,
    /// Workload operations, fault injections and kills issued.
    pub operations: u64,
    /// Faults injected: CSI calls failed (counted by the proxies), EC2 calls throttled (rules
    /// set), components killed, CSIDrivers flipped.
    pub faults: u64,
    /// Single invariant evaluations.
    pub checks: u64,
    /// Files written through pods, and read back.
    pub files_written: u64,
    pub files_verified: u64,
    pub violations: Vec<Violation>,
    pub elapsed: Duration,
    /// The schedule was cut short (Ctrl-C / SIGTERM).
    pub interrupted: bool,
    /// The temp data dir kept because of a violation (its logs explain it).
    pub kept: Option<PathBuf>,
    /// `--sabotage` kinds never done: no pod gave them a chance before settling ended.
    pub sabotage_left: Vec<Sabotage>,
}

impl Report {
    /// The summary line: `N operations, M faults, K invariant checks, V violations`.
    pub fn summary(&self) -> String {
        format!(
            "{} operations, {} faults, {} invariant checks, {} violations",
            self.operations,
            self.faults,
            self.checks,
            self.violations.len()
        )
    }
}

/// Runs the schedule on a throw-away cluster and checks it; a violation is in the report, not
/// an error (errors are for a cluster that could not be run at all).
pub async fn run(flags: &ChaosFlags) -> Result<Report, Error> {
    run_until(flags, tokio_util::sync::CancellationToken::new()).await
}

/// [`run`], with the schedule cut short when `stop` is cancelled (Ctrl-C): the cluster still
/// settles, is checked and cleaned up, and the report says so.
pub async fn run_until(
    flags: &ChaosFlags,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Report, Error> {
    crate::require_root("chaos")?;
    if flags.nodes < 2 || flags.nodes > 10 {
        return Err(Error::Config(format!(
            "--nodes must be between 2 and 10 (pods move between nodes), got {}",
            flags.nodes
        )));
    }
    if flags.claims == 0 || flags.claims > 50 {
        return Err(Error::Config(format!(
            "--claims must be between 1 and 50, got {}",
            flags.claims
        )));
    }
    let seed = flags.seed.unwrap_or_else(seed_from_clock);
    schedule::run(flags, seed, stop).await
}

fn seed_from_clock() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // Mixed, so seeds of runs started close together do not look alike.
    SplitMix64::new(now.as_nanos() as u64).next_u64() % 1_000_000_000
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_summary_line_is_the_documented_one() {
        let r = Report {
            operations: 10_400,
            faults: 1_200,
            checks: 90_000,
            ..Report::default()
        };
        assert_eq!(
            r.summary(),
            "10400 operations, 1200 faults, 90000 invariant checks, 0 violations"
        );
    }
}
