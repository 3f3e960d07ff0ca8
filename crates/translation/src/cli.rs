//! `csi-translate`.
