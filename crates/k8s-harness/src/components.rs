//! Command lines and config files of each component, as /work's k8s README found they run on
//! a 2-core root sandbox: everything on 127.0.0.1 and ephemeral ports, state in the temp dir.

use std::path::Path;

use crate::Error;

/// Where the service-account tokens say they come from.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The service network; its first address is the `kubernetes` Service's, in the serving cert.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/12";
/// The image containerd runs each pod's sandbox from (imported, never pulled).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9";

fn s(p: &Path) -> String {
    p.display().to_string()
}

pub(crate) fn etcd_args(data_dir: &Path, client_port: u16, peer_port: u16) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    vec![
        "--name=harness".into(),
        format!("--data-dir={}", s(data_dir)),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=harness={peer}"),
        "--initial-cluster-state=new".into(),
    ]
}

pub(crate) struct ApiserverFiles<'a> {
    pub(crate) ca: &'a Path,
    pub(crate) serving_cert: &'a Path,
    pub(crate) serving_key: &'a Path,
    pub(crate) kubelet_client_cert: &'a Path,
    pub(crate) kubelet_client_key: &'a Path,
    pub(crate) sa_key: &'a Path,
    pub(crate) sa_pub: &'a Path,
}

pub(crate) fn apiserver_args(f: &ApiserverFiles<'_>, port: u16, etcd_port: u16) -> Vec<String> {
    vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", s(f.serving_cert)),
        format!("--tls-private-key-file={}", s(f.serving_key)),
        format!("--client-ca-file={}", s(f.ca)),
        format!("--kubelet-client-certificate={}", s(f.kubelet_client_cert)),
        format!("--kubelet-client-key={}", s(f.kubelet_client_key)),
        format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
        format!("--service-account-key-file={}", s(f.sa_pub)),
        format!("--service-account-signing-key-file={}", s(f.sa_key)),
        format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
        "--authorization-mode=Node,RBAC".into(),
        // As kubeadm: a kubelet (or a node agent with a node's cert) may only touch its own node.
        "--enable-admission-plugins=NodeRestriction".into(),
        // No credentials is 401, not system:anonymous: a test that forgets its token sees it.
        "--anonymous-auth=false".into(),
        "--allow-privileged=true".into(),
        // The node's name does not resolve: reach kubelets (logs, exec) at their InternalIP.
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        // The default (lease) reconciler logs an error every 10 s for a loopback address.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
    ]
}

pub(crate) struct ControllerManagerFiles<'a> {
    pub(crate) kubeconfig: &'a Path,
    pub(crate) ca: &'a Path,
    pub(crate) ca_key: &'a Path,
    pub(crate) sa_key: &'a Path,
    pub(crate) cert_dir: &'a Path,
}

pub(crate) fn controller_manager_args(
    f: &ControllerManagerFiles<'_>,
    controllers: &str,
    port: u16,
) -> Vec<String> {
    let kc = s(f.kubeconfig);
    vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        format!("--controllers={controllers}"),
        "--use-service-account-credentials=true".into(),
        format!("--root-ca-file={}", s(f.ca)),
        format!("--service-account-private-key-file={}", s(f.sa_key)),
        format!("--cluster-signing-cert-file={}", s(f.ca)),
        format!("--cluster-signing-key-file={}", s(f.ca_key)),
        format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", s(f.cert_dir)),
        "--profiling=false".into(),
    ]
}

pub(crate) fn scheduler_args(kubeconfig: &Path, port: u16, cert_dir: &Path) -> Vec<String> {
    let kc = s(kubeconfig);
    vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", s(cert_dir)),
        "--profiling=false".into(),
    ]
}

/// containerd's config: its own root, state, sockets and CNI config dir under `dir`.
pub(crate) fn containerd_config(dir: &Path, socket: &Path, cni_conf_dir: &Path) -> String {
    let d = s(dir);
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{sock}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The sandbox lacks CAP_SYS_RESOURCE: runc fails on a negative oom_score_adj otherwise.
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir, so teardown finds and unmounts them.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
"#,
        sock = s(socket),
        cni = crate::assets::CNI_BIN_DIR,
        conf = s(cni_conf_dir),
    )
}

/// No pod network: loopback only (pods that must reach the API server use hostNetwork).
pub(crate) const CNI_LOOPBACK_CONFLIST: &str =
    r#"{"cniVersion":"0.4.0","name":"harness-loopback","plugins":[{"type":"loopback"}]}"#;

pub(crate) struct KubeletPorts {
    pub(crate) server: u16,
    pub(crate) healthz: u16,
}

/// The address the kubelet reports and serves on. It refuses a loopback `--node-ip` (the Node
/// then has no addresses, and kube-apiserver cannot reach it for logs and exec), so it is the
/// host's own address: the source address of its default route (a UDP "connect" sends
/// nothing), 127.0.0.1 only when the host has no route at all.
pub(crate) fn host_ip() -> std::net::IpAddr {
    let local = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("198.51.100.1:9").and_then(|()| s.local_addr()));
    match local {
        Ok(a) if !a.ip().is_unspecified() && !a.ip().is_loopback() => a.ip(),
        _ => std::net::IpAddr::from([127, 0, 0, 1]),
    }
}

/// The KubeletConfiguration (JSON) for this machine (see the module doc).
pub(crate) fn kubelet_config(
    ca: &Path,
    root_dir: &Path,
    node_ip: std::net::IpAddr,
    ports: &KubeletPorts,
) -> Result<String, Error> {
    let cfg = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip.to_string(),
        "port": ports.server,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.healthz,
        "authentication": {
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": ca },
        },
        "authorization": { "mode": "Webhook" },
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": false,
        "enforceNodeAllocatable": [],
        "failSwapOn": false,
        "makeIPTablesUtilChains": false,
        "localStorageCapacityIsolation": false,
        "evictionHard": { "nodefs.available": "1%", "imagefs.available": "1%" },
        "imageGCHighThresholdPercent": 100,
        "clusterDomain": "cluster.local",
        // Flexvolume plugins: the default is under /usr/libexec, which the kubelet would create.
        "volumePluginDir": root_dir.join("volume-plugins"),
        "rotateCertificates": false,
        "serverTLSBootstrap": false,
    });
    serde_json::to_string_pretty(&cfg).map_err(|e| Error::Invalid(format!("kubelet config: {e}")))
}

pub(crate) struct KubeletFiles<'a> {
    pub(crate) config: &'a Path,
    pub(crate) kubeconfig: &'a Path,
    pub(crate) root_dir: &'a Path,
    pub(crate) containerd_socket: &'a Path,
}

pub(crate) fn kubelet_args(
    f: &KubeletFiles<'_>,
    node_name: &str,
    node_ip: std::net::IpAddr,
) -> Vec<String> {
    vec![
        format!("--config={}", s(f.config)),
        format!("--kubeconfig={}", s(f.kubeconfig)),
        format!("--root-dir={}", s(f.root_dir)),
        format!("--cert-dir={}", s(&f.root_dir.join("pki"))),
        format!(
            "--container-runtime-endpoint=unix://{}",
            s(f.containerd_socket)
        ),
        format!("--hostname-override={node_name}"),
        format!("--node-ip={node_ip}"),
        "--v=2".into(),
    ]
}
