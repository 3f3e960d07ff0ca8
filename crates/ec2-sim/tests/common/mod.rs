//! Test helpers: a raw EC2 query-protocol client over hyper-util and a tiny XML tree.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ec2_sim::{SimConfig, Simulator, Timing};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use quick_xml::Reader;
use quick_xml::events::Event;

pub mod loops;

/// One XML element: local name, concatenated text, children.
#[derive(Debug, Clone, Default)]
pub struct Node {
    pub name: String,
    pub text: String,
    pub children: Vec<Node>,
}

impl Node {
    pub fn child(&self, name: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Text of a direct child, or "" when absent.
    pub fn get(&self, name: &str) -> String {
        self.child(name).map(|c| c.text.clone()).unwrap_or_default()
    }

    /// Follows a `/`-separated path of element names; the last step may match many.
    pub fn all(&self, path: &str) -> Vec<&Node> {
        let mut cur = vec![self];
        for step in path.split('/') {
            cur = cur
                .into_iter()
                .flat_map(|n| n.children.iter().filter(move |c| c.name == step))
                .collect();
        }
        cur
    }

    /// Text at a path, or "" when absent.
    pub fn at(&self, path: &str) -> String {
        self.all(path)
            .first()
            .map(|n| n.text.clone())
            .unwrap_or_default()
    }
}

pub fn parse(xml: &str) -> Node {
    let mut reader = Reader::from_str(xml);
    let mut stack: Vec<Node> = vec![Node::default()];
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(e) => stack.push(Node {
                name: e.local_name().as_ref().to_string(),
                ..Node::default()
            }),
            Event::Empty(e) => {
                let node = Node {
                    name: e.local_name().as_ref().to_string(),
                    ..Node::default()
                };
                stack.last_mut().unwrap().children.push(node);
            }
            Event::End(_) => {
                let node = stack.pop().unwrap();
                stack.last_mut().unwrap().children.push(node);
            }
            Event::Text(t) => stack.last_mut().unwrap().text.push_str(&t.xml10_content()),
            Event::GeneralRef(r) => {
                let c = match r.resolve_char_ref().ok().flatten() {
                    Some(c) => c.to_string(),
                    None => match r.into_inner().as_ref() {
                        "amp" => "&".into(),
                        "lt" => "<".into(),
                        "gt" => ">".into(),
                        "quot" => "\"".into(),
                        "apos" => "'".into(),
                        other => panic!("unknown entity {other}"),
                    },
                };
                stack.last_mut().unwrap().text.push_str(&c);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(stack.len(), 1, "unbalanced XML: {xml}");
    stack
        .pop()
        .unwrap()
        .children
        .into_iter()
        .next()
        .expect("a root element")
}

/// A raw HTTP client for one simulator: every request (the EC2 endpoint `/` and `/_sim/*`,
/// which need it; `/metrics` and `/healthz`, which ignore it) is signed (SigV4) with
/// `credentials` unless that is `None`.
pub struct Ec2 {
    client: Client<HttpConnector, Full<Bytes>>,
    pub base: String,
    host: String,
    pub credentials: Option<(String, String)>,
    pub region: String,
}

pub struct Reply {
    pub status: u16,
    pub body: String,
    pub xml: Node,
}

impl Reply {
    /// The EC2 error code of an error reply.
    pub fn code(&self) -> String {
        self.xml.at("Errors/Error/Code")
    }
}

impl Ec2 {
    /// Signs with the simulator's default test pair.
    pub fn new(addr: SocketAddr) -> Ec2 {
        Ec2::with_credentials(
            addr,
            Some((
                ec2_sim::DEFAULT_ACCESS_KEY_ID,
                ec2_sim::DEFAULT_SECRET_ACCESS_KEY,
            )),
        )
    }

    /// Signs with `credentials`, or not at all.
    pub fn with_credentials(addr: SocketAddr, credentials: Option<(&str, &str)>) -> Ec2 {
        Ec2 {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
            host: addr.to_string(),
            credentials: credentials.map(|(k, s)| (k.to_string(), s.to_string())),
            region: "us-east-1".into(),
        }
    }

    /// The `X-Amz-Date` and `Authorization` headers of a request, if it is signed.
    pub fn signature(&self, method: &str, path: &str, body: &str) -> Vec<(&'static str, String)> {
        let Some((key, secret)) = &self.credentials else {
            return Vec::new();
        };
        let (p, query) = path.split_once('?').unwrap_or((path, ""));
        ec2_sim::sign_request(
            method,
            p,
            query,
            &self.host,
            body.as_bytes(),
            &self.region,
            key,
            secret,
            std::time::SystemTime::now(),
        )
        .to_vec()
    }

    pub async fn raw(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let headers = self.signature(method, path, body);
        self.send(method, path, body, &headers).await
    }

    /// One request with exactly these extra headers (no signing of its own).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, String)],
    ) -> (u16, String) {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            );
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
        let resp = self.client.request(req).await.expect("HTTP request");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    /// Form-POSTs an action with the SDK's `Version`.
    pub async fn call(&self, action: &str, params: &[(&str, &str)]) -> Reply {
        let mut pairs: Vec<(&str, &str)> = vec![("Action", action), ("Version", "2016-11-15")];
        pairs.extend_from_slice(params);
        let body = serde_urlencoded::to_string(&pairs).unwrap();
        let (status, body) = self.raw("POST", "/", &body).await;
        let xml = parse(&body);
        Reply { status, body, xml }
    }

    /// An action that must succeed; returns the response root.
    pub async fn ok(&self, action: &str, params: &[(&str, &str)]) -> Node {
        let r = self.call(action, params).await;
        assert_eq!(r.status, 200, "{action} {params:?} failed: {}", r.body);
        assert_eq!(r.xml.name, format!("{action}Response"));
        assert!(!r.xml.get("requestId").is_empty());
        r.xml
    }

    /// An action that must fail with `code` and HTTP `status`.
    pub async fn fails(
        &self,
        action: &str,
        params: &[(&str, &str)],
        status: u16,
        code: &str,
    ) -> Reply {
        let r = self.call(action, params).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (status, code),
            "{action} {params:?}: {}",
            r.body
        );
        assert!(!r.xml.get("RequestID").is_empty(), "{}", r.body);
        r
    }

    pub async fn create_volume(&self, zone: &str, size: &str, extra: &[(&str, &str)]) -> String {
        let mut p = vec![
            ("AvailabilityZone", zone),
            ("Size", size),
            ("VolumeType", "gp3"),
        ];
        p.extend_from_slice(extra);
        self.ok("CreateVolume", &p).await.get("volumeId")
    }

    pub async fn run_instance(&self, zone: &str) -> String {
        let x = self
            .ok(
                "RunInstances",
                &[
                    ("ImageId", "ami-12345678"),
                    ("MinCount", "1"),
                    ("MaxCount", "1"),
                    ("Placement.AvailabilityZone", zone),
                ],
            )
            .await;
        x.at("instancesSet/item/instanceId")
    }

    pub async fn volume(&self, id: &str) -> Node {
        let x = self.ok("DescribeVolumes", &[("VolumeId.1", id)]).await;
        x.all("volumeSet/item")[0].clone()
    }

    /// Polls DescribeVolumes until `f` holds (at most 10 s).
    pub async fn wait_volume(&self, id: &str, what: &str, f: impl Fn(&Node) -> bool) -> Node {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.volume(id).await;
            if f(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {id} to be {what}: {v:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn wait_status(&self, id: &str, status: &str) -> Node {
        self.wait_volume(id, status, |v| v.get("status") == status)
            .await
    }

    pub async fn wait_attached(&self, id: &str) -> Node {
        self.wait_volume(id, "attached", |v| {
            v.at("attachmentSet/item/status") == "attached"
        })
        .await
    }
}

pub struct Sim {
    pub sim: Simulator,
    pub ec2: Ec2,
    pub dir: tempfile::TempDir,
}

pub async fn start_with(mut config: SimConfig) -> Sim {
    let dir = tempfile::tempdir().unwrap();
    if config.state_dir == SimConfig::default().state_dir {
        config.state_dir = dir.path().join("state");
    }
    let region = config.region.clone();
    let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("simulator starts");
    let mut ec2 = Ec2::new(sim.local_addr());
    ec2.region = region;
    Sim { sim, ec2, dir }
}

pub async fn start(timing: Timing) -> Sim {
    start_with(SimConfig {
        timing,
        ..SimConfig::default()
    })
    .await
}

pub use test_support::process::ChildGuard;

/// Log lines of a spawned binary, kept up to date in the background.
pub type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Starts the binary on an ephemeral port, accepting the default test pair (given in
/// `EC2_SIM_ACCESS_KEY_ID` / `EC2_SIM_SECRET_ACCESS_KEY`), and returns it with the address it
/// logged and its log lines so far (kept up to date in the background).
pub fn spawn_binary(args: &[&str]) -> (ChildGuard, SocketAddr, Log) {
    spawn_binary_with(
        args,
        &[
            ("EC2_SIM_ACCESS_KEY_ID", ec2_sim::DEFAULT_ACCESS_KEY_ID),
            (
                "EC2_SIM_SECRET_ACCESS_KEY",
                ec2_sim::DEFAULT_SECRET_ACCESS_KEY,
            ),
        ],
    )
}

/// Like [`spawn_binary`] with exactly these `EC2_SIM_*` credential variables (none inherited).
pub fn spawn_binary_with(args: &[&str], env: &[(&str, &str)]) -> (ChildGuard, SocketAddr, Log) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ec2-sim"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("EC2_SIM_ACCESS_KEY_ID")
        .env_remove("EC2_SIM_SECRET_ACCESS_KEY")
        .env_remove("EC2_SIM_CREDENTIALS_FILE")
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        // The log goes to stderr.
        .stderr(Stdio::piped())
        .spawn()
        .expect("ec2-sim binary starts");
    let stderr = child.stderr.take().unwrap();
    let guard = ChildGuard(child);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("log line before exit").unwrap();
        log.lock().unwrap().push(line.clone());
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    // Keep draining the log so the child never blocks on a full pipe.
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    (guard, addr, log)
}
