//! Pod spec rules shared by pods and the pod templates of Deployments and DaemonSets: the
//! subset of the real `ValidatePodSpec` a manifest author trips over (containers, volumes and
//! the mounts that refer to them, probes, ports, env, enumerations), with its field paths.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::names;
use crate::status::FieldError;

/// The volume source fields of `core/v1.Volume`; exactly one must be set.
const VOLUME_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
];
const PROBE_HANDLERS: &[&str] = &["exec", "grpc", "httpGet", "tcpSocket"];
const RESTART_POLICIES: &[&str] = &["Always", "Never", "OnFailure"];
const DNS_POLICIES: &[&str] = &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn not_supported(
    field: String,
    v: Option<&Value>,
    allowed: &'static [&'static str],
) -> Option<FieldError> {
    let v = v.filter(|v| !v.is_null())?;
    if v.as_str().is_some_and(|x| allowed.contains(&x)) {
        None
    } else {
        Some(FieldError::not_supported(field, v.clone(), allowed))
    }
}

/// Validates `spec` (a PodSpec) found at `path` (`spec` for pods, `spec.template.spec` for
/// workloads).
pub(crate) fn validate(path: &str, spec: &Value, errs: &mut Vec<FieldError>) {
    let volumes = volumes(path, spec, errs);
    let containers = list(spec, "containers");
    if containers.is_empty() {
        errs.push(FieldError::required(format!("{path}.containers"), ""));
    }
    let mut names_seen = BTreeSet::new();
    for kind in ["initContainers", "containers"] {
        for (i, c) in list(spec, kind).iter().enumerate() {
            container(
                &format!("{path}.{kind}[{i}]"),
                c,
                &volumes,
                &mut names_seen,
                errs,
            );
        }
    }
    errs.extend(not_supported(
        format!("{path}.restartPolicy"),
        spec.get("restartPolicy"),
        RESTART_POLICIES,
    ));
    errs.extend(not_supported(
        format!("{path}.dnsPolicy"),
        spec.get("dnsPolicy"),
        DNS_POLICIES,
    ));
    let sa = str_of(spec, "serviceAccountName");
    if !sa.is_empty() {
        for p in names::dns1123_subdomain(sa) {
            errs.push(FieldError::invalid(
                format!("{path}.serviceAccountName"),
                json!(sa),
                p,
            ));
        }
    }
}

/// Checks the volumes and returns their names (for the mounts that refer to them).
fn volumes(path: &str, spec: &Value, errs: &mut Vec<FieldError>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (i, v) in list(spec, "volumes").iter().enumerate() {
        let at = format!("{path}.volumes[{i}]");
        let name = str_of(v, "name");
        if name.is_empty() {
            errs.push(FieldError::required(format!("{at}.name"), ""));
        } else {
            for p in names::dns1123_label(name) {
                errs.push(FieldError::invalid(format!("{at}.name"), json!(name), p));
            }
            if !seen.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("{at}.name"), json!(name)));
            }
        }
        let sources: Vec<&&str> = VOLUME_SOURCES
            .iter()
            .filter(|k| v.get(**k).is_some_and(|s| !s.is_null()))
            .collect();
        match sources.as_slice() {
            [] => errs.push(FieldError::required(at, "must specify a volume type")),
            [_] => {}
            [_, rest @ ..] => {
                for k in rest {
                    errs.push(FieldError::forbidden(
                        format!("{at}.{k}"),
                        "may not specify more than 1 volume type",
                    ));
                }
            }
        }
    }
    seen
}

fn container(
    at: &str,
    c: &Value,
    volumes: &BTreeSet<String>,
    names_seen: &mut BTreeSet<String>,
    errs: &mut Vec<FieldError>,
) {
    let name = str_of(c, "name");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{at}.name"), ""));
    } else {
        for p in names::dns1123_label(name) {
            errs.push(FieldError::invalid(format!("{at}.name"), json!(name), p));
        }
        if !names_seen.insert(name.to_string()) {
            errs.push(FieldError::duplicate(format!("{at}.name"), json!(name)));
        }
    }
    if str_of(c, "image").is_empty() {
        errs.push(FieldError::required(format!("{at}.image"), ""));
    }
    errs.extend(not_supported(
        format!("{at}.imagePullPolicy"),
        c.get("imagePullPolicy"),
        PULL_POLICIES,
    ));
    let mut paths = BTreeSet::new();
    for (j, m) in list(c, "volumeMounts").iter().enumerate() {
        let mat = format!("{at}.volumeMounts[{j}]");
        let vol = str_of(m, "name");
        if vol.is_empty() {
            errs.push(FieldError::required(format!("{mat}.name"), ""));
        } else if !volumes.contains(vol) {
            errs.push(FieldError::not_found(format!("{mat}.name"), json!(vol)));
        }
        let mount_path = str_of(m, "mountPath");
        if mount_path.is_empty() {
            errs.push(FieldError::required(format!("{mat}.mountPath"), ""));
        } else if !paths.insert(mount_path.to_string()) {
            errs.push(FieldError::invalid(
                format!("{mat}.mountPath"),
                json!(mount_path),
                "must be unique",
            ));
        }
    }
    for (j, e) in list(c, "env").iter().enumerate() {
        if str_of(e, "name").is_empty() {
            errs.push(FieldError::required(format!("{at}.env[{j}].name"), ""));
        }
    }
    for (j, p) in list(c, "ports").iter().enumerate() {
        let pat = format!("{at}.ports[{j}]");
        let port = str_of(p, "name");
        if !port.is_empty() {
            for problem in names::port_name(port) {
                errs.push(FieldError::invalid(
                    format!("{pat}.name"),
                    json!(port),
                    problem,
                ));
            }
        }
        match p.get("containerPort").and_then(Value::as_i64) {
            Some(1..=65535) => {}
            Some(n) => errs.push(FieldError::invalid(
                format!("{pat}.containerPort"),
                json!(n),
                "must be between 1 and 65535, inclusive",
            )),
            None => errs.push(FieldError::required(format!("{pat}.containerPort"), "")),
        }
        errs.extend(not_supported(
            format!("{pat}.protocol"),
            p.get("protocol"),
            PROTOCOLS,
        ));
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = c.get(probe).filter(|p| !p.is_null()) {
            let handlers: Vec<&&str> = PROBE_HANDLERS
                .iter()
                .filter(|h| p.get(**h).is_some_and(|x| !x.is_null()))
                .collect();
            match handlers.as_slice() {
                [] => errs.push(FieldError::required(
                    format!("{at}.{probe}"),
                    "must specify a handler type",
                )),
                [_] => {}
                [_, rest @ ..] => {
                    for h in rest {
                        errs.push(FieldError::forbidden(
                            format!("{at}.{probe}.{h}"),
                            "may not specify more than 1 handler type",
                        ));
                    }
                }
            }
            for handler in ["httpGet", "tcpSocket"] {
                if let Some(h) = p.get(handler).filter(|g| !g.is_null()) {
                    port_num_or_name(&format!("{at}.{probe}.{handler}.port"), h.get("port"), errs);
                }
            }
        }
    }
}

/// A probe's port: a number in 1..=65535 or a valid port name, as kube-apiserver checks it.
fn port_num_or_name(field: &str, port: Option<&Value>, errs: &mut Vec<FieldError>) {
    match port {
        None | Some(Value::Null) => errs.push(FieldError::required(field, "")),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(1..=65535) => {}
            _ => errs.push(FieldError::invalid(
                field,
                Value::Number(n.clone()),
                "must be between 1 and 65535, inclusive",
            )),
        },
        Some(Value::String(name)) => {
            for problem in names::port_name(name) {
                errs.push(FieldError::invalid(field, json!(name), problem));
            }
        }
        Some(other) => errs.push(FieldError::invalid(
            field,
            other.clone(),
            "must contain a valid port number",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(spec: Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate("spec.template.spec", &spec, &mut errs);
        errs.into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn mounts_must_name_a_volume() {
        let ok = json!({"containers": [{"name": "a", "image": "x:1",
            "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}]}],
            "volumes": [{"name": "socket-dir", "emptyDir": {}}]});
        assert!(fields(ok).is_empty());
        let bad = json!({"containers": [{"name": "a", "image": "x:1",
            "volumeMounts": [{"name": "sockets", "mountPath": "/csi"}]}],
            "volumes": [{"name": "socket-dir", "emptyDir": {}}]});
        assert_eq!(
            fields(bad),
            vec!["spec.template.spec.containers[0].volumeMounts[0].name: Not found: \"sockets\""]
        );
    }

    #[test]
    fn containers_volumes_and_probes() {
        let spec = json!({"containers": [
            {"name": "a", "image": "x:1", "livenessProbe": {"periodSeconds": 5}},
            {"name": "a", "ports": [{"containerPort": 0}]}],
            "volumes": [{"name": "v"}, {"name": "w", "emptyDir": {}, "hostPath": {"path": "/"}}],
            "restartPolicy": "Sometimes"});
        let got = fields(spec);
        let expect = [
            "spec.template.spec.volumes[0]: Required value: must specify a volume type",
            "spec.template.spec.volumes[1].hostPath: Forbidden: may not specify more than 1 volume type",
            "spec.template.spec.containers[0].livenessProbe: Required value: must specify a handler type",
            "spec.template.spec.containers[1].name: Duplicate value: \"a\"",
            "spec.template.spec.containers[1].image: Required value",
            "spec.template.spec.containers[1].ports[0].containerPort: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.template.spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"Never\", \"OnFailure\"",
        ];
        assert_eq!(got, expect);
        assert_eq!(
            fields(json!({})),
            vec!["spec.template.spec.containers: Required value"]
        );
    }

    /// kube-apiserver v1.26 refused the `http-provisioner` port of deploy/kubernetes that
    /// apiserver-lite had taken; these are its messages.
    #[test]
    fn port_names_are_iana_service_names() {
        let spec = json!({"containers": [{"name": "a", "image": "x:1",
            "ports": [{"name": "http-provisioner", "containerPort": 8080},
                      {"name": "ok-name", "containerPort": 8081}],
            "livenessProbe": {"httpGet": {"path": "/", "port": "http-provisioner"}},
            "readinessProbe": {"tcpSocket": {"port": 0}}}]});
        assert_eq!(
            fields(spec),
            vec![
                "spec.template.spec.containers[0].ports[0].name: Invalid value: \"http-provisioner\": must be no more than 15 characters",
                "spec.template.spec.containers[0].livenessProbe.httpGet.port: Invalid value: \"http-provisioner\": must be no more than 15 characters",
                "spec.template.spec.containers[0].readinessProbe.tcpSocket.port: Invalid value: 0: must be between 1 and 65535, inclusive",
            ]
        );
        assert_eq!(
            names::port_name("-8--"),
            vec![
                "must contain at least one letter (a-z)",
                "must not contain consecutive hyphens",
                "must not begin or end with a hyphen",
            ]
        );
        assert!(names::port_name("metrics").is_empty());
    }
}
