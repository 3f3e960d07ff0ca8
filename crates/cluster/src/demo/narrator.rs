//! How a demo talks: numbered steps, each with the time since the demo began and what it
//! proves, so the output reads as a story and as evidence.

use std::time::Instant;

/// Prints steps, their details and what they prove.
pub struct Narrator {
    started: Instant,
    step: usize,
}

impl Default for Narrator {
    fn default() -> Self {
        Self::new()
    }
}

impl Narrator {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            step: 0,
        }
    }

    fn stamp(&self) -> String {
        format!("[{:>6.1}s]", self.started.elapsed().as_secs_f64())
    }

    /// A new step: `== 3. title`.
    pub fn step(&mut self, title: &str) {
        self.step += 1;
        println!();
        println!("{} == {}. {title}", self.stamp(), self.step);
    }

    /// Something seen on the way.
    pub fn show(&self, what: impl AsRef<str>) {
        println!("{}      {}", self.stamp(), what.as_ref());
    }

    /// What the step established.
    pub fn proves(&self, what: impl AsRef<str>) {
        println!("{}      proves: {}", self.stamp(), what.as_ref());
    }

    /// Seconds since the demo began.
    pub fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Steps so far.
    pub fn steps(&self) -> usize {
        self.step
    }
}
