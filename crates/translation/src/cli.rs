//! `csi-translate`: the library behind the binary. `main.rs` parses flags into a [`Config`] and
//! calls [`run`]; tests call [`run`] the same way.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use crate::input::{Document, parse_documents, read_source};
use crate::{Error, Result, plan, translator, vectors};

/// Which way to translate PVs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// In-tree -> CSI.
    #[default]
    ToCsi,
    /// CSI -> in-tree (PersistentVolumes only).
    ToInTree,
}

/// Output format of translated objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A YAML stream, one document per object.
    #[default]
    Yaml,
    /// One JSON object, or a `List` of several.
    Json,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Translate PersistentVolumes.
    Pv {
        input: String,
        direction: Direction,
        format: Format,
    },
    /// Translate inline volumes (bare Volumes or the in-tree volumes of Pods) to CSI PVs.
    Inline {
        input: String,
        namespace: String,
        format: Format,
    },
    /// Translate StorageClasses of in-tree provisioners.
    StorageClass { input: String, format: Format },
    /// Print a migration plan table.
    Plan { input: String },
    /// Run a vector file.
    Vectors { file: PathBuf },
}

/// The tool's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The command.
    pub command: Command,
}

/// What the tool prints, and whether it exits with success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Text for standard output.
    pub text: String,
    /// False: exit status 1 (a vector failed).
    pub success: bool,
}

/// Runs a command. Input `-` is standard input.
pub fn run(config: &Config) -> Result<Output> {
    let (source, origin) = match &config.command {
        Command::Vectors { file } => {
            let text = std::fs::read_to_string(file).map_err(|error| Error::Io {
                path: file.display().to_string(),
                error,
            })?;
            (text, file.display().to_string())
        }
        Command::Plan { input }
        | Command::Pv { input, .. }
        | Command::Inline { input, .. }
        | Command::StorageClass { input, .. } => (read_source(input)?, input.clone()),
    };
    run_text(&config.command, &source, &origin)
}

/// Runs a command on input text that has already been read; `origin` names it in messages.
/// The command's own file argument is not used. This is also the fuzzing entry point: no text
/// makes it panic.
pub fn run_text(command: &Command, text: &str, origin: &str) -> Result<Output> {
    if let Command::Vectors { .. } = command {
        let report = vectors::run_str(text);
        return Ok(Output {
            text: report.render(),
            success: report.failed() == 0,
        });
    }
    let docs = parse_documents(text, origin)?;
    match command {
        Command::Vectors { .. } => Err(Error::Output("unreachable: vectors handled above".into())),
        Command::Plan { .. } => Ok(Output {
            text: plan::render(&plan::plan(&docs)),
            success: true,
        }),
        Command::Pv {
            direction, format, ..
        } => {
            let out = translate_all(&docs, &["PersistentVolume"], |doc| {
                let pv = doc.pv()?;
                let out = match direction {
                    Direction::ToCsi => translator::translate_in_tree_pv_to_csi(&pv),
                    Direction::ToInTree => translator::translate_csi_pv_to_in_tree(&pv),
                };
                Ok(vec![to_value(&out.map_err(|e| doc.error(e.to_string()))?)?])
            })?;
            render(out, *format)
        }
        Command::Inline {
            namespace, format, ..
        } => {
            let out = translate_all(&docs, &["Pod"], |doc| inline(doc, namespace))?;
            render(out, *format)
        }
        Command::StorageClass { format, .. } => {
            let out = translate_all(&docs, &["StorageClass"], |doc| {
                let sc = doc.storage_class()?;
                let plugin = crate::plugin_by_in_tree_name(&sc.provisioner).ok_or_else(|| {
                    doc.error(format!(
                        "field provisioner: {:?} is not an in-tree plugin with CSI migration",
                        sc.provisioner
                    ))
                })?;
                let mut csi = plugin
                    .translate_in_tree_storage_class_to_csi(&sc)
                    .map_err(|e| doc.error(e.to_string()))?;
                // The library leaves the provisioner to its caller; a user of the tool wants
                // the class as it would be written for the CSI driver.
                csi.provisioner = plugin.csi_plugin_name().to_string();
                Ok(vec![to_value(&csi)?])
            })?;
            render(out, *format)
        }
    }
}

fn inline(doc: &Document, namespace: &str) -> Result<Vec<Value>> {
    if doc.kind == "Pod" {
        let pod = doc.pod()?;
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| namespace.to_string());
        let volumes = pod.spec.and_then(|s| s.volumes).unwrap_or_default();
        return volumes
            .iter()
            .filter(|v| translator::is_inline_migratable(v))
            .map(|v| {
                let pv = translator::translate_in_tree_inline_volume_to_csi(v, &ns)
                    .map_err(|e| doc.error(format!("volume {:?}: {e}", v.name)))?;
                to_value(&pv)
            })
            .collect();
    }
    let volume = doc.volume()?;
    let pv = translator::translate_in_tree_inline_volume_to_csi(&volume, namespace)
        .map_err(|e| doc.error(e.to_string()))?;
    Ok(vec![to_value(&pv)?])
}

/// Translates every document of the `kinds` the command handles (and those without a kind);
/// objects of other kinds in a mixed file are passed over. Any failure makes the whole command
/// fail, naming every failing document: a partial translation on standard output would be easy
/// to apply by mistake.
fn translate_all(
    docs: &[Document],
    kinds: &[&str],
    mut f: impl FnMut(&Document) -> Result<Vec<Value>>,
) -> Result<Vec<Value>> {
    let docs: Vec<&Document> = docs
        .iter()
        .filter(|d| d.kind.is_empty() || kinds.contains(&d.kind.as_str()))
        .collect();
    if docs.is_empty() {
        return Err(Error::Input {
            document: "input".into(),
            message: format!(
                "contains no {} (nor an object without a kind)",
                kinds.join(" or ")
            ),
        });
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for doc in docs {
        match f(doc) {
            Ok(values) => out.extend(values),
            Err(e) => errors.push(e.to_string()),
        }
    }
    match errors.len() {
        0 => Ok(out),
        1 => Err(Error::Input {
            document: "translation failed".into(),
            message: errors.remove(0),
        }),
        n => Err(Error::Input {
            document: format!("{n} objects failed to translate"),
            message: format!("\n  {}", errors.join("\n  ")),
        }),
    }
}

fn to_value<T: Serialize>(v: &T) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::Output(e.to_string()))
}

fn render(values: Vec<Value>, format: Format) -> Result<Output> {
    let text = match format {
        Format::Json => {
            let v = if values.len() == 1 {
                values.into_iter().next().unwrap_or(Value::Null)
            } else {
                serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": values })
            };
            let mut s =
                serde_json::to_string_pretty(&v).map_err(|e| Error::Output(e.to_string()))?;
            s.push('\n');
            s
        }
        Format::Yaml => {
            let mut s = String::new();
            for v in &values {
                s.push_str("---\n");
                s.push_str(&serde_saphyr::to_string(v).map_err(|e| Error::Output(e.to_string()))?);
                if !s.ends_with('\n') {
                    s.push('\n');
                }
            }
            s
        }
    };
    Ok(Output {
        text,
        success: true,
    })
}
