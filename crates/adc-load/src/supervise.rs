//! The processes under test (the ADC, and the attacher where VolumeAttachments must be
//! fulfilled) as attacher-load's [`AttacherProcess`]es: logs in files, peak RSS and CPU time
//! sampled, killed when dropped. Every wait of a scenario runs through [`Running::during`], so a
//! process that dies or a phase that hangs ends the run with the logs instead of a long wait.

use std::future::Future;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Instant;

use attacher_load::process::{AttacherProcess, ProcessStats};

use crate::{Error, Scenario};

pub(crate) const ADC: &str = "attach/detach controller";
pub(crate) const ATTACHER: &str = "attacher";

/// Log lines of each process shown with an error.
const TAIL_LINES: usize = 25;

pub(crate) fn spawn(
    component: &'static str,
    bin: &Path,
    args: &[String],
    log: &Path,
) -> Result<AttacherProcess, Error> {
    AttacherProcess::spawn(bin, args, log).map_err(|source| Error::Spawn { component, source })
}

pub(crate) struct Running {
    pub(crate) scenario: Scenario,
    pub(crate) adc: AttacherProcess,
    pub(crate) attacher: Option<AttacherProcess>,
}

enum Outcome<T> {
    Done(Result<T, Error>),
    Exited(&'static str, Result<ExitStatus, attacher_load::Error>),
    TimedOut,
}

impl Running {
    /// Runs `work` until it finishes, a process exits (an error with the logs), or `deadline`
    /// passes (an error with `progress()` and the logs).
    pub(crate) async fn during<T>(
        &mut self,
        phase: &'static str,
        deadline: Instant,
        progress: impl Fn() -> String,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let outcome = {
            let adc = &mut self.adc;
            let attacher = &mut self.attacher;
            tokio::select! {
                r = work => Outcome::Done(r),
                s = adc.exited() => Outcome::Exited(ADC, s),
                s = async {
                    match attacher.as_mut() {
                        Some(a) => a.exited().await,
                        None => std::future::pending().await,
                    }
                } => Outcome::Exited(ATTACHER, s),
                () = tokio::time::sleep_until(deadline.into()) => Outcome::TimedOut,
            }
        };
        match outcome {
            Outcome::Done(r) => r,
            Outcome::Exited(component, status) => Err(Error::Exited {
                scenario: self.scenario,
                component,
                bin: if component == ADC {
                    self.adc.bin().display().to_string()
                } else {
                    self.attacher
                        .as_ref()
                        .map(|a| a.bin().display().to_string())
                        .unwrap_or_default()
                },
                phase,
                status: match status {
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                },
                logs: self.logs(),
            }),
            Outcome::TimedOut => Err(Error::Timeout {
                scenario: self.scenario,
                phase,
                progress: progress(),
                logs: self.logs(),
            }),
        }
    }

    /// The ends of both logs, labelled.
    pub(crate) fn logs(&self) -> String {
        let mut out = format!("--- {ADC} ---\n{}", self.adc.log_tail(TAIL_LINES));
        if let Some(a) = &self.attacher {
            out.push_str(&format!("\n--- {ATTACHER} ---\n{}", a.log_tail(TAIL_LINES)));
        }
        out
    }

    /// Stops both (a last sample first); the attacher's stats are `None` when it did not run.
    pub(crate) async fn stop(self) -> (ProcessStats, Option<ProcessStats>) {
        let adc = self.adc.stop().await;
        let attacher = match self.attacher {
            Some(a) => Some(a.stop().await),
            None => None,
        };
        (adc, attacher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sh(dir: &Path, name: &str, script: &str) -> AttacherProcess {
        spawn(
            ADC,
            Path::new("sh"),
            &["-c".into(), script.into()],
            &dir.join(name),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn an_exiting_attacher_ends_the_wait_with_both_logs() {
        let dir = tempfile::tempdir().unwrap();
        let mut running = Running {
            scenario: Scenario::AttachRequired,
            adc: sh(dir.path(), "adc.log", "echo adc up; exec sleep 600"),
            attacher: Some(sh(
                dir.path(),
                "att.log",
                "sleep 0.3; echo 'no driver' >&2; exit 4",
            )),
        };
        let err = running
            .during(
                "start-up",
                Instant::now() + Duration::from_secs(30),
                String::new,
                std::future::pending::<Result<(), Error>>(),
            )
            .await
            .unwrap_err();
        match &err {
            Error::Exited {
                component,
                phase,
                status,
                logs,
                ..
            } => {
                assert_eq!(*component, ATTACHER);
                assert_eq!(*phase, "start-up");
                assert!(status.contains('4'), "{status}");
                assert!(
                    logs.contains("adc up") && logs.contains("no driver"),
                    "{logs}"
                );
            }
            other => panic!("expected Exited, got {other}"),
        }
        let (adc, _) = running.stop().await;
        assert!(adc.peak_rss_bytes.is_some());
    }

    #[tokio::test]
    async fn a_deadline_reports_progress_and_work_that_finishes_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut running = Running {
            scenario: Scenario::ThroughAdc,
            adc: sh(dir.path(), "adc.log", "exec sleep 600"),
            attacher: None,
        };
        let n = running
            .during(
                "quick",
                Instant::now() + Duration::from_secs(30),
                String::new,
                async { Ok(7) },
            )
            .await
            .unwrap();
        assert_eq!(n, 7);
        let err = running
            .during(
                "attach",
                Instant::now() + Duration::from_millis(100),
                || "3 of 20 listed".to_owned(),
                std::future::pending::<Result<(), Error>>(),
            )
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("through-adc: attach did not finish"),
            "{text}"
        );
        assert!(text.contains("3 of 20 listed"), "{text}");
        drop(running);
    }
}
