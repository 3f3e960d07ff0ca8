//! The in-tree `kubernetes.io/aws-ebs` volume plugin (issue 11): attach and detach through the
//! `ebs-cloud` trait, and the node side (find, format blank only, fsck, mount) with `mount-utils`.
