//! What is on a device: `blkid -p -o export DEV` (low-level probe, no cache).

use std::collections::BTreeMap;
use std::path::Path;

use crate::Result;
use crate::cmd;

/// The result of probing a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// blkid found no signature at all (exit code 2): safe to format.
    Blank,
    /// A filesystem (or another `TYPE`, e.g. `crypto_LUKS`): never format over it.
    Filesystem { fs_type: String },
    /// Something that is not blank but has no `TYPE`: a partition table, or a device where
    /// blkid found conflicting signatures (exit code 8). Never format over it either.
    Other { details: String },
}

/// Probes `device`. Exit code 2 means "nothing found"; 8 means ambivalent signatures.
pub async fn probe(device: &Path) -> Result<Probe> {
    let args = [
        "-p".as_ref(),
        "-o".as_ref(),
        "export".as_ref(),
        device.as_os_str(),
    ];
    let out = cmd::run("blkid", args).await?;
    match out.code {
        Some(0) => Ok(classify(&parse_export(&out.stdout))),
        Some(2) => Ok(Probe::Blank),
        Some(8) => Ok(Probe::Other {
            details: format!("blkid found ambivalent signatures: {}", out.combined()),
        }),
        _ => Err(cmd::command_error("blkid", &args, &out)),
    }
}

/// Parses `KEY=value` lines; values may carry backslash escapes (blkid escapes spaces and
/// quotes in labels), which are dropped since only the keys' plain values matter here.
pub fn parse_export(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.replace('\\', "")))
        .collect()
}

fn classify(fields: &BTreeMap<String, String>) -> Probe {
    if let Some(t) = fields.get("TYPE") {
        return Probe::Filesystem { fs_type: t.clone() };
    }
    let details = if let Some(pt) = fields.get("PTTYPE") {
        format!("partition table {pt}")
    } else {
        let keys: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("blkid reports {}", keys.join(" "))
    };
    Probe::Other { details }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filesystem_type_is_read_from_export_output() {
        let out = "DEVNAME=/dev/loop3\nUUID=1b2c\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n";
        assert_eq!(
            classify(&parse_export(out)),
            Probe::Filesystem {
                fs_type: "ext4".into()
            }
        );
    }

    #[test]
    fn partition_table_is_not_blank() {
        let out = "DEVNAME=/dev/loop3\nPTUUID=abcd\nPTTYPE=gpt\n";
        match classify(&parse_export(out)) {
            Probe::Other { details } => assert!(details.contains("gpt"), "{details}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn escaped_label_values_are_unescaped() {
        let fields = parse_export("LABEL=my\\ disk\nTYPE=xfs\n");
        assert_eq!(fields["LABEL"], "my disk");
        assert_eq!(fields["TYPE"], "xfs");
    }
}
