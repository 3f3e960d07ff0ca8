//! `--driver NAME=COMMAND`: another CSI driver binary put through the whole lifecycle. COMMAND
//! runs (`sh -c`) once as the controller plugin and once per node, each a child process of its
//! own (see `external_process`), with its sidecars in-process as for the built-in drivers: a
//! CSIDriver and a StorageClass named NAME, a csi-provisioner (one against the controller
//! plugin, or with `--driver-node-deployment` one per node against that node's plugin, which
//! a node-local driver like hostpath needs: only the node's own plugin can create its
//! volumes), a csi-attacher against the controller plugin when `--attach-required`, and a
//! node-driver-registrar per node.
//!
//! Before any sidecar starts, every plugin must serve its socket and report NAME from
//! GetPluginInfo: the registrar and the attacher take the driver's name from there, so a
//! plugin reporting another name (a forgotten `--drivername`) would be registered as, and have
//! its VolumeAttachments served for, another driver — the built-in hostpath one, say. `up`
//! fails instead, naming the flag and the plugin's log.
//!
//! The provisioner's mode is a flag rather than guessed from the driver: topology (what a
//! node-local driver reports) is reported by central drivers too (EBS), so it does not tell
//! whether the controller plugin can create every node's volumes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_spec::v1::GetPluginInfoRequest;
use csi_spec::v1::identity_client::IdentityClient;

use crate::component_names::{attacher_name, external_controller, external_node};
use crate::config::UpConfig;
use crate::control_plane::{self, spawn_provisioner};
use crate::external_process::{Child, child_factory};
use crate::identity::{Identity, Kubeconfigs};
use crate::nodes::{self, NodeSpec};
use crate::supervisor::{Stage, Supervisor};
use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER};

/// What COMMAND may contain.
const PLACEHOLDERS: [&str; 4] = ["endpoint", "node", "mode", "state-dir"];

/// The `{node}` of the controller plugin.
const CONTROLLER_NODE: &str = "controller";

/// How long a plugin may take to serve its socket at start.
const PLUGIN_PATIENCE: Duration = Duration::from_secs(60);

/// Unix socket paths hold at most 107 bytes.
const MAX_SOCKET_PATH: usize = 107;

/// One `--driver NAME=COMMAND`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExternalDriver {
    pub(crate) name: String,
    /// COMMAND with its placeholders still in.
    pub(crate) command: String,
}

/// Every `--driver`, checked: NAME=COMMAND, NAME a DNS subdomain and not used twice or by a
/// built-in driver, only known placeholders.
pub(crate) fn parse_all(specs: &[String]) -> Result<Vec<ExternalDriver>, Error> {
    let mut drivers: Vec<ExternalDriver> = Vec::new();
    for spec in specs {
        let d = parse(spec)?;
        if d.name == EBS_DRIVER || d.name == HOSTPATH_DRIVER {
            return Err(flag_error(
                spec,
                format!(
                    "{} is a built-in driver of csi-cluster; pick another name",
                    d.name
                ),
            ));
        }
        if drivers.iter().any(|o| o.name == d.name) {
            return Err(flag_error(spec, format!("{} is given twice", d.name)));
        }
        drivers.push(d);
    }
    Ok(drivers)
}

fn flag_error(spec: &str, why: impl std::fmt::Display) -> Error {
    Error::Config(format!("--driver {spec}: {why}"))
}

fn parse(spec: &str) -> Result<ExternalDriver, Error> {
    let (name, command) = spec
        .split_once('=')
        .ok_or_else(|| flag_error(spec, "want NAME=COMMAND"))?;
    let (name, command) = (name.trim(), command.trim());
    if !is_dns_subdomain(name) {
        return Err(flag_error(
            spec,
            format!(
                "NAME {name:?} must be a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters, starting and ending with a letter or digit), as CSIDriver names are"
            ),
        ));
    }
    if command.is_empty() {
        return Err(flag_error(spec, "COMMAND is empty"));
    }
    for p in placeholders(command) {
        if !PLACEHOLDERS.contains(&p) {
            return Err(flag_error(
                spec,
                format!(
                    "unknown placeholder {{{p}}} in COMMAND (known: {})",
                    PLACEHOLDERS.map(|k| format!("{{{k}}}")).join(" ")
                ),
            ));
        }
    }
    Ok(ExternalDriver {
        name: name.to_string(),
        command: command.to_string(),
    })
}

/// The `{word}`s of `command` (word: lowercase letters, digits, `-`, `_`); other braces (a
/// shell's `${VAR}` included) are left to the shell.
fn placeholders(command: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = command;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let preceded_by_dollar = rest[..open].ends_with('$');
        match after.find('}') {
            Some(close)
                if !preceded_by_dollar
                    && close > 0
                    && after[..close].chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
                    }) =>
            {
                found.push(&after[..close]);
                rest = &after[close + 1..];
            }
            _ => rest = after,
        }
    }
    found
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `value` as one shell word.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// COMMAND for one plugin, placeholders replaced by shell-quoted values.
fn render(command: &str, endpoint: &str, node: &str, mode: &str, state_dir: &Path) -> String {
    let state_dir = state_dir.display().to_string();
    let mut out = command.to_string();
    for (key, value) in [
        ("endpoint", endpoint),
        ("node", node),
        ("mode", mode),
        ("state-dir", state_dir.as_str()),
    ] {
        out = out.replace(&format!("{{{key}}}"), &shell_quote(value));
    }
    out
}

/// One plugin process of `driver`: its socket, state dir and log file.
fn plugin(
    driver: &ExternalDriver,
    socket: PathBuf,
    node: &str,
    mode: &str,
    data_dir: &Path,
) -> Result<Child, Error> {
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(Error::Config(format!(
            "--driver {}: its socket {} is longer than {MAX_SOCKET_PATH} bytes; use a shorter --data-dir or NAME",
            driver.name,
            socket.display()
        )));
    }
    let state_dir = data_dir.join("drivers").join(&driver.name).join(node);
    std::fs::create_dir_all(&state_dir).map_err(|e| Error::io("creating", &state_dir, e))?;
    let endpoint = format!("unix://{}", socket.display());
    Ok(Child {
        what: format!("{} ({mode} plugin{})", driver.name, node_suffix(node, mode)),
        command: render(&driver.command, &endpoint, node, mode, &state_dir),
        env: vec![
            ("CSI_ENDPOINT".into(), endpoint),
            ("KUBE_NODE_NAME".into(), node.to_string()),
        ],
        socket,
        log: data_dir
            .join("logs")
            .join(format!("{}-{node}.log", driver.name)),
    })
}

fn node_suffix(node: &str, mode: &str) -> String {
    if mode == "node" {
        format!(" on {node}")
    } else {
        String::new()
    }
}

/// The objects of every external driver (CSIDriver, StorageClass).
pub(crate) fn objects(
    drivers: &[ExternalDriver],
    attach_required: bool,
) -> Vec<(&'static str, serde_json::Value)> {
    drivers
        .iter()
        .flat_map(|d| crate::bootstrap_objects::driver_objects(&d.name, attach_required))
        .collect()
}

/// Starts every external driver's plugins, waits until each serves its socket under the right
/// name, then starts their sidecars (the nodes' dirs exist already).
pub(crate) async fn start(
    sup: &Supervisor,
    drivers: &[ExternalDriver],
    config: &UpConfig,
    data_dir: &Path,
    kubeconfigs: &Kubeconfigs<'_>,
    specs: &[NodeSpec],
    informers: &crate::informers::Informers,
) -> Result<(), Error> {
    let sockets = data_dir.join("sockets");
    std::fs::create_dir_all(&sockets).map_err(|e| Error::io("creating", &sockets, e))?;
    let mut started = Vec::new();
    for driver in drivers {
        let controller = plugin(
            driver,
            sockets.join(format!("{}.sock", driver.name)),
            CONTROLLER_NODE,
            "controller",
            data_dir,
        )?;
        started.push((driver, external_controller(&driver.name), controller));
        for node in specs {
            let socket = nodes::driver_socket(&node.root_dir(data_dir), &driver.name)?;
            let child = plugin(driver, socket, &node.name, "node", data_dir)?;
            started.push((driver, external_node(&node.name, &driver.name), child));
        }
    }
    for (_, component, child) in &started {
        sup.spawn(
            component.clone(),
            Stage::Drivers,
            child_factory(child.clone()),
        );
    }
    let checks = started
        .iter()
        .map(|(driver, component, child)| check_plugin(sup, &driver.name, component, child));
    for result in futures::future::join_all(checks).await {
        result?;
    }

    for driver in drivers {
        let controller_endpoint = format!(
            "unix://{}",
            sockets.join(format!("{}.sock", driver.name)).display()
        );
        if config.attach_required {
            control_plane::spawn_attacher(
                sup,
                &attacher_name(&driver.name),
                &controller_endpoint,
                &kubeconfigs.path(&Identity::attacher(&driver.name))?,
            )?;
        }
        if !config.driver_node_deployment {
            spawn_provisioner(
                sup,
                kubeconfigs,
                &driver.name,
                &controller_endpoint,
                None,
                None,
            )
            .await?;
        }
        // The driver's per-node provisioners read one set of watches, as the hostpath ones do.
        let node_provisioners = if config.driver_node_deployment {
            let client = kubeconfigs
                .client(
                    &Identity::provisioner(&driver.name),
                    &control_plane::provisioner_informers_agent(&driver.name),
                )
                .await?;
            Some(informers.provisioners(&client))
        } else {
            None
        };
        for node in specs {
            let root = node.root_dir(data_dir);
            let socket = nodes::driver_socket(&root, &driver.name)?;
            nodes::spawn_registrar(
                sup,
                &node.name,
                &driver.name,
                &socket,
                &socket,
                &root.join("plugins_registry"),
            );
            if let Some(shared) = &node_provisioners {
                let endpoint = format!("unix://{}", socket.display());
                spawn_provisioner(
                    sup,
                    kubeconfigs,
                    &driver.name,
                    &endpoint,
                    Some(&node.name),
                    Some(shared),
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Waits until the plugin answers GetPluginInfo with `driver`; fails at once when its process
/// ended (the supervisor started it a second time), naming its log.
async fn check_plugin(
    sup: &Supervisor,
    driver: &str,
    component: &str,
    child: &Child,
) -> Result<(), Error> {
    let endpoint = format!("unix://{}", child.socket.display());
    let fail = |why: String| {
        Error::Config(format!(
            "--driver {driver}: {component} {why}; its output is in {}",
            child.log.display()
        ))
    };
    let started = Instant::now();
    let mut last = String::from("no socket yet");
    loop {
        if sup.starts(component).unwrap_or(0) > 1 {
            return Err(fail("exited right after it started".into()));
        }
        if child.socket.exists() {
            match plugin_name(&endpoint).await {
                Ok(name) if name == driver => return Ok(()),
                Ok(name) => {
                    return Err(fail(format!(
                        "reports the driver name {name:?} in GetPluginInfo, not {driver:?}: give the driver its name (e.g. its --drivername flag), or use --driver {name}=..."
                    )));
                }
                Err(e) => last = e,
            }
        }
        if started.elapsed() > PLUGIN_PATIENCE {
            return Err(fail(format!(
                "did not answer GetPluginInfo on {endpoint} within {PLUGIN_PATIENCE:?} ({last})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn plugin_name(endpoint: &str) -> Result<String, String> {
    let channel = csi_spec::connect_unix(endpoint)
        .await
        .map_err(|e| e.to_string())?;
    let info = tokio::time::timeout(
        Duration::from_secs(5),
        IdentityClient::new(channel).get_plugin_info(GetPluginInfoRequest {}),
    )
    .await
    .map_err(|_| "GetPluginInfo took more than 5 s".to_string())?
    .map_err(|s| format!("GetPluginInfo: {}", s.message()))?;
    Ok(info.into_inner().name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn specs(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn drivers_parse_and_errors_name_the_flag() {
        let d = parse_all(&specs(&[
            "x.example.com=/bin/drv --endpoint {endpoint} --node {node}",
        ]))
        .unwrap();
        assert_eq!(d[0].name, "x.example.com");
        assert_eq!(d[0].command, "/bin/drv --endpoint {endpoint} --node {node}");
        for (spec, needle) in [
            ("foo", "--driver foo: want NAME=COMMAND"),
            (
                "Foo_bar=/bin/x",
                "--driver Foo_bar=/bin/x: NAME \"Foo_bar\" must be a DNS subdomain",
            ),
            ("-x.com=/bin/x", "must be a DNS subdomain"),
            ("x.com=", "COMMAND is empty"),
            (
                "x.com=/bin/x {nodes}",
                "unknown placeholder {nodes} in COMMAND",
            ),
            ("hostpath.csi.k8s.io=/bin/x", "built-in driver"),
        ] {
            let e = parse_all(&specs(&[spec])).unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
        let e = parse_all(&specs(&["a.com=/x", "a.com=/y"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn placeholders_leave_shell_braces_alone() {
        assert_eq!(
            placeholders("d --e {endpoint} ${HOME} {state-dir} a{b c}"),
            vec!["endpoint", "state-dir"]
        );
        assert!(parse_all(&specs(&["x.com=d ${PATH} {mode}"])).is_ok());
    }

    #[test]
    fn rendering_quotes_the_values() {
        let out = render(
            "drv --endpoint {endpoint} --node-id={node} --mode {mode} --dir {state-dir}",
            "unix:///d/s.sock",
            "node-1",
            "node",
            Path::new("/data/it's here"),
        );
        assert_eq!(
            out,
            r"drv --endpoint 'unix:///d/s.sock' --node-id='node-1' --mode 'node' --dir '/data/it'\''s here'"
        );
    }
}
