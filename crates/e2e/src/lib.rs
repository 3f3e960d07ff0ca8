//! No library code: this package holds the end-to-end tests in `tests/` that need several of the
//! workspace's heavy crates at once (the EBS driver with aws-sdk-ec2, the attacher, the API
//! server). Keeping them here keeps `cargo test -p attacher` free of aws-sdk-ec2.
