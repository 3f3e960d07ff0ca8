//! YAML/JSON text -> every `csi-translate` command (pv both ways, inline, storageclass, plan).
//! Errors are expected; a panic, abort or hang is a bug.

#![no_main]

use csi_translation::cli::{Command, Direction, Format, run_text};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let input = String::from("-");
    let commands = [
        Command::Pv {
            input: input.clone(),
            direction: Direction::ToCsi,
            format: Format::Yaml,
        },
        Command::Pv {
            input: input.clone(),
            direction: Direction::ToInTree,
            format: Format::Json,
        },
        Command::Inline {
            input: input.clone(),
            namespace: "ns".into(),
            format: Format::Yaml,
        },
        Command::StorageClass {
            input: input.clone(),
            format: Format::Yaml,
        },
        Command::Plan { input },
    ];
    for command in &commands {
        let _ = run_text(command, text, "fuzz");
    }
});
