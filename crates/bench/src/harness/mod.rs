//! What every scenario measures with: what its command line shares ([`cli`]), its processes
//! under test ([`child`]: log files, peak memory and CPU time from `/proc`, stopped on every
//! path), the API writes of each party from the embedded API server's audit trail
//! ([`writes`]), latency percentiles ([`stats`]) and the "median (min-max)" tables of several
//! runs ([`table`]), how a report is printed ([`output`]), and what a scenario runs its
//! components in: the run's temp dir, API server and in-process components ([`world`]) and the
//! EBS scenarios' cloud ([`ebs`]).
//!
//! Leaf modules: the scenarios import these, never the other way round.

pub mod api;
pub mod child;
pub mod cli;
pub mod ebs;
pub mod goals;
pub mod objects;
pub mod output;
pub mod procfs;
pub mod stats;
pub mod table;
pub mod world;
pub mod writes;
