//! Migration plan.
