//! `csi-translate`: translate in-tree PersistentVolumes, inline volumes and StorageClasses to
//! their CSI form (and PVs back), print a migration plan, or run upstream's test vectors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use csi_translation::cli::{self, Command, Config, Direction, Format};

#[derive(Parser, Debug)]
#[command(name = "csi-translate", version, about, long_about = None)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Translate PersistentVolumes (YAML/JSON: one object, a multi-document stream or a List)
    Pv {
        /// Input file, or - for standard input
        file: String,
        /// Direction: in-tree to CSI, or CSI back to in-tree
        #[arg(long, value_enum, default_value_t = To::Csi)]
        to: To,
        /// Output format
        #[arg(short = 'o', long, value_enum, default_value_t = Out::Yaml)]
        output: Out,
    },
    /// Translate inline volumes (bare Volume objects, or the in-tree volumes of Pods) to CSI PVs
    Inline {
        /// Input file, or - for standard input
        file: String,
        /// Namespace of the pod that uses bare volumes (Azure File keeps its secret there)
        #[arg(long, default_value = "")]
        namespace: String,
        /// Output format
        #[arg(short = 'o', long, value_enum, default_value_t = Out::Yaml)]
        output: Out,
    },
    /// Translate StorageClasses of in-tree provisioners (the provisioner becomes the CSI driver)
    #[command(alias = "sc")]
    Storageclass {
        /// Input file, or - for standard input
        file: String,
        /// Direction; StorageClasses only translate to CSI
        #[arg(long, value_enum, default_value_t = To::Csi)]
        to: To,
        /// Output format
        #[arg(short = 'o', long, value_enum, default_value_t = Out::Yaml)]
        output: Out,
    },
    /// Print a migration plan: each object, its plugin, CSI driver, and whether it translates
    Plan {
        /// Input file (e.g. `kubectl get pv,sc -o yaml`), or - for standard input
        file: String,
    },
    /// Run a test-vector file (../shared/vectors format); exit status 1 if a row fails
    Vectors {
        /// The .jsonl file
        file: PathBuf,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum To {
    Csi,
    InTree,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Out {
    Yaml,
    Json,
}

impl From<Out> for Format {
    fn from(o: Out) -> Self {
        match o {
            Out::Yaml => Format::Yaml,
            Out::Json => Format::Json,
        }
    }
}

fn config(args: Args) -> anyhow::Result<Config> {
    let command = match args.command {
        Cmd::Pv { file, to, output } => Command::Pv {
            input: file,
            direction: if to == To::Csi {
                Direction::ToCsi
            } else {
                Direction::ToInTree
            },
            format: output.into(),
        },
        Cmd::Inline {
            file,
            namespace,
            output,
        } => Command::Inline {
            input: file,
            namespace,
            format: output.into(),
        },
        Cmd::Storageclass { file, to, output } => {
            anyhow::ensure!(
                to == To::Csi,
                "--to in-tree: only PersistentVolumes translate back to in-tree"
            );
            Command::StorageClass {
                input: file,
                format: output.into(),
            }
        }
        Cmd::Plan { file } => Command::Plan { input: file },
        Cmd::Vectors { file } => Command::Vectors { file },
    };
    Ok(Config { command })
}

fn main() -> ExitCode {
    let result = config(Args::parse()).and_then(|c| Ok(cli::run(&c)?));
    match result {
        Ok(out) => {
            print!("{}", out.text);
            if out.success {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("csi-translate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
