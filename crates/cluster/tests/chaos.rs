//! The randomized fault test (`csi-cluster chaos`) in CI: a short schedule with a fresh seed
//! each run (printed; `CSI_RS_CHAOS_SEED` replays one), which must find no violation; and the
//! test of the test: with the storage broken behind the components' backs (`--sabotage`),
//! the same checks must report exactly what was broken.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use cluster::chaos::{self, ChaosFlags, Sabotage};

fn seed() -> u64 {
    std::env::var("CSI_RS_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_000
        })
}

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    test_support::skip_or_fail("chaos needs root (loop devices, mounts)");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_random_schedule_of_faults_breaks_no_invariant() {
    if !root_or_skip() {
        return;
    }
    let seed = seed();
    let flags = ChaosFlags::new(seed, Duration::from_secs(75));
    println!(
        "chaos seed {seed}; replay: CSI_RS_CHAOS_SEED={seed} or {}",
        flags.replay(seed)
    );
    let report = chaos::run(&flags).await.expect("the cluster runs");
    println!(
        "{} ({} files written, {} read back, {:.0}s)",
        report.summary(),
        report.files_written,
        report.files_verified,
        report.elapsed.as_secs_f64()
    );
    let violations: Vec<String> = report.violations.iter().map(ToString::to_string).collect();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations:\n{}\nreplay: {}",
        violations.len(),
        violations.join("\n"),
        flags.replay(seed)
    );
    // A schedule that did nothing would pass too: it must have done and checked a lot.
    assert!(report.operations >= 200, "{}", report.summary());
    assert!(report.faults >= 50, "{}", report.summary());
    assert!(report.checks >= 200, "{}", report.summary());
    assert!(
        report.files_written >= 10,
        "{} files written",
        report.files_written
    );
    assert!(
        report.files_verified >= 5,
        "{} files read back",
        report.files_verified
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checks_see_a_volume_unmounted_under_its_pod_corrupted_data_and_a_deleted_volume() {
    if !root_or_skip() {
        return;
    }
    let seed = seed();
    let mut flags = ChaosFlags::new(seed, Duration::from_secs(25));
    flags.claims = 4;
    sabotage_is_reported(seed, flags).await;
}

/// A schedule can end with no pod a sabotage can act through (no claim on an EBS slot, or only
/// the pod whose mount `Unmount` took): settling must make one. With no schedule at all,
/// settling alone has to do every sabotage.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settling_alone_gives_every_sabotage_a_pod_to_act_through() {
    if !root_or_skip() {
        return;
    }
    let seed = seed();
    let mut flags = ChaosFlags::new(seed, Duration::ZERO);
    flags.claims = 2;
    let seen = sabotage_is_reported(seed, flags).await;
    // Nothing else broke: without faults, the sabotage is all there is to see.
    assert!(
        seen.iter().all(|v| SABOTAGED.contains(&v.as_str())),
        "seed {seed}: {seen:?}"
    );
}

/// What each `--sabotage` kind breaks: Unmount, Corrupt and DeleteVolume in turn.
const SABOTAGED: [&str; 3] = [
    "no pod Ready without its volume mounted",
    "every file written is read back",
    "no Bound claim's volume deleted",
];

/// Runs `flags` with every sabotage; each must be done and reported. Gives the invariants seen.
async fn sabotage_is_reported(seed: u64, mut flags: ChaosFlags) -> Vec<String> {
    flags.settle = Duration::from_secs(60);
    flags.sabotage = vec![Sabotage::Unmount, Sabotage::Corrupt, Sabotage::DeleteVolume];
    println!("chaos seed {seed} with sabotage");
    let report = chaos::run(&flags).await.expect("the cluster runs");
    // Kept for a user to read; this test made its violations on purpose.
    if let Some(dir) = &report.kept {
        std::fs::remove_dir_all(dir).unwrap();
    }
    let seen: Vec<String> = report
        .violations
        .iter()
        .map(|v| v.invariant.to_string())
        .collect();
    for v in &report.violations {
        println!("{v}");
    }
    assert!(
        report.sabotage_left.is_empty(),
        "seed {seed}: sabotage {:?} never done (no pod gave it a chance)",
        report.sabotage_left
    );
    for want in SABOTAGED {
        assert!(
            seen.iter().any(|v| v == want),
            "seed {seed}: {want:?} not reported; saw {seen:?}"
        );
    }
    seen
}
